"""The discard history's inputs, before its rules (``transforms.discard_history``): which
discard records are used, which are bad records, which real queues they name, and which
bad records the round reported already.

Stage order: ``usable_discards`` (queue 0, no duplicate; the rest bad records) ->
``named_real_queues`` (what the job reads next, per queue, with the records before T) ->
``not_reported`` (a broken record met by both the round's read and the discard read is one
bad record).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.messages import DISCARD_TOPIC
from schemas.outputs import BAD_RECORD
from transforms.bad_records import duplicate_records, unparsable_properties
from transforms.messages import mark_duplicates, stored_before, with_half_fields

# Where a bad record is: the same broken record found by two reads is one bad record.
BAD_PLACE = ["broker", "source", "position"]


def other_queue_records(records: DataFrame) -> DataFrame:
    """Bad records: a record of another queue than 0 (the broker creates one queue), whose
    offset would collide with queue 0's in the table's key."""
    reason = F.format_string(
        "%s has one queue (0): a record of queue %d is not used",
        F.lit(DISCARD_TOPIC),
        F.col("queue_id"),
    )
    return records.filter(F.col("queue_id") != 0).select(
        "broker",
        "source",
        "position",
        "topic",
        "queue_id",
        "queue_offset",
        reason.alias("reason"),
        F.lit(None).cast("string").alias("raw_hex"),
    )


def usable_discards(
    records: DataFrame, bad_input: DataFrame, as_of_ms: int
) -> tuple[DataFrame, DataFrame]:
    """(discard records used, every bad discard record): duplicates and unparsable
    properties of records stored before T are bad records like the half records', and so
    is a record of another queue than 0. ``bad_input``: the reader's own bad records."""
    marked = mark_duplicates(records.filter(F.col("queue_id") == 0))
    usable = marked.filter(F.col("duplicate_of").isNull()).drop("duplicate_of")
    fields = with_half_fields(usable.filter(stored_before(as_of_ms)))
    bad = (
        bad_input.select(*BAD_RECORD.fieldNames())
        .unionByName(other_queue_records(records))
        .unionByName(duplicate_records(marked))
        .unionByName(unparsable_properties(fields))
    )
    return usable, bad


def named_real_queues(
    usable: DataFrame,
    as_of_ms: int,
    kept: DataFrame | None = None,
    carried: DataFrame | None = None,
) -> DataFrame:
    """Per (broker, real topic, real queue id) the discard records before T name, how many
    records name it (``records``), how many of them are still open (``open_records``:
    without a row in ``kept``, the final rows earlier runs decided, ``DISCARD_KEY``) and
    how many open ones are decided against what arrived since (``carried_records``: in
    ``carried``, ``DISCARD_KEY``); records naming none count in a row of nulls: one row per
    named queue and per broker, whose sum is every discard record before T."""
    records = with_half_fields(usable.filter(stored_before(as_of_ms)))
    is_open, is_carried = F.lit(True), F.lit(False)
    if kept is not None:
        records = records.join(_marks(kept, "_kept"), on=["broker", "queue_offset"], how="left")
        is_open = F.col("_kept").isNull()
    if carried is not None:
        records = records.join(
            _marks(carried, "_carried"), on=["broker", "queue_offset"], how="left"
        )
        is_carried = is_open & F.col("_carried").isNotNull()
    return records.groupBy("broker", "real_topic", "real_queue_id").agg(
        F.count(F.lit(1)).alias("records"),
        F.count(F.when(is_open, 1)).alias("open_records"),
        F.count(F.when(is_carried, 1)).alias("carried_records"),
    )


def _marks(rows: DataFrame, flag: str) -> DataFrame:
    """``rows``' discard records (``DISCARD_KEY``) as the discard topic's places, flagged."""
    offset = F.col("discard_offset").alias("queue_offset")
    return rows.select("broker", offset, F.lit(True).alias(flag))


def not_reported(bad: DataFrame, reported: DataFrame, place_pattern: str) -> DataFrame:
    """``bad`` (the discard read's bad records) less the ones the round reported already
    (``reported``): a commit-log scan for the discard topic meets every broken record of
    the file, and one the round met through a consume queue is one bad record, not two.
    The round reports it at its commit-log place (a truncated tail) or, when no record
    starts there (a bad magic code), at the consume-queue entry whose reason names that
    place (``place_pattern``: the reader's wording, groups 1 and 2 the file and position)."""
    # try_cast, though the filter keeps only reasons whose group 2 is a number: a reason
    # that is a literal in the plan (a fixed wording) is folded by the optimiser before any
    # filter runs, and a strict cast of its empty group fails the whole query.
    named = reported.filter(F.col("reason").rlike(place_pattern)).select(
        "broker",
        F.regexp_extract("reason", place_pattern, 1).alias("source"),
        F.regexp_extract("reason", place_pattern, 2).try_cast("long").alias("position"),
    )
    places = reported.select(*BAD_PLACE).unionByName(named).distinct()
    return bad.join(places, on=BAD_PLACE, how="left_anti")
