"""The job's materializer (jobs/materialize.py): the one place that caches, collects
per-queue frames and chooses broadcast or shuffle for the round."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.materialize import DriverRowsError, SparkMaterializer, collect_together
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


def test_sizes_compare_the_summed_bounds_with_the_limits(spark: SparkSession) -> None:
    bounds = spark.createDataFrame(
        [("a", 0, 3, 4), ("b", 0, 2, 1)], "broker STRING, queue_id INT, from_h0 LONG, below LONG"
    )
    assert SparkMaterializer(broadcast_rows=5).sizes(bounds).small
    assert not SparkMaterializer(broadcast_rows=4).sizes(bounds).small
    assert SparkMaterializer(floor_rows=5).sizes(bounds).floors
    assert not SparkMaterializer(floor_rows=6).sizes(bounds).floors
    # The job's own: only a store with many records below the starts is read from floors.
    assert not SparkMaterializer.for_session(spark).sizes(bounds).floors


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


@pytest.mark.parametrize("limit", [1, 2], ids=["join", "literal"])
def test_floored_gives_the_joins_rows_as_a_literal_up_to_the_limit(
    spark: SparkSession, limit: int
) -> None:
    queues = SparkMaterializer().per_queue(
        spark.createDataFrame([("a", 0, 5, []), ("a", 1, None, [])], QUEUES)
    )
    records = spark.createDataFrame(
        [("a", 0, 4), ("a", 0, 5), ("a", 0, 9), ("a", 1, 2), ("b", 0, 7)],
        "broker STRING, queue_id INT, queue_offset LONG",
    )
    got = SparkMaterializer(literal_queues=limit).floored(records, queues, "h0")
    assert ("Join" in got._jdf.queryExecution().optimizedPlan().toString()) == (limit == 1)
    # From the floor on; a null floor and a queue without a row keep nothing, as a join.
    expected = spark.createDataFrame(
        [("a", 0, 5), ("a", 0, 9)], "broker STRING, queue_id INT, queue_offset LONG"
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_literal_floor_is_pushed_into_the_scan_of_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The point of the literal: the mirror's scan skips the row groups below every floor.
    path = str(tmp_path / "records")
    spark.range(100).selectExpr("0 AS queue_id", "id AS queue_offset").write.parquet(path)
    scanned = spark.read.parquet(path).select(F.lit("a").alias("broker"), "*")
    queues = SparkMaterializer().per_queue(spark.createDataFrame([("a", 0, 90, [])], QUEUES))
    got = SparkMaterializer().floored(scanned, queues, "h0")
    spark.conf.set("spark.sql.maxMetadataStringLength", "1000")  # the scan's filters, whole
    try:
        plan = _plan(got)
    finally:
        spark.conf.unset("spark.sql.maxMetadataStringLength")
    assert "GreaterThanOrEqual(queue_offset,90)" in plan.split("PushedFilters:")[1]
    assert sorted(row["queue_offset"] for row in got.collect()) == list(range(90, 100))


def _plan(frame: DataFrame) -> str:
    """The frame's physical plan as ``explain`` prints it (a public call, also on Connect)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        frame.explain()
    return printed.getvalue()


@pytest.mark.parametrize("hold", ["records", "kept"])
def test_held_frames_are_one_leaf_over_their_rows_and_no_cache(
    spark: SparkSession, hold: str
) -> None:
    spark.catalog.clearCache()
    frame = spark.range(6).selectExpr("id % 3 AS queue_id", "id").groupBy("queue_id").count()
    materializer = SparkMaterializer()
    held = getattr(materializer, hold)(frame)
    # Later stages start at the checkpointed rows: the aggregate is not planned again, and
    # no later plan is compared with a cache entry.
    assert "HashAggregate" in _plan(frame) and "HashAggregate" not in _plan(held)
    assert not holds_cached_frames(spark)
    assert_df_equality(held, frame, ignore_row_order=True, ignore_nullable=True)
    materializer.release()
    assert_df_equality(held, frame, ignore_row_order=True, ignore_nullable=True)


def test_small_frames_come_to_the_driver_together_with_their_own_types(
    spark: SparkSession,
) -> None:
    queues = spark.createDataFrame([("a", 0, 2**62 + 1, ["w"]), ("b", 1, None, [])], QUEUES)
    counts = spark.range(5).selectExpr("id % 2 AS parity").groupBy("parity").count()
    empty = spark.createDataFrame([], "kind STRING, n LONG")
    got = collect_together({"queues": queues, "counts": counts, "empty": empty})
    assert sorted(got["queues"].to_pylist(), key=lambda row: row["broker"]) == [
        {"broker": "a", "queue_id": 0, "h0": 2**62 + 1, "warnings": ["w"]},
        {"broker": "b", "queue_id": 1, "h0": None, "warnings": []},
    ]
    assert sorted(got["counts"].to_pylist(), key=lambda row: row["parity"]) == [
        {"parity": 0, "count": 3},
        {"parity": 1, "count": 2},
    ]
    assert got["empty"].num_rows == 0 and got["empty"].column_names == ["kind", "n"]
    assert str(got["queues"].schema.field("queue_id").type) == "int32"


def test_small_frames_refuse_a_record_level_frame(spark: SparkSession) -> None:
    records = spark.range(25).withColumnRenamed("id", "queue_offset")
    with pytest.raises(DriverRowsError, match="a record-level frame was taken for a small one"):
        collect_together({"records": records, "none": records.limit(0)}, max_rows=10)
