"""Bad records found by the round itself (spec section 7): duplicates, unparsable op items,
unparsable half properties. Readers report what they could not decode; these are records
that decoded but cannot be used as they are."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.messages import (
    HALF_TOPIC,
    MAY_BE_BAD,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_PREPARED_QUEUE_OFFSET,
    PROP_REAL_QUEUE_ID,
    REMOVE_TAG,
)
from schemas.outputs import BAD_RECORD
from transforms.messages import is_half, is_op
from transforms.ops import (
    ITEM_TEXT,
    LONG_RUN,
    OP_OFFSET,
    PLAIN_BODY,
    may_hold_unparsable_item,
)
from transforms.parsing import is_unparsable, parse_java_int, parse_java_long

RAW_HEX_BYTES = 64
_QUOTED_TEXT_CHARS = 64


def _raw_hex(text: Column) -> Column:
    return F.upper(
        F.hex(F.substring(F.encode(text, "UTF-8").cast(T.BinaryType()), 1, RAW_HEX_BYTES))
    )


def _bad_record(
    broker: Column,
    source: Column,
    position: Column,
    topic: Column,
    queue_id: Column,
    queue_offset: Column,
    reason: Column,
    raw_hex: Column,
) -> list[Column]:
    values = [broker, source, position, topic, queue_id, queue_offset, reason, raw_hex]
    return [
        value.cast(field.dataType).alias(field.name)
        for value, field in zip(values, BAD_RECORD.fields, strict=True)
    ]


def _quoted(text: Column) -> Column:
    return F.concat(F.lit("'"), F.substring(text, 1, _QUOTED_TEXT_CHARS), F.lit("'"))


def duplicate_records(marked: DataFrame) -> DataFrame:
    """Records that lost to another record with the same (broker, topic, queue, offset)."""
    reason = F.format_string(
        "duplicate queue offset: the record at commit-log offset %d is used instead",
        F.col("duplicate_of"),
    )
    return marked.filter(F.col("duplicate_of").isNotNull()).select(
        *_bad_record(
            F.col("broker"),
            F.col("source"),
            F.col("position"),
            F.col("topic"),
            F.col("queue_id"),
            F.col("queue_offset"),
            reason,
            F.lit(None),
        )
    )


def unparsable_op_items(bad_items: DataFrame, op_topic: str) -> DataFrame:
    """One bad record per op body item that is not a long (it names nothing)."""
    reason = F.concat(F.lit("unparsable op body item "), _quoted(F.col(ITEM_TEXT)))
    return bad_items.select(
        *_bad_record(
            F.col("broker"),
            F.col("source"),
            F.col("position"),
            F.lit(op_topic),
            F.col("queue_id"),
            F.col(OP_OFFSET),
            reason,
            _raw_hex(F.col(ITEM_TEXT)),
        )
    )


# Text every int / long parser reads as it is: a minus sign at most, and few enough digits
# to be within range whatever they are (``may_be_bad_arrow``).
_PLAIN_INT = r"\A-?[0-9]{1,9}\z"
_PLAIN_LONG = r"\A-?[0-9]{1,18}\z"

# Half properties that must parse, with the parser the round uses for them and the text
# that always parses. Not the immunity property: the broker reads an unparsable one as the
# transaction timeout, as the round does, so its record takes part in the round (an
# ``unparsable_immunity`` finding, ``transforms.anomaly_rules.pending``), which is what a
# bad record does not.
_CHECKED_PROPERTIES: tuple[tuple[str, str, object, str], ...] = (
    (PROP_CHECK_TIMES, "check_times_raw", parse_java_int, _PLAIN_INT),
    (PROP_REAL_QUEUE_ID, "real_queue_id_raw", parse_java_int, _PLAIN_INT),
    (PROP_PREPARED_QUEUE_OFFSET, "prepared_queue_offset_raw", parse_java_long, _PLAIN_LONG),
)


def _has_unparsable_property() -> Column:
    """A half record with a checked property present and unparsable (never null)."""
    found = F.lit(False)
    for _, raw, parser, _ in _CHECKED_PROPERTIES:
        found = found | is_unparsable(F.col(raw), parser(F.col(raw)))  # type: ignore[operator]
    return found


def unparsable_properties(half: DataFrame) -> DataFrame:
    """One bad record per unparsable counter, REAL_QID or prepared offset of a half record
    (``half`` carries the ``*_raw`` columns of ``with_half_fields``)."""
    problem = T.StructType(
        [T.StructField("reason", T.StringType()), T.StructField("raw", T.StringType())]
    )
    problems = F.array(
        *[
            F.when(
                is_unparsable(F.col(raw), parser(F.col(raw))),  # type: ignore[operator]
                F.struct(
                    F.concat(F.lit(f"unparsable {name} "), _quoted(F.col(raw))).alias("reason"),
                    F.col(raw).alias("raw"),
                ),
            ).cast(problem)
            for name, raw, parser, _ in _CHECKED_PROPERTIES
        ]
    )
    # Cheap pre-filter: a record with every checked property absent or parsed (nearly all)
    # never reaches the array and explode below.
    return (
        half.filter(_has_unparsable_property())
        .select(
            "broker",
            "source",
            "position",
            "topic",
            "queue_id",
            "queue_offset",
            F.explode(F.filter(problems, lambda p: p.isNotNull())).alias("problem"),
        )
        .select(
            *_bad_record(
                F.col("broker"),
                F.col("source"),
                F.col("position"),
                F.col("topic"),
                F.col("queue_id"),
                F.col("queue_offset"),
                F.col("problem.reason"),
                _raw_hex(F.col("problem.raw")),
            )
        )
    )


def may_be_bad() -> Column:
    """``MAY_BE_BAD`` of a lean record: true for every record ``unparsable_properties`` or
    the op items' bad records find something in (a half record with an unparsable checked
    property, an op record with an item that does not parse: ``may_hold_unparsable_item``,
    which also flags a few that hold none), false for any other record. A fact of the
    record alone, derived once when it is mirrored."""
    half = is_half() & _has_unparsable_property()
    op = is_op() & may_hold_unparsable_item()
    return F.coalesce(half | op, F.lit(False))


def may_be_bad_arrow(records: pa.RecordBatch) -> pa.Array:
    """``may_be_bad`` of a batch of decoded records (lean or combined, with the columns the
    rule reads), for the mirror's tasks, which derive the flag as they write its files with
    no Spark (``connectors.mirror_write``). It flags every record ``may_be_bad`` flags, and
    a few more: a checked property counts as parsable only in the plain text every parser
    reads (``_PLAIN_INT``, ``_PLAIN_LONG``), so a sign or a long number within range is
    flagged too. Never null. The tests hold the two forms to each other."""
    topic = records.column("topic")
    unplain_property = pa.scalar(False)
    for _, raw, _, plain in _CHECKED_PROPERTIES:
        text = records.column(raw)
        unplain = pc.and_kleene(pc.is_valid(text), pc.invert(pc.match_substring_regex(text, plain)))
        unplain_property = pc.or_kleene(unplain_property, unplain)
    half = pc.and_kleene(pc.equal(topic, HALF_TOPIC), unplain_property)
    body = records.column("body")
    plain_body = pc.and_kleene(
        pc.match_substring_regex(body, PLAIN_BODY),
        pc.invert(pc.match_substring_regex(body, LONG_RUN)),
    )
    names = pc.and_kleene(pc.equal(records.column("tags"), REMOVE_TAG), pc.is_valid(body))
    op = pc.and_kleene(pc.and_kleene(pc.equal(topic, OP_TOPIC), names), pc.invert(plain_body))
    return pc.fill_null(pc.or_kleene(half, op), False)


def may_be_bad_columns(records: pa.RecordBatch) -> list[pa.Array]:
    """``MAY_BE_BAD_FIELDS``' columns of a batch of decoded records, as the mirror derives
    them (``connectors.mirror.Derived``)."""
    return [may_be_bad_arrow(records)]


def with_may_be_bad(records: DataFrame) -> DataFrame:
    """``records`` (lean, or the mirror's combined rows) with ``MAY_BE_BAD``."""
    return records.withColumn(MAY_BE_BAD, may_be_bad())


def may_be_bad_only(records: DataFrame) -> DataFrame:
    """The ``records`` the round's bad records are looked for in: every one without the
    ``MAY_BE_BAD`` column; with it, those flagged or mirrored before it existed (null).
    A plain condition: the mirror's scan takes it as a pushed filter and skips the files
    and row groups that hold no such record."""
    if MAY_BE_BAD not in records.columns:
        return records
    flag = F.col(MAY_BE_BAD)
    return records.filter(flag.isNull() | flag)
