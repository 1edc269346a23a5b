"""Where each queue's round starts (spec section 1): committed offsets, corrected by what
the queue actually holds."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.messages import HALF_TOPIC, OP_TOPIC, TRANS_GROUP
from transforms.messages import QUEUE_KEY, stored_before
from transforms.ops import OP_OFFSET, is_remove_op, largest_named_offset
from transforms.params import RoundParams

TOPIC_QUEUE_KEY = ["broker", "topic", "queue_id"]
TRANSACTION_TOPICS = (HALF_TOPIC, OP_TOPIC)


def queue_bounds(readable: DataFrame, as_of_ms: int) -> DataFrame:
    """Per (broker, topic, queue_id): ``smallest`` available offset (any store time),
    ``end`` at T (1 + the largest offset stored before T, else the smallest available) and
    ``newest_ms``, the newest store time before T (read by the stale-store warning, so
    that it needs no pass of its own over the records)."""
    before = stored_before(as_of_ms)
    return (
        readable.filter(F.col("topic").isin(*TRANSACTION_TOPICS))
        .groupBy(*TOPIC_QUEUE_KEY)
        .agg(
            F.min("queue_offset").alias("smallest"),
            F.max(F.when(before, F.col("queue_offset"))).alias("largest_before"),
            F.max(F.when(before, F.col("store_timestamp_ms"))).alias("newest_ms"),
        )
        .select(
            *TOPIC_QUEUE_KEY,
            "smallest",
            F.coalesce(F.col("largest_before") + 1, F.col("smallest")).alias("end"),
            "newest_ms",
        )
    )


def queue_domain(bounds: DataFrame, committed: DataFrame) -> DataFrame:
    """Every (broker, queue_id) with half or op records or a committed offset of either topic."""
    from_records = bounds.select(*QUEUE_KEY)
    from_offsets = committed.filter(F.col("topic").isin(*TRANSACTION_TOPICS)).select(*QUEUE_KEY)
    return from_records.unionByName(from_offsets).distinct()


def _start(committed: Column, smallest: Column, end: Column) -> Column:
    has_records = smallest.isNotNull()
    return (
        F.when(~has_records, F.coalesce(committed, F.lit(0).cast("long")))
        .when(committed.isNull(), smallest)
        .when(committed < smallest, smallest)
        .when(committed > end, end)
        .otherwise(committed)
    )


def _warning(
    topic: Column, queue_id: Column, committed: Column, smallest: Column, end: Column
) -> Column:
    where = F.concat_ws(" ", topic, F.lit("queue"), queue_id.cast("string"))
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


def start_offsets(domain: DataFrame, bounds: DataFrame, committed: DataFrame) -> DataFrame:
    """Per (broker, topic, queue_id) of the domain, both topics: ``committed`` (null when
    missing), ``start`` (h0 / p0), ``end`` (``start`` when the queue has no readable
    record: nothing is left to read), ``warning`` (null when none) and ``newest_ms``."""
    topics = F.explode(F.array(*[F.lit(topic) for topic in TRANSACTION_TOPICS])).alias("topic")
    per_topic = domain.select(*QUEUE_KEY, topics)
    committed_offsets = committed.select(*TOPIC_QUEUE_KEY, F.col("offset").alias("committed"))
    joined = per_topic.join(bounds, TOPIC_QUEUE_KEY, how="left").join(
        committed_offsets, TOPIC_QUEUE_KEY, how="left"
    )
    start = _start(F.col("committed"), F.col("smallest"), F.col("end"))
    return joined.select(
        *TOPIC_QUEUE_KEY,
        "committed",
        start.alias("start"),
        F.coalesce(F.col("end"), start).alias("end"),
        _warning(
            F.col("topic"), F.col("queue_id"), F.col("committed"), F.col("smallest"), F.col("end")
        ).alias("warning"),
        "newest_ms",
    )


def queue_starts(starts: DataFrame) -> DataFrame:
    """One row per (broker, queue_id): ``h_committed, h0, half_end, p_committed, p0,
    op_end, offset_warnings`` (sorted, possibly empty), ``newest_ms`` (of either topic)."""

    def of(topic: str, column: str) -> Column:
        return F.max(F.when(F.col("topic") == topic, F.col(column)))

    return starts.groupBy(*QUEUE_KEY).agg(
        of(HALF_TOPIC, "committed").alias("h_committed"),
        of(HALF_TOPIC, "start").alias("h0"),
        of(HALF_TOPIC, "end").alias("half_end"),
        of(OP_TOPIC, "committed").alias("p_committed"),
        of(OP_TOPIC, "start").alias("p0"),
        of(OP_TOPIC, "end").alias("op_end"),
        F.array_sort(F.collect_list("warning")).alias("offset_warnings"),
        F.max("newest_ms").alias("newest_ms"),
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


def with_missing_offset_warnings(queues: DataFrame, files: DataFrame) -> DataFrame:
    """Append to ``warnings`` of each queue row (``h_committed``, ``h0``, ``p_committed``,
    ``p0``) a warning per topic whose committed offset is missing, naming the offsets file
    used and the queue, and the reason the usual file was not used when it was not
    (``files``: ``broker``, ``offsets_file``, ``offsets_note``; spec section 1)."""
    joined = queues.join(
        F.broadcast(files.withColumnRenamed("broker", "_files_broker")),
        F.col("broker") == F.col("_files_broker"),
        how="left",
    )
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
    return joined.withColumn("warnings", F.concat(F.col("warnings"), found)).select(*queues.columns)


# -- where the round ends: h1, h_safe (half queue), p1, p_safe (op queue) ------------------


def round_starts(readable: DataFrame, committed: DataFrame, as_of_ms: int) -> DataFrame:
    """h0 and p0 of every queue of the domain (``queue_starts`` columns), from the readable
    records (any store time) and the committed offsets."""
    bounds = queue_bounds(readable, as_of_ms)
    starts = start_offsets(queue_domain(bounds, committed), bounds, committed)
    return queue_starts(starts)


def with_h1(starts: DataFrame, stops: DataFrame) -> DataFrame:
    """``starts`` plus ``stop_offset`` (the smallest too-young offset from h0, from
    ``stops``; null when none) and ``h1``: the stop offset, else the half queue's end."""
    joined = starts.join(stops.select(*QUEUE_KEY, "stop_offset"), QUEUE_KEY, how="left")
    h1 = F.coalesce(F.col("stop_offset"), F.col("half_end"))
    return joined.select(*starts.columns, "stop_offset", h1.alias("h1"))


