"""The reconciliation round (spec sections 4-6) over any number of brokers and queues.

Two stages, so that a job can persist what several output tables share:
``classify_round`` resolves and classifies (the heavy joins), ``shape_outputs`` derives
the six output tables from that state. ``reconcile`` runs both.

Scale notes: the round never walks a queue with a window (half queue 0 holds every
transaction, so a window per queue would be one task). The walk's stop rule becomes an
aggregate ("the smallest too-young offset"), done-ness of op records becomes a
comparison with each record's largest named offset, and the first missing op offset is
an anti-join of ``offset + 1`` against the offsets present.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.messages import HALF_TOPIC, OP_TOPIC, TRANS_GROUP, UNUSED_BY_ROUND
from schemas.outputs import (
    BAD_RECORD,
    CHECK,
    CLASSES,
    CONSUME_OFFSETS,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    NOT_REACHED,
    REASON_CHECK_MAX,
    REASON_EXPIRED,
    RESOLVED,
    RUN_SUMMARY,
    TOO_YOUNG,
    half_row_schema,
)
from transforms.bad_records import duplicate_records, unparsable_op_items, unparsable_properties
from transforms.classify import counter_after, with_round_class
from transforms.messages import (
    QUEUE_KEY,
    is_half,
    is_op,
    mark_duplicates,
    offset_msg_id,
    stored_before,
    with_half_fields,
)
from transforms.offsets import queue_bounds, queue_domain, queue_starts, start_offsets
from transforms.operator_fields import (
    attention_counts,
    checks_left,
    discard_at_ms,
    message_keys,
    utc_timestamp,
    with_queue_round_facts,
)
from transforms.ops import (
    OP_OFFSET,
    explode_op_items,
    is_remove_op,
    largest_named_offset,
    named_offsets,
    unparsable_items,
)
from transforms.params import RoundParams
from transforms.resolve import resolved_transactions, unresolved_half, with_transaction_key

_UNKNOWN_QUEUE = -1

NOTE = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("warning", T.StringType()),
    ]
)


@dataclass(frozen=True)
class RoundState:
    """What the output tables are shaped from.

    Attributes:
        pending: one row per unresolved half record at offsets >= h0 (half fields,
            ``status``, ``counter_after``, ``immunity_ms``, ``age_ms``).
        queues: one row per (broker, queue_id) of the domain: committed offsets,
            h0/h1/h_safe, p0/p1/p_safe, class counts, warnings.
        bad_records: ``schemas.outputs.BAD_RECORD`` rows (reader's and round's).
    """

    pending: DataFrame
    queues: DataFrame
    bad_records: DataFrame
    params: RoundParams
    cached: tuple[DataFrame, ...] = ()  # frames the round itself cached

    def persist(self) -> RoundState:
        """Materialise the shared record-level state once (a job writes six tables from it).
        ``bad_records`` is cached by ``classify_round`` already."""
        return RoundState(
            self.pending.persist(), self.queues, self.bad_records, self.params, self.cached
        )

    def unpersist(self) -> None:
        for frame in (self.pending, self.bad_records, *self.cached):
            frame.unpersist()


@dataclass(frozen=True)
class RoundOutputs:
    """The output tables of one round, with the schemas of ``schemas.outputs``.

    ``run_summary`` has ``written_at_ms`` and ``duration_ms`` null: they are run-time
    columns filled by the writer.
    """

    check_requests: DataFrame
    discards: DataFrame
    pending: DataFrame
    consume_offsets: DataFrame
    run_summary: DataFrame
    bad_records: DataFrame

    def tables(self) -> dict[str, DataFrame]:
        """Name -> frame, in the order tables are written (offsets last)."""
        return {
            "bad_records": self.bad_records,
            "check_requests": self.check_requests,
            "discards": self.discards,
            "pending": self.pending,
            "run_summary": self.run_summary,
            "consume_offsets": self.consume_offsets,
        }


def _empty_like(frame: DataFrame, schema: T.StructType) -> DataFrame:
    return frame.sparkSession.createDataFrame([], schema)


def _status(h1: Column, stop_offset: Column) -> Column:
    """Before h1 a record keeps its class; the too-young record at h1 stops the round;
    everything after it is not reached this round."""
    offset = F.col("queue_offset")
    return (
        F.when(offset < h1, F.col("round_class"))
        .when(offset == stop_offset, F.lit(TOO_YOUNG))
        .otherwise(F.lit(NOT_REACHED))
    )


def _op_offsets(
    ops: DataFrame, op_items: DataFrame, queues: DataFrame, params: RoundParams
) -> DataFrame:
    """p1 and p_safe per queue: the first op offset >= p0 that is missing or not done
    (with h1, resp. h_safe), else the op queue's end."""
    window = queues.select(*QUEUE_KEY, "p0", "op_end", "h1", "h_safe")
    # A 4.9 broker never marks an op record of another tag done: its op offset stays there
    # for good (p1). Passing it loses nothing, so p_safe does not stop there.
    stalls = F.lit(params.broker_version == "4.9") & ~F.coalesce(is_remove_op(), F.lit(False))
    ahead = (
        ops.select(*QUEUE_KEY, "queue_offset", stalls.alias("stalls"))
        .join(F.broadcast(window), QUEUE_KEY)
        .filter(F.col("queue_offset") >= F.col("p0"))
    )
    # Only op records from p0 on matter: aggregate their items, not the whole op queue's.
    items_ahead = (
        op_items.join(F.broadcast(window.select(*QUEUE_KEY, "p0")), QUEUE_KEY)
        .filter(F.col(OP_OFFSET) >= F.col("p0"))
        .drop("p0")
    )
    largest = largest_named_offset(items_ahead).withColumnRenamed(OP_OFFSET, "queue_offset")
    with_largest = ahead.join(largest, [*QUEUE_KEY, "queue_offset"], how="left")
    first = with_largest.groupBy(*QUEUE_KEY).agg(
        F.min("queue_offset").alias("first_present"),
        F.min(
            F.when((F.col("max_named") >= F.col("h1")) | F.col("stalls"), F.col("queue_offset"))
        ).alias("first_not_done"),
        F.min(F.when(F.col("max_named") >= F.col("h_safe"), F.col("queue_offset"))).alias(
            "first_not_done_safe"
        ),
    )
    # A gap inside [p0, end): an offset whose predecessor is present and which is not.
    successors = ahead.select(
        *QUEUE_KEY, (F.col("queue_offset") + 1).alias("queue_offset"), "op_end"
    )
    gaps = (
        successors.join(
            ahead.select(*QUEUE_KEY, "queue_offset"), [*QUEUE_KEY, "queue_offset"], how="left_anti"
        )
        .filter(F.col("queue_offset") < F.col("op_end"))
        .groupBy(*QUEUE_KEY)
        .agg(F.min("queue_offset").alias("first_gap"))
    )
    result = window.join(first, QUEUE_KEY, how="left").join(gaps, QUEUE_KEY, how="left")
    p0_missing = F.col("first_present").isNull() | (F.col("first_present") > F.col("p0"))
    first_missing = F.when(p0_missing, F.col("p0")).otherwise(F.col("first_gap"))
    return result.select(
        *QUEUE_KEY,
        F.least(first_missing, F.col("first_not_done"), F.col("op_end")).alias("p1"),
        F.least(first_missing, F.col("first_not_done_safe"), F.col("op_end")).alias("p_safe"),
    )


