"""The flag the mirror keeps beside each record (``transforms.bad_records.may_be_bad``): true
for every record the round finds an unparsable property or op item in (and a few op
records that hold none), so that the round reads only the flagged ones (and the ones
mirrored before the flag) for them."""

from __future__ import annotations

import pyarrow as pa
from chispa import assert_df_equality
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.messages import MAY_BE_BAD, OP_TOPIC
from tests.transforms.builders import frame, half, op
from transforms.bad_records import (
    may_be_bad_arrow,
    may_be_bad_only,
    unparsable_op_items,
    unparsable_properties,
    with_may_be_bad,
)
from transforms.messages import as_lean, is_half, is_op, with_half_fields
from transforms.ops import explode_op_items, unparsable_items

# (queue offset, record, flagged)
RECORDS = [
    (1, half(1, 10, key="k1", counter=2, prepared=0), False),
    (2, half(2, 10, key="k2", counter="two"), True),
    (3, half(3, 10, key="k3", real_qid="q"), True),
    (4, half(4, 10, key="k4", prepared="99999999999999999999"), True),  # past a long
    (5, half(5, 10, key="k5", counter=None, real_qid=None), False),  # absent: not bad
    (6, half(6, 10, key="k6", immunity="soon"), False),  # a finding, not a bad record
    (7, op(7, "1,2,"), False),
    (8, op(8, "3,x,"), True),
    (9, op(9, ",,"), False),  # empty items name nothing
    (10, op(10, "x", tag="other"), False),  # another tag names nothing
    (11, op(11, None), False),
    (12, op(12, b"4,\xff,"), True),  # invalid UTF-8 makes its item unparsable
    (13, op(13, "12345678901234567890,"), True),  # past a long
    # Flagged, and no bad record: signs and 19 digits are read from the items themselves.
    (14, op(14, "+5,-6"), True),
    (15, op(15, "9223372036854775807,"), True),
]


def _records(spark: SparkSession) -> DataFrame:
    return as_lean(frame(spark, [record for _, record, _ in RECORDS]))


def _bad_records(records: DataFrame) -> DataFrame:
    """The round's bad records that a record's own columns decide (properties, op items)."""
    half_rows = with_half_fields(records.filter(is_half()))
    items = explode_op_items(records.filter(is_op()))
    return unparsable_properties(half_rows).unionByName(
        unparsable_op_items(unparsable_items(items), OP_TOPIC)
    )


def test_may_be_bad_flags_the_records_the_round_finds_bad_records_in(
    spark: SparkSession,
) -> None:
    flagged = with_may_be_bad(_records(spark)).select("queue_offset", MAY_BE_BAD)
    expected = spark.createDataFrame(
        [(offset, flag) for offset, _, flag in RECORDS], "queue_offset LONG, may_be_bad BOOLEAN"
    )
    assert_df_equality(flagged, expected, ignore_row_order=True, ignore_nullable=True)


def _arrow_flags(records: DataFrame) -> list[bool]:
    """``may_be_bad_arrow`` of ``records``, in their order."""
    return may_be_bad_arrow(pa.RecordBatch.from_struct_array(_struct(records))).to_pylist()


def _struct(records: DataFrame) -> pa.StructArray:
    return records.toArrow().combine_chunks().to_struct_array().combine_chunks()


def test_the_arrow_form_flags_the_same_records_here(spark: SparkSession) -> None:
    records = _records(spark).orderBy("queue_offset")
    assert _arrow_flags(records) == [flag for _, _, flag in sorted(RECORDS, key=lambda r: r[0])]


# Text near the edges of the parsers: signs, spaces, letters, 9/10 and 18/19 digits.
_PROPERTY = st.none() | st.lists(
    st.sampled_from(["0", "7", "-", "+", " ", "x", "12345678", "2147483648", "922337203685477580"]),
    max_size=3,
).map("".join)
_BODY = st.none() | st.lists(
    st.sampled_from([b"0", b"9", b",", b"+", b"-", b" ", b"\xff", b"x", b"123456789"]),
    max_size=6,
).map(b"".join)
_RECORD = st.one_of(
    st.builds(
        lambda counter, real_qid, prepared: half(
            0, 10, key="k", counter=counter, real_qid=real_qid, prepared=prepared
        ),
        _PROPERTY,
        _PROPERTY,
        _PROPERTY,
    ),
    st.builds(lambda body, tag: op(0, body, tag=tag), _BODY, st.sampled_from(["d", "x"])),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_RECORD, min_size=1, max_size=40))
def test_the_arrow_form_flags_every_record_the_spark_form_flags(
    spark: SparkSession, drawn: list[dict]
) -> None:
    """The mirror derives the flag with the Arrow form: a record the round would find a bad
    record in is never left unflagged (a few more may be flagged)."""
    rows = [{**record, "queue_offset": i} for i, record in enumerate(drawn)]
    records = with_may_be_bad(as_lean(frame(spark, rows))).orderBy("queue_offset")
    spark_flags = [row[MAY_BE_BAD] for row in records.select(MAY_BE_BAD).collect()]
    arrow_flags = _arrow_flags(records)
    assert [a for s, a in zip(spark_flags, arrow_flags, strict=True) if s] == [True] * sum(
        spark_flags
    )


def test_the_flagged_records_give_every_bad_record(spark: SparkSession) -> None:
    records = _records(spark)
    expected = _bad_records(records)
    # What the test rests on: bad records to lose, in half and op records.
    assert sorted(row["queue_offset"] for row in expected.collect()) == [2, 3, 4, 8, 12, 13]
    kept = may_be_bad_only(with_may_be_bad(records))
    assert_df_equality(_bad_records(kept), expected, ignore_row_order=True, ignore_nullable=True)


def test_may_be_bad_only_keeps_flagged_and_unknown_records(spark: SparkSession) -> None:
    rows = spark.createDataFrame(
        [(1, True), (2, False), (3, None)], "queue_offset LONG, may_be_bad BOOLEAN"
    )
    kept = may_be_bad_only(rows).select("queue_offset")
    expected = spark.createDataFrame([(1,), (3,)], "queue_offset LONG")
    assert_df_equality(kept, expected, ignore_row_order=True, ignore_nullable=True)
    # Records without the flag (a read of the store or of segments) are all read.
    plain = rows.drop(MAY_BE_BAD)
    assert_df_equality(may_be_bad_only(plain), plain.filter(F.lit(True)), ignore_row_order=True)