def with_h_safe(queues: DataFrame, per_status: DataFrame) -> DataFrame:
    """``queues`` (with ``h1``) plus the columns of ``per_status`` and ``h_safe``: h1, or
    the first unresolved record before it (``first_unresolved``) when that is smaller."""
    extra = [name for name in per_status.columns if name not in QUEUE_KEY]
    joined = queues.join(per_status, QUEUE_KEY, how="left")
    h_safe = F.least(F.col("h1"), F.col("first_unresolved"))
    return joined.select(*queues.columns, *extra, h_safe.alias("h_safe"))


def _op_window(ops: DataFrame, window: DataFrame, stalls: Column) -> DataFrame:
    """Op records at offsets >= p0: ``broker, queue_id, queue_offset, stalls, p0, op_end,
    h1, h_safe``."""
    return (
        ops.select(*QUEUE_KEY, "queue_offset", stalls.alias("stalls"))
        .join(F.broadcast(window), QUEUE_KEY, how="inner")
        .filter(F.col("queue_offset") >= F.col("p0"))
    )


def _first_not_done(ahead: DataFrame, op_items: DataFrame, window: DataFrame) -> DataFrame:
    """Per queue: the first op offset present from p0 and the first not done with h1,
    resp. h_safe (an op record is done when its largest named offset is below it)."""
    # Only op records from p0 on matter: aggregate their items, not the whole op queue's.
    items_ahead = (
        op_items.join(F.broadcast(window.select(*QUEUE_KEY, "p0")), QUEUE_KEY, how="inner")
        .filter(F.col(OP_OFFSET) >= F.col("p0"))
        .drop("p0")
    )
    largest = largest_named_offset(items_ahead).withColumnRenamed(OP_OFFSET, "queue_offset")
    with_largest = ahead.join(largest, [*QUEUE_KEY, "queue_offset"], how="left")
    not_done = (F.col("max_named") >= F.col("h1")) | F.col("stalls")
    not_done_safe = F.col("max_named") >= F.col("h_safe")
    return with_largest.groupBy(*QUEUE_KEY).agg(
        F.min("queue_offset").alias("first_present"),
        F.min(F.when(not_done, F.col("queue_offset"))).alias("first_not_done"),
        F.min(F.when(not_done_safe, F.col("queue_offset"))).alias("first_not_done_safe"),
    )


def _first_gap(ahead: DataFrame) -> DataFrame:
    """Per queue, the first gap inside [p0, end): an offset whose predecessor is present
    and which is not (an anti-join of ``offset + 1``; no window over the queue)."""
    successors = ahead.select(
        *QUEUE_KEY, (F.col("queue_offset") + 1).alias("queue_offset"), "op_end"
    )
    present = ahead.select(*QUEUE_KEY, "queue_offset")
    return (
        successors.join(present, [*QUEUE_KEY, "queue_offset"], how="left_anti")
        .filter(F.col("queue_offset") < F.col("op_end"))
        .groupBy(*QUEUE_KEY)
        .agg(F.min("queue_offset").alias("first_gap"))
    )


def op_offsets(
    ops: DataFrame, op_items: DataFrame, queues: DataFrame, params: RoundParams
) -> DataFrame:
    """``broker, queue_id, p1, p_safe``: the first op offset >= p0 that is missing or not
    done (with h1, resp. h_safe), else the op queue's end. ``queues`` has ``p0, op_end,
    h1, h_safe`` per queue."""
    window = queues.select(*QUEUE_KEY, "p0", "op_end", "h1", "h_safe")
    # A 4.9 broker never marks an op record of another tag done: its op offset stays there
    # for good (p1). Passing it loses nothing, so p_safe does not stop there.
    stalls = F.lit(params.broker_version == "4.9") & ~F.coalesce(is_remove_op(), F.lit(False))
    ahead = _op_window(ops, window, stalls)
    result = window.join(_first_not_done(ahead, op_items, window), QUEUE_KEY, how="left").join(
        _first_gap(ahead), QUEUE_KEY, how="left"
    )
    p0_missing = F.col("first_present").isNull() | (F.col("first_present") > F.col("p0"))
    first_missing = F.when(p0_missing, F.col("p0")).otherwise(F.col("first_gap"))
    return result.select(
        *QUEUE_KEY,
        F.least(first_missing, F.col("first_not_done"), F.col("op_end")).alias("p1"),
        F.least(first_missing, F.col("first_not_done_safe"), F.col("op_end")).alias("p_safe"),
    )
