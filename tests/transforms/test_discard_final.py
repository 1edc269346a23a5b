"""Final discard_history rows (transforms/discard_final.py): a row an earlier run decided
``committed``, ``rolled_back`` or ``ended`` is kept as it was, only for the same discard
record and an earlier T; the other rows are decided again, from their evidence alone."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.transforms.builders import RUN_ID, T, params
from tests.transforms.test_discard_history import _evidence, _history
from transforms.discard_final import final_rows, kept_rows, open_evidence, still_open
from transforms.discard_history import DISCARD_KEY, discard_history

EARLIER_RUN = "r0"
ROWS = "broker STRING, discard_offset LONG, outcome STRING, run_id STRING"


def _earlier(spark: SparkSession) -> DataFrame:
    """The worked case's rows as an earlier run at T - 60 s wrote them, with what that run
    saw and this one cannot: broker c's commit (its evidence is gone now, so it decides
    ``unknown``); and two rows that are not this run's to keep: b/0 was another record at
    the same offset, b/11 was decided at a later T (a backfill runs now)."""
    at = F.concat_ws("/", "broker", "discard_offset")
    outcome = (
        F.when(at.isin("c/0", "b/0"), "committed")
        .when(at == "b/11", "rolled_back")
        .otherwise(F.col("outcome"))
    )
    return (
        _history(spark)
        .withColumn("outcome", outcome)
        .withColumn(
            "offset_msg_id", F.when(at == "b/0", "0A0000FF").otherwise(F.col("offset_msg_id"))
        )
        .withColumn("as_of_ms", F.when(at == "b/11", T + 1).otherwise(T - 60_000))
        .withColumn("run_id", F.lit(EARLIER_RUN))
        .withColumn("first_seen_run_id", F.lit(EARLIER_RUN))
    )


def test_final_rows_are_those_decided_for_good_at_or_before_t(spark: SparkSession) -> None:
    earlier = spark.createDataFrame(
        [
            ("b", 0, "committed", T),
            ("b", 1, "rolled_back", T - 1),
            ("b", 2, "ended", T + 1),  # a later T: not this backfill's
            ("b", 3, "unresolved", T - 1),
            ("b", 4, "pending_again", T - 1),
            ("b", 5, "unknown", T - 1),
        ],
        "broker STRING, discard_offset LONG, outcome STRING, as_of_ms LONG",
    )
    assert sorted(r["discard_offset"] for r in final_rows(earlier, T).collect()) == [0, 1]


def test_a_kept_row_is_as_it_was_written_and_the_others_are_decided_again(
    spark: SparkSession,
) -> None:
    evidence = _evidence(spark)
    kept = kept_rows(evidence.rows, final_rows(_earlier(spark), T))
    out = discard_history(open_evidence(evidence, kept), params(), kept)

    decided = _history(spark).select("broker", "discard_offset", "outcome", F.lit(RUN_ID))
    earlier_run = ("b/2", "b/3", "b/4", "b/10", "c/0")  # final then: kept
    at = F.concat_ws("/", "broker", "discard_offset")
    expected = decided.select(
        "broker",
        "discard_offset",
        F.when(at == "c/0", "committed").otherwise(F.col("outcome")).alias("outcome"),
        F.when(at.isin(*earlier_run), EARLIER_RUN).otherwise(RUN_ID).alias("run_id"),
    )
    assert_df_equality(
        out.select("broker", "discard_offset", "outcome", "run_id"),
        spark.createDataFrame(expected.collect(), ROWS),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # A kept row is the earlier run's row, every column.
    assert_df_equality(
        out.filter(F.col("run_id") == EARLIER_RUN),
        _earlier(spark).filter(F.concat_ws("/", "broker", "discard_offset").isin(*earlier_run)),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_the_open_evidence_holds_the_open_rows_and_their_half_records_alone(
    spark: SparkSession,
) -> None:
    evidence = _evidence(spark)
    kept = kept_rows(evidence.rows, final_rows(_earlier(spark), T))
    opened = open_evidence(evidence, kept)
    open_keys = {tuple(r) for r in opened.rows.select(*DISCARD_KEY).collect()}
    kept_keys = {tuple(r) for r in kept.select(*DISCARD_KEY).collect()}
    every_key = {tuple(r) for r in evidence.rows.select(*DISCARD_KEY).collect()}
    assert kept_keys == {("b", 2), ("b", 3), ("b", 4), ("b", 10), ("c", 0)}
    assert open_keys == every_key - kept_keys
    linked = {tuple(r) for r in opened.linked.select(*DISCARD_KEY).distinct().collect()}
    assert linked and linked <= open_keys
    assert_df_equality(
        still_open(evidence.rows, kept), opened.rows, ignore_row_order=True, ignore_nullable=True
    )
