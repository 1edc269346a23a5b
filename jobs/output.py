"""The job's I/O side: the Delta tables of one run (offsets last), the run-time columns of
``run_summary``, the consumerOffset.json fragments and the lines printed at the end.

The tables' writers (delta-rs, delta-spark) live in ``connectors/delta_*``; this module
decides what is written and in which order. ``connectors.delta`` is imported where it is
used: it loads deltalake, which the Python workers (``jobs.session.WORKER_MODULES``) do not
need.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypedDict

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets
from jobs.anomalies import KindCount, anomaly_lines
from jobs.attention import attention_lines, settings_line
from jobs.offsets import (
    FRAGMENT_AFTER,
    FRAGMENT_COMMITTED,
    FRAGMENT_SAFE,
    write_fragment_facts,
)
from schemas.messages import HALF_TOPIC
from schemas.outputs import CLASSES, CONSUME_OFFSETS_TABLE, RUN_SUMMARY_TABLE, table_schema
from transforms.round import RoundOutputs

Progress = Callable[[str], None]
# Called with a table's name right after its commit (tests stop a run there: the fault tests
# of tests/robustness pass one; the command line passes none).
AfterCommit = Callable[[str], None]


class RunFacts(TypedDict):
    """What run_summary records beside the round's settings."""

    inputs: list[str]
    writer: str
    job_version: str


def with_run_time_columns(summary: DataFrame, facts: RunFacts, started: float) -> DataFrame:
    """``run_summary`` with the columns only the writer knows: inputs, writer, job version,
    when it was written and how long the run took until then."""
    now = int(time.time() * 1000)
    return summary.withColumns(
        {
            "inputs": F.array(*[F.lit(i) for i in facts["inputs"]]).cast("array<string>"),
            "writer": F.lit(facts["writer"]),
            "job_version": F.lit(facts["job_version"]),
            "written_at_ms": F.lit(now),
            "duration_ms": F.lit(now - int(started * 1000)),
        }
    )


def fit_to_cores(frame: DataFrame) -> DataFrame:
    """``frame`` in at most as many partitions as the session has cores, without a shuffle.

    A table's frame has the partitions of whatever it was last computed from: a union of
    the anomaly rules or of the bad records' sources has one per input partition (14 for
    the ``make run`` sample's four anomaly rows), and every partition is a write task that
    deserialises the Hadoop configuration and writes a file, most of them empty. The
    cores bound the tasks that run at once anyway; on a cluster they are all its
    executors' cores, so a big table is still written by every executor."""
    return frame.coalesce(frame.sparkSession.sparkContext.defaultParallelism)


def write_outputs(
    spark: SparkSession,
    outputs: RoundOutputs,
    run_id: str,
    output_root: str,
    include_body: bool,
    started: float,
    progress: Progress,
    facts: RunFacts | None = None,
    writer_choice: str = "auto",
    catalog_schema: str = "",
    after_commit: AfterCommit | None = None,
) -> dict[str, int]:
    """Create the tables if absent, replace this run's rows in each; offsets last.
    ``facts`` (``run_facts``: inputs, writer, job version) are recorded in run_summary;
    ``after_commit`` is called with each table's name once it is committed."""
    from connectors.delta import MERGED_TABLES, open_output, register_tables

    writer = open_output(spark, output_root, writer_choice)
    progress(f"writing through {type(writer).__name__}")
    facts = facts or run_facts(writer, ())
    counts: dict[str, int] = {}
    for name in outputs.tables():
        writer.ensure_table(name, table_schema(name, include_body))
    for name, frame in outputs.tables().items():
        schema = table_schema(name, include_body)
        if name == RUN_SUMMARY_TABLE:
            frame = with_run_time_columns(frame, facts, started)
        frame = fit_to_cores(frame)
        if name == CONSUME_OFFSETS_TABLE:
            counts[name] = writer.merge_offsets(frame, schema)
        elif name in MERGED_TABLES:  # discard_history: merged on its key, not per run
            counts[name] = writer.merge_rows(name, frame, schema)
        else:
            counts[name] = writer.replace_run(name, frame, schema, run_id)
        progress(f"wrote {name}: {counts[name]} rows")
        if after_commit is not None:
            after_commit(name)
    if catalog_schema:
        names = register_tables(spark, output_root, catalog_schema, list(outputs.tables()))
        progress(f"registered {', '.join(names)}")
    return counts


