"""The reconciliation job: command line (``python -m jobs.reconcile``, ``spark-submit
jobs/reconcile.py``) and notebook functions.

Shape: parse arguments and configuration -> validate inputs (before Spark starts, so bad
input fails fast with one line) -> build the session -> read -> round (transforms) ->
write the six Delta tables (offsets last) and the consumerOffset.json fragments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # spark-submit jobs/reconcile.py: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# A notebook that imports this module before it creates its session with a plain
# SparkSession.builder.getOrCreate() gets Python workers running this interpreter (the one
# with pyarrow and the project), not whatever `python3` is first on PATH. An explicit
# PYSPARK_PYTHON wins; a session started earlier keeps its workers (probe_workers says so).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.errors import InputError
from jobs.config import JobConfig, load_config
from schemas.messages import COMMITTED_OFFSET

if TYPE_CHECKING:
    from transforms.params import RoundParams
    from transforms.round import RoundOutputs

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
FAULT_ENV = "RMQ_RECONCILE_FAIL_AFTER"  # test hook: stop right after committing this table


class StrictModeError(RuntimeError):
    """--strict and the input has bad records."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2 (spec section 7)
        raise InputError(message)


def packaged_defaults() -> JobConfig:
    """conf/default.toml over the built-in defaults; the built-in ones if it is unreadable
    (the run itself then reports the file with one line)."""
    try:
        return load_config(None, {})
    except InputError:
        return JobConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m jobs.reconcile",
        description="Reconcile RocketMQ transactional messages offline and write Delta tables.",
    )
    inputs = parser.add_argument_group("inputs (a broker store, or exported segments)")
    inputs.add_argument(
        "--store",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="broker store directory; repeat for several brokers",
    )
    inputs.add_argument("--half", help="exported half records (Parquet/JSON/Delta)")
    inputs.add_argument("--op", help="exported op records (Parquet/JSON/Delta)")
    inputs.add_argument("--offsets", help="consumerOffset.json for exported segments")
    inputs.add_argument(
        "--format", choices=["parquet", "json", "delta"], help="format of --half/--op"
    )
    inputs.add_argument("--broker", help="broker name of exported segments")
    parser.add_argument("--output", required=True, help="output root: one Delta table per folder")
    parser.add_argument(
        "--as-of", dest="as_of", help="now | latest | ISO-8601 | epoch ms (default now)"
    )
    parser.add_argument(
        "--run-id", dest="run_id", help="default: derived from the inputs, T and settings"
    )
    parser.add_argument("--conf", help="TOML file overriding conf/default.toml")
    # Flags default to None so that --conf can override the packaged defaults; the help
    # shows the packaged defaults (conf/default.toml, the broker's own).
    defaults = packaged_defaults()
    parser.add_argument(
        "--check-max",
        dest="check_max",
        type=int,
        help=f"discard when the counter reaches it (default {defaults.check_max})",
    )
    parser.add_argument(
        "--transaction-timeout-ms",
        dest="transaction_timeout_ms",
        type=int,
        help=f"default immunity (default {defaults.transaction_timeout_ms})",
    )
    parser.add_argument(
        "--file-reserved-hours",
        dest="file_reserved_hours",
        type=int,
        help=f"discard when older, by born time (default {defaults.file_reserved_hours})",
    )
    parser.add_argument(
        "--broker-version",
        dest="broker_version",
        choices=["5", "4.9"],
        help="the broker's version line: 5 (5.1+, default) or 4.9 (4.9.x and 5.0.0)",
    )
    parser.add_argument("--strict", action="store_const", const=True, help="fail on any bad record")
    parser.add_argument(
        "--include-body",
        dest="include_body",
        action="store_const",
        const=True,
        help="keep message bodies in the output (they can hold personal data)",
    )
    parser.add_argument(
        "--verify-crc",
        dest="verify_crc",
        action="store_const",
        const=True,
        help="check each record's body CRC (store input)",
    )
    parser.add_argument(
        "--writer",
        choices=["auto", "delta-spark", "delta-rs"],
        help="Delta writer (default auto: delta-spark when the session can write Delta)",
    )
    parser.add_argument(
        "--catalog-schema",
        dest="catalog_schema",
        metavar="NAME",
        help="also register the tables as NAME.<table> in the session's catalog",
    )
    parser.add_argument("--master", help="Spark master when not launched by spark-submit")
    parser.add_argument("--verbose", action="store_true", help="show Spark's own logging")
    return parser


