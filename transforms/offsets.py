"""Where each queue's round starts (spec section 1): committed offsets, corrected by what
the queue actually holds."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.messages import HALF_TOPIC, OP_TOPIC, TRANS_GROUP
from transforms.merge import Facts, carried, merged
from transforms.messages import QUEUE_KEY, stored_before
from transforms.ops import HALF_OFFSET, OP_OFFSET, is_remove_op
from transforms.params import RoundParams
from transforms.queue_values import Attach, joined_values, per_broker

TOPIC_QUEUE_KEY = ["broker", "topic", "queue_id"]
TRANSACTION_TOPICS = (HALF_TOPIC, OP_TOPIC)


def _topic_rows(readable: DataFrame, committed: DataFrame) -> DataFrame:
    """Both topics' records (``queue_offset``, ``store_timestamp_ms``) and committed offsets
    (``committed``) as rows of one frame, keyed by ``broker, topic, queue_id``."""
    records = readable.filter(F.col("topic").isin(*TRANSACTION_TOPICS)).select(
        *TOPIC_QUEUE_KEY, "queue_offset", "store_timestamp_ms"
    )
    offsets = committed.filter(F.col("topic").isin(*TRANSACTION_TOPICS)).select(
        *TOPIC_QUEUE_KEY, F.col("offset").alias("committed")
    )
    return records.unionByName(offsets, allowMissingColumns=True)


def queue_bounds(rows: DataFrame, as_of_ms: int | None) -> DataFrame:
    """Per (broker, queue_id) of any record or committed offset of either topic (the
    domain), for each topic (``h_``, ``p_``): ``smallest`` available offset (any store
    time), ``largest`` offset stored before T and ``committed``; ``newest_ms``, the
    newest store time before T of either topic (read by the stale-store warning, so that
    it needs no pass of its own); and ``records_read``, the records of both topics. One
    aggregate over ``_topic_rows``: the domain, the bounds and the committed offsets were
    three shuffles and two joins. ``as_of_ms`` None: every record with a store time, the
    bounds at any T after the newest record (``latest``, found from ``newest_ms``)."""
    before = (
        stored_before(as_of_ms) if as_of_ms is not None else F.col("store_timestamp_ms").isNotNull()
    )

    aggregates = []
    for prefix, topic in (("h_", HALF_TOPIC), ("p_", OP_TOPIC)):
        in_topic = F.col("topic") == topic
        aggregates += [
            F.min(F.when(in_topic, F.col("queue_offset"))).alias(prefix + "smallest"),
            F.max(F.when(in_topic & before, F.col("queue_offset"))).alias(prefix + "largest"),
            F.max(F.when(in_topic, F.col("committed"))).alias(prefix + "committed"),
        ]
    newest = F.max(F.when(before, F.col("store_timestamp_ms"))).alias("newest_ms")
    # The records the queue's read gave (any store time), for the job's progress line.
    records = F.count("queue_offset").alias("records_read")
    return rows.groupBy(*QUEUE_KEY).agg(*aggregates, newest, records)


def _start(committed: Column, smallest: Column, end: Column) -> Column:
    has_records = smallest.isNotNull()
    return (
        F.when(~has_records, F.coalesce(committed, F.lit(0).cast("long")))
        .when(committed.isNull(), smallest)
        .when(committed < smallest, smallest)
        .when(committed > end, end)
        .otherwise(committed)
    )


def _warning(topic: str, committed: Column, smallest: Column, end: Column) -> Column:
    where = F.concat_ws(" ", F.lit(topic), F.lit("queue"), F.col("queue_id").cast("string"))
    below = F.format_string(
        "%s: committed offset %d is below the smallest available offset %d; starting at %d",
        where,
        committed,
        smallest,
        smallest,
    )
    beyond = F.format_string(
        "%s: committed offset %d is beyond the queue's end %d at the as-of time; starting at %d",
        where,
        committed,
        end,
        end,
    )
    return F.when(smallest.isNotNull() & (committed < smallest), below).when(
        smallest.isNotNull() & (committed > end), beyond
    )


def queue_starts(bounds: DataFrame) -> DataFrame:
    """One row per (broker, queue_id): ``h_committed, h0, half_end, p_committed, p0,
    op_end, offset_warnings`` (sorted, possibly empty), ``newest_ms``, ``records_read``. A
    topic's end is 1 +
    its largest offset before T, else its smallest; its start is the committed offset
    brought inside [smallest, end]; a queue without records of a topic starts and ends at
    its committed offset (else 0): nothing is left to read."""
    columns, warnings = [], []
    for prefix, topic, start, end in (
        ("h_", HALF_TOPIC, "h0", "half_end"),
        ("p_", OP_TOPIC, "p0", "op_end"),
    ):
        committed, smallest = F.col(prefix + "committed"), F.col(prefix + "smallest")
        available_end = F.coalesce(F.col(prefix + "largest") + 1, smallest)
        first = _start(committed, smallest, available_end)
        columns += [
            committed.alias(prefix + "committed"),
            first.alias(start),
            F.coalesce(available_end, first).alias(end),
        ]
        warnings.append(_warning(topic, committed, smallest, available_end))
    found = F.filter(F.array(*warnings), lambda warning: warning.isNotNull())
    return bounds.select(
        *QUEUE_KEY,
        *columns,
        F.array_sort(found).alias("offset_warnings"),
        "newest_ms",
        "records_read",
    )


def _missing_warning(topic: str, committed: str, start: str) -> Column:
    # The queue started at its head: an operator must know the picture is not the broker's
    # (which would have started from its committed offset).
    missing = F.format_string(
        "%s queue %d: no committed offset (key %s@%s) in %s; starting at the queue's smallest"
        " available offset %d",
        F.lit(topic),
        F.col("queue_id"),
        F.lit(topic),
        F.lit(TRANS_GROUP),
        F.coalesce(F.col("offsets_file"), F.lit("no offsets file")),
        F.col(start),
    )
    return F.when(F.col(committed).isNull() & F.col(start).isNotNull(), missing)


# (broker, offsets file used, why the usual file was not used or None), per broker.
OffsetsFile = tuple[str, str, str | None]


def with_missing_offset_warnings(queues: DataFrame, files: Sequence[OffsetsFile]) -> DataFrame:
    """Append to ``warnings`` of each queue row (``h_committed``, ``h0``, ``p_committed``,
    ``p0``) a warning per topic whose committed offset is missing, naming the offsets file
    used and the queue, and the reason the usual file was not used when it was not
    (``files``: ``broker, offsets_file, offsets_note`` per broker; spec section 1)."""
    # A literal per broker, not a join (a broadcast is a Spark job).
    named = queues.withColumn(
        "offsets_file", per_broker({row[0]: row[1] for row in files}, "string")
    ).withColumn("offsets_note", per_broker({row[0]: row[2] for row in files}, "string"))
    # Why the usual file was not used (the .bak, or none usable), on every queue it
    # concerns: a store without any queue gets no summary row for it.
    file_note = F.when(
        F.col("offsets_note").isNotNull() & F.col("h0").isNotNull(),
        F.format_string("queue %d: %s", F.col("queue_id"), F.col("offsets_note")),
    )
    found = F.filter(
        F.array(
            file_note,
            _missing_warning(HALF_TOPIC, "h_committed", "h0"),
            _missing_warning(OP_TOPIC, "p_committed", "p0"),
        ),
        lambda warning: warning.isNotNull(),
    )
    return named.withColumn("warnings", F.concat(F.col("warnings"), found)).select(*queues.columns)


# -- where the round ends: h1, h_safe (half queue), p1, p_safe (op queue) ------------------


def round_bounds(readable: DataFrame, committed: DataFrame, as_of_ms: int | None) -> DataFrame:
    """``queue_bounds`` of the readable records (any store time) and the committed offsets."""
    return queue_bounds(_topic_rows(readable, committed), as_of_ms)


def round_starts(readable: DataFrame, committed: DataFrame, as_of_ms: int) -> DataFrame:
    """h0 and p0 of every queue of the domain (``queue_starts`` columns), from the readable
    records (any store time) and the committed offsets."""
    return queue_starts(round_bounds(readable, committed, as_of_ms))


def with_h1(starts: DataFrame, stops: Facts) -> DataFrame:
    """``starts`` plus ``stop_offset`` (the smallest too-young offset from h0, from
    ``stops``; null when none) and ``h1``: the stop offset, else the half queue's end."""
    joined = merged(carried(starts), stops)
    h1 = F.coalesce(F.col("stop_offset"), F.col("half_end"))
    return joined.select(*starts.columns, "stop_offset", h1.alias("h1"))


