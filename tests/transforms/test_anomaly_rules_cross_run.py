"""``stalled_offset`` (transforms/anomaly_rules/cross_run.py) on inline frames: this run's
run_summary rows and earlier runs' offsets per queue."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from schemas.outputs import ANOMALY
from tests.transforms.builders import T, params
from transforms.anomaly_rules.cross_run import stalled_offset

SUMMARY_COLUMNS = "broker STRING, queue_id INT, h0 BIGINT, p0 BIGINT, check BIGINT, immune BIGINT, discard_check_max BIGINT, discard_expired BIGINT, too_young BIGINT, not_reached BIGINT"
EARLIER_DDL = "broker STRING, queue_id INT, as_of_ms BIGINT, h0 BIGINT, p0 BIGINT"


def test_stalled_offset_over_the_last_runs(spark: SparkSession) -> None:
    """Half offset 10 in this run and the two runs before (spanning 100 s > 3 x 30 s) with 2
    records pending: stalled. The op offset moved (7 -> 9): not stalled."""
    summary = spark.createDataFrame([("b", 0, 10, 9, 2, 0, 0, 0, 0, 0)], SUMMARY_COLUMNS)
    earlier = spark.createDataFrame(
        [("b", 0, T - 100_000, 10, 7), ("b", 0, T - 50_000, 10, 9)], EARLIER_DDL
    )

    found = stalled_offset(summary, earlier, params())

    detail = (
        "half offset 10 unchanged over the last 3 runs (100000 ms, more than 3 x"
        " check_interval_ms) while 2 records are pending: the broker's round does not move it"
        " (#1568, #9500)"
    )
    expected = spark.createDataFrame(
        [("b", 0, "stalled_offset", "critical", None, None, 10, None, 3.0, 3.0, detail)], ANOMALY
    )
    assert_df_equality(found, expected, ignore_nullable=True)


@pytest.mark.parametrize(
    ("why", "summary_row", "earlier_rows"),
    [
        (
            "nothing pending",
            ("b", 0, 10, 9, 0, 0, 0, 0, 0, 0),
            [(T - 100_000, 10, 9), (T - 50_000, 10, 9)],
        ),
        ("too few runs", ("b", 0, 10, 9, 2, 0, 0, 0, 0, 0), [(T - 100_000, 10, 9)]),
        (
            "span too short",
            ("b", 0, 10, 9, 2, 0, 0, 0, 0, 0),
            [(T - 60_000, 10, 9), (T - 30_000, 10, 9)],
        ),
        (
            "both moved",
            ("b", 0, 10, 9, 2, 0, 0, 0, 0, 0),
            [(T - 100_000, 8, 7), (T - 50_000, 10, 9)],
        ),
    ],
)
def test_stalled_offset_non_cases(
    spark: SparkSession, why: str, summary_row: tuple, earlier_rows: list
) -> None:
    summary = spark.createDataFrame([summary_row], SUMMARY_COLUMNS)
    earlier = spark.createDataFrame([("b", 0, *row) for row in earlier_rows], EARLIER_DDL)
    assert stalled_offset(summary, earlier, params()).count() == 0, why