# -- time -------------------------------------------------------------------------------


def parse_as_of(text: str) -> int | str:
    """``now`` and ``latest`` stay symbolic; an ISO-8601 instant or epoch ms becomes epoch ms."""
    if text in ("now", "latest"):
        return text
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"--as-of must be now, latest, an ISO-8601 instant or epoch ms: {text}"
        ) from None
    if instant.tzinfo is None:
        raise InputError(f"--as-of needs a time zone (e.g. {text}Z): {text}")
    return int(instant.timestamp() * 1000)


def resolve_as_of(as_of: int | str, messages: DataFrame) -> int:
    """``latest``: 1 ms after the newest record read (all brokers and queues); ``now`` when
    there is none."""
    if isinstance(as_of, int):
        return as_of
    if as_of == "latest":
        newest = messages.agg(F.max("store_timestamp_ms")).first()[0]
        if newest is not None:
            return int(newest) + 1
    return int(time.time() * 1000)


def derive_run_id(inputs: Sequence[str], as_of_ms: int, config: JobConfig) -> str:
    """Same inputs, T and settings -> same id, so a rerun replaces its own rows."""
    settings = {
        k: v
        for k, v in asdict(config).items()
        if k
        in (
            "check_max",
            "transaction_timeout_ms",
            "file_reserved_hours",
            "include_body",
            "verify_crc",
            "broker_version",
        )
    }
    digest = hashlib.sha256(json.dumps([sorted(inputs), as_of_ms, settings]).encode()).hexdigest()
    return f"r{as_of_ms}-{digest[:12]}"


# -- extract ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """What was read: records, reader bad records, committed offsets, reader notes."""

    messages: DataFrame
    bad_records: DataFrame
    committed_offsets: DataFrame
    notes: DataFrame
    identity: list[str]  # for the default run id
    release: Callable[[], None] | None = None  # set when the reader already caches its output
    # (broker, offsets file used, why the usual file was not used or None), for warnings
    offsets_files: tuple[tuple[str, str, str | None], ...] = ()

    def persist(self) -> Inputs:
        """Cache the records once; the store reader's output is cached already."""
        if self.release is not None:
            return self
        messages, bad_records = self.messages.persist(), self.bad_records.persist()

        def release() -> None:
            messages.unpersist()
            bad_records.unpersist()

        return Inputs(
            messages,
            bad_records,
            self.committed_offsets,
            self.notes,
            self.identity,
            release,
            self.offsets_files,
        )

    def unpersist(self) -> None:
        if self.release is not None:
            self.release()


def read_store_inputs(spark: SparkSession, stores: Sequence[str], config: JobConfig) -> Inputs:
    from connectors.rocketmq.reader import parse_store_arg, read_stores
    from transforms.round import NOTE

    specs = [parse_store_arg(arg) for arg in stores]
    read = read_stores(
        spark, specs, verify_crc=config.verify_crc, include_half_body=config.include_body, lean=True
    )
    notes = spark.createDataFrame(list(read.notes), NOTE)
    identity = [f"store:{spec.broker}={spec.root.resolve()}" for spec in specs]
    return Inputs(
        read.messages,
        read.bad_records,
        read.committed_offsets,
        notes,
        identity,
        read.unpersist,
        read.offsets_files,
    )


