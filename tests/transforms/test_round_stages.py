"""Each stage of the round (transforms/round_stages.py) alone, on small inline frames.

The whole-round worked cases (test_worked_cases.py) and the property test against the
reference remain the acceptance tests; these pin one stage's contract each.
"""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from schemas.messages import HALF_TOPIC, OP_TOPIC
from schemas.outputs import BAD_RECORD
from tests.transforms.builders import T, frame, half, op, params
from transforms.merge import Facts, merged
from transforms.offsets import window_facts, window_rows
from transforms.resolve import transaction_records
from transforms.round_stages import (
    NOTE,
    bad_record_facts,
    classified,
    marked_records,
    note_facts,
    queue_summary,
    read_bounds,
    records_from_h0,
    round_bad_records,
    round_records,
    settled_from_h0,
    status_facts,
    stop_facts,
    unresolved,
    with_statuses,
)

S = 1_000
HALF_KEYS = "broker STRING, queue_id INT, queue_offset LONG"


def test_round_records_keep_half_and_op_records_with_an_unset_flag(spark: SparkSession) -> None:
    records = frame(spark, [half(0, 60 * S, key="tx-0"), half(1, 60 * S), op(0, "0,")])
    out = round_records(records, params()).select(
        "topic", "queue_offset", "transaction_key", "offset_unique", "body"
    )
    expected = spark.createDataFrame(
        [
            (HALF_TOPIC, 0, "tx-0", False, None),
            (HALF_TOPIC, 1, "\u0000offset:1", False, None),  # no UNIQ_KEY: its own transaction
            (OP_TOPIC, 0, "\u0000offset:0", False, bytearray(b"0,")),
        ],
        "topic STRING, queue_offset LONG, transaction_key STRING, offset_unique BOOLEAN, body BINARY",
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)


def test_marked_records_check_only_records_not_flagged_unique(spark: SparkSession) -> None:
    records = spark.createDataFrame(
        [
            ("b", HALF_TOPIC, 0, 5, 100, "f", 100, False),
            ("b", HALF_TOPIC, 0, 5, 200, "f", 200, False),  # loses to commit-log offset 100
            ("b", HALF_TOPIC, 1, 7, 300, "f", 300, True),  # trusted: never checked
            ("b", HALF_TOPIC, 1, 7, 400, "f", 400, True),
        ],
        "broker STRING, topic STRING, queue_id INT, queue_offset LONG, commitlog_offset LONG,"
        " source STRING, position LONG, offset_unique BOOLEAN",
    )
    out = marked_records(records).select("queue_id", "commitlog_offset", "duplicate_of")
    expected = spark.createDataFrame(
        [(0, 100, None), (0, 200, 100), (1, 300, None), (1, 400, None)],
        "queue_id INT, commitlog_offset LONG, duplicate_of LONG",
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)


