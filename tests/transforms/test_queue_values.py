"""Per-queue values attached to records (transforms/queue_values.py): the literal lookup
gives the rows of the broadcast join, on inline frames."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from transforms.queue_values import joined_values, literal_values, per_broker

QUEUE = "broker STRING, queue_id INT"


@pytest.fixture(scope="module")
def records(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [("a", 0, 1), ("a", 0, 2), ("a", 1, 3), ("b", 0, 4), ("c", 0, 5)],
        f"{QUEUE}, queue_offset LONG",
    )


def test_literal_values_are_the_join(spark: SparkSession, records: DataFrame) -> None:
    # Queue (c, 0) has no row: its record is dropped, as by the inner join; (a, 1) has a
    # null value, kept as null; the extra column is not attached.
    queues = spark.createDataFrame(
        [("a", 0, 10, "x"), ("a", 1, None, "y"), ("b", 0, 30, "z")],
        f"{QUEUE}, h0 LONG, other STRING",
    )
    rows = queues.select("broker", "queue_id", "h0").collect()
    expected = joined_values(records, queues, ["h0"])
    got = literal_values(records, queues, rows, ["h0"])
    assert got.columns == ["broker", "queue_id", "queue_offset", "h0"]
    assert_df_equality(got, expected.select(*got.columns), ignore_row_order=True)
    assert got.count() == 4


def test_literal_values_without_queues_keep_no_record(
    spark: SparkSession, records: DataFrame
) -> None:
    queues = spark.createDataFrame([], f"{QUEUE}, h0 LONG")
    got = literal_values(records, queues, [], ["h0"])
    assert got.columns == ["broker", "queue_id", "queue_offset", "h0"]
    assert got.count() == 0


def test_per_broker_looks_up_each_rows_broker(spark: SparkSession) -> None:
    rows = spark.createDataFrame([("a",), ("b",), ("c",)], "broker STRING")
    out = rows.select(
        "broker",
        per_broker({"a": 1, "b": 2}, "long").alias("value"),
        per_broker({}, "long").alias("none"),
    )
    expected = spark.createDataFrame(
        [("a", 1, None), ("b", 2, None), ("c", None, None)],
        "broker STRING, value LONG, none LONG",
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)
