"""Per-queue facts merged in one aggregate (transforms/merge.py), on inline frames."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from transforms.merge import Facts, carried, merged

QUEUE = "broker STRING, queue_id INT"


def _parts(spark: SparkSession) -> tuple[Facts, Facts, Facts]:
    queues = spark.createDataFrame(
        [("a", 0, 10, ["w"]), ("a", 1, None, [])], f"{QUEUE}, h0 LONG, notes ARRAY<STRING>"
    )
    offsets = spark.createDataFrame(
        # queue (a, 2) is not in `queues`
        [("a", 0, 12), ("a", 0, 11), ("a", 2, 5)],
        f"{QUEUE}, _offset LONG",
    )
    bad = spark.createDataFrame([("a", 0), ("a", 1), ("a", 1)], QUEUE).withColumn("_bad", F.lit(1))
    return (
        carried(queues),
        Facts(offsets, (F.min("_offset").alias("first"), F.count("_offset").alias("n"))),
        Facts(bad, (F.count("_bad").alias("bad"),)),
    )


def test_merged_with_a_carried_frame_is_a_left_join_of_each_part(spark: SparkSession) -> None:
    out = merged(*_parts(spark))
    expected = spark.createDataFrame(
        # Each part's aggregates see only its own rows: (a, 1) has no offsets, two bad rows.
        [("a", 0, 10, ["w"], 11, 2, 1), ("a", 1, None, [], None, 0, 2)],
        f"{QUEUE}, h0 LONG, notes ARRAY<STRING>, first LONG, n LONG, bad LONG",
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)


def test_merged_outer_keeps_the_queues_of_every_part(spark: SparkSession) -> None:
    out = merged(*_parts(spark), outer=True).select("broker", "queue_id", "h0", "first", "bad")
    expected = spark.createDataFrame(
        [("a", 0, 10, 11, 1), ("a", 1, None, None, 2), ("a", 2, None, 5, 0)],
        f"{QUEUE}, h0 LONG, first LONG, bad LONG",
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)


def test_merged_without_a_carried_frame_is_the_parts_aggregates(spark: SparkSession) -> None:
    _, offsets, _ = _parts(spark)
    expected = spark.createDataFrame(
        [("a", 0, 11, 2), ("a", 2, 5, 1)], f"{QUEUE}, first LONG, n LONG"
    )
    assert_df_equality(merged(offsets), expected, ignore_row_order=True, ignore_nullable=True)