def read_segment_inputs(
    spark: SparkSession, half: str, op: str, fmt: str, broker: str, offsets: str | None
) -> Inputs:
    from connectors.rocketmq.offsets_file import committed_rows, read_consumer_offsets
    from connectors.segments import read_segments
    from transforms.round import NOTE

    table = None
    if offsets is not None:
        table = read_consumer_offsets(offsets)
        if table is None:
            raise InputError(f"{offsets}: offsets file not found")
    read = read_segments(spark, half, op, fmt, broker)
    committed = spark.createDataFrame(committed_rows(broker, table), COMMITTED_OFFSET)
    identity = [f"{fmt}:{broker}:{Path(p).resolve()}" for p in (half, op)] + [f"offsets:{offsets}"]
    used = offsets if offsets is not None else "no --offsets given"
    return Inputs(
        read.messages,
        read.bad_records,
        committed,
        spark.createDataFrame([], NOTE),
        identity,
        offsets_files=((broker, used, None),),
    )


def validate_output(output: str, stores: Sequence[str]) -> None:
    """A local ``--output`` must not be a file nor inside a store (the job never writes
    into a broker's store). URIs of other file systems pass through."""
    if "://" in output and not output.startswith("file://"):
        return
    path = Path(output.removeprefix("file://")).resolve()
    if path.exists() and not path.is_dir():
        raise InputError(f"--output {output}: is a file, not a directory")
    from connectors.rocketmq.reader import parse_store_arg

    for arg in stores:
        root = parse_store_arg(arg).root.resolve()
        if path == root or root in path.parents:
            raise InputError(f"--output {output}: is inside the store {root}; write elsewhere")


def validate_arguments(args: argparse.Namespace) -> None:
    """Everything that can be checked before Spark starts (exit code 2, one line)."""
    from connectors.rocketmq.offsets_file import read_consumer_offsets

    validate_output(args.output, args.store)

    segments = [args.half, args.op, args.format, args.broker]
    if args.store and any(value is not None for value in [*segments, args.offsets]):
        raise InputError("use either --store or --half/--op/--format/--broker, not both")
    if not args.store:
        if any(value is None for value in segments):
            raise InputError("give --store DIR, or all of --half, --op, --format and --broker")
        from connectors.segments import validate_segment_path

        validate_segment_path(args.half, args.format)
        validate_segment_path(args.op, args.format)
        if args.offsets is not None:
            if not Path(args.offsets).is_file():
                raise InputError(f"{args.offsets}: offsets file not found")
            read_consumer_offsets(args.offsets)
        return
    from connectors.rocketmq.offsets_file import load_store_offsets
    from connectors.rocketmq.reader import parse_store_arg, validate_store

    brokers: set[str] = set()
    for arg in args.store:
        spec = parse_store_arg(arg)
        validate_store(spec)
        if spec.broker in brokers:
            raise InputError(f"broker name '{spec.broker}' given twice; name stores NAME=DIR")
        brokers.add(spec.broker)
        load_store_offsets(spec.root)  # malformed without a usable .bak -> InputError now


# -- the round for notebooks ----------------------------------------------------------------


def _params(config: JobConfig, as_of_ms: int, run_id: str):
    from transforms.params import RoundParams

    return RoundParams(
        as_of_ms=as_of_ms,
        run_id=run_id,
        check_max=config.check_max,
        transaction_timeout_ms=config.transaction_timeout_ms,
        file_reserved_hours=config.file_reserved_hours,
        include_body=config.include_body,
        broker_version=config.broker_version,
        check_interval_ms=config.check_interval_ms,
    )


def _round(inputs: Inputs, config: JobConfig, as_of: int | str, run_id: str | None):
    from jobs.materialize import SparkMaterializer
    from transforms.round import classify_round

    as_of_ms = resolve_as_of(as_of, inputs.messages)
    run_id = run_id or derive_run_id(inputs.identity, as_of_ms, config)
    state = classify_round(
        inputs.messages,
        inputs.committed_offsets,
        _params(config, as_of_ms, run_id),
        bad_input=inputs.bad_records,
        notes=inputs.notes,
        materialize=SparkMaterializer(),  # the job's one decision on caching and collecting
    )
    return with_picture_warnings(state, inputs, config)


