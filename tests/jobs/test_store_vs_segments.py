"""The same records give the same round whether read from a broker store or from exports."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.reconcile import main
from schemas.messages import MESSAGE_COLUMNS
from simulator.simulation import SimConfig, write_store
from tests.robustness.store import read_table

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

COMPARED = {
    "pending": (
        "broker",
        "queue_id",
        "half_offset",
        "uniq_key",
        "status",
        "check_times",
        "immunity_ms",
        "offset_msg_id",
        # The operator columns: the store reader's lean columns give what the properties
        # map of an export gives.
        "keys",
        "tags",
        "transaction_id",
        "born_host",
        "checks_left",
        "discard_at_ms",
        "born_at",
        "stored_at",
    ),
    "check_requests": ("broker", "half_offset", "check_times"),
    "discards": ("broker", "half_offset", "reason", "check_times"),
    "consume_offsets": (
        "broker",
        "topic",
        "queue_id",
        "offset_committed",
        "offset_before",
        "offset_after",
        "offset_safe",
    ),
    "run_summary": (
        "broker",
        "queue_id",
        "h0",
        "h1",
        "h_safe",
        "p0",
        "p1",
        "p_safe",
        "resolved",
        "check",
        "immune",
        "discard_check_max",
        "discard_expired",
        "too_young",
        "not_reached",
        "bad_records",
    ),
}


def rows(root: Path, table: str) -> list[tuple]:
    def value(row: dict, column: str) -> object:
        return tuple(row[column]) if isinstance(row[column], list) else row[column]

    return sorted(
        tuple(value(row, c) for c in COMPARED[table]) for row in read_table(root, table).to_pylist()
    )


def test_store_and_exported_segments_agree(spark: SparkSession, tmp_path: Path) -> None:
    store = tmp_path / "broker-a"
    write_store(
        SimConfig(
            transactions=400,
            seed=11,
            immunity_fraction=0.1,
            never_fraction=0.05,
            commitlog_file_size=256 * 1024,
        ),
        store,
    )
    from_store = tmp_path / "from-store"
    assert (
        main(
            [
                "--store",
                f"broker-a={store}",
                "--as-of",
                "latest",
                "--output",
                str(from_store),
                "--run-id",
                "x",
            ],
            spark=spark,
        )
        == 0
    )

    # Export the decoded half and op records as Parquet, the way an auditor would.
    from connectors.rocketmq.reader import StoreSpec, read_stores

    read = read_stores(spark, [StoreSpec("broker-a", store)])
    messages = read.messages.select(*MESSAGE_COLUMNS)
    half, op = tmp_path / "half", tmp_path / "op"
    messages.filter("topic = 'RMQ_SYS_TRANS_HALF_TOPIC'").write.parquet(str(half))
    messages.filter("topic = 'RMQ_SYS_TRANS_OP_HALF_TOPIC'").write.parquet(str(op))
    read.unpersist()
    from_segments = tmp_path / "from-segments"
    assert (
        main(
            [
                "--half",
                str(half),
                "--op",
                str(op),
                "--offsets",
                str(store / "config" / "consumerOffset.json"),
                "--format",
                "parquet",
                "--broker",
                "broker-a",
                "--as-of",
                "latest",
                "--output",
                str(from_segments),
                "--run-id",
                "x",
            ],
            spark=spark,
        )
        == 0
    )

    pending = rows(from_store, "pending")
    assert pending, "the simulated store should leave some transactions pending"
    columns = COMPARED["pending"]
    # Not vacuous: the simulated producers set KEYS, TAGS and a transaction id on most.
    for column in ("keys", "tags", "transaction_id", "born_host"):
        assert any(row[columns.index(column)] for row in pending), column
    for table in COMPARED:
        assert rows(from_store, table) == rows(from_segments, table), table
