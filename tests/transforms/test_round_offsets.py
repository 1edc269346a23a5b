"""Where a round starts and ends, per queue (transforms/offsets.py): h0/p0, h1, h_safe,
p1/p_safe, each alone on small inline frames."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.messages import COMMITTED_OFFSET, HALF_TOPIC, OP_TOPIC
from tests.transforms.builders import T, params
from transforms.merge import Facts, carried, merged
from transforms.messages import QUEUE_KEY
from transforms.offsets import (
    p1_and_p_safe,
    round_bounds,
    round_starts,
    window_facts,
    window_rows,
    with_h1,
    with_h_safe,
)
from transforms.params import RoundParams

QUEUE = "broker STRING, queue_id INT"
OPS = f"{QUEUE}, queue_offset LONG, tags STRING"
ITEMS = f"{QUEUE}, op_offset LONG, half_offset LONG"
WINDOW = f"{QUEUE}, p0 LONG, op_end LONG, h1 LONG, h_safe LONG"


def op_offsets(
    ops: DataFrame, items: DataFrame, window: DataFrame, round_params: RoundParams
) -> DataFrame:
    """``broker, queue_id, p1, p_safe`` of every queue of ``window``, as the round finds
    them: the op rows joined with the window, then merged per queue (no half records)."""
    window = window.withColumn("h0", F.lit(None).cast("long"))
    no_half = ops.select(*QUEUE_KEY, "queue_offset").limit(0)
    rows = window_rows(no_half, ops, items, window, round_params)
    return merged(carried(window), window_facts(rows)).select(*QUEUE_KEY, *p1_and_p_safe())


def test_round_starts_correct_committed_offsets_to_what_the_queue_holds(
    spark: SparkSession,
) -> None:
    readable = spark.createDataFrame(
        [
            ("b", HALF_TOPIC, 0, 5, T - 10),
            ("b", HALF_TOPIC, 0, 6, T - 5),
            ("b", HALF_TOPIC, 0, 7, T + 5),  # stored after T: not part of the end
            ("b", OP_TOPIC, 0, 0, T - 1),
        ],
        "broker STRING, topic STRING, queue_id INT, queue_offset LONG, store_timestamp_ms LONG",
    )
    committed = spark.createDataFrame(
        [("b", HALF_TOPIC, 0, 2), ("b", OP_TOPIC, 0, 1)], COMMITTED_OFFSET
    )
    out = round_starts(readable, committed, T).select(
        "broker",
        "queue_id",
        "h_committed",
        "h0",
        "half_end",
        "p_committed",
        "p0",
        "op_end",
        "newest_ms",
        "records_read",
    )
    expected = spark.createDataFrame(
        # h0 raised to the smallest offset 5; the newest record before T is the op's; the
        # records read are all four, whatever their store time.
        [("b", 0, 2, 5, 7, 1, 1, 1, T - 1, 4)],
        f"{QUEUE}, h_committed LONG, h0 LONG, half_end LONG, p_committed LONG, p0 LONG,"
        " op_end LONG, newest_ms LONG, records_read LONG",
    )
    assert_df_equality(out, expected, ignore_nullable=True)


def test_the_bounds_of_every_record_are_the_bounds_at_latest(spark: SparkSession) -> None:
    # T = latest is 1 ms after the newest record: every record with a store time is before
    # it, and a record without one never is (the job finds T and the bounds in one pass).
    readable = spark.createDataFrame(
        [
            ("b", HALF_TOPIC, 0, 5, T - 10),
            ("b", HALF_TOPIC, 0, 9, None),
            ("b", OP_TOPIC, 0, 0, T + 7),
            ("c", OP_TOPIC, 1, 3, T - 1),
        ],
        "broker STRING, topic STRING, queue_id INT, queue_offset LONG, store_timestamp_ms LONG",
    )
    committed = spark.createDataFrame(
        [("b", HALF_TOPIC, 0, 2), ("d", OP_TOPIC, 0, 4)], COMMITTED_OFFSET
    )
    every = round_bounds(readable, committed, None)
    latest = T + 8
    assert every.agg(F.max("newest_ms")).collect() == [(latest - 1,)]
    assert_df_equality(
        every,
        round_bounds(readable, committed, latest),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # An earlier T cuts the newest record out: the bounds differ.
    assert every.exceptAll(round_bounds(readable, committed, latest - 1)).count() == 1


def test_h1_is_the_stop_offset_else_the_half_end(spark: SparkSession) -> None:
    starts = spark.createDataFrame(
        [("b", 0, 0, 9), ("b", 1, 0, 4)], f"{QUEUE}, h0 LONG, half_end LONG"
    )
    stops = spark.createDataFrame([("b", 0, 3)], f"{QUEUE}, stop_offset LONG")
    expected = spark.createDataFrame(
        [("b", 0, 0, 9, 3, 3), ("b", 1, 0, 4, None, 4)],
        f"{QUEUE}, h0 LONG, half_end LONG, stop_offset LONG, h1 LONG",
    )
    facts = Facts(stops, (F.min("stop_offset").alias("stop_offset"),))
    assert_df_equality(
        with_h1(starts, facts), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_h_safe_stops_at_the_first_unresolved_record_before_h1(spark: SparkSession) -> None:
    queues = spark.createDataFrame([("b", 0, 8), ("b", 1, 4)], f"{QUEUE}, h1 LONG")
    per_status = spark.createDataFrame(
        [("b", 0, 2, 1)], f"{QUEUE}, check LONG, first_unresolved LONG"
    )
    expected = spark.createDataFrame(
        [("b", 0, 8, 2, 1, 1), ("b", 1, 4, None, None, 4)],
        f"{QUEUE}, h1 LONG, check LONG, first_unresolved LONG, h_safe LONG",
    )
    facts = Facts(
        per_status,
        (F.sum("check").alias("check"), F.min("first_unresolved").alias("first_unresolved")),
    )
    assert_df_equality(
        with_h_safe(queues, facts), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_op_offsets_stop_at_a_gap_or_an_op_record_not_done(spark: SparkSession) -> None:
    window = spark.createDataFrame(
        [
            ("b", 0, 1, 6, 10, 5),  # op 3 names 7: not done with h_safe 5, done with h1 10
            ("b", 1, 0, 4, 10, 10),  # op 2 is missing: a gap
            ("b", 2, 0, 1, 10, 10),  # p0 itself is missing
        ],
        WINDOW,
    )
    ops = spark.createDataFrame(
        [
            ("b", 0, 0, "d"),
            ("b", 0, 1, "d"),
            ("b", 0, 2, "d"),
            ("b", 0, 3, "d"),
            ("b", 0, 4, "d"),
            ("b", 0, 5, "d"),
            ("b", 1, 0, "d"),
            ("b", 1, 1, "d"),
            ("b", 1, 3, "d"),
        ],
        OPS,
    )
    items = spark.createDataFrame(
        [("b", 0, 1, 0), ("b", 0, 3, 7), ("b", 0, 4, 2), ("b", 1, 0, 0), ("b", 1, 1, 1)], ITEMS
    )
    expected = spark.createDataFrame(
        [("b", 0, 6, 3), ("b", 1, 2, 2), ("b", 2, 0, 0)], f"{QUEUE}, p1 LONG, p_safe LONG"
    )
    assert_df_equality(
        op_offsets(ops, items, window, params()),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.mark.parametrize(("version", "p1"), [("5", 2), ("4.9", 1)])
def test_a_4_9_broker_stalls_p1_at_an_op_record_of_another_tag(
    spark: SparkSession, version: str, p1: int
) -> None:
    window = spark.createDataFrame([("b", 0, 0, 2, 10, 10)], WINDOW)
    ops = spark.createDataFrame([("b", 0, 0, "d"), ("b", 0, 1, "other")], OPS)
    items = spark.createDataFrame([("b", 0, 0, 0)], ITEMS)
    expected = spark.createDataFrame([("b", 0, p1, 2)], f"{QUEUE}, p1 LONG, p_safe LONG")
    assert_df_equality(
        op_offsets(ops, items, window, params(broker_version=version)),
        expected,
        ignore_nullable=True,
    )
