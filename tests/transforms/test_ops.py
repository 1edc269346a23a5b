"""Op bodies -> named half offsets (transforms/ops.py), on inline op records."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from transforms.ops import HALF_OFFSET, OP_OFFSET, explode_op_items, largest_item

OPS = "broker STRING, queue_id INT, queue_offset BIGINT, store_timestamp_ms BIGINT, source STRING,"
OPS += " position BIGINT, tags STRING, body BINARY"
ITEMS = "broker STRING, queue_id INT, op_offset BIGINT, op_store_ms BIGINT, source STRING,"
ITEMS += " position BIGINT, item_text STRING, half_offset BIGINT"


def _ops(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            ("b", 0, 0, 1000, "f", 10, "d", bytearray(b"12")),  # 4.9: one offset per record
            ("b", 0, 1, 1001, "f", 20, "d", bytearray(b"7,9,8,")),  # 5.x: a batch, trailing comma
            ("b", 0, 2, 1002, "f", 30, "d", bytearray(b"1,,x,")),  # an empty item is skipped
            ("b", 0, 3, 1003, "f", 40, "d", bytearray(b"\xff5,")),  # invalid UTF-8: unparsable
            ("b", 0, 4, 1004, "f", 50, "x", bytearray(b"3")),  # another tag names nothing
            ("b", 0, 5, 1005, "f", 60, "d", None),
        ],
        OPS,
    )


def test_explode_op_items_reads_both_body_styles_and_keeps_bad_items(
    spark: SparkSession,
) -> None:
    ops = _ops(spark)
    expected = spark.createDataFrame(
        [
            ("b", 0, 0, 1000, "f", 10, "12", 12),
            ("b", 0, 1, 1001, "f", 20, "7", 7),
            ("b", 0, 1, 1001, "f", 20, "9", 9),
            ("b", 0, 1, 1001, "f", 20, "8", 8),
            ("b", 0, 2, 1002, "f", 30, "1", 1),
            ("b", 0, 2, 1002, "f", 30, "x", None),
            ("b", 0, 3, 1003, "f", 40, "\ufffd5", None),
        ],
        ITEMS,
    )
    assert_df_equality(explode_op_items(ops), expected, ignore_row_order=True, ignore_nullable=True)


def test_largest_item_is_the_largest_named_offset_of_each_op_record(spark: SparkSession) -> None:
    """Read from the body without exploding, it agrees with the exploded items' aggregate:
    12, 9 and 1 (x does not parse); null for a record naming nothing (only an unparsable
    item, another tag, no body)."""
    ops = _ops(spark)
    found = ops.select(
        "broker",
        "queue_id",
        F.col("queue_offset").alias("op_offset"),
        largest_item().alias("max_named"),
    )
    expected = spark.createDataFrame(
        [
            ("b", 0, 0, 12),
            ("b", 0, 1, 9),
            ("b", 0, 2, 1),
            ("b", 0, 3, None),
            ("b", 0, 4, None),
            ("b", 0, 5, None),
        ],
        "broker STRING, queue_id INT, op_offset BIGINT, max_named BIGINT",
    )
    assert_df_equality(found, expected, ignore_row_order=True, ignore_nullable=True)
    items = explode_op_items(ops).filter(F.col(HALF_OFFSET).isNotNull())
    aggregated = items.groupBy("broker", "queue_id", OP_OFFSET).agg(
        F.max(HALF_OFFSET).alias("max_named")
    )
    assert_df_equality(
        found.filter(F.col("max_named").isNotNull()),
        aggregated,
        ignore_row_order=True,
        ignore_nullable=True,
    )
