"""The round's floors (transforms/floors.py), each step alone on inline frames."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import SparkSession

from transforms.floors import linked_facts, reaching_facts, with_half_floors, with_op_floor
from transforms.merge import merged

HALF = "broker STRING, queue_id INT, transaction_key STRING, queue_offset LONG, prepared_queue_offset LONG"
KEYS = "broker STRING, queue_id INT, transaction_key STRING"
STARTS = "broker STRING, queue_id INT, h0 LONG, p0 LONG"
FLOORS = "broker STRING, queue_id INT, p0 LONG, half_floor LONG, named_floor LONG"
OPS = "broker STRING, queue_id INT, queue_offset LONG, tags STRING, body BINARY"


def test_linked_facts_reach_every_record_of_a_transaction_from_h0(spark: SparkSession) -> None:
    half = spark.createDataFrame(
        [
            ("a", 0, "K", 3, None),  # K's original, far below h0
            ("a", 0, "L", 1, None),  # no record of L from h0: not linked
            ("a", 0, "P", 7, 2),  # an immunity copy: its prepared offset resolves it too
            ("a", 0, "K", 10, None),
            ("a", 1, "K", 0, None),  # K of another queue is another transaction
            ("a", 1, "M", 4, None),
        ],
        HALF,
    )
    from_h0 = spark.createDataFrame([("a", 0, "K"), ("a", 0, "P"), ("a", 1, "M")], KEYS)
    for small in (True, False):
        facts = linked_facts(half, from_h0, small)
        expected = spark.createDataFrame(
            [("a", 0, 3, 2), ("a", 1, 4, None)],
            "broker STRING, queue_id INT, first_linked LONG, first_prepared LONG",
        )
        assert_df_equality(merged(facts), expected, ignore_row_order=True, ignore_nullable=True)


def test_half_floors_are_h0_unless_a_linked_record_lies_below(spark: SparkSession) -> None:
    starts = spark.createDataFrame([("a", 0, 10, 6), ("a", 1, 5, 0), ("b", 0, 8, 2)], STARTS)
    linked = linked_facts(
        spark.createDataFrame(
            [("a", 0, "K", 3, 1), ("a", 0, "K", 10, None), ("a", 1, "M", 5, None)], HALF
        ),
        spark.createDataFrame([("a", 0, "K"), ("a", 1, "M")], KEYS),
        small=True,
    )
    expected = spark.createDataFrame(
        # (a, 0): K reaches 3, its prepared offset 1; (a, 1): nothing below h0; (b, 0): no
        # record from h0 at all.
        [("a", 0, 6, 3, 1), ("a", 1, 0, 5, 5), ("b", 0, 2, 8, 8)],
        FLOORS,
    )
    assert_df_equality(
        with_half_floors(starts, linked), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_the_op_floor_is_the_first_op_naming_a_linked_offset_or_p0(spark: SparkSession) -> None:
    floors = spark.createDataFrame(
        [("a", 0, 6, 3, 1), ("a", 1, 4, 5, 5), ("b", 0, 2, 8, 8)], FLOORS
    )
    ops = spark.createDataFrame(
        [
            ("a", 0, 0, "d", b"0,"),  # names only 0, below the named floor 1
            ("a", 0, 1, "x", b"9"),  # another tag names nothing
            ("a", 0, 2, "d", b"0,7,"),  # a batch: its largest item reaches the floor
            ("a", 0, 3, "d", b"1"),
            ("a", 1, 0, "d", b"junk"),  # names nothing that parses
            ("a", 1, 1, "d", b"2"),
            ("b", 0, 3, "d", b"9"),  # reaches the floor, but p0 is smaller
        ],
        OPS,
    )
    expected = spark.createDataFrame(
        [("a", 0, 3, 1, 2), ("a", 1, 5, 5, 4), ("b", 0, 8, 8, 2)],
        "broker STRING, queue_id INT, half_floor LONG, named_floor LONG, op_floor LONG",
    )
    got = with_op_floor(floors, reaching_facts(ops, floors))
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)