def with_picture_warnings(state, inputs: Inputs, config: JobConfig):
    """The round's state with the warnings of a picture that may be wrong added to
    ``run_summary.warnings`` (spec section 1): a committed offset missing (naming the
    offsets file used), a broker's newest record too old for a live broker."""
    from dataclasses import replace

    from transforms.offsets import with_missing_offset_warnings
    from transforms.staleness import newest_records, stale_after_ms, with_stale_store_warning

    as_of_ms = state.params.as_of_ms
    limit = stale_after_ms(config.check_interval_ms, config.transaction_timeout_ms)
    per_queue = state.materialize.per_queue
    newest = per_queue(newest_records(inputs.messages, as_of_ms))  # one row per broker
    files = inputs.messages.sparkSession.createDataFrame(
        list(inputs.offsets_files), "broker string, offsets_file string, offsets_note string"
    )
    queues = with_missing_offset_warnings(state.queues, files).transform(
        with_stale_store_warning, newest, as_of_ms, limit, state.params.reserved_ms
    )
    return replace(state, queues=per_queue(queues))


def refuse_far_past_store(messages: DataFrame, as_of_ms: int, config: JobConfig) -> None:
    """--strict: T beyond a broker's newest half/op record by more than the retention
    (``file_reserved_hours``) would make every transaction of it expired: refuse (exit 2)."""
    from transforms.staleness import newest_records

    limit = config.file_reserved_hours * 3_600_000
    for row in newest_records(messages, as_of_ms).orderBy("broker").collect():  # per broker
        if row["newest_ms"] is not None and as_of_ms - row["newest_ms"] > limit:
            raise InputError(
                f"broker {row['broker']}: T={as_of_ms} is {as_of_ms - row['newest_ms']} ms after"
                f" its newest half/op record, more than the retention ({config.file_reserved_hours}"
                " h) and --strict is set: the store looks copied; use --as-of latest or the"
                " instant the store was copied"
            )


def reconcile_stores(
    spark: SparkSession,
    stores: Sequence[str],
    *,
    as_of: str | int = "latest",
    run_id: str | None = None,
    **settings: object,
):
    """Notebook entry point: the round over broker stores, as DataFrames; nothing written.

    Args:
        spark: the caller's session.
        stores: ``"[NAME=]DIR"`` strings, one per broker.
        as_of: ``now``, ``latest``, an ISO-8601 instant or epoch ms.
        run_id: default derived from the inputs, T and settings.
        settings: any ``JobConfig`` field (check_max, transaction_timeout_ms, ...).

    Returns:
        ``transforms.round.RoundOutputs``.
    """
    from jobs.session import probe_workers
    from transforms.round import shape_outputs

    config = load_config(None, dict(settings))
    probe_workers(spark)
    inputs = read_store_inputs(spark, stores, config)
    return shape_outputs(_round(inputs, config, parse_as_of(str(as_of)), run_id))


def reconcile_segments(
    spark: SparkSession,
    half: str,
    op: str,
    *,
    fmt: str,
    broker: str,
    offsets: str | None = None,
    as_of: str | int = "latest",
    run_id: str | None = None,
    **settings: object,
):
    """Notebook entry point for exported segments (see ``reconcile_stores``)."""
    from jobs.session import probe_workers
    from transforms.round import shape_outputs

    config = load_config(None, dict(settings))
    probe_workers(spark)
    inputs = read_segment_inputs(spark, half, op, fmt, broker, offsets)
    return shape_outputs(_round(inputs, config, parse_as_of(str(as_of)), run_id))


