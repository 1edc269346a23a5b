"""The stages of a round (spec sections 4-7), each a pure ``DataFrame -> DataFrame`` step.

``transforms.round.classify_round`` composes them in this order: round records (the input
contract) -> duplicates marked -> start offsets (``transforms.offsets``) -> records from
h0 -> resolution -> classes -> stop offsets and h1 -> statuses -> safe offsets -> op
offsets -> queue summary, with the bad records beside. None of them runs a Spark job:
what is cached or brought to the driver is the caller's decision (``Materializer``).

Scale notes: no stage walks a queue with a window (half queue 0 holds every
transaction, so a window per queue would be one task). The walk's stop rule is an
aggregate ("the smallest too-young offset"), done-ness of op records a comparison with
each record's largest named offset, and the first missing op offset the first
``offset + 1`` of a present offset that is not present itself, found by one aggregate per
op offset (``transforms.offsets.window_facts``). Per-queue facts are merged by one
aggregate over a union of their parts, not by joins (``transforms.merge``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.messages import OFFSET_UNIQUE, OP_TOPIC, UNUSED_BY_ROUND
from schemas.outputs import (
    BAD_RECORD,
    CHECK,
    CLASSES,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    NOT_REACHED,
    RESOLVED,
    TOO_YOUNG,
)
from transforms.bad_records import duplicate_records, unparsable_op_items, unparsable_properties
from transforms.classify import counter_after, with_round_class
from transforms.merge import Facts, carried, merged
from transforms.messages import QUEUE_KEY, is_half, is_op, mark_duplicates, with_half_fields
from transforms.offsets import p1_and_p_safe
from transforms.ops import OP_OFFSET, named_offsets, unparsable_items
from transforms.params import RoundParams
from transforms.picture import BAD_PLACES, bad_record_places, offset_hold
from transforms.queue_values import Attach, Floor, joined_floor, joined_values
from transforms.resolve import (
    SETTLED_BY,
    resolved_transactions,
    with_settled_by,
    with_transaction_key,
)

# Classes counted per queue from the statuses (resolved records are counted separately).
STATUS_COUNTS = tuple(name for name in CLASSES if name != RESOLVED)
# Statuses of unresolved records before h1: each bounds h_safe.
UNRESOLVED_BEFORE_H1 = (CHECK, IMMUNE, DISCARD_CHECK_MAX, DISCARD_EXPIRED)


def round_records(messages: DataFrame, params: RoundParams) -> DataFrame:
    """The input contract: half and op records with the derived half fields, the
    transaction key and ``offset_unique``, without the columns no later stage reads. Half
    bodies are kept only with ``include_body``."""
    if OFFSET_UNIQUE not in messages.columns:
        messages = messages.withColumn(OFFSET_UNIQUE, F.lit(False))
    records = messages.filter(is_half() | is_op())
    with_fields = with_transaction_key(with_half_fields(records))
    body = F.col("body") if params.include_body else F.when(is_op(), F.col("body"))
    return with_fields.drop(*UNUSED_BY_ROUND).withColumn("body", body)


def marked_records(records: DataFrame) -> DataFrame:
    """``records`` with ``duplicate_of`` (null for the record used, spec section 7) in
    place of ``offset_unique``; records flagged unique skip the check."""
    return mark_duplicates(records, F.col(OFFSET_UNIQUE)).drop(OFFSET_UNIQUE)


def records_from_h0(half: DataFrame, starts: DataFrame, floor: Floor = joined_floor) -> DataFrame:
    """Half records at offsets >= h0 of their queue: the only ones classified. ``floor``
    cuts them (the job's ``Materializer.floored`` is a condition the mirror's scan takes
    as a pushed filter)."""
    return floor(half, starts, "h0")


def read_bounds(starts: DataFrame) -> DataFrame:
    """``broker, queue_id, from_h0, below`` per queue, without reading a record:

    - ``from_h0``: at most this many half records from h0. Offsets of the records stored
      before T are below ``half_end`` and unique once duplicates are settled, so
      ``half_end - h0`` bounds them;
    - ``below``: about this many records lie below h0 and p0 (those read, less the offsets
      from h0 and from p0 to the ends): what reading from the floors can spare
      (``transforms.floors``).
    """
    from_h0 = F.greatest(F.coalesce(F.col("half_end") - F.col("h0"), F.lit(0)), F.lit(0))
    from_starts = (F.col("half_end") - F.col("h0")) + (F.col("op_end") - F.col("p0"))
    below = F.greatest(F.col("records_read") - F.coalesce(from_starts, F.lit(0)), F.lit(0))
    return starts.select(
        *QUEUE_KEY, from_h0.cast("long").alias("from_h0"), below.cast("long").alias("below")
    )


def settled_from_h0(
    linked: DataFrame, op_items: DataFrame, from_h0: DataFrame, small: bool
) -> DataFrame:
    """Records from h0 with ``settled_by_op_offset`` (rules 1-3; null: unresolved, really
    pending). Only the transactions of ``from_h0`` are resolved, from ``linked``, every
    half record of theirs (``transaction_records``: rule 3 reaches below h0 through them);
    ``small`` says ``from_h0`` may be broadcast."""
    settling = resolved_transactions(linked, named_offsets(op_items, OP_OFFSET), small=small)
    # Named transactions of the few records from h0 are fewer than their records: broadcast.
    return with_settled_by(from_h0, settling, small=small)


def unresolved(settled: DataFrame) -> DataFrame:
    """The records of ``settled_from_h0`` that are really pending, without the column."""
    return settled.filter(F.col(SETTLED_BY).isNull()).drop(SETTLED_BY)


def classified(unresolved: DataFrame, params: RoundParams) -> DataFrame:
    """Records with ``immunity_ms``, ``age_ms`` and ``round_class`` (spec 5)."""
    with_class = with_round_class(unresolved, params)
    return with_class.select(*unresolved.columns, "immunity_ms", "age_ms", "round_class")


def stop_facts(candidates: DataFrame) -> Facts:
    """``stop_offset``: the smallest too-young offset of each queue that has one (the
    broker's walk stops there)."""
    too_young = candidates.filter(F.col("round_class") == TOO_YOUNG)
    rows = too_young.select(*QUEUE_KEY, F.col("queue_offset").alias("_too_young"))
    return Facts(rows, (F.min("_too_young").alias("stop_offset"),))


def with_statuses(
    candidates: DataFrame, h1s: DataFrame, attach: Attach = joined_values
) -> DataFrame:
    """Candidates with ``status`` and ``counter_after`` in place of ``round_class``. Before
    h1 a record keeps its class; the too-young record at h1 stops the round; everything
    after it is not reached this round."""
    offset = F.col("queue_offset")
    status = (
        F.when(offset < F.col("h1"), F.col("round_class"))
        .when(offset == F.col("stop_offset"), F.lit(TOO_YOUNG))
        .otherwise(F.lit(NOT_REACHED))
    )
    kept = [name for name in candidates.columns if name != "round_class"]
    return (
        attach(candidates, h1s, ["h1", "stop_offset"])
        .withColumn("status", status)
        .select(*kept, "status", counter_after(F.col("status")).alias("counter_after"))
    )


def status_facts(pending: DataFrame, params: RoundParams) -> Facts:
    """Per queue: a count per status, ``first_unresolved`` (bounds h_safe) and
    ``first_live_copy`` (for the discard forecast)."""
    # Every unresolved record before h1 bounds h_safe, discards included (spec 2026-11-23):
    # this job writes neither put-back copies nor TRANS_CHECK_MAX_TIME_TOPIC, so installing
    # an offset past any of them would lose it (a wrong --as-of can make all "expired").
    before_h1 = F.col("_status").isin(*UNRESOLVED_BEFORE_H1)
    # The first put-back whose copy the broker does not discard on sight (its fresh copy
    # ends the broker's loop).
    live_copy = F.col("_status").isin(CHECK, IMMUNE) & (F.col("_counter_after") < params.check_max)
    rows = pending.select(
        *QUEUE_KEY,
        F.col("queue_offset").alias("_offset"),
        F.col("status").alias("_status"),
        F.col("counter_after").alias("_counter_after"),
    )
    return Facts(
        rows,
        (
            *[F.count(F.when(F.col("_status") == name, 1)).alias(name) for name in STATUS_COUNTS],
            F.min(F.when(before_h1, F.col("_offset"))).alias("first_unresolved"),
            F.min(F.when(live_copy, F.col("_offset"))).alias("first_live_copy"),
        ),
    )


def round_bad_records(
    marked: DataFrame, op_items: DataFrame, half: DataFrame, bad_input: DataFrame | None
) -> DataFrame:
    """``BAD_RECORD`` rows: the readers' (``bad_input``), duplicates, unparsable op items,
    unparsable half properties (spec section 7)."""
    parts = [
        duplicate_records(marked),
        unparsable_op_items(unparsable_items(op_items), OP_TOPIC),
        unparsable_properties(half),
    ]
    if bad_input is not None:
        parts.insert(0, bad_input)
    bad_records = parts[0].select(*BAD_RECORD.fieldNames())
    for part in parts[1:]:
        bad_records = bad_records.unionByName(part.select(*BAD_RECORD.fieldNames()))
    return bad_records


def no_duplicates(marked: DataFrame) -> DataFrame:
    """The records used: duplicates dropped, ``duplicate_of`` gone."""
    return marked.filter(F.col("duplicate_of").isNull()).drop("duplicate_of")


# A null queue id (unknown queue) never matches in a join: it stands as -1 (no real queue
# id is negative) so that one summary row carries both its counts and its notes.
_UNKNOWN_QUEUE = -1

NOTE = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("warning", T.StringType()),
    ]
)


