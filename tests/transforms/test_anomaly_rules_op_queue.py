"""The anomaly rules over the op records from p0 (transforms/anomaly_rules/op_queue.py), each
alone on small inline frames: the op records of one queue with its window attached by
``windowed``."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from schemas.outputs import ANOMALY
from tests.transforms.builders import frame, op, params
from transforms.anomalies import RoundEvidence, windowed
from transforms.anomaly_rules.op_queue import op_backlog, op_queue_gap, op_stall_4_9
from transforms.ops import explode_op_items

QUEUES_DDL = (
    "broker STRING, queue_id INT, h0 BIGINT, h1 BIGINT, p0 BIGINT, p1 BIGINT, p_safe BIGINT"
)


def _evidence(spark: SparkSession, ops: list[dict], queues: DataFrame) -> RoundEvidence:
    op_frame = frame(spark, ops)
    half = frame(spark, [])
    return windowed(RoundEvidence(half, op_frame, explode_op_items(op_frame), half), queues)


def test_op_stall_4_9_at_the_op_offset(spark: SparkSession) -> None:
    """Op 1 has tag x: the round's p1 is 1 on a 4.9 broker (p_safe passes it, 3)."""
    ops = [op(0, "0"), op(1, "1", tag="x"), op(2, "1")]
    queues = spark.createDataFrame([("b", 0, 0, 2, 0, 1, 3)], QUEUES_DDL)
    evidence = _evidence(spark, ops, queues)

    found = op_stall_4_9(evidence, params(broker_version="4.9"))

    detail = (
        "op record at op offset 1 has tag x, not d: a 4.9 broker never marks it done, so its op"
        " offset stays at 1 for good; installing p_safe 3 passes it"
    )
    expected = spark.createDataFrame(
        [("b", 0, "op_stall_4_9", "critical", None, None, None, 1, 1.0, None, detail)], ANOMALY
    )
    assert_df_equality(found, expected, ignore_nullable=True)
    # Non-cases: a 5.x broker marks it done; on 4.9 a d record at p1 (p1 = 2) is no stall.
    assert op_stall_4_9(evidence, params(broker_version="5")).count() == 0
    at_d = spark.createDataFrame([("b", 0, 0, 2, 0, 2, 3)], QUEUES_DDL)
    assert op_stall_4_9(_evidence(spark, ops, at_d), params(broker_version="4.9")).count() == 0


def test_op_stall_4_9_says_when_p_safe_stops_before_it(spark: SparkSession) -> None:
    """Op 0 names half 1, below h1 = 2 (done for p1) but not below h_safe = 0 (half 0 is
    pending): p_safe stops at op 0, before the x record at p1 = 1, and installing it does
    not pass the stall yet."""
    queues = spark.createDataFrame([("b", 0, 0, 2, 0, 1, 0)], QUEUES_DDL)
    evidence = _evidence(spark, [op(0, "1"), op(1, "", tag="x")], queues)

    (found,) = op_stall_4_9(evidence, params(broker_version="4.9")).collect()

    assert (found["op_offset"], found["value"]) == (1, 1.0)
    assert found["detail"] == (
        "op record at op offset 1 has tag x, not d: a 4.9 broker never marks it done, so its op"
        " offset stays at 1 for good; p_safe 0 stops before it (an op record before it names a"
        " half offset the broker has yet to pass), so installing p_safe does not pass it yet"
    )


BACKLOG = (
    "%d op records between op offset 0 and the op queue's end %d name only half offsets"
    " below h1 4: the broker reads them again every round, 1 pulls of 32 (threshold 2)"
)


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (3, [("warning", 3.0, BACKLOG % (3, 4))]),
        (21, [("critical", 21.0, BACKLOG % (21, 22))]),  # over 10 x 2
        (2, []),  # at the threshold: none
    ],
)
def test_op_backlog_counts_the_op_records_naming_only_offsets_below_h1(
    spark: SparkSession, count: int, expected: list[tuple]
) -> None:
    """Op 0 names half 5 (at or beyond h1 = 4: it holds p0 back legitimately), then
    ``count`` op records naming half offsets below h1."""
    ops = [op(0, "5,")] + [op(1 + i, f"{i % 3},") for i in range(count)]
    queues = spark.createDataFrame([("b", 0, 0, 4, 0, 0, 0)], QUEUES_DDL)

    found = op_backlog(_evidence(spark, ops, queues), params(op_backlog_records=2))

    rows = [
        ("b", 0, "op_backlog", severity, None, None, None, 0, value, 2.0, detail)
        for severity, value, detail in expected
    ]
    assert_df_equality(found, spark.createDataFrame(rows, ANOMALY), ignore_nullable=True)


GAP = (
    "op offsets %d to %d (%d) are missing inside [p0, end): what they named is unknown, so"
    " half records they resolved look pending (deleted consume-queue files, #2133)"
)


@pytest.mark.parametrize(
    ("offsets", "p0", "gaps"),
    [
        ([0, 1, 4, 6], 0, [(2, 3), (5, 5)]),  # one row per missing range
        ([0, 3], 1, [(1, 2)]),  # the committed op offset itself is missing
        ([0, 2, 3], 2, []),  # a hole below p0 (retention, or consumed) is no gap
    ],
)
def test_op_queue_gap_one_row_per_missing_range(
    spark: SparkSession, offsets: list[int], p0: int, gaps: list[tuple[int, int]]
) -> None:
    ops = [op(offset, f"{offset},") for offset in offsets]
    queues = spark.createDataFrame([("b", 0, 0, 4, p0, p0, p0)], QUEUES_DDL)

    found = op_queue_gap(_evidence(spark, ops, queues))

    rows = [
        (
            "b",
            0,
            "op_queue_gap",
            "critical",
            None,
            None,
            None,
            first,
            float(last - first + 1),
            0.0,
            GAP % (first, last, last - first + 1),
        )
        for first, last in gaps
    ]
    expected = spark.createDataFrame(rows, ANOMALY)
    assert_df_equality(found, expected, ignore_row_order=True, ignore_nullable=True)