def test_records_from_h0_drop_records_below_the_start(spark: SparkSession) -> None:
    half_rows = spark.createDataFrame(
        [("b", 0, 3, "x"), ("b", 0, 4, "y"), ("b", 1, 0, "z"), ("c", 0, 9, "w")],
        f"{HALF_KEYS}, note STRING",
    )
    starts = spark.createDataFrame(
        [("b", 0, 4), ("b", 1, 0)], "broker STRING, queue_id INT, h0 LONG"
    )
    expected = spark.createDataFrame(
        [("b", 0, 4, "y"), ("b", 1, 0, "z")],  # broker c has no start: outside the domain
        f"{HALF_KEYS}, note STRING",
    )
    assert_df_equality(
        records_from_h0(half_rows, starts), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_read_bounds_count_the_records_from_h0_and_below_the_starts(
    spark: SparkSession,
) -> None:
    starts = spark.createDataFrame(
        [
            ("b", 0, 4, 10, 2, 5, 20),
            ("b", 1, 7, 7, 0, 0, 0),
            ("c", 0, 5, 3, 0, 3, 1),
            ("d", 0, None, None, None, None, 0),
        ],
        "broker STRING, queue_id INT, h0 LONG, half_end LONG, p0 LONG, op_end LONG,"
        " records_read LONG",
    )
    expected = spark.createDataFrame(
        # (b, 0): 6 from h0; 20 read, 6 from h0 and 3 from p0, so 11 below. Never negative
        # (records stored after T are read too), never null.
        [("b", 0, 6, 11), ("b", 1, 0, 0), ("c", 0, 0, 0), ("d", 0, 0, 0)],
        "broker STRING, queue_id INT, from_h0 LONG, below LONG",
    )
    assert_df_equality(read_bounds(starts), expected, ignore_nullable=True)


@pytest.mark.parametrize("small", [True, False], ids=["broadcast", "shuffle"])
def test_settled_from_h0_names_the_first_op_that_settled_each_transaction(
    spark: SparkSession, small: bool
) -> None:
    half_rows = spark.createDataFrame(
        [
            ("b", 0, 0, "tx-a", None),  # named (rule 1): resolves its put-back copy at 4
            ("b", 0, 1, "tx-b", None),  # original of the immunity copy at 5
            ("b", 0, 4, "tx-a", None),
            ("b", 0, 5, "tx-c", 1),  # its prepared offset 1 is named (rule 2)
            ("b", 0, 6, "tx-d", None),  # nothing names tx-d: unresolved
        ],
        f"{HALF_KEYS}, transaction_key STRING, prepared_queue_offset LONG",
    )
    op_items = spark.createDataFrame(
        # Offset 0 named twice (the first op wins); an unparsable item names nothing.
        [("b", 0, 0, 7), ("b", 0, 0, 3), ("b", 0, 1, 8), ("b", 0, None, 9)],
        "broker STRING, queue_id INT, half_offset LONG, op_offset LONG",
    )
    from_h0 = half_rows.filter("queue_offset >= 4")
    expected = spark.createDataFrame(
        [
            ("b", 0, 4, "tx-a", None, 3),  # rule 3, through the record at 0
            ("b", 0, 5, "tx-c", 1, 8),  # rule 2
            ("b", 0, 6, "tx-d", None, None),
        ],
        f"{HALF_KEYS}, transaction_key STRING, prepared_queue_offset LONG, "
        "settled_by_op_offset LONG",
    )
    out = settled_from_h0(half_rows, op_items, from_h0, small=small)
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)
    # Given only the transactions from h0 (what the round passes), the same.
    linked = transaction_records(half_rows, from_h0, small=small)
    settled = settled_from_h0(linked, op_items, from_h0, small=small)
    assert_df_equality(settled, expected, ignore_row_order=True, ignore_nullable=True)
    assert_df_equality(
        unresolved(settled),
        expected.filter("queue_offset = 6").drop("settled_by_op_offset"),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_classified_takes_the_first_class_that_applies(spark: SparkSession) -> None:
    rows = spark.createDataFrame(
        [
            (0, 15, T - 60 * S, None),  # counter at check_max
            (1, None, T - 73 * 3600 * S, None),  # born before the retention
            (2, None, T - 10 * S, "60"),  # immunity 60 s not over
            (3, None, T - 2 * S, None),  # younger than the 6 s timeout
            (4, 2, T - 60 * S, None),
        ],
        "queue_offset LONG, check_times INT, born_timestamp_ms LONG, immunity_raw STRING",
    )
    out = classified(rows, params()).select("queue_offset", "immunity_ms", "round_class")
    expected = spark.createDataFrame(
        [
            (0, 6_000, "discard_check_max"),
            (1, 6_000, "discard_expired"),
            (2, 60_000, "immune"),
            (3, 6_000, "too_young"),
            (4, 6_000, "check"),
        ],
        "queue_offset LONG, immunity_ms LONG, round_class STRING",
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)


def test_stop_offsets_are_the_smallest_too_young_offset(spark: SparkSession) -> None:
    candidates = spark.createDataFrame(
        [
            ("b", 0, 3, "too_young"),
            ("b", 0, 2, "check"),
            ("b", 0, 7, "too_young"),
            ("b", 1, 1, "check"),
        ],
        f"{HALF_KEYS}, round_class STRING",
    )
    expected = spark.createDataFrame([("b", 0, 3)], "broker STRING, queue_id INT, stop_offset LONG")
    assert_df_equality(
        merged(stop_facts(candidates)), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_statuses_before_at_and_after_h1(spark: SparkSession) -> None:
    candidates = spark.createDataFrame(
        [
            ("b", 0, 1, "check", 2),
            ("b", 0, 3, "too_young", None),  # the stop
            ("b", 0, 5, "check", 0),  # after the stop: not reached, counter unchanged
            ("b", 1, 0, "discard_expired", None),
        ],
        f"{HALF_KEYS}, round_class STRING, check_times INT",
    )
    h1s = spark.createDataFrame(
        [("b", 0, 3, 3), ("b", 1, 9, None)],
        "broker STRING, queue_id INT, h1 LONG, stop_offset LONG",
    )
    expected = spark.createDataFrame(
        [
            ("b", 0, 1, 2, "check", 3),
            ("b", 0, 3, None, "too_young", None),
            ("b", 0, 5, 0, "not_reached", 0),
            ("b", 1, 0, None, "discard_expired", 1),
        ],
        f"{HALF_KEYS}, check_times INT, status STRING, counter_after INT",
    )
    assert_df_equality(
        with_statuses(candidates, h1s), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_status_counts_bound_h_safe_by_the_first_unresolved(spark: SparkSession) -> None:
    pending = spark.createDataFrame(
        [
            ("b", 0, 2, "discard_expired", 1),
            ("b", 0, 4, "check", 15),  # a put-back the broker discards on sight
            ("b", 0, 6, "immune", 3),  # the first live copy
            ("b", 0, 8, "too_young", None),
            ("b", 0, 9, "not_reached", 0),
        ],
        f"{HALF_KEYS}, status STRING, counter_after INT",
    )
    out = merged(status_facts(pending, params()))
    expected = spark.createDataFrame(
        [("b", 0, 1, 1, 0, 1, 1, 1, 2, 6)],
        "broker STRING, queue_id INT, check LONG, immune LONG, discard_check_max LONG,"
        " discard_expired LONG, too_young LONG, not_reached LONG, first_unresolved LONG,"
        " first_live_copy LONG",
    )
    assert_df_equality(out, expected, ignore_nullable=True)


def test_in_window_counts_half_records_in_h0_to_h1(spark: SparkSession) -> None:
    half_rows = spark.createDataFrame(
        [("b", 0, 1), ("b", 0, 2), ("b", 0, 3), ("b", 0, 4)], HALF_KEYS
    )
    window = spark.createDataFrame(
        [("b", 0, 2, 4, 4, 0, 0)],
        "broker STRING, queue_id INT, h0 LONG, h1 LONG, h_safe LONG, p0 LONG, op_end LONG",
    )
    no_ops = spark.createDataFrame([], f"{HALF_KEYS}, tags STRING")
    no_items = spark.createDataFrame(
        [], "broker STRING, queue_id INT, op_offset LONG, half_offset LONG"
    )
    rows = window_rows(half_rows, no_ops, no_items, window, params())
    expected = spark.createDataFrame([("b", 0, 2)], "broker STRING, queue_id INT, in_window LONG")
    assert_df_equality(
        merged(window_facts(rows)).select("broker", "queue_id", "in_window"),
        expected,
        ignore_nullable=True,
    )


def _bad(topic: str, queue_offset: int, reason: str, raw_hex: str | None) -> tuple:
    return ("b", "f", queue_offset, topic, 0, queue_offset, reason, raw_hex)


def test_round_bad_records_union_reader_duplicate_op_and_property_problems(
    spark: SparkSession,
) -> None:
    marked = spark.createDataFrame(
        [("b", "f", 1, HALF_TOPIC, 0, 1, 7), ("b", "f", 2, HALF_TOPIC, 0, 2, None)],
        "broker STRING, source STRING, position LONG, topic STRING, queue_id INT,"
        " queue_offset LONG, duplicate_of LONG",
    )
    op_items = spark.createDataFrame(
        [("b", 0, 3, "f", 3, "x", None), ("b", 0, 3, "f", 3, "4", 4)],
        "broker STRING, queue_id INT, op_offset LONG, source STRING, position LONG,"
        " item_text STRING, half_offset LONG",
    )
    half_rows = spark.createDataFrame(
        [("b", "f", 5, HALF_TOPIC, 0, 5, "two", None, None, None)],
        "broker STRING, source STRING, position LONG, topic STRING, queue_id INT,"
        " queue_offset LONG, check_times_raw STRING, immunity_raw STRING,"
        " real_queue_id_raw STRING, prepared_queue_offset_raw STRING",
    )
    reader_bad = spark.createDataFrame([_bad(HALF_TOPIC, 9, "bad magic", "00")], BAD_RECORD)
    out = round_bad_records(marked, op_items, half_rows, reader_bad)
    expected = spark.createDataFrame(
        [
            _bad(HALF_TOPIC, 9, "bad magic", "00"),
            _bad(
                HALF_TOPIC,
                1,
                "duplicate queue offset: the record at commit-log offset 7 is used instead",
                None,
            ),
            _bad(OP_TOPIC, 3, "unparsable op body item 'x'", "78"),
            _bad(HALF_TOPIC, 5, "unparsable TRANSACTION_CHECK_TIMES 'two'", "74776F"),
        ],
        BAD_RECORD,
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)


def test_queue_summary_keeps_queues_only_bad_records_or_notes_name(spark: SparkSession) -> None:
    queues = spark.createDataFrame(
        [("b", 0, 0, 0, 5, 5, 0, 0, 2, 1, 0, 0, 0, 0, 0, None, 4, ["offset note"], 9, 7)],
        "broker STRING, queue_id INT, h_committed LONG, h0 LONG, h1 LONG, h_safe LONG,"
        " p_committed LONG, p0 LONG, op_end LONG, check LONG, immune LONG,"
        " discard_check_max LONG, discard_expired LONG, too_young LONG, not_reached LONG,"
        " stop_offset LONG, first_live_copy LONG, offset_warnings ARRAY<STRING>,"
        " newest_ms LONG, records_read LONG",
    )
    # The op queue's first offsets (op_offset_facts): 0 and 1 present, nothing pending.
    op_firsts = spark.createDataFrame(
        [("b", 0, 0), ("b", 0, 1)], "broker STRING, queue_id INT, _present LONG"
    )
    op_facts = Facts(
        op_firsts,
        (F.min("_present").alias("first_present"),)
        + tuple(
            F.lit(None).cast("long").alias(name)
            for name in ("first_not_done", "first_not_done_safe", "first_gap")
        ),
    )
    in_window = Facts(
        spark.createDataFrame([("b", 0, 5)], "broker STRING, queue_id INT, _in LONG"),
        (F.sum("_in").alias("in_window"),),
    )
    bad = spark.createDataFrame(
        [_bad(HALF_TOPIC, 1, "r", None), ("b", "f", 0, None, None, None, "corrupt", None)],
        BAD_RECORD,
    )
    notes = spark.createDataFrame([("b", None, "broker note"), ("b", 0, "queue note")], NOTE)
    out = queue_summary(queues, in_window, op_facts, bad_record_facts(bad), note_facts(notes))
    out = out.select(
        "broker",
        "queue_id",
        "h1",
        "p1",
        "resolved",
        "check",
        "bad_records",
        "warnings",
        "records_read",
    )
    expected = spark.createDataFrame(
        [
            ("b", 0, 5, 2, 4, 1, 1, ["offset note", "queue note"], 7),
            # The unknown queue's own row: it read no record.
            ("b", None, None, None, 0, 0, 1, ["broker note"], 0),
        ],
        "broker STRING, queue_id INT, h1 LONG, p1 LONG, resolved LONG, check LONG,"
        " bad_records LONG, warnings ARRAY<STRING>, records_read LONG",
    )
    assert_df_equality(out, expected, ignore_row_order=True, ignore_nullable=True)
