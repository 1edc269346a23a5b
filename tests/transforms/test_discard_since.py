"""Open discard rows decided against what arrived since (transforms/discard_since.py): the
rows an earlier run left ``unresolved`` are carried, the evidence keeps only what that run's
view did not hold (and what rows decided in full need), and the rows come out as a full
decision gives them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.decided_view import DecidedView, parse_view, view_text
from schemas.messages import OP_TOPIC
from schemas.outputs import DISCARD_HISTORY
from tests.transforms.builders import BROKER, T, frame, half, op, params
from tests.transforms.test_discard_history import commit, discard
from transforms.anomalies import RoundEvidence
from transforms.discard_history import DISCARD_KEY, DiscardEvidence, discard_history, evidence_from
from transforms.discard_since import (
    carried_keys,
    fresh_floors,
    needed,
    since_evidence,
    unseen_by,
    with_carried,
)
from transforms.messages import is_half, is_op, with_half_fields
from transforms.ops import explode_op_items

S = 1_000
EARLIER_T = T - 30 * S  # the earlier run's T
EARLIER_RUN = "earlier-run"


def _h(offset: int, key: str, stored_age_ms: int = 60 * S) -> dict[str, Any]:
    return half(offset, 2 * 3_600_000, key=key, counter=15, stored_age_ms=stored_age_ms)


# Half records 0..4 (K4's stored last, after commit 0).
HALVES = {key: _h(offset, key) for offset, key in enumerate(["K0", "K1", "K2", "K3"])}
HALVES["K4"] = _h(4, "K4", stored_age_ms=40 * S)
# Op queue 0 of the half queue: op 0 was in the earlier run's view, op 1 arrived since.
OPS = [
    op(0, "4,", stored_age_ms=35 * S),  # ends K4 (discarded after the earlier run)
    op(1, "2,", stored_age_ms=10 * S),  # ends K2, after the earlier run
]
# ORDERS queue 0: commit 0 (of K0) was in the earlier run's view, commit 1 (of K3) arrived
# since.
COMMITS = [
    {**commit(HALVES["K0"], 45 * S), "queue_offset": 0},
    {**commit(HALVES["K3"], 5 * S), "queue_offset": 1},
]
VIEW = DecidedView(EARLIER_RUN, EARLIER_T, {(BROKER, OP_TOPIC, 0): 1, (BROKER, "ORDERS", 0): 1})


def _discards() -> list[dict[str, Any]]:
    """K1, K2 and K3 discarded before the earlier run; K4 discarded after it (its op was
    written before the discard: a resolved transaction discarded, RocketMQ #8311). K0's
    commit names no discarded transaction."""
    early = [
        discard(offset, key, 16, 3_600_000, stored_age_ms=50 * S)
        for offset, key in [(1, "K1"), (2, "K2"), (3, "K3")]
    ]
    return [*early, discard(4, "K4", 16, 3_600_000, stored_age_ms=20 * S)]


def _evidence(spark: SparkSession, as_of_ms: int) -> DiscardEvidence:
    """The evidence at ``as_of_ms`` of every record, as a run then decides it."""
    messages = frame(spark, [*HALVES.values(), *OPS])
    ops = messages.filter(is_op())
    half_fields = with_half_fields(messages.filter(is_half()))
    evidence = RoundEvidence(half_fields, ops, explode_op_items(ops), half_fields)
    pending = spark.createDataFrame([], "broker STRING, uniq_key STRING, store_timestamp_ms LONG")
    readable = [(BROKER, "ORDERS", 0)]
    commits = frame(spark, COMMITS)
    return evidence_from(
        evidence, frame(spark, _discards()), pending, commits, readable, as_of_ms, small=True
    )


def _local(frame_: DataFrame) -> DataFrame:
    """``frame_``'s rows as an inline frame: what a table read back gives (one small leaf,
    not the plan that decided them)."""
    return frame_.sparkSession.createDataFrame(frame_.collect(), frame_.schema)


@pytest.fixture(scope="module")
def earlier(spark: SparkSession) -> DataFrame:
    """What the earlier run wrote: every row unresolved at its T."""
    decided = discard_history(
        _evidence(spark, EARLIER_T), params(as_of_ms=EARLIER_T, run_id=EARLIER_RUN)
    )
    return _local(decided)


def test_the_rows_an_earlier_run_left_unresolved_are_carried(
    spark: SparkSession, earlier: DataFrame
) -> None:
    assert {r["outcome"] for r in earlier.collect()} == {"unresolved"}
    rows = _local(_evidence(spark, T).rows)
    carried = carried_keys(rows, earlier, VIEW, T)
    expected = spark.createDataFrame([(BROKER, 1), (BROKER, 2), (BROKER, 3)], DISCARD_KEY)
    assert_df_equality(carried, expected, ignore_row_order=True, ignore_nullable=True)
    # Another run's view, a view after this T, another record at the same place, or
    # another outcome: decided in full.
    assert carried_keys(rows, earlier, replace(VIEW, run_id="other"), T).count() == 0
    assert carried_keys(rows, earlier, VIEW, EARLIER_T - 1).count() == 0
    moved = earlier.withColumn("discarded_at_ms", F.col("discarded_at_ms") + 1)
    assert carried_keys(rows, moved, VIEW, T).count() == 0
    ended = earlier.withColumn("outcome", F.lit("rolled_back"))
    assert carried_keys(rows, ended, VIEW, T).count() == 0


def test_the_view_did_not_see_other_queues_nor_from_its_ends_nor_from_its_t(
    spark: SparkSession,
) -> None:
    commits = frame(spark, COMMITS).union(
        frame(spark, [{**COMMITS[0], "queue_offset": 0, "queue_id": 1}])  # a queue not in it
    )
    unseen = commits.select(
        "queue_id",
        "queue_offset",
        unseen_by(VIEW, "queue_offset", "store_timestamp_ms").alias("unseen"),
    )
    expected = spark.createDataFrame(
        [(0, 0, False), (0, 1, True), (1, 0, True)],
        "queue_id INT, queue_offset LONG, unseen BOOLEAN",
    )
    assert_df_equality(unseen, expected, ignore_row_order=True, ignore_nullable=True)
    # A record below the end but stored at or after the view's T was not evidence then.
    late = commits.withColumn("store_timestamp_ms", F.lit(EARLIER_T))
    assert late.filter(unseen_by(VIEW, "queue_offset", "store_timestamp_ms")).count() == 3
    # Another broker's record, and one whose place or time is unknown, are unseen too.
    other = commits.withColumn("broker", F.lit("another"))
    assert other.filter(unseen_by(VIEW, "queue_offset", "store_timestamp_ms")).count() == 3
    for column in ("queue_offset", "store_timestamp_ms"):
        nulls = commits.withColumn(column, F.lit(None).cast("long"))
        assert nulls.filter(unseen_by(VIEW, "queue_offset", "store_timestamp_ms")).count() == 3
    assert spark.range(1).select(unseen_by(DecidedView("r", T), "x", "y")).collect() == [(True,)]


def test_what_the_view_saw_is_pushed_into_the_scan_of_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The point of the plain comparisons: the mirror's scan skips the files the view's run
    # read (a NOT over the queues or a coalesce would stay a filter after the scan).
    path = str(tmp_path / "commits")
    frame(spark, COMMITS).drop("broker", "topic").write.parquet(path)
    scanned = spark.read.parquet(path).select(
        F.lit(BROKER).alias("broker"), F.lit("ORDERS").alias("topic"), "*"
    )
    floors = {BROKER: EARLIER_T + 1}
    got = needed(
        scanned, unseen_by(VIEW, "queue_offset", "store_timestamp_ms"), "store_timestamp_ms", floors
    )
    spark.conf.set("spark.sql.maxMetadataStringLength", "1000")  # the scan's filters, whole
    try:
        plan = got._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.unset("spark.sql.maxMetadataStringLength")
    pushed = plan.split("PushedFilters:")[1].split("\n")[0]
    assert "GreaterThanOrEqual(queue_offset,1)" in pushed, pushed
    assert f"GreaterThanOrEqual(store_timestamp_ms,{EARLIER_T + 1})" in pushed, pushed
    assert sorted(r["queue_offset"] for r in got.collect()) == [1]


def test_carried_rows_are_decided_against_what_arrived_since_as_in_full(
    spark: SparkSession, earlier: DataFrame
) -> None:
    full = _evidence(spark, T)
    carried = _local(carried_keys(full.rows, earlier, VIEW, T))
    flagged = replace(full, linked=with_carried(full.linked, carried))
    # K4 is decided in full: what names its half record was stored after it.
    floors = {r["broker"]: r["floor_ms"] for r in fresh_floors(flagged.linked).collect()}
    assert floors == {BROKER: HALVES["K4"]["store_timestamp_ms"]}
    since = since_evidence(flagged, VIEW, floors)
    # What the earlier run saw is left out, but for what K4 may need (op 0).
    assert sorted(r["op_offset"] for r in since.op_items.collect()) == [0, 1]
    assert [r["queue_offset"] for r in since.commits.collect()] == [1]
    rows = discard_history(since, params()).collect()
    decided = spark.createDataFrame(rows, DISCARD_HISTORY)
    expected = discard_history(full, params())
    assert_df_equality(decided, expected, ignore_row_order=True, ignore_nullable=True)
    outcomes = {r["uniq_key"]: r["outcome"] for r in rows}
    assert outcomes == {
        "K1": "unresolved",
        "K2": "rolled_back",
        "K3": "committed",
        "K4": "rolled_back",
    }
    # Without a row decided in full, the seen op is left out too.
    assert [r["op_offset"] for r in since_evidence(flagged, VIEW, {}).op_items.collect()] == [1]


def test_a_view_reads_back_as_written() -> None:
    assert parse_view(view_text(VIEW)) == VIEW
    assert VIEW.without(frozenset({BROKER})).ends == {}
    for text in (None, "", "not json", '{"format": 99}', '{"format": 1}'):
        assert parse_view(text) is None
