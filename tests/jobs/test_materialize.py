"""The job's materializer (jobs/materialize.py): the one place that caches, collects
per-queue frames and chooses broadcast or shuffle for the round."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from jobs.materialize import DriverRowsError, SparkMaterializer
from tests.spark_cache import holds_cached_frames

QUEUES = "broker STRING, queue_id INT, h0 LONG, warnings ARRAY<STRING>"


def test_per_queue_comes_back_as_a_local_relation_with_the_same_rows(spark: SparkSession) -> None:
    queues = (
        spark.createDataFrame([("a", 0, 2**62 + 1, ["w"]), ("a", 1, None, [])], QUEUES)
        .groupBy("broker", "queue_id", "h0", "warnings")
        .count()
    )
    local = SparkMaterializer().per_queue(queues)
    assert "LocalTableScan" in local._jdf.queryExecution().executedPlan().toString()
    assert_df_equality(local, queues, ignore_row_order=True, ignore_nullable=True)


def test_per_queue_refuses_a_frame_larger_than_any_set_of_queues(spark: SparkSession) -> None:
    records = spark.range(11).withColumnRenamed("id", "queue_offset")
    with pytest.raises(DriverRowsError, match="11 rows, more than any set of queues"):
        SparkMaterializer(max_queue_rows=10).per_queue(records)


def test_is_small_compares_the_summed_bounds_with_the_broadcast_limit(
    spark: SparkSession,
) -> None:
    bound = spark.createDataFrame(
        [("a", 0, 3), ("b", 0, 2)], "broker STRING, queue_id INT, rows LONG"
    )
    assert SparkMaterializer(broadcast_rows=5).is_small(bound)
    assert not SparkMaterializer(broadcast_rows=4).is_small(bound)


@pytest.mark.parametrize("limit", [1, 2], ids=["join", "literal"])
def test_attach_gives_the_joins_rows_as_a_literal_up_to_the_limit(
    spark: SparkSession, limit: int
) -> None:
    queues = SparkMaterializer().per_queue(
        spark.createDataFrame([("a", 0, 5, []), ("a", 1, None, [])], QUEUES)
    )
    records = spark.createDataFrame(
        [("a", 0, 1), ("a", 1, 2), ("b", 0, 3)], "broker STRING, queue_id INT, queue_offset LONG"
    )
    got = SparkMaterializer(literal_queues=limit).attach(records, queues, ["h0"])
    plan = got._jdf.queryExecution().optimizedPlan().toString()
    # Two queues: over a limit of 1 the values are joined, within 2 looked up.
    assert ("Join" in plan) == (limit == 1)
    expected = spark.createDataFrame(
        [("a", 0, 1, 5), ("a", 1, 2, None)],
        "broker STRING, queue_id INT, queue_offset LONG, h0 LONG",
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_records_cuts_the_lineage_to_one_leaf_and_caches_nothing(spark: SparkSession) -> None:
    spark.catalog.clearCache()
    frame = spark.range(6).selectExpr("id % 3 AS queue_id", "id").groupBy("queue_id").count()
    materializer = SparkMaterializer()
    kept = materializer.records(frame)
    # Later stages start at one leaf: the plan above the cut is not carried along.
    plan = kept._jdf.queryExecution().analyzed().toString()
    assert plan.startswith("LogicalRDD") and len(plan.splitlines()) == 1, plan
    # Nothing is registered with the cache manager: a cache that the cut plan would not
    # read is planning for nothing.
    assert not holds_cached_frames(spark)
    assert_df_equality(kept, frame, ignore_row_order=True, ignore_nullable=True)
    materializer.release()
    assert_df_equality(kept, frame, ignore_row_order=True, ignore_nullable=True)


def _cache_filled(spark: SparkSession, frame: DataFrame) -> bool:
    cached = spark._jsparkSession.sharedState().cacheManager().lookupCachedData(frame._jdf)
    return (
        cached.isDefined()
        and cached.get().cachedRepresentation().cacheBuilder().isCachedColumnBuffersLoaded()
    )


def test_kept_frames_are_read_from_their_cache_until_released(spark: SparkSession) -> None:
    spark.catalog.clearCache()
    frame = spark.range(30).filter("id % 7 = 0")
    materializer = SparkMaterializer()
    kept = materializer.kept(frame)
    # A stage built on the kept frame afterwards plans a read of the cache, and reading it
    # fills the cache: later readers do not filter every row again.
    reader = kept.selectExpr("id + 1 AS next")
    assert "InMemoryRelation" in reader._jdf.queryExecution().withCachedData().toString()
    assert not _cache_filled(spark, kept)
    assert sorted(row.next for row in reader.collect()) == [1, 8, 15, 22, 29]
    assert _cache_filled(spark, kept)
    materializer.release()
    assert not holds_cached_frames(spark)


def test_a_projection_of_cached_records_is_not_cached_again(spark: SparkSession) -> None:
    records = spark.range(10).withColumnRenamed("id", "queue_offset").persist()
    try:
        narrow = records.filter("queue_offset > 2").selectExpr("queue_offset * 2 AS doubled")
        assert SparkMaterializer().records(narrow) is narrow
        assert not narrow.is_cached
        aggregated = narrow.groupBy().count()
        materializer = SparkMaterializer()
        kept = materializer.records(aggregated)
        assert kept is not aggregated
        # A projection of a kept frame reads the same cut: not cut a second time.
        projected = kept.selectExpr("count + 1 AS more")
        assert materializer.records(projected) is projected
        materializer.release()
    finally:
        records.unpersist()


def test_a_union_left_with_one_branch_is_narrow_and_two_branches_are_not(
    spark: SparkSession,
) -> None:
    # The store reader's records when every offset is unique: the duplicate branch is
    # filtered by a constant, which only the optimiser removes (the analysed plan still
    # has the union).
    records = spark.range(10).withColumnRenamed("id", "queue_offset").persist()
    try:
        kept = records.filter("true").unionByName(records.filter("false"))
        assert SparkMaterializer().records(kept) is kept
        both = records.filter("queue_offset > 2").unionByName(records.filter("queue_offset < 1"))
        materializer = SparkMaterializer()
        assert materializer.records(both) is not both
        materializer.release()
    finally:
        records.unpersist()
