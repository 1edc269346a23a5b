"""Record-level building blocks (transforms/messages.py): the offset message id and the
marking of duplicate records, on small inline frames."""

from __future__ import annotations

from chispa import assert_column_equality, assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from schemas.messages import LEAN_MESSAGE, SOURCED_MESSAGE
from transforms.messages import as_lean, mark_duplicates, offset_msg_id

PORT_AND_OFFSET_255 = "00002A9F" + "00000000000000FF"  # port 10911, commit-log offset 255


def test_offset_msg_id_is_address_port_and_offset_in_hex(spark: SparkSession) -> None:
    rows = [
        ("10.0.0.1:10911", 255, "0A000001" + PORT_AND_OFFSET_255),
        ("[::1]:10911", 255, "0" * 31 + "1" + PORT_AND_OFFSET_255),
        ("[fe80::1:2]:10911", 255, "FE80" + "0" * 20 + "00010002" + PORT_AND_OFFSET_255),
        ("10.0.0.256:10911", 255, None),  # not an address
        ("broker-a:10911", 255, None),  # a name, not an address
        ("10.0.0.1", 255, None),  # no port
        ("10.0.0.1:99999999999", 255, None),  # port beyond int32
        ("10.0.0.1:10911", None, None),
        (None, 255, None),
    ]
    frame = spark.createDataFrame(rows, "host STRING, offset BIGINT, expected STRING")
    frame = frame.withColumn("got", offset_msg_id(F.col("host"), F.col("offset")))
    assert_column_equality(frame, "got", "expected")


def test_as_lean_gives_the_round_its_property_columns_and_drops_the_rest(
    spark: SparkSession,
) -> None:
    """Exported records (with the properties map) in the store reader's lean contract: a
    property becomes its column, an empty or absent one is null."""
    record = dict.fromkeys(SOURCED_MESSAGE.fieldNames())
    record.update(
        broker="b",
        topic="RMQ_SYS_TRANS_HALF_TOPIC",
        queue_offset=7,
        properties={"UNIQ_KEY": "K7", "PGROUP": "", "KEYS": "order-7", "OTHER": "x"},
        source="half.parquet",
        position=3,
    )
    got = as_lean(spark.createDataFrame([record], SOURCED_MESSAGE))
    expected_row = dict.fromkeys(LEAN_MESSAGE.fieldNames())
    expected_row.update(
        broker="b",
        topic="RMQ_SYS_TRANS_HALF_TOPIC",
        queue_offset=7,
        source="half.parquet",
        position=3,
        uniq_key="K7",
        keys_raw="order-7",
    )
    assert_df_equality(got, spark.createDataFrame([expected_row], LEAN_MESSAGE))


RECORDS = "broker STRING, topic STRING, queue_id INT, queue_offset BIGINT, commitlog_offset BIGINT, source STRING, position BIGINT"
MARKED = RECORDS + ", duplicate_of BIGINT"


def test_mark_duplicates_keeps_the_smallest_commit_log_offset(spark: SparkSession) -> None:
    records = spark.createDataFrame(
        [
            ("b", "H", 0, 5, 900, "f1", 0),
            ("b", "H", 0, 5, 400, "f2", 0),  # the same queue offset stored twice: this one wins
            ("b", "H", 0, 6, 950, "f1", 50),
            ("b", "H", 1, 5, 960, "f1", 60),  # another queue: not a duplicate
        ],
        RECORDS,
    )
    expected = spark.createDataFrame(
        [
            ("b", "H", 0, 5, 900, "f1", 0, 400),
            ("b", "H", 0, 5, 400, "f2", 0, None),
            ("b", "H", 0, 6, 950, "f1", 50, None),
            ("b", "H", 1, 5, 960, "f1", 60, None),
        ],
        MARKED,
    )
    got = mark_duplicates(records).select(*expected.columns)
    assert_df_equality(got, expected, ignore_row_order=True)


def test_mark_duplicates_breaks_ties_by_source_then_keeps_one_identical_copy(
    spark: SparkSession,
) -> None:
    records = spark.createDataFrame(
        [
            ("b", "H", 0, 5, 400, "f2", 0),
            ("b", "H", 0, 5, 400, "f1", 0),  # same commit-log offset: the smaller source wins
            ("b", "H", 0, 7, 500, "f1", 9),
            ("b", "H", 0, 7, 500, "f1", 9),  # byte-identical copies: exactly one is used
        ],
        RECORDS,
    )
    got = mark_duplicates(records).select("queue_offset", "source", "duplicate_of")
    expected = spark.createDataFrame(
        [(5, "f2", 400), (5, "f1", None), (7, "f1", 500), (7, "f1", None)],
        "queue_offset BIGINT, source STRING, duplicate_of BIGINT",
    )
    assert_df_equality(got, expected, ignore_row_order=True)


def test_records_unique_by_construction_skip_the_check(spark: SparkSession) -> None:
    records = spark.createDataFrame(
        [
            ("b", "H", 0, 5, 900, "f1", 0, True),
            ("b", "H", 0, 5, 400, "f2", 0, False),
            ("b", "H", 0, 6, 950, "f1", 50, None),  # null counts as not unique
            ("b", "H", 0, 6, 990, "f1", 90, None),
        ],
        RECORDS + ", unique BOOLEAN",
    )
    got = mark_duplicates(records, F.col("unique")).select("commitlog_offset", "duplicate_of")
    # 900 is trusted, so 400 has no rival among the checked records; 990 loses to 950.
    expected = spark.createDataFrame(
        [(900, None), (400, None), (950, None), (990, 950)],
        "commitlog_offset BIGINT, duplicate_of BIGINT",
    )
    assert_df_equality(got, expected, ignore_row_order=True)
