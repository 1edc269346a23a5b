"""discard_history (transforms/discard_history.py): reason and outcome of each discard
record, on hand-built inline records (one Spark plan for every rule, plus the nearest
non-cases)."""

from __future__ import annotations

from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from schemas.messages import DISCARD_TOPIC
from schemas.outputs import DISCARD_HISTORY
from tests.transforms.builders import BROKER, RUN_ID, STORE_HOST, T, frame, half, op, params
from transforms.anomalies import RoundEvidence
from transforms.anomaly_rules.pending import discarded_without_check
from transforms.discard_history import (
    DISCARD_KEY,
    DiscardEvidence,
    commit_times,
    discard_history,
    discarded_unchecked,
    evidence_from,
)
from transforms.messages import is_half, is_op, with_half_fields
from transforms.ops import explode_op_items

HOUR = 3_600_000
S = 1_000
# Every discard of broker b was stored 10 s before T; ops of b reach back 30 s (coverage).
DISCARDED = 10 * S


def discard(
    offset: int, key: str | None, counter: int | None, born_age: int, **kw: Any
) -> dict[str, Any]:
    """A record of TRANS_CHECK_MAX_TIME_TOPIC queue 0 (a copy of a half record)."""
    row = half(
        offset,
        born_age,
        key=key,
        counter=counter,
        stored_age_ms=kw.pop("stored_age_ms", DISCARDED),
        commitlog=9_000_000 + 1_000 * offset,
        **kw,
    )
    return {**row, "topic": DISCARD_TOPIC}


def commit(of: dict[str, Any], stored_age_ms: int, *, sys_flag: int = 0x8) -> dict[str, Any]:
    """The real message of a commit of half record ``of`` (ORDERS queue 0)."""
    row = half(900 + of["queue_offset"], 1, stored_age_ms=stored_age_ms, broker=of["broker"])
    return {
        **row,
        "topic": "ORDERS",
        "queue_id": 0,
        "sys_flag": sys_flag,
        "commitlog_offset": 20_000_000 + of["queue_offset"],
        "prepared_transaction_offset": of["commitlog_offset"],
    }


def _round(spark: SparkSession, records: list[dict[str, Any]]) -> RoundEvidence:
    """The round's evidence of ``records`` as the round builds it: half records with their
    fields, op records, and the items their bodies name."""
    messages = frame(spark, records)
    ops = messages.filter(is_op())
    half = with_half_fields(messages.filter(is_half()))
    return RoundEvidence(half, ops, explode_op_items(ops), half)


def msg_id(commitlog_offset: int) -> str:
    """RocketMQ's offset message id of a record stored by ``STORE_HOST`` (spec section 2)."""
    ip, port = STORE_HOST.split(":")
    address = "".join(f"{int(part):02X}" for part in ip.split("."))
    return f"{address}{int(port):08X}{commitlog_offset:016X}"


def _h(offset: int, key: str, counter: int | None, stored_age: int, **kw: Any) -> dict[str, Any]:
    return half(offset, 80 * HOUR, key=key, counter=counter, stored_age_ms=stored_age, **kw)


def _scenario() -> dict[str, list[dict[str, Any]]]:
    h3 = _h(3, "K3", 14, 40 * S)
    h10 = _h(10, "K10", 15, 40 * S)
    h11 = _h(11, "K11", 15, 40 * S)
    halves = [
        _h(0, "K0", 15, 40 * S),
        _h(1, "K1", 2, 40 * S),
        _h(2, "K2", 14, 40 * S),
        h3,
        _h(4, "K3", 13, 70 * S),  # older copy: not the latest earlier one
        _h(5, "K4", 15, 40 * S, real_qid=7),
        _h(6, "K4", 14, 5 * S, real_qid=7),  # stored after the discard: not "earlier"
        _h(7, "K7", 0, 5 * S),  # resumed copy, pending now
        _h(8, "K8", 15, 40 * S),
        h10,
        h11,
    ]
    discards = [
        discard(0, "K0", 16, 100 * S),  # counter > max
        discard(1, "K1", 3, 73 * HOUR),  # counter < max
        discard(2, "K2", 15, HOUR),  # = max, within retention
        discard(3, "K3", 15, 80 * HOUR),  # = max, old, latest earlier counter 14
        discard(4, "K4", 15, 80 * HOUR, real_qid=7),  # = max, old, latest earlier 15
        discard(5, "K5", 15, 80 * HOUR),  # = max, old, no half left
        discard(6, None, 16, 100 * S),  # no key
        discard(7, "K7", 16, 100 * S),  # resumed: pending again
        discard(8, "K8", None, 100 * S),  # no counter
        discard(10, "K10", 16, 100 * S),  # committed after the discard
        discard(11, "K11", 16, 100 * S),  # a non-commit record names it
        discard(0, "K9", 16, 100 * S, broker="c"),  # evidence gone on broker c
    ]
    ops = [
        op(0, "2,", stored_age_ms=5 * S),  # ends K2 after the discard
        op(1, "5,", stored_age_ms=30 * S),  # ends K4 before it (oldest op of b)
        op(0, "77,", stored_age_ms=5 * S, broker="c"),  # c's ops start after its discard
    ]
    commits = [commit(h3, 20 * S), commit(h10, 5 * S), commit(h11, 5 * S, sys_flag=0)]
    return {"records": halves + ops, "discards": discards, "commits": commits}


