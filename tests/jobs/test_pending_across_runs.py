"""Pending across runs, the extract side (jobs/history.py): which earlier run each broker
chains from, and reading that run's pending rows, on small tables written with delta-rs.
The command line's carry-over is asserted in tests/jobs/test_cli.py (run-2 after run-1)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from jobs.history import EarlierRun, earlier_pending, latest_earlier_runs

COLUMNS = (
    "broker",
    "half_offset",
    "uniq_key",
    "first_seen_run_id",
    "pending_since_ms",
    "as_of_ms",
    "run_id",
)


def test_earlier_pending_reads_each_brokers_run_also_from_files_without_the_columns(
    spark: SparkSession, tmp_path: Path
) -> None:
    _summary(tmp_path, [("a", "r1", 100), ("b", "r1", 100), ("a", "r2", 200)])
    # Written before first_seen_run_id / pending_since_ms existed (only the columns read).
    old = pa.table(
        {
            "broker": ["a", "b", "a"],
            "queue_id": pa.array([0, 0, 0], pa.int32()),
            "half_offset": pa.array([1, 1, 2], pa.int64()),
            "uniq_key": ["K1", "K2", None],
            "run_id": ["r1", "r1", "r2"],
            "as_of_ms": pa.array([100, 100, 200], pa.int64()),
        }
    )
    write_deltalake(str(tmp_path / "pending"), old, partition_by=["run_id"])

    earlier = earlier_pending(spark, str(tmp_path), "now", 300)

    rows = sorted(tuple(row) for row in earlier.select(*COLUMNS).collect())
    # a chains from r2 (its K1 row of r1 is not read), b from r1.
    assert rows == [("a", 2, None, None, None, 200, "r2"), ("b", 1, "K2", None, None, 100, "r1")]
    assert earlier_pending(spark, str(tmp_path), "now", 100) is None


def _summary(root: Path, rows: list[tuple[str, str, int]]) -> None:
    broker, run_id, as_of = zip(*rows, strict=True)
    data = pa.table(
        {
            "broker": pa.array(broker),
            "queue_id": pa.array([0] * len(rows), pa.int32()),
            "run_id": pa.array(run_id),
            "as_of_ms": pa.array(as_of, pa.int64()),
        }
    )
    write_deltalake(str(root / "run_summary"), data, partition_by=["run_id"])


def test_each_broker_chains_from_its_latest_run_before_t(tmp_path: Path) -> None:
    _summary(
        tmp_path,
        [
            ("a", "r1", 100),
            ("a", "r2", 200),
            ("b", "r1", 100),  # broker b was not in r2
            ("a", "r3", 300),  # at T: not history for T
            ("a", "r4", 400),  # after T: a backfill of T does not inherit from it
            ("c", "r5", 200),
            ("c", "r0", 200),  # same T: the larger run id, whatever the order
        ],
    )

    assert latest_earlier_runs(str(tmp_path), "now", 300) == [
        EarlierRun("a", "r2", 200),
        EarlierRun("b", "r1", 100),
        EarlierRun("c", "r5", 200),
    ]
    assert latest_earlier_runs(str(tmp_path), "now", 100) == []
    assert latest_earlier_runs(str(tmp_path / "absent"), "now", 300) == []