# Up to this many records from h0, the round's joins broadcast them (the usual case: the
# committed offset is near the end of the queue); beyond it, Spark shuffles as usual.
BROADCAST_ROWS = 2_000_000


def _is_small(frame: DataFrame) -> bool:
    """Whether a (cached) frame is small enough to broadcast; costs one count."""
    return frame.count() <= BROADCAST_ROWS


def lean_records(messages: DataFrame, params: RoundParams) -> DataFrame:
    """Half and op records with the derived half fields and transaction key, without the
    columns no later step reads. Half bodies are kept only with ``include_body``."""
    records = messages.filter(is_half() | is_op())
    with_fields = with_transaction_key(with_half_fields(records))
    body = F.col("body") if params.include_body else F.when(is_op(), F.col("body"))
    return with_fields.drop(*UNUSED_BY_ROUND).withColumn("body", body)


def localize(per_queue: DataFrame) -> DataFrame:
    """Bring a per-queue frame to the driver and back as a local relation.

    Only for frames with one row per (broker, queue) or (broker, topic, queue): never
    proportional to the records. Without it, every later join re-plans the aggregates
    that produced the frame, and each broadcast of it is a Spark job of its own; a small
    round took hundreds of stages.
    """
    rows = per_queue.collect()  # one row per queue: never proportional to the records
    return per_queue.sparkSession.createDataFrame(rows, per_queue.schema)


