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
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from connectors.connect import default_parallelism
from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets
from jobs.anomalies import KindCount, anomaly_lines, kind_counts
from jobs.attention import attention_lines, settings_line
from jobs.config import JobConfig
from jobs.discards import outcome_counts
from jobs.materialize import collect_together
from jobs.offsets import (
    FRAGMENT_AFTER,
    FRAGMENT_COMMITTED,
    FRAGMENT_SAFE,
    write_fragment_facts,
)
from jobs.pipeline import Reconciled
from schemas.decided_view import view_text
from schemas.messages import HALF_TOPIC
from schemas.outputs import CLASSES, CONSUME_OFFSETS_TABLE, RUN_SUMMARY_TABLE, table_schema
from transforms.outputs import SMALL_TABLES, RoundOutputs, RunFacts

Progress = Callable[[str], None]
# The printout's counts, collected with the small tables (``Written``).
KINDS, OUTCOMES = "anomaly_kinds", "discard_outcomes"
# Called with a table's name right after its commit (tests stop a run there: the fault tests
# of tests/robustness pass one; the command line passes none).
AfterCommit = Callable[[str], None]


@dataclass(frozen=True)
class Written:
    """What a run wrote: rows per table, and the small tables' rows (brought to the driver
    once, then written and printed): ``run_summary``, ``consume_offsets``, the anomaly
    counts (``jobs.anomalies.kind_counts``) and the discard outcomes
    (``jobs.discards.outcome_counts``)."""

    counts: dict[str, int]
    run_summary: list[dict[str, Any]]
    consume_offsets: list[dict[str, Any]]
    kinds: list[dict[str, Any]]
    outcomes: list[dict[str, Any]]


def fit_to_cores(frame: DataFrame) -> DataFrame:
    """``frame`` in at most as many partitions as the session has cores, without a shuffle.

    A table's frame has the partitions of whatever it was last computed from: a union of
    the anomaly rules or of the bad records' sources has one per input partition, and
    every partition is a write task that deserialises the Hadoop configuration and writes
    a file, most of them empty. The cores bound the tasks that run at once anyway; on a
    cluster they are all its executors' cores, so a big table is still written by every
    executor."""
    return frame.coalesce(default_parallelism(frame.sparkSession))


def _small_tables(outputs: RoundOutputs) -> dict[str, pa.Table]:
    """The small tables and the printout's counts, in one Spark action."""
    return collect_together(
        {
            RUN_SUMMARY_TABLE: outputs.run_summary,
            CONSUME_OFFSETS_TABLE: outputs.consume_offsets,
            KINDS: kind_counts(outputs.anomalies),
            OUTCOMES: outcome_counts(outputs.discard_history),
        }
    )


def write_tables(
    spark: SparkSession,
    reconciled: Reconciled,
    output_root: str,
    config: JobConfig,
    started: float,
    progress: Progress,
    after_commit: AfterCommit | None = None,
) -> Written:
    """Shape every table with the run's facts, create the tables if absent and replace this
    run's rows in each (``discard_history`` merged on its key; offsets last). The small
    tables reach the driver together and are committed from there; each record-level
    table is written once by the executors. ``after_commit`` is called with each table's
    name once it is committed."""
    from connectors.delta import MERGED_TABLES, open_output, register_tables

    writer = open_output(spark, output_root, config.writer)
    progress(f"writing through {type(writer).__name__}")
    now_ms = int(time.time() * 1000)
    facts = RunFacts(
        inputs=tuple(reconciled.identity),
        writer=str(getattr(writer, "name", type(writer).__name__)),
        job_version=job_version(),
        written_at_ms=now_ms,
        duration_ms=now_ms - int(started * 1000),
    )
    outputs = reconciled.tables(facts)
    small = _small_tables(outputs)
    run_id = reconciled.params.run_id
    counts: dict[str, int] = {}
    for name in outputs.tables():
        writer.ensure_table(name, table_schema(name, config.include_body))
    for name, frame in outputs.tables().items():
        schema = table_schema(name, config.include_body)
        if name == CONSUME_OFFSETS_TABLE:
            counts[name] = writer.merge_offsets(small[name], schema)
        elif name in SMALL_TABLES:
            counts[name] = writer.replace_run_rows(name, small[name], schema, run_id)
        elif name in MERGED_TABLES:  # discard_history: merged on its key, not per run
            # The commit carries what the rows were decided against (the next run's since).
            view = view_text(reconciled.view) if reconciled.view is not None else None
            counts[name] = writer.merge_rows(name, fit_to_cores(frame), schema, view)
        else:
            counts[name] = writer.replace_run(name, fit_to_cores(frame), schema, run_id)
        progress(f"wrote {name}: {counts[name]} rows")
        if after_commit is not None:
            after_commit(name)
    if config.catalog_schema:
        names = register_tables(spark, output_root, config.catalog_schema, list(outputs.tables()))
        progress(f"registered {', '.join(names)}")
    return Written(
        counts,
        small[RUN_SUMMARY_TABLE].to_pylist(),
        small[CONSUME_OFFSETS_TABLE].to_pylist(),
        small[KINDS].to_pylist(),
        small[OUTCOMES].to_pylist(),
    )


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
