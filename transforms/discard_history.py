"""Discard history (spec section 6, ``discard_history``): every message the broker has
discarded to ``TRANS_CHECK_MAX_TIME_TOPIC``, why, and what became of it since.

A discard record is a copy of the half record the broker gave up on (all properties copied,
``TRANSACTION_CHECK_TIMES`` included; its store time is the moment of the discard). This
module decides, per discard record, the ``reason`` (counter or age) and the ``outcome`` as
the store shows it now, from evidence the job reads beside it (``DiscardEvidence``): the
transaction's half records, the op records, this round's pending rows and the committed
messages of the real queues the discard records name. Joins and aggregates only: a
transaction has a handful of half records (its original and its put-back copies), so
joining discard records to them is small even when the half queue is not.

Pure ``DataFrame -> DataFrame``; the evidence is read by ``connectors.rocketmq.discards``
and put together by ``jobs.discards``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.messages import DISCARD_TOPIC
from schemas.outputs import DISCARD_HISTORY, DISCARD_REASONS, OUTCOMES
from transforms.anomalies import RoundEvidence
from transforms.merge import Facts, carried, merged
from transforms.messages import offset_msg_id, stored_before, with_half_fields
from transforms.operator_fields import message_keys
from transforms.ops import OP_OFFSET, OP_STORE_MS, named_offsets
from transforms.params import RoundParams
from transforms.round import LAZY

# reason and outcome (in the order the rules are tried): the table's vocabulary, in
# schemas.outputs where the report reads it
CHECK_MAX, EXPIRED, UNDETERMINED = DISCARD_REASONS
UNKNOWN, PENDING_AGAIN, COMMITTED, ROLLED_BACK, ENDED, UNRESOLVED = OUTCOMES

# Transaction bits of a commit-log record's sysflag (MessageSysFlag): a committed real
# message is stored with TRANSACTION_COMMIT_TYPE.
_TRANSACTION_MASK = 0xC
_COMMIT_TYPE = 0x8

DISCARD_KEY = ["broker", "discard_offset"]
# Joins the parts of a real queue's name into one key (no topic name holds it).
_KEY_SEPARATOR = "\u0000"


@dataclass(frozen=True)
class DiscardEvidence:
    """What the outcome of a discard is decided from; every frame any store time (the
    transform cuts at T) unless said otherwise.

    Attributes:
        as_of_ms: T, which ``rows`` and ``linked`` were cut at.
        rows: ``discard_rows``: one row per discard record stored before T.
        linked: ``transaction_halves`` of ``rows``: the half records of the discarded
            transactions, read once from all half records and then by every rule (the
            job keeps it: it is small, the half queue is not).
        op_items: ``broker, queue_id, half_offset, op_store_ms, op_offset``: what each
            ``d`` op record names, with the op record's store time and queue offset (the
            round's op items).
        op_store_times: ``broker, store_timestamp_ms`` of every readable op record.
        pending: this round's pending rows (at least ``broker``, ``uniq_key``,
            ``store_timestamp_ms``).
        commits: records of the real queues the discard records name (``broker, topic,
            queue_id, sys_flag, prepared_transaction_offset, store_timestamp_ms``).
        readable_queues: (broker, topic, queue id) of the real queues that could be read
            (a few, known on the driver).
        small: the discard rows' half records (``linked``) are few enough to broadcast
            against every op item and commit (``broadcast_or_merge``); the job decides
            from the count of discard records.
    """

    as_of_ms: int
    rows: DataFrame
    linked: DataFrame
    op_items: DataFrame
    op_store_times: DataFrame
    pending: DataFrame
    commits: DataFrame
    readable_queues: Sequence[tuple[str, str, int]]
    small: bool = False


def broadcast_or_merge(discard_side: DataFrame, small: bool) -> DataFrame:
    """The discard side of a join with every half record, op item or commit: broadcast
    when ``small``, else a sort-merge join. Never left to Spark's estimate: a store read is
    a Python map over a few task ids, whose estimate is a few bytes whatever it returns,
    so Spark would plan a broadcast of millions of commits and run the driver out of heap."""
    return F.broadcast(discard_side) if small else discard_side.hint("merge")


def evidence_from(
    round_evidence: RoundEvidence,
    discards: DataFrame,
    pending: DataFrame,
    commits: DataFrame,
    readable_queues: Sequence[tuple[str, str, int]],
    as_of_ms: int,
    keep: Callable[[DataFrame], DataFrame] = LAZY.records,
    small: bool = False,
    few: bool = False,
) -> DiscardEvidence:
    """The evidence at T from the round's own frames (``round_evidence``: its half records
    with their fields, its op records and the items their bodies name, each split once by
    the round), the discard records (``discards``: duplicates already removed) and what the
    job read beside them. ``keep`` materialises the discarded transactions' half records,
    which every rule reads (the job caches them; by default they stay lazy); ``small``:
    see ``DiscardEvidence``; ``few``: the discard rows themselves are few enough to
    broadcast against every half record (implied by ``small``; the discard rows can be
    few while their half records, up to ``check_max + 2`` each, are not). Every answer gives
    the same rows."""
    rows = discard_rows(discards, as_of_ms)
    return DiscardEvidence(
        as_of_ms=as_of_ms,
        rows=rows,
        linked=keep(transaction_halves(rows, round_evidence.half, as_of_ms, few or small)),
        op_items=named_offsets(round_evidence.op_items, OP_STORE_MS, OP_OFFSET),
        op_store_times=round_evidence.ops.select("broker", "store_timestamp_ms"),
        pending=pending,
        commits=commits,
        readable_queues=readable_queues,
        small=small,
    )


def discard_rows(discards: DataFrame, as_of_ms: int) -> DataFrame:
    """One row per discard record stored before T, with its transaction's fields and what
    an operator searches it by (``keys``, ``tags``, ``transaction_id``: the discard record
    carries the half record's properties, so they read as in the half-row tables)."""
    fields = with_half_fields(discards.filter(stored_before(as_of_ms)))
    return fields.select(
        "broker",
        F.col("queue_offset").alias("discard_offset"),
        offset_msg_id(F.col("store_host"), F.col("commitlog_offset")).alias("offset_msg_id"),
        "uniq_key",
        "producer_group",
        "real_topic",
        "real_queue_id",
        "check_times",
        "born_timestamp_ms",
        F.col("store_timestamp_ms").alias("discarded_at_ms"),
        message_keys(F.col("keys_raw")).alias("keys"),
        "tags",
        "transaction_id",
    )


def transaction_halves(
    rows: DataFrame, half: DataFrame, as_of_ms: int, small: bool = False
) -> DataFrame:
    """Each discard row joined to the half records of its transaction (same broker and
    ``uniq_key``) stored before T: ``DISCARD_KEY`` plus the half record's place, counter,
    store time and commit-log offset. ``half``: half records with their fields
    (``transforms.messages.with_half_fields``). A row without ``uniq_key`` has none."""
    halves = half.filter(stored_before(as_of_ms)).select(
        "broker",
        "uniq_key",
        F.col("queue_id").alias("half_queue_id"),
        F.col("queue_offset").alias("half_offset"),
        F.col("commitlog_offset").alias("half_commitlog_offset"),
        F.col("check_times").alias("half_check_times"),
        F.col("prepared_queue_offset").alias("half_prepared_offset"),
        F.col("store_timestamp_ms").alias("half_stored_ms"),
    )
    keys = rows.select(*DISCARD_KEY, "uniq_key", "real_topic", "real_queue_id", "discarded_at_ms")
    keys = broadcast_or_merge(keys.filter(F.col("uniq_key").isNotNull()), small)
    return halves.join(keys, on=["broker", "uniq_key"], how="inner")


def half_facts(linked: DataFrame) -> Facts:
    """Per discard row: ``has_half``, whether any half record of its transaction remains
    (null when none), and ``earlier_counter``, the counter of the latest one stored before
    the discard (a null counter is 0: the broker's first increment makes it 1)."""
    earlier = F.col("half_stored_ms") < F.col("discarded_at_ms")
    order = F.struct(F.col("half_stored_ms"), F.col("half_offset"))
    counter = F.coalesce(F.col("half_check_times"), F.lit(0))
    rows = linked.select(
        *DISCARD_KEY,
        F.lit(True).alias("_half"),
        F.when(earlier, counter).alias("_counter"),
        F.when(earlier, order).alias("_order"),
    )
    return Facts(
        rows,
        (
            F.max("_half").alias("has_half"),
            F.max_by("_counter", "_order").alias("earlier_counter"),
        ),
    )


def commit_times(
    linked: DataFrame, commits: DataFrame, as_of_ms: int, small: bool = False
) -> Facts:
    """Per discard row: ``commit_ms``, the earliest store time of a committed message in
    its real queue whose prepared-transaction offset is the commit-log offset of one of its
    half records."""
    is_commit = (F.col("sys_flag").bitwiseAND(_TRANSACTION_MASK)) == _COMMIT_TYPE
    committed = commits.filter(stored_before(as_of_ms) & is_commit).select(
        "broker",
        F.col("topic").alias("real_topic"),
        F.col("queue_id").alias("real_queue_id"),
        F.col("prepared_transaction_offset").alias("half_commitlog_offset"),
        F.col("store_timestamp_ms").alias("_commit_ms"),
    )
    on = ["broker", "real_topic", "real_queue_id", "half_commitlog_offset"]
    rows = committed.join(broadcast_or_merge(linked, small), on=on, how="inner")
    rows = rows.select(*DISCARD_KEY, "_commit_ms")
    return Facts(rows, (F.min("_commit_ms").alias("commit_ms"),))


def op_times(linked: DataFrame, op_items: DataFrame, as_of_ms: int, small: bool = False) -> Facts:
    """Per discard row: ``op_ms``, the earliest store time of an op record stored before T
    naming one of its half records."""
    named = op_items.filter(F.col("op_store_ms") < F.lit(as_of_ms)).select(
        "broker",
        F.col("queue_id").alias("half_queue_id"),
        "half_offset",
        F.col("op_store_ms").alias("_op_ms"),
    )
    on = ["broker", "half_queue_id", "half_offset"]
    rows = named.join(broadcast_or_merge(linked, small), on=on, how="inner")
    rows = rows.select(*DISCARD_KEY, "_op_ms")
    return Facts(rows, (F.min("_op_ms").alias("op_ms"),))


def resumed_pending(rows: DataFrame, pending: DataFrame) -> Facts:
    """Per discard row: ``is_pending`` (true, else null) when its transaction has a pending
    row of this round stored after the discard: a copy put back by a resume. (A pending
    record stored before the discard is the discarded copy itself, below a committed
    offset that did not move.)"""
    later = pending.filter(F.col("uniq_key").isNotNull()).select(
        "broker", "uniq_key", F.col("store_timestamp_ms").alias("pending_stored_ms")
    )
    resumed = (
        rows.select(*DISCARD_KEY, "uniq_key", "discarded_at_ms")
        .join(later, on=["broker", "uniq_key"], how="inner")
        .filter(F.col("pending_stored_ms") > F.col("discarded_at_ms"))
        .select(*DISCARD_KEY, F.lit(True).alias("_pending"))
    )
    return Facts(resumed, (F.max("_pending").alias("is_pending"),))


def discarded_unchecked(evidence: DiscardEvidence) -> DataFrame:
    """The discard records (stored before T) whose transaction's half records stored before
    the discard hold an immunity copy and no check copy: the broker put the record back
    for its immunity until the counter reached ``check_max`` and never asked the producer
    (the past evidence of ``immunity_exhausts_checks``).

    An immunity copy carries ``TRAN_PREPARED_QUEUE_OFFSET``; a check copy is written just
    before a check is sent and carries a counter without it (RocketMQ's
    ``putImmunityMsgBackToHalfQueue`` and ``putBackHalfMsgQueue``). Columns: ``broker``,
    ``queue_id`` and ``half_offset`` (the transaction's first half record), ``uniq_key``,
    ``producer_group``, ``discard_offset``, ``check_times`` (the discard record's counter)
    and ``immunity_copies``."""
    before = evidence.linked.filter(F.col("half_stored_ms") < F.col("discarded_at_ms"))
    immunity_copy = F.col("half_prepared_offset").isNotNull()
    check_copy = F.col("half_check_times").isNotNull() & F.col("half_prepared_offset").isNull()
    first = F.struct(F.col("half_offset"), F.col("half_queue_id"))
    per_discard = before.groupBy(*DISCARD_KEY).agg(
        F.count(F.when(immunity_copy, 1)).alias("immunity_copies"),
        F.count(F.when(check_copy, 1)).alias("check_copies"),
        F.min(first).alias("first"),
    )
    return (
        per_discard.filter((F.col("immunity_copies") > 0) & (F.col("check_copies") == 0))
        .join(evidence.rows, on=DISCARD_KEY, how="inner")
        .select(
            "broker",
            F.col("first.half_queue_id").alias("queue_id"),
            F.col("first.half_offset").alias("half_offset"),
            "uniq_key",
            "producer_group",
            "discard_offset",
            "check_times",
            "immunity_copies",
        )
    )


def with_flags(evidence: DiscardEvidence) -> DataFrame:
    """The discard rows with every fact the rules read: one row per record, the facts
    merged in one aggregate (``transforms.merge``) instead of a join each."""
    rows, linked, as_of_ms = evidence.rows, evidence.linked, evidence.as_of_ms
    # A literal set, not a join: the queues are a few, and a join with them is a job.
    real_queue = [F.col("broker"), F.col("real_topic"), F.col("real_queue_id").cast("string")]
    known = F.concat_ws(_KEY_SEPARATOR, *real_queue).isin(
        sorted({_KEY_SEPARATOR.join(map(str, queue)) for queue in evidence.readable_queues})
    )
    readable = F.when(
        F.col("real_topic").isNotNull() & F.col("real_queue_id").isNotNull() & known, True
    )
    oldest_op = (
        evidence.op_store_times.filter(stored_before(as_of_ms))
        .groupBy("broker")
        .agg(F.min("store_timestamp_ms").alias("oldest_op_ms"))
    )
    facts = merged(
        carried(rows, DISCARD_KEY),
        half_facts(linked),
        commit_times(linked, evidence.commits, as_of_ms, evidence.small),
        op_times(linked, evidence.op_items, as_of_ms, evidence.small),
        resumed_pending(rows, evidence.pending),
        keys=DISCARD_KEY,
    )
    return facts.withColumn("queue_readable", readable).join(oldest_op, on="broker", how="left")


def discard_reason(params: RoundParams) -> Column:
    """``reason``: the broker tests the counter first, then the age, and an age discard
    carries its counter already incremented; so a counter equal to ``check_max`` is
    ambiguous only when the record was also older than the retention at the discard, and
    then the counter of the latest earlier half record decides."""
    counter = F.col("check_times")
    limit = F.lit(params.check_max)
    within_retention = (F.col("discarded_at_ms") - F.col("born_timestamp_ms")) <= params.reserved_ms
    return (
        F.when(counter.isNull(), UNDETERMINED)
        .when(counter > limit, CHECK_MAX)
        .when(counter < limit, EXPIRED)
        .when(within_retention, CHECK_MAX)
        .when(F.col("earlier_counter") == limit - 1, EXPIRED)
        .when(F.col("earlier_counter") == limit, CHECK_MAX)
        .otherwise(UNDETERMINED)
    )


def discard_outcome() -> Column:
    """``outcome``: the first rule that applies (spec section 6)."""
    no_key = F.col("uniq_key").isNull()
    has_half = F.coalesce(F.col("has_half"), F.lit(False))
    # The op queue still reaches back to the discard: an end written since would be seen.
    ops_cover_discard = F.coalesce(F.col("oldest_op_ms") <= F.col("discarded_at_ms"), F.lit(False))
    evidence_gone = ~has_half & ~ops_cover_discard
    return (
        F.when(no_key | evidence_gone, UNKNOWN)
        .when(F.coalesce(F.col("is_pending"), F.lit(False)), PENDING_AGAIN)
        .when(F.col("commit_ms").isNotNull(), COMMITTED)
        .when(F.col("op_ms").isNotNull() & F.col("queue_readable").isNotNull(), ROLLED_BACK)
        .when(F.col("op_ms").isNotNull(), ENDED)
        .otherwise(UNRESOLVED)
    )


def ended_before_discard() -> Column:
    """True when the end (op or committed message) was stored before the discard: the broker
    discarded a resolved transaction (RocketMQ #8311). Null when the outcome is unknown."""
    ended = F.col("outcome").isin(COMMITTED, ROLLED_BACK, ENDED)
    first_end = F.least(F.col("commit_ms"), F.col("op_ms"))
    return (
        F.when(F.col("outcome") == UNKNOWN, F.lit(None).cast(T.BooleanType()))
        .when(ended, first_end < F.col("discarded_at_ms"))
        .otherwise(F.lit(False))
    )


def resume_futile(params: RoundParams) -> Column:
    """For ``unresolved`` rows: a resumed copy keeps its born time, so the broker discards it
    again by age when it is older than the retention: true for ``expired`` (and
    ``undetermined``, which only arises beyond the retention) and for any record whose age
    at T is beyond the retention. Null for other outcomes."""
    too_old = (F.lit(params.as_of_ms) - F.col("born_timestamp_ms")) > params.reserved_ms
    by_age = F.col("reason").isin(EXPIRED, UNDETERMINED) | too_old
    return F.when(F.col("outcome") == UNRESOLVED, by_age)


def discard_history(
    evidence: DiscardEvidence, params: RoundParams, kept: DataFrame | None = None
) -> DataFrame:
    """One ``discard_history`` row per discard record stored before T (``DISCARD_HISTORY``
    columns; ``evidence`` cut at the run's T): the rows of ``evidence`` decided now, and
    ``kept``, the final rows earlier runs decided (``transforms.discard_final``; then
    ``evidence`` holds the other rows alone). ``first_seen_run_id`` is this run: the
    writer's merge keeps an existing row's."""
    if evidence.as_of_ms != params.as_of_ms:
        raise ValueError(
            f"discard evidence was cut at {evidence.as_of_ms}, the run's T is {params.as_of_ms}"
        )
    decided = (
        with_flags(evidence)
        .withColumn("reason", discard_reason(params))
        .withColumn("outcome", discard_outcome())
        .withColumn("ended_before_discard", ended_before_discard())
        .withColumn("resume_futile", resume_futile(params))
    )
    resumable = F.col("resume_futile") == F.lit(False)
    values = {
        "resume_topic": F.when(resumable, F.lit(DISCARD_TOPIC)),
        "resume_offset_msg_id": F.when(resumable, F.col("offset_msg_id")),
        "first_seen_run_id": F.lit(params.run_id),
        "run_id": F.lit(params.run_id),
        "as_of_ms": F.lit(params.as_of_ms),
    }
    shaped = decided.select(
        *[
            values.get(field.name, F.col(field.name)).cast(field.dataType).alias(field.name)
            for field in DISCARD_HISTORY.fields
        ]
    )
    return shaped if kept is None else shaped.unionByName(kept.select(*shaped.columns))


def discard_history_counts(history: DataFrame) -> DataFrame:
    """``broker, discard_history_rows``: the rows this run wrote per broker (run_summary)."""
    return history.groupBy("broker").agg(F.count(F.lit(1)).alias("discard_history_rows"))