def with_h_safe(queues: DataFrame, per_status: Facts) -> DataFrame:
    """``queues`` (with ``h1``) plus the aggregates of ``per_status`` and ``h_safe``: h1,
    or the first unresolved record before it (``first_unresolved``) when that is smaller."""
    joined = merged(carried(queues), per_status)
    extra = [name for name in joined.columns if name not in queues.columns]
    h_safe = F.least(F.col("h1"), F.col("first_unresolved"))
    return joined.select(*queues.columns, *extra, h_safe.alias("h_safe"))


# Columns of the rows ``window_rows`` joins with the per-queue window.
_KIND, _OFFSET = "_kind", "_offset"
_HALF, _OP, _NEXT, _ITEM = "half", "op", "next", "item"
WINDOW = ("h0", "h1", "h_safe", "p0", "op_end")


def window_rows(
    half: DataFrame,
    ops: DataFrame,
    op_items: DataFrame,
    window: DataFrame,
    params: RoundParams,
    attach: Attach = joined_values,
) -> DataFrame:
    """What the round's end offsets read, as rows of one frame joined once with the
    per-queue ``window`` (``broker, queue_id`` and ``WINDOW``): half records in [h0, h1)
    (kind ``half``), op records from p0 (``op``, with ``stalls``), each op offset's
    successor (``next``) and each named offset of an op record from p0 (``item``, the
    offset in ``named``). One ``attach`` for all of them: a broadcast is a Spark job."""
    # A 4.9 broker never marks an op record of another tag done: its op offset stays there
    # for good (p1). Passing it loses nothing, so p_safe does not stop there.
    stalls = F.lit(params.broker_version == "4.9") & ~F.coalesce(is_remove_op(), F.lit(False))
    offset = F.col("queue_offset")
    parts = [
        half.select(*QUEUE_KEY, F.lit(_HALF).alias(_KIND), offset.alias(_OFFSET)),
        ops.select(
            *QUEUE_KEY, F.lit(_OP).alias(_KIND), offset.alias(_OFFSET), stalls.alias("stalls")
        ),
        ops.select(*QUEUE_KEY, F.lit(_NEXT).alias(_KIND), (offset + 1).alias(_OFFSET)),
        op_items.filter(F.col(HALF_OFFSET).isNotNull()).select(
            *QUEUE_KEY,
            F.lit(_ITEM).alias(_KIND),
            F.col(OP_OFFSET).alias(_OFFSET),
            F.col(HALF_OFFSET).alias("named"),
        ),
    ]
    rows = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    at = F.col(_OFFSET)
    kind = F.col(_KIND)
    wanted = (
        ((kind == _HALF) & (at >= F.col("h0")) & (at < F.col("h1")))
        | (kind.isin(_OP, _ITEM) & (at >= F.col("p0")))
        # a successor of an op record from p0
        | ((kind == _NEXT) & (at > F.col("p0")))
    )
    return attach(rows, window, WINDOW).filter(wanted)


