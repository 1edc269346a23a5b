"""transforms.broker_round: the broker's round per queue through applyInArrow gives, for each
queue, what walk_queue gives on that queue's records."""

from __future__ import annotations

import pyarrow.compute as pc
from chispa import assert_df_equality
from pyspark.sql import types as T

from tests.transforms.builders import T as AS_OF
from tests.transforms.builders import params
from transforms.broker_round import (
    BROKER_ROUND,
    END_COLUMNS,
    broker_actions,
    broker_ends,
    broker_round,
    broker_settings,
)
from transforms.broker_walk import walk_queue

S = 1000
HALF = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("queue_offset", T.LongType()),
        T.StructField("uniq_key", T.StringType()),
        T.StructField("check_times_raw", T.StringType()),
        T.StructField("immunity_raw", T.StringType()),
        T.StructField("prepared_queue_offset_raw", T.StringType()),
        T.StructField("born_timestamp_ms", T.LongType()),
        T.StructField("store_timestamp_ms", T.LongType()),
    ]
)
OPS = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("queue_offset", T.LongType()),
        T.StructField("tags", T.StringType()),
        T.StructField("body", T.BinaryType()),
        T.StructField("store_timestamp_ms", T.LongType()),
    ]
)
STARTS = "broker string, queue_id int, h0 long, p0 long"


def _half(broker, queue, offset, key, age_s, counter=None, immunity=None, prepared=None):
    born = AS_OF - age_s * S
    return (broker, queue, offset, key, counter, immunity, prepared, born, born)


def _op(broker, queue, offset, body, tags="d", age_s=30):
    return (broker, queue, offset, tags, body.encode(), AS_OF - age_s * S)


HALF_ROWS = [
    # broker a, queue 0: below h0, resolved, checked, at check_max, immune, too young.
    _half("a", 0, 0, "A0", 600),
    _half("a", 0, 1, "A1", 600),
    _half("a", 0, 2, "A2", 600, counter="2"),
    _half("a", 0, 3, "A3", 500, counter="15"),
    _half("a", 0, 4, "A4", 30, immunity="60"),
    _half("a", 0, 5, "A5", 1),
    _half("a", 0, 6, "A6", -5),  # stored at or after T: does not exist
    # broker b, queue 1: one check whose copy the walk reaches and discards (check_max 3).
    _half("b", 1, 7, "B7", 600, counter="2"),
]
OP_ROWS = [_op("a", 0, 0, "0"), _op("a", 0, 1, "1,"), _op("b", 1, 4, "3,")]
STARTS_ROWS = [("a", 0, 1, 0), ("b", 1, 7, 4), ("c", 0, 0, 0)]


def _expected(spark, prm):
    """walk_queue per queue, on the same records as Arrow tables."""
    half = spark.createDataFrame(HALF_ROWS, HALF).toArrow()
    ops = spark.createDataFrame(OP_ROWS, OPS).toArrow()
    rows = []
    for broker, queue, h0, p0 in STARTS_ROWS:

        def mine(table, broker=broker, queue=queue):
            keep = pc.and_(
                pc.equal(table["broker"], broker),
                pc.equal(table["queue_id"], queue),
            )
            return table.filter(keep)

        actions, end = walk_queue(mine(half), mine(ops), h0, p0, prm.as_of_ms, broker_settings(prm))
        for row in actions.to_pylist():
            rows.append({"broker": broker, "queue_id": queue, **row})
        ending = {name: getattr(end, name) for name in END_COLUMNS.fieldNames()}
        rows.append(
            {"broker": broker, "queue_id": queue, "step": actions.num_rows, "action": "round_end"}
            | ending
        )
    return spark.createDataFrame(
        [tuple(r.get(name) for name in BROKER_ROUND.fieldNames()) for r in rows], BROKER_ROUND
    )


def test_broker_round_is_walk_queue_per_queue(spark):
    prm = params(check_max=3, broker_version="5")
    walked = broker_round(
        spark.createDataFrame(HALF_ROWS, HALF),
        spark.createDataFrame(OP_ROWS, OPS),
        spark.createDataFrame(STARTS_ROWS, STARTS),
        prm,
    )
    expected = _expected(spark, prm)
    assert_df_equality(walked, expected, ignore_row_order=True)
    actions = broker_actions(walked).orderBy("broker", "queue_id", "step")
    got = [
        (
            r.broker,
            r.half_offset,
            r.action,
            r.counter,
            r.own_copy,
            r.record_offset,
            r.copy_discarded,
        )
        for r in actions.collect()
    ]
    assert got == [
        ("a", 1, "resolved", None, False, 1, False),
        ("a", 2, "check", 3, False, 2, False),
        ("a", 3, "discard_check_max", 15, False, 3, False),
        ("a", 4, "immunity_put_back", 1, False, 4, False),
        ("b", 7, "check", 3, False, 7, True),  # its copy (8) is discarded in the same round
        ("b", 8, "discard_check_max", 3, True, 7, False),  # a copy of the record at 7
    ]
    ends = {r.broker: r for r in broker_ends(walked).collect()}  # one row per queue
    assert (ends["a"].h1, ends["a"].p1, ends["a"].stop, ends["a"].copies) == (5, 2, "too_young", 2)
    assert (ends["b"].h1, ends["b"].p1, ends["b"].stop, ends["b"].copies) == (9, 5, "end", 1)
    assert (ends["c"].h1, ends["c"].p1, ends["c"].actions) == (0, 0, 0)


def test_each_action_carries_the_columns_of_the_stored_record_it_is_about(spark):
    """``carried``: an action row has its record's columns; a copy this round appended has
    the columns of the record it copies; an end row has none."""
    rows = [(*row, f"group-{row[2]}") for row in HALF_ROWS]
    half = spark.createDataFrame(
        rows, T.StructType([*HALF.fields, T.StructField("group", T.StringType())])
    )
    walked = broker_round(
        half,
        spark.createDataFrame(OP_ROWS, OPS),
        spark.createDataFrame(STARTS_ROWS, STARTS),
        params(check_max=3, broker_version="5"),
        carried=["group", "born_timestamp_ms"],
    )
    assert walked.columns == [*BROKER_ROUND.fieldNames(), "group", "born_timestamp_ms"]
    got = {
        (r.broker, r.half_offset, r.action): (r.group, r.born_timestamp_ms)
        for r in walked.filter("broker = 'b'").collect()
    }
    born_7 = AS_OF - 600 * S
    assert got == {
        ("b", 7, "check"): ("group-7", born_7),
        ("b", 8, "discard_check_max"): ("group-7", born_7),
        ("b", None, "round_end"): (None, None),
    }
