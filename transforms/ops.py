"""Op records -> the half offsets they name (spec section 3).

4.9 brokers write one decimal per op record (``"1234"``); 5.1+ brokers write a batch with
each item followed by a comma (``"7,9,8,"``, unsorted). Both are read the same way: split
on ``,``, drop empty items, parse each as a long. Only records tagged ``d`` name anything.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.messages import REMOVE_TAG
from transforms.parsing import parse_java_long

OP_ITEM_SEPARATOR = ","
ITEM_TEXT = "item_text"
HALF_OFFSET = "half_offset"
OP_OFFSET = "op_offset"
OP_STORE_MS = "op_store_ms"
# An op body whose items all parse as they are: digits and commas only, and no run of 19
# digits (which may be past a long). Read by ``may_hold_unparsable_item`` and by its Arrow
# form (``transforms.bad_records.may_be_bad_arrow``).
PLAIN_BODY = r"\A[0-9,]*\z"
LONG_RUN = "[0-9]{19}"


def is_remove_op() -> Column:
    """Only ``d`` (REMOVETAG) op records name half offsets; any other tag names nothing."""
    return F.col("tags") == REMOVE_TAG


def names_items() -> Column:
    """An op record whose body is read for items: a ``d`` record with a body."""
    return is_remove_op() & F.col("body").isNotNull()


def _items() -> Column:
    """The body's items, empty ones included, as strings."""
    # make_valid_utf8: invalid bytes become U+FFFD (decode() would fail the whole job).
    return F.split(F.make_valid_utf8(F.col("body").cast("string")), OP_ITEM_SEPARATOR)


def largest_item() -> Column:
    """The largest half offset an op record's items name (null when it names none: another
    tag, no body, no item that parses), read from its body: a reader of op records needs
    no aggregate of their exploded items joined back.

    An op record is *done* for a round when every item >= h0 is < h1; since h1 >= h0 that
    is exactly ``largest < h1``, so the largest item is all such a reader needs to know.
    """
    parsed = F.transform(_items(), parse_java_long)
    return F.when(names_items(), F.array_max(parsed))


def explode_op_items(ops: DataFrame) -> DataFrame:
    """One row per non-empty item of each ``d`` op body: the one place op bodies are split
    (the round does it once; the anomaly rules and the discard history read its items).
    The body is decoded as UTF-8; invalid bytes become replacement characters and so make
    the item unparsable rather than silently different.

    Returns ``broker, queue_id, op_offset, op_store_ms, source, position, item_text,
    half_offset``; ``half_offset`` is null for an item that does not parse (a bad record
    that names nothing). ``op_store_ms`` is the op record's store time: when the half
    record it names was resolved (its readers need no second join with the op records).
    """
    carried = (
        "broker",
        "queue_id",
        F.col("queue_offset").alias(OP_OFFSET),
        F.col("store_timestamp_ms").alias(OP_STORE_MS),
        "source",
        "position",
    )
    return (
        ops.filter(names_items())
        .select(*carried, F.explode(_items()).alias(ITEM_TEXT))
        .filter(F.col(ITEM_TEXT) != "")
        .withColumn(HALF_OFFSET, parse_java_long(F.col(ITEM_TEXT)))
    )


def may_hold_unparsable_item() -> Column:
    """True for every op record ``explode_op_items`` gives an item that does not parse (a
    bad record), read from its body in one pass, not split: a body that names items and
    holds anything but digits and commas (a sign, a space, invalid UTF-8, which Java reads
    as U+FFFD) or a run of 19 digits or more (which may be past a long) is flagged, so a
    few flagged records hold none. Two plain patterns, no lambda: a projection with it is
    compiled, not interpreted row by row. Never null."""
    text = F.col("body").cast("string")
    plain = text.rlike(PLAIN_BODY) & ~text.rlike(LONG_RUN)
    return F.coalesce(names_items() & ~plain, F.lit(False))


def named_offsets(op_items: DataFrame, *also: str) -> DataFrame:
    """``named`` of spec section 3: ``broker, queue_id, half_offset`` named by any op
    record, and the columns ``also`` of the op item naming it (``op_offset``: which op
    record; duplicates kept; consumers test membership with semi/anti joins, or aggregate)."""
    return op_items.filter(F.col(HALF_OFFSET).isNotNull()).select(
        "broker", "queue_id", HALF_OFFSET, *also
    )


def named_with_times(op_items: DataFrame) -> DataFrame:
    """``broker, queue_id, half_offset, op_store_ms``: ``named`` with the store time of the
    op record naming each offset (when that half record was resolved)."""
    return named_offsets(op_items, OP_STORE_MS)


def unparsable_items(op_items: DataFrame) -> DataFrame:
    """The items that do not parse, one row each: they are bad records."""
    return op_items.filter(F.col(HALF_OFFSET).isNull())