def reconcile_stores_to_delta(
    spark: SparkSession,
    stores: Sequence[str],
    output: str,
    *,
    as_of: str | int = "latest",
    run_id: str | None = None,
    writer: str = "auto",
    catalog_schema: str = "",
    **settings: object,
) -> dict[str, int]:
    """Notebook entry point that also writes: the round over ``stores`` into ``output``.

    In a session that has Delta (a Databricks-like notebook, or ``build_session(delta=True)``)
    ``writer="auto"`` writes through Spark (delta-spark); elsewhere through delta-rs. Same
    tables and semantics as the command line (a rerun of a run id replaces its rows).

    Returns:
        Table name -> rows written.
    """
    from transforms.round import shape_outputs

    config = load_config(None, {**settings, "writer": writer, "catalog_schema": catalog_schema})
    inputs = read_store_inputs(spark, stores, config).persist()
    state = _round(inputs, config, parse_as_of(str(as_of)), run_id)
    try:
        return write_outputs(
            spark,
            shape_outputs(state),
            state.params.run_id,
            output,
            config.include_body,
            time.time(),
            lambda message: None,
            writer_choice=config.writer,
            catalog_schema=config.catalog_schema,
        )
    finally:
        inputs.unpersist()


# -- load -----------------------------------------------------------------------------------


def _fault_point(table: str) -> None:
    if os.environ.get(FAULT_ENV) == table:
        raise SystemExit(f"fault injected after committing {table} ({FAULT_ENV})")


def write_outputs(
    spark: SparkSession,
    outputs,
    run_id: str,
    output_root: str,
    include_body: bool,
    started: float,
    progress,
    facts: dict[str, object] | None = None,
    writer_choice: str = "auto",
    catalog_schema: str = "",
) -> dict[str, int]:
    """Create the tables if absent, replace this run's rows in each; offsets last.
    ``facts`` (``run_facts``: inputs, writer, job version) are recorded in run_summary."""
    from connectors.delta import open_output, register_tables
    from schemas.outputs import CONSUME_OFFSETS_TABLE, RUN_SUMMARY_TABLE, table_schema

    writer = open_output(spark, output_root, writer_choice)
    progress(f"writing through {type(writer).__name__}")
    facts = facts or run_facts(writer, ())
    counts: dict[str, int] = {}
    for name in outputs.tables():
        writer.ensure_table(name, table_schema(name, include_body))
    for name, frame in outputs.tables().items():
        schema = table_schema(name, include_body)
        if name == RUN_SUMMARY_TABLE:
            now = int(time.time() * 1000)
            frame = frame.withColumns(
                {
                    "inputs": F.array(*[F.lit(i) for i in facts["inputs"]]).cast("array<string>"),
                    "writer": F.lit(facts["writer"]),
                    "job_version": F.lit(facts["job_version"]),
                    "written_at_ms": F.lit(now),
                    "duration_ms": F.lit(now - int(started * 1000)),
                }
            )
        if name == CONSUME_OFFSETS_TABLE:
            counts[name] = writer.merge_offsets(frame, schema)
        else:
            counts[name] = writer.replace_run(name, frame, schema, run_id)
        progress(f"wrote {name}: {counts[name]} rows")
        _fault_point(name)
    if catalog_schema:
        names = register_tables(spark, output_root, catalog_schema, list(outputs.tables()))
        progress(f"registered {', '.join(names)}")
    return counts


def run_facts(writer: object, inputs: Sequence[str]) -> dict[str, object]:
    """What run_summary records beside the round's settings: the inputs, the writer
    (``delta-rs`` or ``delta-spark``) and the job's version."""
    name = str(getattr(writer, "name", type(writer).__name__))
    return {"inputs": list(inputs), "writer": name, "job_version": job_version()}


