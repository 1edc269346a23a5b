"""What earlier runs in the same output root left behind, for the columns that span runs
(pending's ``first_seen_run_id`` / ``pending_since_ms``), for the discard history's
final rows, and the view its last run decided the open rows against (``decided_view``).

Which runs to chain from is decided on ``run_summary`` (a row per queue and run, read in
the driver through delta-rs), and the pending rows of those runs are read by Spark from the
files Delta's log lists for their partitions. Both writers write the same log, so this
reads the tables of either. ``transforms.outputs.shape_tables`` carries the first sightings
over (``transforms.pending_history``).
"""

from __future__ import annotations

from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.delta_commit import PARTITION_COLUMN, absolute_root, commit_value
from connectors.delta_read import arrow_dataset, newest_data_commit
from schemas.decided_view import VIEW_KEY, DecidedView, parse_view
from schemas.outputs import (
    DISCARD_HISTORY,
    DISCARD_HISTORY_TABLE,
    PENDING,
    PENDING_TABLE,
    RUN_SUMMARY_TABLE,
)

# What carry_pending_since reads of an earlier pending row (run_id is the partition column:
# it is in Delta's log, not in the files, and is added per run below).
EARLIER_PENDING_COLUMNS = (
    "broker",
    "queue_id",
    "half_offset",
    "uniq_key",
    "first_seen_run_id",
    "pending_since_ms",
    "as_of_ms",
)


@dataclass(frozen=True)
class EarlierRun:
    """The run a broker's pending rows chain from."""

    broker: str
    run_id: str
    as_of_ms: int


def _open(root: str, table: str) -> DeltaTable | None:
    try:
        return DeltaTable(f"{absolute_root(root)}/{table}")
    except TableNotFoundError:
        return None


def latest_earlier_runs(root: str, run_id: str, as_of_ms: int) -> list[EarlierRun]:
    """Per broker, the latest run before T (by ``as_of_ms``, then run id) other than
    ``run_id``. A run at T or after it is not history for T (a backfill of an older T must
    not inherit from the future), and a rerun of ``run_id`` ignores its own earlier rows."""
    summary = arrow_dataset(f"{absolute_root(root)}/{RUN_SUMMARY_TABLE}")
    if summary is None:
        return []
    rows = summary.to_table(columns=["broker", "run_id", "as_of_ms"]).to_pylist()
    latest: dict[str, tuple[int, str]] = {}
    for row in rows:  # one row per queue and run: the table's size is runs x queues
        if row["run_id"] == run_id or row["as_of_ms"] >= as_of_ms:
            continue
        candidate = (row["as_of_ms"], row["run_id"])
        latest[row["broker"]] = max(latest.get(row["broker"], candidate), candidate)
    return [EarlierRun(broker, rid, at) for broker, (at, rid) in sorted(latest.items())]


def _read_schema() -> T.StructType:
    return T.StructType([PENDING[name] for name in EARLIER_PENDING_COLUMNS])


def earlier_pending(spark: SparkSession, root: str, run_id: str, as_of_ms: int) -> DataFrame | None:
    """The pending rows of each broker's latest earlier run, or None when there is none.

    Files written before ``first_seen_run_id`` / ``pending_since_ms`` existed lack them:
    read with the table's columns, they come back null (carry_pending_since then takes that
    run itself as the first sighting).
    """
    runs = latest_earlier_runs(root, run_id, as_of_ms)
    table = _open(root, PENDING_TABLE) if runs else None
    if table is None:
        return None
    frames = []
    for run in runs:
        uris = table.file_uris(file_pruning_predicate=[(PARTITION_COLUMN, "=", run.run_id)])
        if not uris:
            continue  # that run had nothing pending
        rows = spark.read.schema(_read_schema()).parquet(*uris)
        frames.append(
            rows.filter(F.col("broker") == run.broker).withColumn("run_id", F.lit(run.run_id))
        )
    if not frames:
        return None
    earlier = frames[0]
    for frame in frames[1:]:
        earlier = earlier.unionByName(frame)
    return earlier


def earlier_discard_history(spark: SparkSession, root: str) -> DataFrame | None:
    """The output root's ``discard_history`` rows (None when it has none), read by Spark
    from the files Delta's log lists (the table is one row per discard record, not per
    run). Files written before ``keys``, ``tags`` and ``transaction_id`` existed come back
    null there, as the table reads them."""
    table = _open(root, DISCARD_HISTORY_TABLE)
    uris = table.file_uris() if table is not None else []
    if not uris:
        return None
    return spark.read.schema(DISCARD_HISTORY).parquet(*uris)


def decided_view(root: str) -> DecidedView | None:
    """The view the run that last changed ``discard_history`` decided its rows against
    (``schemas.decided_view``), from that commit's metadata: delta-rs keeps it as a key of
    its own, delta-spark inside its ``userMetadata`` token. None when the commit has none
    (a run without the mirror, another tool's change)."""
    table = _open(root, DISCARD_HISTORY_TABLE)
    newest = newest_data_commit(table) if table is not None else None
    if newest is None:
        return None
    text = commit_value(newest, VIEW_KEY)
    return parse_view(text) if text is not None else None
