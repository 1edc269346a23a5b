"""Pending across runs (transforms/pending_history.py): which earlier sighting a pending row
inherits, on small inline frames."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import SparkSession

from transforms.pending_history import carry_pending_since, earliest_sightings

# This run's pending rows, as shape_tables writes them (first seen now, at T = 900).
NOW = (
    "broker STRING, queue_id INT, half_offset LONG, uniq_key STRING, status STRING,"
    " first_seen_run_id STRING, pending_since_ms LONG, run_id STRING, as_of_ms LONG"
)
EARLIER = NOW


def _now(rows: list[tuple]) -> list[tuple]:
    return [(*row, "r3", 900, "r3", 900) for row in rows]


def test_a_transaction_pending_earlier_keeps_its_first_sighting(spark: SparkSession) -> None:
    pending = spark.createDataFrame(
        _now(
            [
                ("a", 0, 10, "K1", "check"),  # pending in r2, first seen in r1
                ("a", 0, 11, "K2", "check"),  # pending in r2, written before the columns existed
                ("a", 0, 12, "K3", "too_young"),  # new
                ("b", 0, 10, "K1", "check"),  # same key on another broker: new
                ("a", 1, 5, None, "check"),  # no key: matched by queue and offset
                ("a", 1, 6, None, "check"),  # no key, another offset: new
            ],
        ),
        NOW,
    )
    earlier = spark.createDataFrame(
        [
            ("a", 0, 3, "K1", "check", "r1", 100, "r2", 500),
            ("a", 0, 4, "K2", "check", None, None, "r2", 500),
            ("a", 1, 5, None, "immune", "r2", 500, "r2", 500),
            ("a", 1, 7, None, "check", "r1", 100, "r2", 500),
        ],
        EARLIER,
    )

    out = carry_pending_since(pending, earlier)

    expected = spark.createDataFrame(
        [
            ("a", 0, 10, "K1", "check", "r1", 100, "r3", 900),
            ("a", 0, 11, "K2", "check", "r2", 500, "r3", 900),
            ("a", 0, 12, "K3", "too_young", "r3", 900, "r3", 900),
            ("b", 0, 10, "K1", "check", "r3", 900, "r3", 900),
            ("a", 1, 5, None, "check", "r2", 500, "r3", 900),
            ("a", 1, 6, None, "check", "r3", 900, "r3", 900),
        ],
        NOW,
    )
    assert_df_equality(out, expected, ignore_row_order=True)


def test_no_earlier_rows_leave_the_rows_as_they_are(spark: SparkSession) -> None:
    pending = spark.createDataFrame(_now([("a", 0, 10, "K1", "check")]), NOW)

    out = carry_pending_since(pending, spark.createDataFrame([], EARLIER))

    assert_df_equality(out, pending)


def test_the_earliest_of_several_sightings_wins_whatever_the_order(spark: SparkSession) -> None:
    # The original and a check copy of one transaction, seen first in different runs.
    earlier = spark.createDataFrame(
        [
            ("a", 0, 4, "K1", "check", "r2", 300, "r2", 500),
            ("a", 0, 3, "K1", "check", "r0", 50, "r2", 500),
            ("a", 0, 6, "K2", "check", "rb", 70, "r2", 500),
            ("a", 0, 7, "K2", "check", "ra", 70, "r2", 500),  # same time: smaller run id
        ],
        EARLIER,
    )

    out = earliest_sightings(earlier).selectExpr(
        "broker", "_carried.first_seen_run_id AS run", "_carried.pending_since_ms AS since"
    )

    expected = spark.createDataFrame(
        [("a", "r0", 50), ("a", "ra", 70)], "broker STRING, run STRING, since LONG"
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)