def _no_warnings() -> Column:
    return F.array().cast("array<string>")


def _known_queue() -> Column:
    return F.coalesce(F.col("queue_id"), F.lit(_UNKNOWN_QUEUE)).alias("queue_id")


def bad_record_facts(bad_records: DataFrame) -> Facts:
    """``bad_records`` per queue (queue -1 for an unknown queue), and where they lie
    (``transforms.picture.bad_record_places``: what holds a queue's offsets)."""
    keyed = bad_records.select("broker", _known_queue(), "topic", "queue_offset")
    places = bad_record_places(keyed)
    rows = places.rows.withColumn("_bad", F.lit(1))
    return Facts(rows, (F.count("_bad").alias("bad_records"), *places.aggregates))


def note_facts(notes: DataFrame) -> Facts:
    """``queue_notes`` per queue (sorted; queue -1 for a whole broker)."""
    rows = notes.select("broker", _known_queue(), F.col("warning").alias("_note"))
    return Facts(rows, (F.array_sort(F.collect_list("_note")).alias("queue_notes"),))


def queue_summary(queues: DataFrame, *facts: Facts) -> DataFrame:
    """One row per queue: offsets, class counts, bad records, warnings and
    ``offset_hold`` (``transforms.picture``: why its offsets must not be installed, or
    null) (``RoundState``). ``queues`` has the offsets up to h_safe and the status counts;
    ``facts`` are ``window_facts`` (``transforms.offsets``), ``bad_record_facts`` and
    ``note_facts``, merged in one aggregate.

    Bad records and reader notes of queues outside the domain (e.g. a queue whose only
    record is unreadable, or a corrupt commit-log region with no queue) still get a row:
    nothing is dropped silently."""
    joined = merged(carried(queues), *facts, outer=True)
    counts = {name: F.coalesce(F.col(name), F.lit(0)).cast("long") for name in STATUS_COUNTS}
    unresolved = sum((counts[name] for name in UNRESOLVED_BEFORE_H1), F.lit(0))
    resolved = F.coalesce(F.col("in_window"), F.lit(0)) - unresolved
    summary = joined.select(
        "broker",
        F.when(F.col("queue_id") != _UNKNOWN_QUEUE, F.col("queue_id")).alias("queue_id"),
        "h_committed",
        "h0",
        "h1",
        "h_safe",
        "p_committed",
        "p0",
        *p1_and_p_safe(),
        F.when(F.col("h0").isNotNull(), resolved).otherwise(F.lit(0)).cast("long").alias(RESOLVED),
        *[column.alias(name) for name, column in counts.items()],
        F.coalesce(F.col("bad_records"), F.lit(0)).cast("long").alias("bad_records"),
        F.concat(
            F.coalesce(F.col("offset_warnings"), _no_warnings()),
            F.coalesce(F.col("queue_notes"), _no_warnings()),
        ).alias("warnings"),
        F.col("stop_offset").alias("stopped_at"),
        "first_live_copy",
        "newest_ms",
        F.coalesce(F.col("records_read"), F.lit(0)).alias("records_read"),
        *BAD_PLACES,
    )
    # Decided over the offsets just computed (p1 and p_safe are the select's own columns).
    return summary.withColumn("offset_hold", offset_hold()).drop(*BAD_PLACES)
