"""The pure-Python reference (``tests.reference``) against the spec's worked cases, its
parsing rules, and invariants of its own. No Spark: if these fail, fix the reference first."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from schemas.messages import HALF_TOPIC, OP_TOPIC
from schemas.outputs import CLASSES, NOT_REACHED, RESOLVED
from tests import reference
from tests.reference import (
    UNPARSABLE,
    immunity_ms,
    offset_msg_id,
    parse_int,
    parse_long,
    reason_kind,
)
from tests.transforms.builders import T, committed_rows, half, op, params
from tests.transforms.generators import cases
from tests.transforms.worked_cases import CASES, S, WorkedCase


def _run(case: WorkedCase) -> reference.RoundResult:
    return reference.reconcile(case.records, case.committed_rows, params())


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_reproduces_worked_case(name: str) -> None:
    case = CASES[name]

    result = _run(case)

    summary = result.summaries[("b", 0)]
    assert (
        summary.h0,
        summary.h1,
        summary.h_safe,
        summary.p0,
        summary.p1,
        summary.p_safe,
    ) == case.offsets
    assert summary.counts == {c: case.counts.get(c, 0) for c in CLASSES}
    assert sorted(
        (r["half_offset"], r["status"], r["check_times"], r["immunity_ms"]) for r in result.pending
    ) == sorted(case.pending)
    # The reference round is the job's own (really pending) picture: the broker's other
    # actions (``broker_only``) are not in it.
    assert sorted((r["half_offset"], r["check_times"]) for r in result.check_requests) == sorted(
        (offset, counter)
        for offset, counter, settled, own in case.check_requests
        if settled is None and not own
    )
    assert sorted(
        (r["half_offset"], r["reason"], r["check_times"]) for r in result.discards
    ) == sorted(
        (offset, reason, counter)
        for offset, reason, counter, settled, own in case.discards
        if settled is None and not own
    )
    assert sorted(
        (r["topic"], r["queue_offset"], reason_kind(r["reason"])) for r in result.bad_records
    ) == sorted(case.bad)
    assert summary.bad_records == len(case.bad)
    assert bool(summary.warnings) == case.warns
    assert list(result.summaries) == [("b", 0)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("12", 12),
        ("+7", 7),
        ("-0", 0),
        ("-1", -1),
        ("007", 7),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
        ("9223372036854775808", UNPARSABLE),
        ("-9223372036854775809", UNPARSABLE),
        ("", UNPARSABLE),
        ("+", UNPARSABLE),
        ("-", UNPARSABLE),
        (" 3", UNPARSABLE),
        ("3 ", UNPARSABLE),
        ("3\n", UNPARSABLE),
        ("1.5", UNPARSABLE),
        ("1e3", UNPARSABLE),
        ("0x1", UNPARSABLE),
        ("1_0", UNPARSABLE),
        ("\u0661", UNPARSABLE),  # ARABIC-INDIC DIGIT ONE: ASCII digits only
        ("--1", UNPARSABLE),
        (None, None),
    ],
)
def test_numbers_parse_like_long_parse_long_with_ascii_digits(
    text: str | None, expected: object
) -> None:
    actual = parse_long(text)

    assert (actual is UNPARSABLE) == (expected is UNPARSABLE)
    assert actual == expected


def test_counters_parse_within_32_bits() -> None:
    assert parse_int("2147483647") == 2**31 - 1
    assert parse_int("-2147483648") == -(2**31)
    assert parse_int("2147483648") is UNPARSABLE


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, 6000),
        ("60", 60_000),
        ("0", 0),
        ("-5", -5_000),
        ("-1", 6000),
        ("abc", 6000),
        (" 60", 6000),
        ("9223372036854775", 9_223_372_036_854_775_000),
        ("9223372036854776", 6000),  # parses, overflows x 1000
        ("99999999999999999999", 6000),  # does not parse
    ],
)
def test_effective_immunity(raw: str | None, expected: int) -> None:
    assert immunity_ms(raw, 6000) == expected


def test_offset_msg_id_is_address_port_and_commitlog_offset_in_hex() -> None:
    assert offset_msg_id("10.0.0.1:10911", 0) == "0A00000100002A9F0000000000000000"
    assert offset_msg_id("10.0.0.1:10911", 0x1234) == "0A00000100002A9F0000000000001234"
    assert offset_msg_id("[::1]:10911", 1) == "0" * 31 + "1" + "00002A9F" + "0" * 15 + "1"


def test_duplicates_keep_the_smallest_commitlog_offset_then_source_and_position() -> None:
    records = [
        half(0, 60 * S, key="late", commitlog=2_000, stored_age_ms=1_000),
        half(
            0, 60 * S, key="early", commitlog=1_000, stored_age_ms=-1_000
        ),  # wins, though stored after T
        half(1, 60 * S, key="z", commitlog=3_000, source="z.parquet", position=1),
        half(1, 60 * S, key="a", commitlog=3_000, source="a.parquet", position=9),
        half(1, 60 * S, key="a2", commitlog=3_000, source="a.parquet", position=10),
    ]

    result = reference.reconcile(records, committed_rows(0, None), params())

    # Offset 0's winner is stored after T: it does not exist, and the loser takes no part.
    assert [(r["half_offset"], r["uniq_key"]) for r in result.pending] == [(1, "a")]
    assert sorted((r["queue_offset"], r["source"], r["position"]) for r in result.bad_records) == [
        (0, "commitlog/00000000000000000000", 2_000),
        (1, "a.parquet", 10),
        (1, "z.parquet", 1),
    ]


def test_each_unparsable_op_item_is_one_bad_record_and_other_tags_are_not_examined() -> None:
    records = [
        op(0, "x,y,3,"),
        op(1, " 4"),
        op(2, "x", tag="x"),  # not a d record: not examined
        op(3, "x,", stored_age_ms=0),  # stored at T: does not exist
        op(4, ",,"),  # only empty items: names nothing, no bad record
    ]

    result = reference.reconcile(records, [], params())

    assert sorted((r["topic"], r["queue_offset"]) for r in result.bad_records) == [
        (OP_TOPIC, 0),
        (OP_TOPIC, 0),
        (OP_TOPIC, 1),
    ]
    assert result.summaries[("b", 0)].bad_records == 3


def test_property_problems_only_for_winners_stored_before_t() -> None:
    records = [
        half(0, 60 * S, counter="x", immunity="9223372036854776", real_qid="q", prepared="p"),
        half(1, 60 * S, counter="x", stored_age_ms=0),  # at T: not examined
        half(2, 60 * S, counter="1", commitlog=1),
        half(2, 60 * S, counter="x", commitlog=2),  # the duplicate: only "duplicate"
    ]

    result = reference.reconcile(records, [], params())

    assert sorted((r["queue_offset"], reason_kind(r["reason"])) for r in result.bad_records) == [
        (0, "REAL_QID"),
        (0, "TRANSACTION_CHECK_TIMES"),
        (0, "TRAN_PREPARED_QUEUE_OFFSET"),
        (2, "duplicate"),
    ]


def test_rule_3_is_scoped_to_the_queue() -> None:
    records = [
        half(0, 60 * S, key="K", queue=0),
        half(0, 60 * S, key="K", queue=1),
        op(0, "0", queue=0),
    ]

    result = reference.reconcile(records, [], params())

    assert [(r["queue_id"], r["status"]) for r in result.pending] == [(1, "check")]


def test_committed_offsets_are_clamped_to_the_available_range() -> None:
    records = [half(3, 60 * S), half(4, 60 * S), half(5, 60 * S, stored_age_ms=-1), op(2, "9")]
    offsets = [("b", HALF_TOPIC, 0, 9), ("b", OP_TOPIC, 0, 0), ("b", HALF_TOPIC, 7, 12)]

    result = reference.reconcile(records, offsets, params())

    # Half end at T is 5 (offset 5 is stored after T); the op queue starts at 2; queue 7 has
    # no record and keeps its committed offset; its op offset is missing: 0.
    assert (result.summaries[("b", 0)].h0, result.summaries[("b", 0)].p0) == (5, 2)
    assert len(result.summaries[("b", 0)].warnings) == 2
    assert (result.summaries[("b", 7)].h0, result.summaries[("b", 7)].p0) == (12, 0)
    assert result.summaries[("b", 7)].warnings == []


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(cases(params()))
def test_reference_invariants(case) -> None:  # type: ignore[no-untyped-def]
    p = params()
    result = reference.reconcile(case.records, case.committed, p)

    for summary in result.summaries.values():
        assert summary.h0 <= summary.h_safe <= summary.h1
        assert summary.p0 <= summary.p_safe <= summary.p1
        pending = [
            r
            for r in result.pending
            if (r["broker"], r["queue_id"]) == (summary.broker, summary.queue_id)
        ]
        assert len(pending) == sum(n for c, n in summary.counts.items() if c != RESOLVED)
        assert summary.counts["too_young"] <= 1
        assert all(r["half_offset"] > summary.h1 for r in pending if r["status"] == NOT_REACHED)
        assert all(
            r["half_offset"] < summary.h1
            for r in pending
            if r["status"] not in (NOT_REACHED, "too_young")
        )
    assert all(r["as_of_ms"] == T for r in result.pending)


def test_bytes_that_are_not_utf8_spoil_only_their_item() -> None:
    records = [half(0, 60 * S), half(1, 60 * S), op(0, b"\xff0,1,")]

    result = reference.reconcile(records, [], params())

    assert [(r["half_offset"], r["status"]) for r in result.pending] == [(0, "check")]
    assert [(r["queue_offset"], reason_kind(r["reason"])) for r in result.bad_records] == [
        (0, "op_body")
    ]


def test_identical_duplicate_rows_are_used_once() -> None:
    result = reference.reconcile([half(0, 60 * S), half(0, 60 * S)], [], params())

    assert [r["half_offset"] for r in result.check_requests] == [0]
    assert [reason_kind(r["reason"]) for r in result.bad_records] == ["duplicate"]


def test_empty_property_values_are_absent_properties() -> None:
    # Section 2: "a segment with an empty name or empty value is ignored".
    records = [
        half(0, 60 * S, key="", counter="", group="", real_qid=""),
        half(1, 60 * S, key="", immunity=""),
        half(2, 1 * S, immunity=""),
        op(0, "0"),
    ]

    result = reference.reconcile(records, [], params())

    assert result.bad_records == []
    assert [
        (r["half_offset"], r["status"], r["uniq_key"], r["producer_group"], r["real_queue_id"])
        for r in result.pending
    ] == [
        (1, "check", None, "PG_ORDERS", 0),
        (2, "too_young", None, "PG_ORDERS", 0),
    ]
