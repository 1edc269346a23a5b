"""--strict refuses a T far past a broker's newest half/op record (jobs/run.py
``refuse_far_past_store``): judged on the round's per-queue rows, already on the driver."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession

from connectors.errors import InputError
from jobs.config import load_config
from jobs.run import refuse_far_past_store

T = 1_000_000_000_000
RETENTION_MS = 72 * 3_600_000
CONFIG = load_config(None, {})


def _queues(spark: SparkSession, rows: list[tuple[str, int, int | None]]) -> DataFrame:
    return spark.createDataFrame(rows, "broker STRING, queue_id INT, newest_ms LONG")


def test_a_broker_whose_newest_queue_is_within_the_retention_passes(spark: SparkSession) -> None:
    # Broker a's older queue alone would be refused; its newest queue decides. A queue
    # without a record before T says nothing.
    queues = _queues(
        spark,
        [("a", 0, T - RETENTION_MS - 1), ("a", 1, T - RETENTION_MS), ("b", 0, None)],
    )
    assert CONFIG.file_reserved_hours * 3_600_000 == RETENTION_MS
    refuse_far_past_store(queues, T, CONFIG)


def test_the_broker_past_the_retention_is_named(spark: SparkSession) -> None:
    queues = _queues(spark, [("a", 0, T - 1), ("b", 0, T - RETENTION_MS - 1)])
    with pytest.raises(InputError, match=r"^broker b: T=.* --as-of latest"):
        refuse_far_past_store(queues, T, CONFIG)