def job_version() -> str:
    """The installed package's version; a spark-submit zip is not installed: ``unknown``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rmq-txn-reconcile")
    except PackageNotFoundError:
        return "unknown"


def write_offset_fragments(offset_rows: list[dict], output_root: str) -> list[Path]:
    """Per broker, in the broker's own format: ``consumerOffset.safe.json`` (offset_safe),
    ``consumerOffset.after.json`` (offset_after, unsafe to install by hand) and
    ``consumerOffset.committed.json`` (offset_committed: what ``jobs.offsets install``
    checks the target against)."""
    from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets
    from jobs.offsets import FRAGMENT_AFTER, FRAGMENT_COMMITTED, FRAGMENT_SAFE
    from schemas.messages import HALF_TOPIC

    files = {"offset_after": FRAGMENT_AFTER, "offset_safe": FRAGMENT_SAFE}
    files["offset_committed"] = FRAGMENT_COMMITTED
    by_broker: dict[str, dict[str, dict[str, dict[int, int]]]] = {}
    for row in offset_rows:
        key = HALF_KEY if row["topic"] == HALF_TOPIC else OP_KEY
        tables = by_broker.setdefault(row["broker"], {column: {} for column in files})
        for column in files:
            if row[column] is not None:  # offset_committed is null when the key was missing
                tables[column].setdefault(key, {})[row["queue_id"]] = row[column]
    written = []
    for broker, tables in sorted(by_broker.items()):
        folder = Path(output_root) / "offset_fragments" / broker
        for column, name in files.items():
            write_consumer_offsets(folder / name, tables[column])
        written.append(folder)
    return written


def format_summary(
    summary_rows: list[dict],
    output_root: str,
    run_id: str,
    as_of_ms: int,
    offset_rows: Sequence[dict] = (),
) -> str:
    from jobs.attention import attention_lines, settings_line
    from schemas.outputs import CLASSES

    when = datetime.fromtimestamp(as_of_ms / 1000).astimezone().isoformat(timespec="milliseconds")
    lines = [f"run {run_id}  as of {as_of_ms} ({when})", settings_line(summary_rows)]
    lines.append("needs attention first:")
    lines += [f"  {line}" for line in attention_lines(summary_rows, offset_rows, output_root)]
    lines.append("per queue:")
    for row in sorted(
        summary_rows,
        key=lambda r: (r["broker"], r["queue_id"] if r["queue_id"] is not None else -1),
    ):
        classes = "  ".join(f"{name}={row[name]}" for name in CLASSES)
        lines.append(
            f"  {row['broker']} queue {row['queue_id']}: {classes}  bad_records={row['bad_records']}"
        )
        if row["h0"] is not None:
            lines.append(
                f"    half offset {row['h0']} -> {row['h1']} (safe {row['h_safe']});"
                f" op offset {row['p0']} -> {row['p1']} (safe {row['p_safe']})"
            )
        for warning in row["warnings"] or []:
            lines.append(f"    warning: {warning}")
    lines.append(
        f"tables: {Path(output_root).resolve()}/<check_requests|discards|pending|consume_offsets|run_summary|bad_records>"
    )
    lines.append(
        f"offset fragments: {Path(output_root).resolve()}/offset_fragments/<broker>/consumerOffset.<safe|after|committed>.json"
    )
    return "\n".join(lines)


def bad_records_line(count: int, output_root: str, run_id: str) -> str:
    """The line that says bad records exist and where they are (without --strict the run
    goes on, and a count inside the per-queue lines is easy to miss)."""
    table = Path(output_root).resolve() / "bad_records"
    return (
        f"warning: {count} bad record(s) took no part in the round: rows in {table}"
        f" (run_id {run_id}); --strict makes them fail the run"
    )


def round_totals(queues: DataFrame) -> tuple[int, int]:
    """(bad records, unresolved records from h0) summed over a round's per-queue rows."""
    from schemas.outputs import CLASSES, RESOLVED

    unresolved = [name for name in CLASSES if name != RESOLVED]
    rows = queues.select("bad_records", *unresolved).collect()  # one row per queue
    return (
        sum(row["bad_records"] for row in rows),
        sum(row[name] for row in rows for name in unresolved),
    )


PHASE_PREFIX = "rmq-txn-reconcile: "


def _phase(spark: SparkSession, name: str) -> None:
    """Label the Spark jobs that follow (Spark UI, event log; ``bench/`` reads stage times
    per phase from it)."""
    spark.sparkContext.setJobDescription(PHASE_PREFIX + name)