def _evidence(spark: SparkSession, small: bool = False, few: bool = False) -> DiscardEvidence:
    """The worked case's evidence, its joins chosen by ``small`` and ``few``."""
    case = _scenario()
    # K7's resumed copy (stored after the discard) is pending; K8's pending record is the
    # discarded copy itself (stored before the discard: a committed offset that stalled).
    pending = spark.createDataFrame(
        [(BROKER, "K7", T - 5 * S), (BROKER, "K8", T - 40 * S)],
        "broker STRING, uniq_key STRING, store_timestamp_ms LONG",
    )
    readable = [(BROKER, "ORDERS", 0), ("c", "ORDERS", 0)]
    return evidence_from(
        _round(spark, case["records"]),
        frame(spark, case["discards"]),
        pending,
        frame(spark, case["commits"]),
        readable,
        T,
        small=small,
        few=few,
    )


def _history(spark: SparkSession, small: bool = False, few: bool = False) -> DataFrame:
    return discard_history(_evidence(spark, small, few), params())


RULES = (
    "broker STRING, discard_offset LONG, uniq_key STRING, reason STRING, outcome STRING,"
    " ended_before_discard BOOLEAN, resume_futile BOOLEAN, resume_topic STRING,"
    " resume_offset_msg_id STRING"
)


def _resume(offset: int) -> tuple[bool, str, str]:
    return False, DISCARD_TOPIC, msg_id(9_000_000 + 1_000 * offset)


FUTILE = (True, None, None)