def classify_round(
    messages: DataFrame,
    committed_offsets: DataFrame,
    params: RoundParams,
    bad_input: DataFrame | None = None,
    notes: DataFrame | None = None,
    unique_offsets: Column | bool | None = None,
) -> RoundState:
    """Resolve and classify every half record of every queue in ``messages``.

    Runs the few Spark jobs that settle per-queue state (start offsets, stop offsets,
    safe offsets); the record-level results stay lazy frames.

    Args:
        messages: readable records (``SOURCED_MESSAGE``) of the half and op topics, any
            store time, duplicates allowed.
        committed_offsets: ``COMMITTED_OFFSET`` rows.
        params: T, run id, broker configuration.
        bad_input: ``BAD_RECORD`` rows the readers produced (optional).
        notes: reader warnings (``NOTE``: broker, queue_id or null for the whole broker,
            warning), shown in ``run_summary.warnings``.
        unique_offsets: records whose queue offset cannot repeat (from the store reader):
            a condition, or True for all records; they skip the duplicate check. With True,
            ``messages`` must be cached by the caller: the round then adds no cache of
            every record.
    """
    as_of = params.as_of_ms
    lean = lean_records(messages, params)
    if unique_offsets is True:
        # Nothing to deduplicate and the input is cached: each step computes the few
        # derived columns it reads, which is cheaper than caching every record again.
        marked = lean.withColumn("duplicate_of", F.lit(None).cast(T.LongType()))
        cached_records: tuple[DataFrame, ...] = ()
    else:
        # Every later step reads this one narrow, deduplicated frame: cached so that the
        # per-queue aggregates, the joins and the bad records do not each redo the
        # duplicate check (a shuffle of every record) and the property lookups.
        unique = unique_offsets if isinstance(unique_offsets, Column) else None
        marked = mark_duplicates(lean, unique).persist(StorageLevel.MEMORY_AND_DISK)
        cached_records = (marked,)
    readable = marked.filter(F.col("duplicate_of").isNull()).drop("duplicate_of")
    current = readable.filter(stored_before(as_of))

    half = current.filter(is_half())
    ops = current.filter(is_op())
    # Op bodies are split and parsed once: three consumers (named offsets, done-ness of
    # op records, unparsable items).
    op_items = explode_op_items(ops).persist(StorageLevel.MEMORY_AND_DISK)

    bounds = queue_bounds(readable, as_of)
    starts = localize(
        queue_starts(
            start_offsets(queue_domain(bounds, committed_offsets), bounds, committed_offsets)
        )
    )

    # Only records from h0 on can be classified, and only their transactions need
    # resolving: the round resolves those few transactions instead of the whole queue.
    from_h0 = (
        half.join(F.broadcast(starts.select(*QUEUE_KEY, "h0")), QUEUE_KEY)
        .filter(F.col("queue_offset") >= F.col("h0"))
        .drop("h0")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    unresolved = unresolved_half(
        from_h0,
        resolved_transactions(half, named_offsets(op_items), of=from_h0, small=_is_small(from_h0)),
    )
    # Cached because the stop offsets are aggregated from them before the statuses are
    # assigned.
    candidates = unresolved.transform(with_round_class, params).persist()
    stops = (
        candidates.filter(F.col("round_class") == TOO_YOUNG)
        .groupBy(*QUEUE_KEY)
        .agg(F.min("queue_offset").alias("stop_offset"))
    )
    with_h1 = localize(
        starts.join(stops, QUEUE_KEY, how="left").withColumn(
            "h1", F.coalesce(F.col("stop_offset"), F.col("half_end"))
        )
    )
    status = _status(F.col("h1"), F.col("stop_offset"))
    pending = (
        candidates.join(F.broadcast(with_h1.select(*QUEUE_KEY, "h1", "stop_offset")), QUEUE_KEY)
        .withColumn("status", status)
        .withColumn("counter_after", counter_after(F.col("status")))
        .drop("h1", "stop_offset", "round_class")
    )

    # Every unresolved record before h1 bounds h_safe, discards included (spec 2026-11-23):
    # this job writes neither put-back copies nor TRANS_CHECK_MAX_TIME_TOPIC, so installing
    # an offset past any of them would lose it (a wrong --as-of can make all of them
    # "expired").
    before_h1 = F.col("status").isin(CHECK, IMMUNE, DISCARD_CHECK_MAX, DISCARD_EXPIRED)
    per_status = pending.groupBy(*QUEUE_KEY).agg(
        *[
            F.count(F.when(F.col("status") == name, 1)).alias(name)
            for name in CLASSES
            if name != RESOLVED
        ],
        F.min(F.when(before_h1, F.col("queue_offset"))).alias("first_unresolved"),
        # For the discard forecast: the first put-back whose copy the broker does not
        # discard on sight (its fresh copy ends the broker's loop).
        F.min(
            F.when(
                F.col("status").isin(CHECK, IMMUNE) & (F.col("counter_after") < params.check_max),
                F.col("queue_offset"),
            )
        ).alias("first_live_copy"),
    )
    with_safe = localize(
        with_h1.join(per_status, QUEUE_KEY, how="left").withColumn(
            "h_safe", F.least(F.col("h1"), F.col("first_unresolved"))
        )
    )
    in_window = (
        half.select(*QUEUE_KEY, "queue_offset")
        .join(F.broadcast(with_safe.select(*QUEUE_KEY, "h0", "h1")), QUEUE_KEY)
        .filter((F.col("queue_offset") >= F.col("h0")) & (F.col("queue_offset") < F.col("h1")))
        .groupBy(*QUEUE_KEY)
        .agg(F.count(F.lit(1)).alias("in_window"))
    )

    bad_parts = [
        duplicate_records(marked),
        unparsable_op_items(unparsable_items(op_items), OP_TOPIC),
        unparsable_properties(half),
    ]
    if bad_input is not None:
        bad_parts.insert(0, bad_input.select(*BAD_RECORD.fieldNames()))
    bad_records = bad_parts[0]
    for part in bad_parts[1:]:
        bad_records = bad_records.unionByName(part)
    # Counted per queue below, then counted and written by the job: found once (finding
    # them scans every record).
    bad_records = bad_records.persist(StorageLevel.MEMORY_AND_DISK)

    queues = with_safe.join(
        _op_offsets(ops, op_items, with_safe, params), QUEUE_KEY, how="left"
    ).join(in_window, QUEUE_KEY, how="left")
    # Bad records and reader notes of queues outside the domain (e.g. a queue whose only
    # record is unreadable, or a corrupt commit-log region with no queue) still get a
    # summary row: nothing is dropped silently.
    # A null queue id (unknown queue) would never match in a join: stand it in by -1
    # (no real queue id is negative) so that one row carries both counts and notes.
    unknown_as_sentinel = F.coalesce(F.col("queue_id"), F.lit(_UNKNOWN_QUEUE)).alias("queue_id")
    bad_counts = (
        bad_records.select("broker", unknown_as_sentinel)
        .groupBy(*QUEUE_KEY)
        .agg(F.count(F.lit(1)).alias("bad_records"))
    )
    note_rows = notes if notes is not None else _empty_like(messages, NOTE)
    queue_notes = (
        note_rows.select("broker", unknown_as_sentinel, "warning")
        .groupBy(*QUEUE_KEY)
        .agg(F.array_sort(F.collect_list("warning")).alias("queue_notes"))
    )
    queues = (
        queues.join(bad_counts, QUEUE_KEY, how="full")
        .join(queue_notes, QUEUE_KEY, how="full")
        .withColumn("queue_id", F.when(F.col("queue_id") != _UNKNOWN_QUEUE, F.col("queue_id")))
    )
    counts = {
        name: F.coalesce(F.col(name), F.lit(0)).cast("long") for name in CLASSES if name != RESOLVED
    }
    resolved = F.coalesce(F.col("in_window"), F.lit(0)) - sum(
        (counts[name] for name in (CHECK, IMMUNE, DISCARD_CHECK_MAX, DISCARD_EXPIRED)), F.lit(0)
    )
    queues = queues.select(
        *QUEUE_KEY,
        "h_committed",
        "h0",
        "h1",
        "h_safe",
        "p_committed",
        "p0",
        "p1",
        "p_safe",
        F.when(F.col("h0").isNotNull(), resolved).otherwise(F.lit(0)).cast("long").alias(RESOLVED),
        *[column.alias(name) for name, column in counts.items()],
        F.coalesce(F.col("bad_records"), F.lit(0)).cast("long").alias("bad_records"),
        F.concat(
            F.coalesce(F.col("offset_warnings"), F.array().cast("array<string>")),
            F.coalesce(F.col("queue_notes"), F.array().cast("array<string>")),
        ).alias("warnings"),
        F.col("stop_offset").alias("stopped_at"),
        "first_live_copy",
    )
    return RoundState(
        pending=pending,
        queues=localize(queues),
        bad_records=bad_records,
        params=params,
        cached=(candidates, from_h0, op_items, bad_records, *cached_records),
    )


def _half_rows(pending: DataFrame, params: RoundParams, extra: list[Column]) -> DataFrame:
    schema = half_row_schema(params.include_body)
    values = {
        "broker": F.col("broker"),
        "queue_id": F.col("queue_id"),
        "half_offset": F.col("queue_offset"),
        "commitlog_offset": F.col("commitlog_offset"),
        "offset_msg_id": offset_msg_id(F.col("store_host"), F.col("commitlog_offset")),
        "uniq_key": F.col("uniq_key"),
        "producer_group": F.col("producer_group"),
        "real_topic": F.col("real_topic"),
        "real_queue_id": F.col("real_queue_id"),
        "born_timestamp_ms": F.col("born_timestamp_ms"),
        "store_timestamp_ms": F.col("store_timestamp_ms"),
        "age_ms": F.col("age_ms"),
        "check_times": F.col("counter_after"),
        "immunity_ms": F.col("immunity_ms"),
        "keys": message_keys(F.col("keys_raw")),
        "tags": F.col("tags"),
        "transaction_id": F.col("transaction_id"),
        "born_host": F.col("born_host"),
        "checks_left": checks_left(params),
        "discard_at_ms": discard_at_ms(params),
        "born_at": utc_timestamp(F.col("born_timestamp_ms")),
        "stored_at": utc_timestamp(F.col("store_timestamp_ms")),
        "as_of": utc_timestamp(F.lit(params.as_of_ms).cast(T.LongType())),
        "body": F.col("body"),
    }
    columns = [values[field.name].cast(field.dataType).alias(field.name) for field in schema.fields]
    return pending.select(*columns, *extra)


def _run_columns(params: RoundParams) -> list[Column]:
    return [
        F.lit(params.run_id).alias("run_id"),
        F.lit(params.as_of_ms).cast("long").alias("as_of_ms"),
    ]


def _consume_offsets(queues: DataFrame, params: RoundParams) -> DataFrame:
    per_topic = F.explode(
        F.array(
            F.struct(
                F.lit(HALF_TOPIC).alias("topic"),
                F.col("h_committed").alias("offset_committed"),
                F.col("h0").alias("offset_before"),
                F.col("h1").alias("offset_after"),
                F.col("h_safe").alias("offset_safe"),
            ),
            F.struct(
                F.lit(OP_TOPIC).alias("topic"),
                F.col("p_committed").alias("offset_committed"),
                F.col("p0").alias("offset_before"),
                F.col("p1").alias("offset_after"),
                F.col("p_safe").alias("offset_safe"),
            ),
        )
    ).alias("row")
    rows = queues.filter(F.col("h0").isNotNull()).select(*QUEUE_KEY, per_topic)
    return rows.select(
        "broker",
        F.col("row.topic").alias("topic"),
        "queue_id",
        F.lit(TRANS_GROUP).alias("group"),
        "row.offset_committed",
        "row.offset_before",
        "row.offset_after",
        "row.offset_safe",
        *_run_columns(params),
    ).select(*[F.col(f.name).cast(f.dataType) for f in CONSUME_OFFSETS.fields])


# run_summary columns only the writer knows (null in the frames a notebook gets).
WRITER_FILLED = ("inputs", "writer", "job_version", "written_at_ms", "duration_ms")


def _settings_columns(params: RoundParams) -> list[Column]:
    """The round's effective settings, recorded in run_summary."""
    return [
        F.lit(params.check_max).alias("check_max"),
        F.lit(params.transaction_timeout_ms).alias("transaction_timeout_ms"),
        F.lit(params.file_reserved_hours).alias("file_reserved_hours"),
        F.lit(params.check_interval_ms).alias("check_interval_ms"),
    ]


def shape_outputs(state: RoundState) -> RoundOutputs:
    """The six output tables (spec section 6) from a classified round."""
    params = state.params
    run = _run_columns(params)
    pending = with_queue_round_facts(state.pending, state.queues)
    discard_reason = F.when(F.col("status") == DISCARD_CHECK_MAX, REASON_CHECK_MAX).otherwise(
        REASON_EXPIRED
    )
    check_requests = _half_rows(pending.filter(F.col("status") == CHECK), params, run)
    discards = _half_rows(
        pending.filter(F.col("status").isin(DISCARD_CHECK_MAX, DISCARD_EXPIRED)),
        params,
        [discard_reason.alias("reason"), *run],
    )
    pending_rows = _half_rows(pending, params, [F.col("status"), *run])
    attention = attention_counts(pending, params)
    summary = (
        state.queues.join(attention, QUEUE_KEY, how="left")
        .select(
            *QUEUE_KEY,
            "h0",
            "h1",
            "h_safe",
            "p0",
            "p1",
            "p_safe",
            *CLASSES,
            "bad_records",
            *[
                F.coalesce(F.col(name), F.lit(0)).alias(name)
                for name in ("discard_next_round", "past_last_check")
            ],
            "warnings",
            *_settings_columns(params),
            *[F.lit(None).alias(name) for name in WRITER_FILLED],
            *run,
        )
        .select(*[F.col(f.name).cast(f.dataType) for f in RUN_SUMMARY.fields])
    )
    bad_records = state.bad_records.select(*BAD_RECORD.fieldNames(), *run)
    return RoundOutputs(
        check_requests=check_requests,
        discards=discards,
        pending=pending_rows,
        consume_offsets=_consume_offsets(state.queues, params),
        run_summary=summary,
        bad_records=bad_records,
    )


def reconcile(
    messages: DataFrame,
    committed_offsets: DataFrame,
    params: RoundParams,
    bad_input: DataFrame | None = None,
    notes: DataFrame | None = None,
) -> RoundOutputs:
    """Run one round over decoded half and op records of any number of brokers.

    Args:
        messages: readable records (``schemas.messages.SOURCED_MESSAGE``) of the half and
            op topics, any store time; duplicates allowed (section 7 settles them).
        committed_offsets: ``schemas.messages.COMMITTED_OFFSET`` rows from the offsets files.
        params: as-of time, run id and broker configuration.
        bad_input: ``schemas.outputs.BAD_RECORD`` rows the readers already produced.
        notes: reader warnings for ``run_summary.warnings`` (``NOTE`` schema).

    Returns:
        The six output DataFrames; nothing is written.
    """
    return shape_outputs(classify_round(messages, committed_offsets, params, bad_input, notes))