def run(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    started = time.time()

    def progress(message: str) -> None:
        print(f"[{time.time() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    overrides = {
        key: getattr(args, key)
        for key in (
            "check_max",
            "transaction_timeout_ms",
            "file_reserved_hours",
            "broker_version",
            "strict",
            "include_body",
            "verify_crc",
            "as_of",
            "master",
            "writer",
            "catalog_schema",
        )
    }
    config = load_config(args.conf, overrides)
    as_of = parse_as_of(config.as_of)
    validate_arguments(args)

    if spark is None:
        from jobs.session import build_session

        under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit decides the master
        spark = build_session(
            master=None if under_submit else config.master,
            shuffle_partitions=config.shuffle_partitions,
            driver_memory=config.driver_memory,
            verbose=args.verbose,
            delta=config.writer == "delta-spark",  # Delta's extension (jars via the Ivy cache)
        )
    from connectors.delta import choose_writer
    from jobs.session import probe_workers
    from transforms.round import shape_outputs

    probe_workers(spark)
    choose_writer(spark, config.writer)  # --writer delta-spark without Delta: exit 2 now
    if args.store:
        inputs = read_store_inputs(spark, args.store, config)
    else:
        inputs = read_segment_inputs(
            spark, args.half, args.op, args.format, args.broker, args.offsets
        )
    inputs = inputs.persist()
    _phase(spark, "decode")
    records = inputs.messages.count()
    progress(f"read {records} half/op records from {len(inputs.identity)} input(s)")

    as_of = resolve_as_of(as_of, inputs.messages)
    if config.strict:
        refuse_far_past_store(inputs.messages, as_of, config)
    _phase(spark, "resolve and classify")
    state = _round(inputs, config, as_of, args.run_id).persist()
    params = state.params
    # Both totals from the per-queue rows the round already brought to the driver: every
    # bad record and every unresolved record from h0 is counted in one queue's row, so no
    # Spark job counts them again.
    bad, pending = round_totals(state.queues)
    progress(
        f"resolved and classified: {pending} unresolved half records from h0, {bad} bad records"
    )
    if config.strict and bad:
        first = state.bad_records.orderBy("broker", "source", "position").first()
        raise StrictModeError(
            f"{bad} bad record(s) and --strict is set; first: {first['reason']} at {first['source']}:{first['position']}"
        )
    outputs = with_pending_history(spark, shape_outputs(state), args.output, params)
    _phase(spark, "write")
    from connectors.delta import open_output

    facts = run_facts(open_output(spark, args.output), inputs.identity)
    write_outputs(
        spark,
        outputs,
        params.run_id,
        args.output,
        config.include_body,
        started,
        progress,
        facts,
        writer_choice=config.writer,
        catalog_schema=config.catalog_schema,
    )
    # One row per queue and topic.
    offset_rows = [row.asDict() for row in outputs.consume_offsets.collect()]
    write_offset_fragments(offset_rows, args.output)
    summary_rows = [
        {**row.asDict(), **facts} for row in outputs.run_summary.collect()
    ]  # one row per queue
    print(format_summary(summary_rows, args.output, params.run_id, params.as_of_ms, offset_rows))
    if bad:
        print(bad_records_line(bad, args.output, params.run_id))
    state.unpersist()
    inputs.unpersist()
    spark.sparkContext.setJobDescription(None)
    progress("done")
    return EXIT_OK


def with_pending_history(
    spark: SparkSession, outputs: RoundOutputs, output: str, params: RoundParams
) -> RoundOutputs:
    """Pending rows that carry their first sighting from the output root's earlier runs."""
    from dataclasses import replace

    from jobs.history import earlier_pending
    from transforms.pending_history import carry_pending_since

    earlier = earlier_pending(spark, output, params.run_id, params.as_of_ms)
    if earlier is None:
        return outputs
    return replace(outputs, pending=carry_pending_since(outputs.pending, earlier))


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Command line entry point; returns the exit code (0 done, 1 failure, 2 bad input)."""
    try:
        args = build_parser().parse_args(argv)
        return run(args, spark)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except StrictModeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_FAILED
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(f"error: {exc.code}", file=sys.stderr)
            return EXIT_FAILED
        return int(exc.code or 0)
    except Exception as exc:  # a failure while running: one line, details with --verbose
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {type(exc).__name__}: {first_line}", file=sys.stderr)
        if "--verbose" in (argv or sys.argv):
            raise
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
