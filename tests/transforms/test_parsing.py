"""Column helpers that parse like Java (transforms/parsing.py), one boundary per row."""

from __future__ import annotations

from chispa import assert_column_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from transforms.parsing import is_unparsable, nonempty, parse_java_int, parse_java_long

LONG_MAX, LONG_MIN = 2**63 - 1, -(2**63)
INT_MAX, INT_MIN = 2**31 - 1, -(2**31)


def test_parse_java_long_accepts_what_long_parse_long_accepts(spark: SparkSession) -> None:
    rows = [
        ("0", 0),
        ("+7", 7),
        ("-7", -7),
        ("007", 7),
        (str(LONG_MAX), LONG_MAX),
        (str(LONG_MIN), LONG_MIN),
        (str(LONG_MAX + 1), None),  # out of range: NumberFormatException
        (str(LONG_MIN - 1), None),
        (" 1", None),  # Java does not trim
        ("1 ", None),
        ("1\n", None),  # `$` alone would accept the trailing newline
        ("1.5", None),
        ("1e3", None),
        ("", None),
        ("-", None),
        ("\u0663", None),  # a non-ASCII digit: the spec accepts ASCII digits only
        (None, None),
    ]
    frame = spark.createDataFrame(rows, "text STRING, expected BIGINT").withColumn(
        "parsed", parse_java_long(F.col("text"))
    )
    assert_column_equality(frame, "parsed", "expected")


def test_parse_java_int_stops_at_the_int_range(spark: SparkSession) -> None:
    rows = [
        (str(INT_MAX), INT_MAX),
        (str(INT_MIN), INT_MIN),
        (str(INT_MAX + 1), None),
        (str(INT_MIN - 1), None),
        ("+0", 0),
        ("12a", None),
        (None, None),
    ]
    frame = spark.createDataFrame(rows, "text STRING, expected INT").withColumn(
        "parsed", parse_java_int(F.col("text"))
    )
    assert_column_equality(frame, "parsed", "expected")


def test_is_unparsable_is_present_but_not_parsed(spark: SparkSession) -> None:
    rows = [("12", False), ("x", True), (None, False)]
    frame = spark.createDataFrame(rows, "raw STRING, expected BOOLEAN").withColumn(
        "unparsable", is_unparsable(F.col("raw"), parse_java_long(F.col("raw")))
    )
    assert_column_equality(frame, "unparsable", "expected")


def test_nonempty_makes_an_empty_value_absent(spark: SparkSession) -> None:
    rows = [("a", "a"), ("", None), (" ", " "), (None, None)]
    frame = spark.createDataFrame(rows, "text STRING, expected STRING").withColumn(
        "value", nonempty(F.col("text"))
    )
    assert_column_equality(frame, "value", "expected")
