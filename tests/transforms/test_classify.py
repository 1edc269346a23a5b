"""The classification predicates of spec section 5 (transforms/classify.py) at their
boundaries, one row per side of each boundary."""

from __future__ import annotations

from chispa import assert_column_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.outputs import CHECK, DISCARD_CHECK_MAX, DISCARD_EXPIRED, IMMUNE, TOO_YOUNG
from tests.transforms.builders import params
from transforms.classify import (
    counter_after,
    effective_immunity_ms,
    is_expired,
    is_immune,
    is_too_young,
    reached_check_max,
    round_class,
)

T = 1_000_000_000_000
PARAMS = params(
    as_of_ms=T, run_id="r", check_max=15, transaction_timeout_ms=6_000, file_reserved_hours=72
)
RESERVED = 72 * 3_600_000
MAX_IMMUNITY_S = (2**63 - 1) // 1000
COLUMNS = "check_times INT, age BIGINT, immunity_raw STRING, immunity_ms BIGINT, expected "


def _records(spark: SparkSession, rows: list[tuple], expected_type: str) -> DataFrame:
    """Half records born ``age`` ms before T."""
    frame = spark.createDataFrame(rows, COLUMNS + expected_type)
    return frame.withColumn("born_timestamp_ms", F.lit(T) - F.col("age"))


def test_reached_check_max_from_the_maximum_on(spark: SparkSession) -> None:
    rows = [(14, 0, None, None, False), (15, 0, None, None, True), (None, 0, None, None, False)]
    frame = _records(spark, rows, "BOOLEAN").withColumn("got", reached_check_max(PARAMS))
    assert_column_equality(frame, "got", "expected")


def test_is_expired_only_beyond_the_reserved_time(spark: SparkSession) -> None:
    rows = [(None, RESERVED, None, None, False), (None, RESERVED + 1, None, None, True)]
    frame = _records(spark, rows, "BOOLEAN").withColumn("got", is_expired(PARAMS))
    assert_column_equality(frame, "got", "expected")


def test_is_immune_while_younger_than_its_immunity(spark: SparkSession) -> None:
    rows = [
        (None, 59_999, "60", 60_000, True),
        (None, 60_000, "60", 60_000, False),
        (None, 10, None, 6_000, False),  # no property: too young or check, never immune
    ]
    frame = _records(spark, rows, "BOOLEAN").withColumn("got", is_immune(PARAMS))
    assert_column_equality(frame, "got", "expected")


def test_is_too_young_within_the_timeout_and_not_in_the_future(spark: SparkSession) -> None:
    rows = [
        (None, -1, None, None, False),  # born in the future: checked (the broker's age <= -1)
        (None, 0, None, None, True),
        (None, 5_999, None, None, True),
        (None, 6_000, None, None, False),
        (None, 0, "60", 60_000, False),  # with the property it is immunity that decides
    ]
    frame = _records(spark, rows, "BOOLEAN").withColumn("got", is_too_young(PARAMS))
    assert_column_equality(frame, "got", "expected")


def test_effective_immunity_falls_back_to_the_timeout(spark: SparkSession) -> None:
    rows = [
        (None, 0, "60", None, 60_000),
        (None, 0, "0", None, 0),  # no lower bound
        (None, 0, "-1", None, 6_000),  # the broker's "not set"
        (None, 0, "abc", None, 6_000),
        (None, 0, None, None, 6_000),
        (None, 0, str(MAX_IMMUNITY_S), None, MAX_IMMUNITY_S * 1000),
        (None, 0, str(MAX_IMMUNITY_S + 1), None, 6_000),  # x 1000 would overflow
    ]
    frame = _records(spark, rows, "BIGINT").withColumn("got", effective_immunity_ms(PARAMS))
    assert_column_equality(frame, "got", "expected")


def test_round_class_takes_the_first_class_that_applies(spark: SparkSession) -> None:
    rows = [
        (15, RESERVED + 1, None, 6_000, DISCARD_CHECK_MAX),  # also expired: check_max first
        (3, RESERVED + 1, "60", 60_000, DISCARD_EXPIRED),
        (3, 10, "60", 60_000, IMMUNE),
        (3, 10, None, 6_000, TOO_YOUNG),
        (3, 6_000, None, 6_000, CHECK),
    ]
    frame = _records(spark, rows, "STRING").withColumn("got", round_class(PARAMS))
    assert_column_equality(frame, "got", "expected")


def test_counter_after_counts_put_backs_and_expiry_only(spark: SparkSession) -> None:
    rows = [
        (CHECK, None, 1),
        (IMMUNE, 4, 5),
        (DISCARD_EXPIRED, 2, 3),
        (DISCARD_CHECK_MAX, 15, 15),
        (TOO_YOUNG, None, None),
    ]
    frame = spark.createDataFrame(rows, "status STRING, check_times INT, expected INT")
    frame = frame.withColumn("got", counter_after(F.col("status")))
    assert_column_equality(frame, "got", "expected")
