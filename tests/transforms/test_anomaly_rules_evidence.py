"""What every anomaly rule ends in (transforms/anomaly_rules/evidence.py): the ``ANOMALY``
contract of ``finding`` and the literal structures built as one SQL text each."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from schemas.outputs import ANOMALY
from transforms.anomaly_rules.evidence import finding, sql_array, sql_map


def test_finding_is_the_anomaly_contract_with_the_keys_not_given_null(
    spark: SparkSession,
) -> None:
    frame = spark.createDataFrame(
        [("b", 0, 7, "x"), ("c", 1, 9, "y")],
        "broker STRING, queue_id INT, n INT, note STRING",
    )

    found = finding(
        frame,
        "some_kind",
        F.lit("warning"),
        F.col("n"),  # an int: cast to the contract's double
        F.lit(2),
        F.concat(F.lit("note "), F.col("note")),
        op_offset=F.col("n"),
    )

    expected = spark.createDataFrame(
        [
            ("b", 0, "some_kind", "warning", None, None, None, 7, 7.0, 2.0, "note x"),
            ("c", 1, "some_kind", "warning", None, None, None, 9, 9.0, 2.0, "note y"),
        ],
        ANOMALY,
    )
    assert [(f.name, f.dataType) for f in found.schema.fields] == [
        (f.name, f.dataType) for f in ANOMALY.fields
    ]
    assert_df_equality(found, expected, ignore_row_order=True, ignore_nullable=True)


def test_literal_structures_keep_their_text(spark: SparkSession) -> None:
    """Quotes and backslashes survive the SQL text."""
    texts = ["it's", "back\\slash", "plain"]
    (row,) = (
        spark.range(1)
        .select(
            sql_array(texts).alias("array"),
            sql_map({"k'1": "v'1", "k2": "back\\slash"}).alias("map"),
        )
        .collect()
    )
    assert row["array"] == texts
    assert row["map"] == {"k'1": "v'1", "k2": "back\\slash"}
