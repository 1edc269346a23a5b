"""``slow_producer`` (transforms/anomaly_rules/producer.py) alone, on inline frames: the
window's half records with their queue's window, the op items naming them and the pending
records."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from schemas.outputs import ANOMALY
from tests.transforms.builders import T, params
from transforms.anomaly_rules.evidence import RoundEvidence
from transforms.anomaly_rules.producer import slow_producer

S = 1_000
HALF_DDL = (
    "broker STRING, queue_id INT, transaction_key STRING, queue_offset BIGINT, h0 BIGINT,"
    " h1 BIGINT, producer_group STRING, born_timestamp_ms BIGINT, store_timestamp_ms BIGINT,"
    " check_times INT, prepared_queue_offset BIGINT"
)
ITEMS_DDL = "broker STRING, queue_id INT, half_offset BIGINT, op_store_ms BIGINT"
PENDING_DDL = "broker STRING, queue_id INT, transaction_key STRING, queue_offset BIGINT"
DETAIL = (
    "producer group PG_SLOW: 1 of 2 transactions (50.0 %) were resolved only after a check"
    " copy existed (threshold 10 %); op store time - born time p50 5000 ms, p99 40000 ms"
    " (5.x op times include up to transactionOpBatchInterval, 3000 ms by default)"
)


def _evidence(spark: SparkSession, prepared: int | None) -> RoundEvidence:
    """Window [1, 3): transaction A (half 0, born 60 s before T, and its copy at 1, counter 1,
    stored 40 s before T, carrying ``prepared``) answered by an op record 20 s before T;
    B (half 2) committed 55 s before T, 5 s after its birth."""
    born = T - 60 * S
    half = spark.createDataFrame(
        [
            ("b", 0, "A", 0, 1, 3, "PG_SLOW", born, born + 1, None, None),
            ("b", 0, "A", 1, 1, 3, "PG_SLOW", born, T - 40 * S, 1, prepared),
            ("b", 0, "B", 2, 1, 3, "PG_SLOW", born, born + 1, None, None),
        ],
        HALF_DDL,
    )
    items = spark.createDataFrame([("b", 0, 2, T - 55 * S), ("b", 0, 1, T - 20 * S)], ITEMS_DDL)
    return RoundEvidence(half, half.limit(0), items, half)


@pytest.mark.parametrize(
    ("why", "prepared", "min_transactions", "expected"),
    [
        ("A resolved only after its check copy", None, 2, [(50.0, DETAIL)]),
        ("A's copy is an immunity copy, not a check copy", 0, 2, []),
        ("fewer transactions than judged", None, 3, []),
    ],
)
def test_slow_producer_share_resolved_after_a_check_copy(
    spark: SparkSession,
    why: str,
    prepared: int | None,
    min_transactions: int,
    expected: list[tuple],
) -> None:
    pending = spark.createDataFrame([], PENDING_DDL)
    round_params = params(slow_producer_min_transactions=min_transactions)

    found = slow_producer(_evidence(spark, prepared), pending, round_params)

    rows = [
        ("b", 0, "slow_producer", "warning", None, "PG_SLOW", None, None, value, 10.0, detail)
        for value, detail in expected
    ]
    assert_df_equality(found, spark.createDataFrame(rows, ANOMALY), ignore_nullable=True)


def test_slow_producer_leaves_out_transactions_still_pending(spark: SparkSession) -> None:
    """With A's copy pending, A is not resolved in this window: B alone, answered in time."""
    pending = spark.createDataFrame([("b", 0, "A", 1)], PENDING_DDL)
    round_params = params(slow_producer_min_transactions=1)

    found = slow_producer(_evidence(spark, None), pending, round_params)

    assert found.count() == 0
