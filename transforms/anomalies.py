"""The anomalies table (docs/spec/anomalies.md): what the broker gets wrong or will waste, one row
per finding, with the number each rule measured and the threshold it was compared with.

Each rule is one function over the round's own frames (``RoundEvidence`` beside the pending
records and the per-queue rows): joins and aggregates only, and every rule ends in
``_finding``, the ``ANOMALY`` schema contract. ``stalled_offset`` needs earlier runs of the
output root, which ``jobs.anomalies`` reads; the rule itself is pure and lives here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.outputs import (
    ANOMALY,
    ANOMALY_COUNT_COLUMNS,
    CHECK,
    CRITICAL,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    NOT_REACHED,
    RUN_SUMMARY,
    SEVERITIES,
    TOO_YOUNG,
    WARNING,
)
from transforms.classify import with_round_class
from transforms.messages import QUEUE_KEY
from transforms.ops import (
    HALF_OFFSET,
    OP_OFFSET,
    OP_STORE_MS,
    explode_op_items,
    is_remove_op,
    largest_named_offset,
    named_with_times,
)
from transforms.params import RoundParams
from transforms.resolve import TRANSACTION_KEY

RECHECK_OF_RESOLVED = "recheck_of_resolved"
IMMUNITY_EXHAUSTS_CHECKS = "immunity_exhausts_checks"
SLOW_PRODUCER = "slow_producer"
OP_BACKLOG = "op_backlog"
OP_QUEUE_GAP = "op_queue_gap"
STALLED_OFFSET = "stalled_offset"
SYSTEM_TOPIC_OR_DELAY = "system_topic_or_delay"
OP_STALL_4_9 = "op_stall_4_9"
KINDS = (
    RECHECK_OF_RESOLVED,
    IMMUNITY_EXHAUSTS_CHECKS,
    SLOW_PRODUCER,
    OP_BACKLOG,
    OP_QUEUE_GAP,
    STALLED_OFFSET,
    SYSTEM_TOPIC_OR_DELAY,
    OP_STALL_4_9,
)

OP_PULL_SIZE = 32  # op records per pull of the broker's check (OP_MSG_PULL_NUMS)
BACKLOG_CRITICAL_FACTOR = 10
# RocketMQ's reserved topic names (TopicValidator) and the prefix of its system topics.
SYSTEM_TOPICS = (
    "TBW102",
    "SCHEDULE_TOPIC_XXXX",
    "BenchmarkTest",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT",
)
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
# The broker's action on a record it sees as unresolved, by the class it gives it.
_BROKER_ACTIONS = {
    DISCARD_CHECK_MAX: "discards it (counter at check_max)",
    DISCARD_EXPIRED: "discards it (older than the retention)",
    IMMUNE: "puts it back without a check (immunity)",
    CHECK: "checks it again",
    TOO_YOUNG: "stops its round at it (too young)",
}


@dataclass(frozen=True)
class RoundEvidence:
    """The round's frames the rules read beyond ``pending`` and the per-queue rows: readable
    half records and op records stored before T, and the op items (``transforms.ops``)."""

    half: DataFrame
    ops: DataFrame
    op_items: DataFrame


def narrowed(
    evidence: RoundEvidence,
    queues: DataFrame,
    keep: Callable[[DataFrame], DataFrame] = lambda frame: frame,
) -> RoundEvidence:
    """``evidence`` cut down to what the rules read, each part materialised by ``keep``
    (the job caches them; they are small when h0 is near the queue's end). Every rule
    gives the same findings over the result as over ``evidence``:

    - ``half``: every half record of a transaction with a record in [h0, h1) (the window
      the rules judge; its transactions' other records for ``slow_producer``);
    - ``ops``: the op records from p0 (``op_backlog``, ``op_queue_gap``, ``op_stall_4_9``);
    - ``op_items``: the items naming the offset, or the prepared offset, of one of those
      half records (``recheck_of_resolved``, ``slow_producer``).

    Without it each rule filtered every record again: about twenty scans of the round's
    records per run (docs/benchmarks.md)."""
    in_window = _in_window(evidence.half, queues)
    # The distincts are not for the semi-joins' sake: their exchange runs first and tells
    # adaptive execution how few keys there are, so that the semi-join can broadcast them
    # (a filter's size estimate is that of every half record).
    transactions = in_window.select(*QUEUE_KEY, TRANSACTION_KEY).distinct()
    half = keep(evidence.half.join(transactions, [*QUEUE_KEY, TRANSACTION_KEY], how="left_semi"))
    ops = keep(_ops_from_p0(evidence, queues).select(*evidence.ops.columns))
    offsets = half.select(*QUEUE_KEY, F.col("queue_offset").alias(HALF_OFFSET)).unionByName(
        half.select(*QUEUE_KEY, F.col("prepared_queue_offset").alias(HALF_OFFSET))
    )
    op_items = keep(
        evidence.op_items.join(
            offsets.filter(F.col(HALF_OFFSET).isNotNull()).distinct(),
            [*QUEUE_KEY, HALF_OFFSET],
            how="left_semi",
        )
    )
    return RoundEvidence(half, ops, op_items)


def _finding(
    frame: DataFrame,
    kind: str,
    severity: Column,
    value: Column,
    threshold: Column,
    detail: Column,
    **keys: Column,
) -> DataFrame:
    """The ``ANOMALY`` contract; ``keys`` fills uniq_key, producer_group, half_offset and
    op_offset (null when not given: a queue- or group-level finding)."""
    columns = {
        "broker": F.col("broker"),
        "queue_id": F.col("queue_id"),
        "kind": F.lit(kind),
        "severity": severity,
        "value": value,
        "threshold": threshold,
        "detail": detail,
    }
    columns.update(keys)
    return frame.select(
        *[columns.get(f.name, F.lit(None)).cast(f.dataType).alias(f.name) for f in ANOMALY.fields]
    )


def _window(queues: DataFrame, *names: str) -> DataFrame:
    return F.broadcast(queues.filter(F.col("h0").isNotNull()).select(*QUEUE_KEY, *names))


def _in_window(half: DataFrame, queues: DataFrame) -> DataFrame:
    """The half records in [h0, h1) of their queue, with ``h0`` and ``h1``."""
    return half.join(_window(queues, "h0", "h1"), QUEUE_KEY, how="inner").filter(
        (F.col("queue_offset") >= F.col("h0")) & (F.col("queue_offset") < F.col("h1"))
    )


def recheck_of_resolved(
    evidence: RoundEvidence, pending: DataFrame, queues: DataFrame, params: RoundParams
) -> DataFrame:
    """Records in [h0, h1) resolved only through rules 2-3 (their own offset is named by no
    op record) that the broker, matching exact offsets, acts on: it checks, puts back or
    discards them, or stops at them. An immunity copy whose original (at or after h0) is
    named is skipped by the broker too (``checkPrepareQueueOffset``), so it is no finding."""
    in_window = _in_window(evidence.half, queues).drop("h1")
    named = evidence.op_items.filter(F.col(HALF_OFFSET).isNotNull()).select(
        *QUEUE_KEY, F.col(HALF_OFFSET).alias("queue_offset")
    )
    named_prepared = named.withColumnRenamed("queue_offset", "prepared_queue_offset")
    still_pending = pending.select(*QUEUE_KEY, "queue_offset")
    broker_sees_unresolved = (
        in_window.join(named, [*QUEUE_KEY, "queue_offset"], how="left_anti")
        .join(still_pending, [*QUEUE_KEY, "queue_offset"], how="left_anti")
        .transform(with_round_class, params)
    )
    skipped_by_broker = (
        (F.col("round_class") == IMMUNE) & (F.col("prepared_queue_offset") >= F.col("h0"))
    ).alias("skipped")
    prepared_named = broker_sees_unresolved.select("*", skipped_by_broker).join(
        named_prepared.distinct().withColumn("prepared_named", F.lit(True)),
        [*QUEUE_KEY, "prepared_queue_offset"],
        how="left",
    )
    acted_on = prepared_named.filter(
        ~(F.col("skipped") & F.coalesce(F.col("prepared_named"), F.lit(False)))
    )
    action = F.element_at(
        F.create_map(*[F.lit(text) for pair in _BROKER_ACTIONS.items() for text in pair]),
        F.col("round_class"),
    )
    discarded = F.col("round_class").isin(DISCARD_CHECK_MAX, DISCARD_EXPIRED)
    counter = F.coalesce(F.col("check_times"), F.lit(0))
    detail = F.format_string(
        "half offset %d is resolved through another record of its transaction (rules 2-3),"
        " but the broker matches exact offsets and %s; counter %d of check_max %d",
        F.col("queue_offset"),
        action,
        counter,
        F.lit(params.check_max),
    )
    return _finding(
        acted_on,
        RECHECK_OF_RESOLVED,
        F.when(discarded, F.lit(CRITICAL)).otherwise(F.lit(WARNING)),
        counter,
        F.lit(params.check_max),
        detail,
        uniq_key=F.col("uniq_key"),
        producer_group=F.col("producer_group"),
        half_offset=F.col("queue_offset"),
    )


def immunity_exhausts_checks(pending: DataFrame, params: RoundParams) -> DataFrame:
    """Pending records still immune whose immunity outlasts the put-backs left: immunity -
    age > (check_max - counter) x check_interval_ms, so the counter reaches check_max (and
    the record is discarded) before any check is sent (RocketMQ #8311, #9320, #615). The
    counter is the stored one (null = 0)."""
    # In decimals: an age near the ends of a long (a born time far from T) must not overflow
    # the subtraction and fail the run.
    exact = T.DecimalType(38, 0)
    counter = F.coalesce(F.col("check_times"), F.lit(0)).cast(exact)
    left_ms = F.col("immunity_ms").cast(exact) - F.col("age_ms").cast(exact)
    budget_ms = (F.lit(params.check_max).cast(exact) - counter) * F.lit(params.check_interval_ms)
    immune_now = (
        F.col("immunity_raw").isNotNull()
        & F.col("status").isin(IMMUNE, NOT_REACHED)
        & (F.col("age_ms") < F.col("immunity_ms"))
    )
    exhausts = immune_now & (left_ms > budget_ms)
    detail = F.format_string(
        "half offset %d stays immune %s ms more, but %s put-back(s) every %d ms bring its"
        " counter (%s) to check_max %d first: it is discarded without a check",
        F.col("queue_offset"),
        left_ms.cast("string"),
        (F.lit(params.check_max) - counter).cast("string"),
        F.lit(params.check_interval_ms),
        counter.cast("string"),
        F.lit(params.check_max),
    )
    return _finding(
        pending.filter(exhausts),
        IMMUNITY_EXHAUSTS_CHECKS,
        F.lit(WARNING),
        left_ms,
        budget_ms,
        detail,
        uniq_key=F.col("uniq_key"),
        producer_group=F.col("producer_group"),
        half_offset=F.col("queue_offset"),
    )


def discarded_without_check(unchecked: DataFrame) -> DataFrame:
    """The past evidence of ``immunity_exhausts_checks``: one finding per discard record
    whose transaction had immunity copies and no check copy before it
    (``transforms.discard_history.discarded_unchecked``): it was discarded unchecked."""
    detail = F.format_string(
        "discard record %d (TRANS_CHECK_MAX_TIME_TOPIC, counter %d): half offset %d was put"
        " back %d time(s) for its immunity and never checked before the broker discarded it",
        F.col("discard_offset"),
        F.coalesce(F.col("check_times"), F.lit(0)),
        F.col("half_offset"),
        F.col("immunity_copies"),
    )
    return _finding(
        unchecked,
        IMMUNITY_EXHAUSTS_CHECKS,
        F.lit(WARNING),
        F.col("immunity_copies"),
        F.lit(0),  # check copies seen before the discard
        detail,
        uniq_key=F.col("uniq_key"),
        producer_group=F.col("producer_group"),
        half_offset=F.col("half_offset"),
    )


def _window_transactions(
    evidence: RoundEvidence, pending: DataFrame, queues: DataFrame
) -> DataFrame:
    """``broker, queue_id, transaction_key, producer_group`` of the transactions resolved in
    this round's window: a record of theirs in [h0, h1) that is not pending."""
    return (
        _in_window(evidence.half, queues)
        .join(pending.select(*QUEUE_KEY, "queue_offset"), [*QUEUE_KEY, "queue_offset"], "left_anti")
        .groupBy(*QUEUE_KEY, TRANSACTION_KEY)
        .agg(F.first("producer_group", ignorenulls=True).alias("producer_group"))
    )


def _transaction_timings(evidence: RoundEvidence, transactions: DataFrame) -> DataFrame:
    """Per transaction of ``transactions``: ``born`` (its earliest born time), ``resolved_at``
    (the store time of the first op record naming one of its records, by offset or as the
    original of an immunity copy) and ``first_check_copy_at`` (the store time of its first
    check copy: a put-back with a counter and without ``TRAN_PREPARED_QUEUE_OFFSET``, which
    only immunity copies carry)."""
    keys = [*QUEUE_KEY, TRANSACTION_KEY]
    records = evidence.half.join(transactions.select(*keys), keys, how="left_semi")
    naming = named_with_times(evidence.op_items).withColumnRenamed(OP_STORE_MS, "op_at")
    by_offset = records.join(
        naming.withColumnRenamed(HALF_OFFSET, "queue_offset"), [*QUEUE_KEY, "queue_offset"], "inner"
    )
    by_prepared = records.join(
        naming.withColumnRenamed(HALF_OFFSET, "prepared_queue_offset"),
        [*QUEUE_KEY, "prepared_queue_offset"],
        "inner",
    )
    resolved_at = (
        by_offset.select(*keys, "op_at")
        .unionByName(by_prepared.select(*keys, "op_at"))
        .groupBy(*keys)
        .agg(F.min("op_at").alias("resolved_at"))
    )
    check_copy = F.col("check_times").isNotNull() & F.col("prepared_queue_offset").isNull()
    shape = records.groupBy(*keys).agg(
        F.min("born_timestamp_ms").alias("born"),
        F.min(F.when(check_copy, F.col("store_timestamp_ms"))).alias("first_check_copy_at"),
    )
    return transactions.join(shape, keys, how="inner").join(resolved_at, keys, how="inner")


def slow_producer(
    evidence: RoundEvidence, pending: DataFrame, queues: DataFrame, params: RoundParams
) -> DataFrame:
    """Per producer group, over the transactions resolved in this run's window: the share
    resolved only after a check copy existed (the producer did not answer by itself in
    time), with p50/p99 of op store time - born time. A group with fewer transactions than
    ``slow_producer_min_transactions`` is not judged."""
    timings = _transaction_timings(evidence, _window_transactions(evidence, pending, queues))
    after_check = F.col("first_check_copy_at") < F.col("resolved_at")
    latency = F.col("resolved_at") - F.col("born")
    groups = timings.groupBy(*QUEUE_KEY, "producer_group").agg(
        F.count(F.lit(1)).alias("transactions"),
        F.count(F.when(after_check, 1)).alias("after_check"),
        F.percentile_approx(latency, [0.5, 0.99]).alias("latency"),
    )
    percent = F.col("after_check") * 100.0 / F.col("transactions")
    slow = (F.col("transactions") >= params.slow_producer_min_transactions) & (
        percent > params.slow_producer_percent
    )
    detail = F.format_string(
        "producer group %s: %d of %d transactions (%.1f %%) were resolved only after a check"
        " copy existed (threshold %d %%); op store time - born time p50 %d ms, p99 %d ms"
        " (5.x op times include up to transactionOpBatchInterval, 3000 ms by default)",
        F.coalesce(F.col("producer_group"), F.lit("(none)")),
        F.col("after_check"),
        F.col("transactions"),
        percent,
        F.lit(params.slow_producer_percent),
        F.col("latency")[0],
        F.col("latency")[1],
    )
    return _finding(
        groups.filter(slow),
        SLOW_PRODUCER,
        F.lit(WARNING),
        percent,
        F.lit(params.slow_producer_percent),
        detail,
        producer_group=F.col("producer_group"),
    )


def _ops_from_p0(evidence: RoundEvidence, queues: DataFrame) -> DataFrame:
    """Op records at offsets >= p0 (stored before T), with the queue's ``p0``, ``p1``,
    ``h1`` and ``p_safe``."""
    return evidence.ops.join(
        _window(queues, "p0", "p1", "h1", "p_safe"), QUEUE_KEY, "inner"
    ).filter(F.col("queue_offset") >= F.col("p0"))


def op_backlog(evidence: RoundEvidence, queues: DataFrame, params: RoundParams) -> DataFrame:
    """Op records from p0 to the op queue's end that name only half offsets below h1: the
    broker reads them again every round (ops naming offsets at or beyond h1 hold p0 back
    legitimately). Over ``op_backlog_records``: warning; over ten times that: critical."""
    from_p0 = _ops_from_p0(evidence, queues)
    # The items of the op records from p0 only: split again from their bodies (a few op
    # records), not filtered out of every op item of the queue.
    items = explode_op_items(from_p0.select(*evidence.ops.columns))
    largest = largest_named_offset(items).withColumnRenamed(OP_OFFSET, "queue_offset")
    ahead = from_p0.join(largest, [*QUEUE_KEY, "queue_offset"], "inner")
    per_queue = ahead.groupBy(*QUEUE_KEY, "p0", "h1").agg(
        F.count(F.when(F.col("max_named") < F.col("h1"), 1)).alias("backlog"),
        (F.max("queue_offset") + 1).alias("op_end"),
    )
    limit = params.op_backlog_records
    severity = F.when(F.col("backlog") > limit * BACKLOG_CRITICAL_FACTOR, F.lit(CRITICAL))
    detail = F.format_string(
        "%d op records between op offset %d and the op queue's end %d name only half offsets"
        " below h1 %d: the broker reads them again every round, %d pulls of %d (threshold %d)",
        F.col("backlog"),
        F.col("p0"),
        F.col("op_end"),
        F.col("h1"),
        F.ceil(F.col("backlog") / OP_PULL_SIZE),
        F.lit(OP_PULL_SIZE),
        F.lit(limit),
    )
    return _finding(
        per_queue.filter(F.col("backlog") > limit),
        OP_BACKLOG,
        severity.otherwise(F.lit(WARNING)),
        F.col("backlog"),
        F.lit(limit),
        detail,
        op_offset=F.col("p0"),
    )


def op_queue_gap(evidence: RoundEvidence, queues: DataFrame) -> DataFrame:
    """One row per range of op offsets missing inside [p0, end) (deleted consume-queue
    files, RocketMQ #2133, or unreadable records). A gap starts at an absent offset whose
    predecessor is present (or at an absent p0) and ends at the next present offset, one
    whose predecessor is absent: anti-joins with ``offset + 1``, then the few starts paired
    with the few ends."""
    ahead = _ops_from_p0(evidence, queues).select(*QUEUE_KEY, "queue_offset", "p0")
    present = ahead.select(*QUEUE_KEY, "queue_offset")
    after_present = ahead.select(*QUEUE_KEY, (F.col("queue_offset") + 1).alias("queue_offset"))
    p0_starts = (
        _window(queues, "p0")
        .select(*QUEUE_KEY, F.col("p0").alias("queue_offset"))
        .join(present.select(*QUEUE_KEY).distinct(), QUEUE_KEY, "left_semi")
    )
    starts = (
        after_present.unionByName(p0_starts)
        .distinct()
        .join(present, [*QUEUE_KEY, "queue_offset"], "left_anti")
        .withColumnRenamed("queue_offset", "gap_start")
    )
    ends = (
        ahead.join(after_present, [*QUEUE_KEY, "queue_offset"], "left_anti")
        .filter(F.col("queue_offset") > F.col("p0"))
        .select(*QUEUE_KEY, F.col("queue_offset").alias("gap_end"))
    )
    gaps = (
        starts.join(ends, QUEUE_KEY, "inner")
        .filter(F.col("gap_end") > F.col("gap_start"))
        .groupBy(*QUEUE_KEY, "gap_start")
        .agg(F.min("gap_end").alias("gap_end"))
    )
    missing = F.col("gap_end") - F.col("gap_start")
    detail = F.format_string(
        "op offsets %d to %d (%d) are missing inside [p0, end): what they named is unknown, so"
        " half records they resolved look pending (deleted consume-queue files, #2133)",
        F.col("gap_start"),
        F.col("gap_end") - 1,
        missing,
    )
    return _finding(
        gaps, OP_QUEUE_GAP, F.lit(CRITICAL), missing, F.lit(0), detail, op_offset=F.col("gap_start")
    )


def _delay_property() -> Column:
    """``name=value`` of the first delay or timer property a record carries (a delay level
    of 0 means no delay), else null."""
    level = F.when(
        F.col("delay_level_raw").isNotNull() & (F.col("delay_level_raw") != "0"),
        F.concat(F.lit("DELAY="), F.col("delay_level_raw")),
    )
    timers = [
        F.when(F.col(column).isNotNull(), F.concat(F.lit(f"{name}="), F.col(column)))
        for name, column in (
            ("TIMER_DELIVER_MS", "timer_deliver_ms_raw"),
            ("TIMER_DELAY_SEC", "timer_delay_sec_raw"),
            ("TIMER_DELAY_MS", "timer_delay_ms_raw"),
        )
    ]
    return F.coalesce(level, *timers)


def system_topic_or_delay(pending: DataFrame) -> DataFrame:
    """Pending transactions whose real topic is a system topic (RocketMQ's reserved names,
    the ``rmq_sys_`` prefix) or that carry a delay or timer property (RocketMQ #1540: such a
    message loops between the schedule topic and the half topic). One row per transaction:
    its first pending record."""
    system = F.col("real_topic").isin(*SYSTEM_TOPICS) | F.col("real_topic").startswith(
        SYSTEM_TOPIC_PREFIX
    )
    flagged = pending.select("*", system.alias("system"), _delay_property().alias("delay")).filter(
        F.col("system") | F.col("delay").isNotNull()
    )
    first = flagged.groupBy(*QUEUE_KEY, TRANSACTION_KEY).agg(
        F.min(
            F.struct("queue_offset", "uniq_key", "producer_group", "real_topic", "system", "delay")
        ).alias("r")
    )
    reasons = F.concat_ws(
        " and ",
        F.when(
            F.col("r.system"),
            F.format_string("its real topic %s is a system topic", F.col("r.real_topic")),
        ),
        F.when(F.col("r.delay").isNotNull(), F.format_string("it carries %s", F.col("r.delay"))),
    )
    detail = F.format_string(
        "half offset %d: %s; the broker does not deliver such a transaction as sent (#1540)",
        F.col("r.queue_offset"),
        reasons,
    )
    return _finding(
        first,
        SYSTEM_TOPIC_OR_DELAY,
        F.lit(WARNING),
        F.lit(None),
        F.lit(None),
        detail,
        uniq_key=F.col("r.uniq_key"),
        producer_group=F.col("r.producer_group"),
        half_offset=F.col("r.queue_offset"),
    )


def op_stall_4_9(evidence: RoundEvidence, queues: DataFrame, params: RoundParams) -> DataFrame:
    """On a 4.9 broker, an op record with another tag than ``d`` at the new op offset p1: such
    a broker never marks it done, so its op offset stays there for good. p_safe does not
    stop at it, but stops before it when an op record before it names a half offset from
    h_safe on (done for h1, not for h_safe): ``detail`` says whether installing p_safe
    passes it."""
    ahead = _ops_from_p0(evidence, queues)
    other_tag = ~F.coalesce(is_remove_op(), F.lit(False))
    stalled = ahead.filter(
        F.lit(params.broker_version == "4.9") & (F.col("queue_offset") == F.col("p1")) & other_tag
    )
    cure = F.when(
        F.col("p_safe") > F.col("queue_offset"),
        F.format_string("installing p_safe %d passes it", F.col("p_safe")),
    ).otherwise(
        F.format_string(
            "p_safe %d stops before it (an op record before it names a half offset the broker"
            " has yet to pass), so installing p_safe does not pass it yet",
            F.col("p_safe"),
        )
    )
    detail = F.format_string(
        "op record at op offset %d has tag %s, not d: a 4.9 broker never marks it done, so its"
        " op offset stays at %d for good; %s",
        F.col("queue_offset"),
        F.coalesce(F.col("tags"), F.lit("(none)")),
        F.col("p1"),
        cure,
    )
    return _finding(
        stalled,
        OP_STALL_4_9,
        F.lit(CRITICAL),
        F.col("queue_offset"),
        F.lit(None),
        detail,
        op_offset=F.col("queue_offset"),
    )


def stalled_offset(summary: DataFrame, earlier: DataFrame, params: RoundParams) -> DataFrame:
    """Queues whose half or op offset (h0 / p0: the committed offset as the round used it)
    is the same in this run and in the ``stalled_offset_runs - 1`` earlier runs of
    ``earlier`` (``broker, queue_id, as_of_ms, h0, p0``: one row per distinct T, already
    limited to the latest ones by the caller), those runs spanning more than
    ``stalled_offset_runs x check_interval_ms``, while records are pending (#1568, #9500).
    ``summary``: this run's ``run_summary`` rows."""
    runs = params.stalled_offset_runs
    unresolved = [CHECK, IMMUNE, DISCARD_CHECK_MAX, DISCARD_EXPIRED, TOO_YOUNG, NOT_REACHED]
    now = summary.filter(F.col("h0").isNotNull()).select(
        *QUEUE_KEY,
        F.col("h0").alias("h_now"),
        F.col("p0").alias("p_now"),
        sum((F.col(name) for name in unresolved), F.lit(0)).alias("pending"),
    )
    before = earlier.filter(F.col("as_of_ms") < params.as_of_ms)
    history = (
        now.join(before, QUEUE_KEY, "inner")
        .groupBy(*QUEUE_KEY, "h_now", "p_now", "pending")
        .agg(
            F.count(F.lit(1)).alias("earlier_runs"),
            F.min("as_of_ms").alias("since_ms"),
            F.count(F.when(~F.col("h0").eqNullSafe(F.col("h_now")), 1)).alias("h_moves"),
            F.count(F.when(~F.col("p0").eqNullSafe(F.col("p_now")), 1)).alias("p_moves"),
        )
    )
    span = F.lit(params.as_of_ms) - F.col("since_ms")
    long_enough = (
        (F.col("earlier_runs") >= runs - 1)
        & (span > runs * params.check_interval_ms)
        & (F.col("pending") > 0)
    )
    per_topic = F.explode(
        F.array(
            F.struct(
                F.lit("half").alias("topic"),
                F.col("h_moves").alias("moves"),
                F.col("h_now").alias("offset"),
            ),
            F.struct(
                F.lit("op").alias("topic"),
                F.col("p_moves").alias("moves"),
                F.col("p_now").alias("offset"),
            ),
        )
    ).alias("t")
    stuck = history.filter(long_enough).select("*", per_topic).filter(F.col("t.moves") == 0)
    detail = F.format_string(
        "%s offset %d unchanged over the last %d runs (%d ms, more than %d x check_interval_ms)"
        " while %d records are pending: the broker's round does not move it (#1568, #9500)",
        F.col("t.topic"),
        F.col("t.offset"),
        F.lit(runs),
        span,
        F.lit(runs),
        F.col("pending"),
    )
    is_half = F.col("t.topic") == "half"
    return _finding(
        stuck,
        STALLED_OFFSET,
        F.lit(CRITICAL),
        F.lit(runs),
        F.lit(runs),
        detail,
        half_offset=F.when(is_half, F.col("t.offset")),
        op_offset=F.when(~is_half, F.col("t.offset")),
    )


def round_anomalies(
    evidence: RoundEvidence, pending: DataFrame, queues: DataFrame, params: RoundParams
) -> DataFrame:
    """Every rule that the round's own frames decide (all but ``stalled_offset``), as
    ``ANOMALY`` rows."""
    parts = [
        recheck_of_resolved(evidence, pending, queues, params),
        immunity_exhausts_checks(pending, params),
        slow_producer(evidence, pending, queues, params),
        op_backlog(evidence, queues, params),
        op_queue_gap(evidence, queues),
        system_topic_or_delay(pending),
        op_stall_4_9(evidence, queues, params),
    ]
    found = parts[0]
    for part in parts[1:]:
        found = found.unionByName(part)
    return found


def with_run_columns(anomalies: DataFrame, params: RoundParams) -> DataFrame:
    """``ANOMALY`` rows with ``run_id`` and ``as_of_ms``: the anomalies table."""
    return anomalies.select(
        *ANOMALY.fieldNames(),
        F.lit(params.run_id).alias("run_id"),
        F.lit(params.as_of_ms).cast("long").alias("as_of_ms"),
    )


def with_anomaly_counts(summary: DataFrame, anomalies: DataFrame) -> DataFrame:
    """``run_summary`` rows with ``anomalies_<severity>``: this run's anomalies of that
    severity on the queue (0 when none). Columns in ``RUN_SUMMARY`` order."""
    counts = anomalies.groupBy(*QUEUE_KEY).agg(
        *[
            F.count(F.when(F.col("severity") == severity, 1)).alias(column)
            for severity, column in zip(SEVERITIES, ANOMALY_COUNT_COLUMNS, strict=True)
        ]
    )
    # A summary row of an unknown queue (null queue_id) matches nothing: 0.
    joined = summary.drop(*ANOMALY_COUNT_COLUMNS).join(counts, QUEUE_KEY, how="left")
    filled = {column: F.coalesce(F.col(column), F.lit(0)) for column in ANOMALY_COUNT_COLUMNS}
    return joined.select(
        *[
            filled.get(f.name, F.col(f.name)).cast(f.dataType).alias(f.name)
            for f in RUN_SUMMARY.fields
        ]
    )