def run_facts(writer: object, inputs: Sequence[str]) -> RunFacts:
    """What run_summary records beside the round's settings: the inputs, the writer
    (``delta-rs`` or ``delta-spark``) and the job's version."""
    name = str(getattr(writer, "name", type(writer).__name__))
    return {"inputs": list(inputs), "writer": name, "job_version": job_version()}


def job_version() -> str:
    """The installed package's version; a spark-submit zip is not installed: ``unknown``."""
    try:
        return version("rmq-txn-reconcile")
    except PackageNotFoundError:
        return "unknown"


def write_offset_fragments(
    offset_rows: list[dict[str, Any]],
    output_root: str,
    run_id: str = "",
    stores: Mapping[str, Path] | None = None,
) -> list[Path]:
    """Per broker, in the broker's own format: ``consumerOffset.safe.json`` (offset_safe),
    ``consumerOffset.after.json`` (offset_after, never installed) and
    ``consumerOffset.committed.json`` (offset_committed: what ``jobs.offsets install``
    checks the target against); and ``fragment.json``, whose they are (the broker, the run,
    marks of its store from ``stores``, broker -> store root). A held queue's offsets are
    null, so it is in no installable fragment. Every file is written again, so that an
    earlier run's fragment never stays beside this run's."""
    files = {"offset_after": FRAGMENT_AFTER, "offset_safe": FRAGMENT_SAFE}
    files["offset_committed"] = FRAGMENT_COMMITTED
    by_broker: dict[str, dict[str, dict[str, dict[int, int]]]] = {}
    for row in offset_rows:
        key = HALF_KEY if row["topic"] == HALF_TOPIC else OP_KEY
        tables = by_broker.setdefault(row["broker"], {column: {} for column in files})
        for column in files:
            if row[column] is not None:  # missing key, or a held queue
                tables[column].setdefault(key, {})[row["queue_id"]] = row[column]
    written = []
    for broker, tables in sorted(by_broker.items()):
        folder = Path(output_root) / "offset_fragments" / broker
        for column, name in files.items():
            write_consumer_offsets(folder / name, tables[column])
        store = (stores or {}).get(broker)
        write_fragment_facts(folder, broker, run_id, store, tables["offset_committed"])
        written.append(folder)
    return written


def _queue_lines(row: Mapping[str, Any]) -> list[str]:
    """One queue's lines of the printed summary: class counts and offsets (its warnings
    and a hold come first, among what needs attention)."""
    classes = "  ".join(f"{name}={row[name]}" for name in CLASSES)
    lines = [
        f"  {row['broker']} queue {row['queue_id']}: {classes}  bad_records={row['bad_records']}"
    ]
    if row.get("offset_hold"):
        lines.append("    offsets held (see above): nothing to install")
    elif row["h0"] is not None:
        lines.append(
            f"    half offset {row['h0']} -> {row['h1']} (safe {row['h_safe']});"
            f" op offset {row['p0']} -> {row['p1']} (safe {row['p_safe']})"
        )
    return lines


def format_summary(
    summary_rows: list[dict[str, Any]],
    output_root: str,
    run_id: str,
    as_of_ms: int,
    offset_rows: Sequence[dict[str, Any]] = (),
    anomaly_counts: Sequence[KindCount] | None = None,
    run_notes: Sequence[str] = (),
) -> str:
    """The summary a run prints: T, settings, what needs attention first (``run_notes``
    first, e.g. how T was chosen), each queue, and where the tables and offset fragments
    are."""
    when = datetime.fromtimestamp(as_of_ms / 1000).astimezone().isoformat(timespec="milliseconds")
    lines = [f"run {run_id}  as of {as_of_ms} ({when})", settings_line(summary_rows)]
    lines.append("needs attention first:")
    attention = attention_lines(summary_rows, offset_rows, output_root, run_notes)
    lines += [f"  {line}" for line in attention]
    if anomaly_counts is not None:  # one line per anomaly kind found
        lines += anomaly_lines(anomaly_counts)
    lines.append("per queue:")
    for row in sorted(
        summary_rows,
        key=lambda r: (r["broker"], r["queue_id"] if r["queue_id"] is not None else -1),
    ):
        lines += _queue_lines(row)
    lines.append(
        f"tables: {Path(output_root).resolve()}/<check_requests|discards|pending|consume_offsets|run_summary|bad_records|discard_history|anomalies>"
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
