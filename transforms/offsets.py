"""Where each queue's round starts (spec section 1): committed offsets, corrected by what
the queue actually holds."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.messages import HALF_TOPIC, OP_TOPIC
from transforms.messages import QUEUE_KEY, stored_before

TOPIC_QUEUE_KEY = ["broker", "topic", "queue_id"]
TRANSACTION_TOPICS = (HALF_TOPIC, OP_TOPIC)


def queue_bounds(readable: DataFrame, as_of_ms: int) -> DataFrame:
    """Per (broker, topic, queue_id): ``smallest`` available offset (any store time) and
    ``end`` at T (1 + the largest offset stored before T, else the smallest available)."""
    return (
        readable.filter(F.col("topic").isin(*TRANSACTION_TOPICS))
        .groupBy(*TOPIC_QUEUE_KEY)
        .agg(
            F.min("queue_offset").alias("smallest"),
            F.max(F.when(stored_before(as_of_ms), F.col("queue_offset"))).alias("largest_before"),
        )
        .select(
            *TOPIC_QUEUE_KEY,
            "smallest",
            F.coalesce(F.col("largest_before") + 1, F.col("smallest")).alias("end"),
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
    record: nothing is left to read) and ``warning`` (null when none)."""
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
    )


def queue_starts(starts: DataFrame) -> DataFrame:
    """One row per (broker, queue_id): ``h_committed, h0, half_end, p_committed, p0,
    op_end, offset_warnings`` (sorted, possibly empty)."""

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
    )
