"""Final discard_history rows (transforms/discard_final.py): a row an earlier run decided
``committed``, ``rolled_back`` or ``ended`` is kept as it was, only for the same discard
record and an earlier T; the other rows are decided again, from their evidence alone."""

from __future__ import annotations

from typing import Any

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from schemas.outputs import DISCARD_HISTORY
from tests.transforms.builders import RUN_ID, T, params
from tests.transforms.test_discard_history import _evidence, _history
from transforms.discard_final import final_rows, kept_rows, open_evidence, still_open
from transforms.discard_history import DISCARD_KEY, discard_history

EARLIER_RUN = "r0"
# What the earlier run saw that this one cannot (broker c's commit: its evidence is gone
# now, so this run alone would say `unknown`), and two final rows that are not this run's
# to keep: b/0 was another record at the same offset, b/11 was decided at a later T (this
# run is a backfill).
EARLIER_OUTCOMES = {("c", 0): "committed", ("b", 0): "committed", ("b", 11): "rolled_back"}
KEPT = {("b", 2), ("b", 3), ("b", 4), ("b", 10), ("c", 0)}


def _earlier(spark: SparkSession, first_look: list[dict[str, Any]]) -> DataFrame:
    """The worked case's rows (``first_look``) as the earlier run at T - 60 s wrote them."""
    rows = []
    for row in first_look:
        key = (row["broker"], row["discard_offset"])
        rows.append(
            {
                **row,
                "outcome": EARLIER_OUTCOMES.get(key, row["outcome"]),
                "offset_msg_id": "0A0000FF" if key == ("b", 0) else row["offset_msg_id"],
                "as_of_ms": T + 1 if key == ("b", 11) else T - 60_000,
                "run_id": EARLIER_RUN,
                "first_seen_run_id": EARLIER_RUN,
            }
        )
    return spark.createDataFrame([tuple(r.values()) for r in rows], DISCARD_HISTORY)


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


def test_a_kept_row_is_as_written_and_the_others_are_decided_from_their_evidence_alone(
    spark: SparkSession,
) -> None:
    first_look = [row.asDict(recursive=True) for row in _history(spark).collect()]
    earlier = _earlier(spark, first_look)
    evidence = _evidence(spark)
    kept = kept_rows(evidence.rows, final_rows(earlier, T))
    opened = open_evidence(evidence, kept)

    # The open evidence: the other rows, and only their transactions' half records.
    open_keys = {tuple(r) for r in opened.rows.select(*DISCARD_KEY).collect()}
    assert open_keys == {(r["broker"], r["discard_offset"]) for r in first_look} - KEPT
    linked = {tuple(r) for r in opened.linked.select(*DISCARD_KEY).distinct().collect()}
    assert linked and linked <= open_keys
    assert_df_equality(
        still_open(evidence.rows, kept), opened.rows, ignore_row_order=True, ignore_nullable=True
    )

    # The rows: the kept ones as the earlier run wrote them, every column; the others as a
    # first look decides them (b/0 and b/11 too: not theirs to keep), with this run's id.
    earlier_rows = {
        (r["broker"], r["discard_offset"]): r.asDict(recursive=True) for r in earlier.collect()
    }
    expected = [
        earlier_rows[key] if key in KEPT else row
        for row in first_look
        for key in [(row["broker"], row["discard_offset"])]
    ]
    assert {r["run_id"] for r in expected if (r["broker"], r["discard_offset"]) not in KEPT} == {
        RUN_ID
    }
    assert_df_equality(
        discard_history(opened, params(), kept),
        spark.createDataFrame([tuple(r.values()) for r in expected], DISCARD_HISTORY),
        ignore_row_order=True,
        ignore_nullable=True,
    )