def window_facts(rows: DataFrame) -> Facts:
    """Per queue, from ``window_rows``: ``in_window``, the half records in [h0, h1)
    (resolved ones are these minus the unresolved ones); ``first_present``, the first op
    offset from p0; ``first_not_done`` and ``first_not_done_safe``, the first whose largest
    named offset reaches h1, resp. h_safe, or that stalls (done is ``max_named < h1``:
    every item >= h0 must be < h1); ``first_gap``, the first offset inside [p0, op_end)
    whose predecessor is present and which is not.

    One aggregate per offset, then per queue: no window over the queue, no join of the
    records. Half and op rows go through the same aggregates (a half offset apart from an
    op one): split, the optimiser prunes each branch's broadcast of the window
    differently, and each broadcast is a Spark job."""
    kind = F.col(_KIND)
    per_offset = rows.groupBy(
        *QUEUE_KEY, _OFFSET, (kind == _HALF).alias("_is_half"), "h1", "h_safe", "op_end"
    ).agg(
        F.max(kind == _OP).alias("present"),
        F.max(kind == _NEXT).alias("successor"),
        F.max("stalls").alias("stalls"),
        F.max("named").alias("max_named"),
    )
    at, present = F.col(_OFFSET), F.col("present")
    not_done = present & ((F.col("max_named") >= F.col("h1")) | F.col("stalls"))
    not_done_safe = present & (F.col("max_named") >= F.col("h_safe"))
    gap = F.col("successor") & ~present & (at < F.col("op_end"))
    firsts = per_offset.select(
        *QUEUE_KEY,
        F.when(F.col("_is_half"), 1).alias("_in_window"),
        F.when(present, at).alias("_present"),
        F.when(not_done, at).alias("_not_done"),
        F.when(not_done_safe, at).alias("_not_done_safe"),
        F.when(gap, at).alias("_gap"),
    )
    return Facts(
        firsts,
        (
            F.count("_in_window").alias("in_window"),
            F.min("_present").alias("first_present"),
            F.min("_not_done").alias("first_not_done"),
            F.min("_not_done_safe").alias("first_not_done_safe"),
            F.min("_gap").alias("first_gap"),
        ),
    )


def p1_and_p_safe() -> list[Column]:
    """``p1`` and ``p_safe`` from ``window_facts``' columns and ``p0, op_end``: the
    first op offset >= p0 that is missing or not done (with h1, resp. h_safe), else the op
    queue's end."""
    p0_missing = F.col("first_present").isNull() | (F.col("first_present") > F.col("p0"))
    first_missing = F.when(p0_missing, F.col("p0")).otherwise(F.col("first_gap"))
    return [
        F.least(first_missing, F.col("first_not_done"), F.col("op_end")).alias("p1"),
        F.least(first_missing, F.col("first_not_done_safe"), F.col("op_end")).alias("p_safe"),
    ]