@pytest.mark.parametrize(
    ("small", "few"),
    [(False, False), (False, True), (True, True)],
    ids=["merge-joined", "discards-broadcast", "broadcast"],
)
def test_reason_and_outcome_of_each_hand_built_discard(
    spark: SparkSession, small: bool, few: bool
) -> None:
    out = _history(spark, small, few)
    expected = [
        ("b", 0, "K0", "check_max", "unresolved", False, *_resume(0)),
        ("b", 1, "K1", "expired", "unresolved", False, *FUTILE),
        ("b", 2, "K2", "check_max", "rolled_back", False, None, None, None),
        ("b", 3, "K3", "expired", "committed", True, None, None, None),
        ("b", 4, "K4", "check_max", "ended", True, None, None, None),
        ("b", 5, "K5", "undetermined", "unresolved", False, *FUTILE),
        ("b", 6, None, "check_max", "unknown", None, None, None, None),
        ("b", 7, "K7", "check_max", "pending_again", False, None, None, None),
        ("b", 8, "K8", "undetermined", "unresolved", False, *FUTILE),
        ("b", 10, "K10", "check_max", "committed", False, None, None, None),
        ("b", 11, "K11", "check_max", "unresolved", False, *_resume(11)),
        ("c", 0, "K9", "check_max", "unknown", None, None, None, None),
    ]
    assert_df_equality(
        out.select(*spark.createDataFrame([], RULES).columns),
        spark.createDataFrame(expected, RULES),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_rows_have_the_table_schema_and_this_run(spark: SparkSession) -> None:
    out = _history(spark)
    assert [(f.name, f.dataType) for f in out.schema] == [
        (f.name, f.dataType) for f in DISCARD_HISTORY
    ]
    row = out.filter("discard_offset = 3 AND broker = 'b'").first()
    assert row is not None
    assert (row["first_seen_run_id"], row["run_id"], row["as_of_ms"]) == (RUN_ID, RUN_ID, T)
    assert (row["discarded_at_ms"], row["born_timestamp_ms"]) == (T - DISCARDED, T - 80 * HOUR)
    assert (row["check_times"], row["real_topic"], row["producer_group"]) == (
        15,
        "ORDERS",
        "PG_ORDERS",
    )


def test_a_discard_row_is_found_by_the_keys_tags_and_transaction_id_it_carries(
    spark: SparkSession,
) -> None:
    """The discard record carries the half record's properties: ``keys`` is KEYS split on
    spaces (empty items dropped, an empty array without KEYS), ``tags`` the record's tag,
    ``transaction_id`` its ``__transactionId__``, as in the half-row tables."""
    searched = {"KEYS": "ORD-1  ORD-2 ", "__transactionId__": "TX-1"}
    discards = [
        {**discard(0, "K0", 16, 100 * S, extra_properties=searched), "tags": "TagA"},
        discard(1, "K1", 16, 100 * S),
    ]
    pending = spark.createDataFrame([], "broker STRING, uniq_key STRING, store_timestamp_ms LONG")
    queues: list[tuple[str, str, int]] = []
    evidence = evidence_from(
        _round(spark, []), frame(spark, discards), pending, frame(spark, []), queues, T
    )
    columns = "discard_offset LONG, keys ARRAY<STRING>, tags STRING, transaction_id STRING"
    expected = [(0, ["ORD-1", "ORD-2"], "TagA", "TX-1"), (1, [], None, None)]
    assert_df_equality(
        discard_history(evidence, params()).select(*spark.createDataFrame([], columns).columns),
        spark.createDataFrame(expected, columns),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_a_discard_stored_at_or_after_t_does_not_exist_yet(spark: SparkSession) -> None:
    late = discard(0, "K0", 16, 100 * S, stored_age_ms=0)
    empty = spark.createDataFrame([], "broker STRING, uniq_key STRING, store_timestamp_ms LONG")
    queues: list[tuple[str, str, int]] = []
    evidence = evidence_from(
        _round(spark, []), frame(spark, [late]), empty, frame(spark, []), queues, T
    )
    assert discard_history(evidence, params()).count() == 0


def test_evidence_cut_at_another_t_is_refused(spark: SparkSession) -> None:
    """The discard rows and their transactions are cut at the evidence's T: a run at another
    T would decide rows that do not exist at its own."""
    empty = spark.createDataFrame([], "broker STRING, uniq_key STRING, store_timestamp_ms LONG")
    queues: list[tuple[str, str, int]] = []
    evidence = evidence_from(
        _round(spark, []), frame(spark, []), empty, frame(spark, []), queues, T - 1
    )
    with pytest.raises(ValueError, match=f"cut at {T - 1}, the run's T is {T}"):
        discard_history(evidence, params())


def test_the_counter_tie_follows_the_run_check_max(spark: SparkSession) -> None:
    """check_max is the run's setting: with 16, a counter of 16 whose age at the discard was
    beyond the retention is decided by the earlier half record (15 = max - 1: expired)."""
    records = [_h(0, "K0", 15, 40 * S)]
    d = discard(0, "K0", 16, 80 * HOUR)
    pending = spark.createDataFrame([], "broker STRING, uniq_key STRING, store_timestamp_ms LONG")
    queues: list[tuple[str, str, int]] = []
    evidence = evidence_from(
        _round(spark, records), frame(spark, [d]), pending, frame(spark, []), queues, T
    )
    by_16 = discard_history(evidence, params(check_max=16)).first()
    by_15 = discard_history(evidence, params()).first()
    assert by_16 is not None and by_15 is not None
    assert (by_16["reason"], by_15["reason"]) == ("expired", "check_max")


def test_a_discard_after_only_immunity_copies_is_a_finding_and_a_check_copy_is_not(
    spark: SparkSession,
) -> None:
    """The past evidence of immunity_exhausts_checks: before the discard, K20 has its
    original and two immunity copies (TRAN_PREPARED_QUEUE_OFFSET); the nearest non-cases
    add a check copy (K21), have their immunity copy only after the discard (K22), or only
    check copies (K23)."""
    records = [
        _h(20, "K20", None, 60 * S),
        _h(21, "K20", 1, 50 * S, prepared=20),
        _h(22, "K20", 2, 45 * S, prepared=20),
        _h(30, "K21", None, 60 * S),
        _h(31, "K21", 1, 50 * S, prepared=30),
        _h(32, "K21", 2, 45 * S),  # check copy: a check was sent
        _h(40, "K22", None, 60 * S),
        _h(41, "K22", 1, 5 * S, prepared=40),  # after the discard
        _h(50, "K23", None, 60 * S),
        _h(51, "K23", 1, 50 * S),
    ]
    discards = [discard(n, f"K{n}", 15, 80 * HOUR) for n in (20, 21, 22, 23)]
    pending = spark.createDataFrame([], "broker STRING, uniq_key STRING, store_timestamp_ms LONG")
    queues: list[tuple[str, str, int]] = []
    evidence = evidence_from(
        _round(spark, records), frame(spark, discards), pending, frame(spark, []), queues, T
    )
    found = discarded_without_check(discarded_unchecked(evidence))
    columns = "broker STRING, queue_id INT, kind STRING, severity STRING, uniq_key STRING,"
    columns += " half_offset LONG, op_offset LONG, value DOUBLE, threshold DOUBLE"
    expected = [(BROKER, 0, "immunity_exhausts_checks", "warning", "K20", 20, None, 2.0, 0.0)]
    assert_df_equality(
        found.select(*spark.createDataFrame([], columns).columns),
        spark.createDataFrame(expected, columns),
        ignore_nullable=True,
    )
    detail = found.first()
    assert detail is not None and detail["detail"] == (
        "discard record 20 (TRANS_CHECK_MAX_TIME_TOPIC, counter 15): half offset 20 was put"
        " back 2 time(s) for its immunity and never checked before the broker discarded it"
    )


def test_unknown_wins_over_pending_again_and_pending_again_over_committed(
    spark: SparkSession,
) -> None:
    """Outcome precedence, each with its nearest non-case. K60 (broker c) has a resumed copy
    pending, but no half record and no op record of c reaching back to the discard: unknown
    (a run's pending rows are half records too, so a store cannot show both; the rule
    order is what is tested). K62 (broker e) is the same with e's ops reaching back:
    pending_again. K61 was committed after its discard and a resumed copy is pending:
    pending_again. K63 is committed alike, its pending record stored before the discard
    (the discarded copy itself): committed."""
    h61, h63 = _h(61, "K61", 15, 40 * S), _h(63, "K63", 15, 40 * S)
    records = [
        h61,
        h63,
        op(0, "99,", stored_age_ms=30 * S),  # b's ops reach back past its discards
        op(0, "99,", stored_age_ms=30 * S, broker="e"),
    ]
    discards = [
        discard(60, "K60", 16, 100 * S, broker="c"),
        discard(62, "K62", 16, 100 * S, broker="e"),
        discard(61, "K61", 16, 100 * S),
        discard(63, "K63", 16, 100 * S),
    ]
    pending = spark.createDataFrame(
        [("c", "K60", T - 5 * S), ("e", "K62", T - 5 * S), (BROKER, "K61", T - 5 * S)]
        + [(BROKER, "K63", T - 40 * S)],
        "broker STRING, uniq_key STRING, store_timestamp_ms LONG",
    )
    readable = [(BROKER, "ORDERS", 0)]
    commits = [commit(h61, 5 * S), commit(h63, 5 * S)]
    evidence = evidence_from(
        _round(spark, records),
        frame(spark, discards),
        pending,
        frame(spark, commits),
        readable,
        T,
    )

    out = discard_history(evidence, params()).collect()

    assert sorted((r["broker"], r["discard_offset"], r["outcome"]) for r in out) == [
        ("b", 61, "pending_again"),
        ("b", 63, "committed"),
        ("c", 60, "unknown"),
        ("e", 62, "pending_again"),
    ]


@pytest.mark.parametrize(
    ("small", "few", "halves_join", "commits_join"),
    [
        (False, False, "SortMergeJoin", "SortMergeJoin"),
        (False, True, "BroadcastHashJoin", "SortMergeJoin"),
        (True, True, "BroadcastHashJoin", "BroadcastHashJoin"),
    ],
)
def test_the_job_chooses_each_join_of_the_discard_side(
    spark: SparkSession, small: bool, few: bool, halves_join: str, commits_join: str
) -> None:
    """The discard rows are broadcast against every half record when ``few``, their half
    records against every commit when ``small``; never Spark's estimate, which takes a
    store read for a few bytes."""
    evidence = _evidence(spark, small, few)

    def joins(df: DataFrame) -> str:
        return df._jdf.queryExecution().sparkPlan().toString()

    assert halves_join in joins(evidence.linked)
    facts = commit_times(evidence.linked, evidence.commits, T, evidence.small).rows
    assert commits_join in joins(facts.join(evidence.rows, on=DISCARD_KEY, how="left"))
