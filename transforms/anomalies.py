"""The anomalies table (docs/spec/anomalies.md): what the broker gets wrong or will waste, one row
per finding, with the number each rule measured and the threshold it was compared with.

Each rule is one function over the round's own frames (``RoundEvidence``, each record with
its queue's window attached by ``windowed``, beside the pending records): joins and
aggregates only, facts of one key merged in one aggregate (``transforms.merge``), and every
rule ends in ``_finding``, the ``ANOMALY`` schema contract. ``stalled_offset`` needs earlier
runs of the output root, which ``jobs.anomalies`` reads; the rule itself is pure and lives
here.
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
    IMMUNITY_EXHAUSTS_CHECKS,
    NOT_REACHED,
    OP_BACKLOG,
    OP_QUEUE_GAP,
    OP_STALL_4_9,
    RECHECK_OF_RESOLVED,
    RUN_SUMMARY,
    SEVERITIES,
    SLOW_PRODUCER,
    STALLED_OFFSET,
    SYSTEM_TOPIC_OR_DELAY,
    TOO_YOUNG,
    WARNING,
)
from transforms.classify import with_round_class
from transforms.merge import Facts, carried, merged
from transforms.messages import QUEUE_KEY
from transforms.ops import (
    HALF_OFFSET,
    OP_STORE_MS,
    is_remove_op,
    largest_item,
    named_offsets,
    named_with_times,
)
from transforms.params import RoundParams
from transforms.queue_values import Attach, joined_values
from transforms.resolve import TRANSACTION, resolving_offsets

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
    half records and op records stored before T, the op items (``transforms.ops``), and
    ``linked``: the half records of the transactions with a record from h0 (what resolution
    read), among which are the records of every transaction the anomaly rules judge."""

    half: DataFrame
    ops: DataFrame
    op_items: DataFrame
    linked: DataFrame


# The per-queue values each evidence part carries (``windowed``).
HALF_WINDOW = ("h0", "h1")
OP_WINDOW = ("p0", "p1", "h1", "p_safe")


def windowed(
    evidence: RoundEvidence, queues: DataFrame, attach: Attach = joined_values
) -> RoundEvidence:
    """``evidence`` of the queues with a window (``h0`` known), each record with its queue's
    values: the half records of the transactions from h0 (``linked``: every rule's half
    records are among them) with ``HALF_WINDOW``, the op records with ``OP_WINDOW``. Every
    rule reads them, so they are attached once here by ``attach`` (the job's choice: a
    literal map for a few queues, a broadcast join beyond); each rule joining the per-queue
    rows again was a broadcast, so a Spark job, per rule and projection."""
    window = queues.filter(F.col("h0").isNotNull())
    half = attach(evidence.linked, window, HALF_WINDOW)
    return RoundEvidence(half, attach(evidence.ops, window, OP_WINDOW), evidence.op_items, half)


def narrowed(
    evidence: RoundEvidence, keep: Callable[[DataFrame], DataFrame] = lambda frame: frame
) -> RoundEvidence:
    """``windowed`` evidence cut down to what the rules read, each part materialised by
    ``keep`` (the job caches them; they are small when h0 is near the queue's end). Every
    rule gives the same findings over the result as over ``evidence``:

    - ``half``: every half record of a transaction with a record in [h0, h1) (the window
      the rules judge; its transactions' other records for ``slow_producer``);
    - ``ops``: the op records from p0 (``op_backlog``, ``op_queue_gap``, ``op_stall_4_9``);
    - ``op_items``: the items naming the offset, or the prepared offset, of one of those
      half records (``recheck_of_resolved``, ``slow_producer``).

    Without it each rule would filter every record again: about twenty scans of the
    round's records per run."""
    # The distincts are not for the semi-joins' sake: their exchange runs first and tells
    # adaptive execution how few keys there are, so that the semi-join can broadcast them
    # (a filter's size estimate is that of every half record).
    transactions = evidence.half.filter(_in_window()).select(*TRANSACTION).distinct()
    half = keep(evidence.half.join(transactions, TRANSACTION, how="left_semi"))
    ops = keep(_from_p0(evidence.ops))
    offsets = half.select(*QUEUE_KEY, resolving_offsets().alias(HALF_OFFSET))
    op_items = keep(
        evidence.op_items.join(
            offsets.filter(F.col(HALF_OFFSET).isNotNull()).distinct(),
            [*QUEUE_KEY, HALF_OFFSET],
            how="left_semi",
        )
    )
    return RoundEvidence(half, ops, op_items, half)


def finding(
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


def _in_window() -> Column:
    """A half record of ``windowed`` evidence in [h0, h1) of its queue."""
    return (F.col("queue_offset") >= F.col("h0")) & (F.col("queue_offset") < F.col("h1"))


def _from_p0(ops: DataFrame) -> DataFrame:
    """The op records of ``windowed`` evidence at offsets >= p0 (stored before T)."""
    return ops.filter(F.col("queue_offset") >= F.col("p0"))


def _flag(frame: DataFrame, keys: list[str], name: str) -> Facts:
    """``name``: true for the keys of ``frame`` (null for the others), for ``merged``."""
    return Facts(frame.select(*keys, F.lit(True).alias(name)), (F.max(name).alias(name),))


def _unresolved_by_offset(
    evidence: RoundEvidence, named: DataFrame, pending: DataFrame
) -> DataFrame:
    """The half records in [h0, h1) that no op record names by their own offset (``named``:
    ``named_offsets``) and that are not pending: resolved through another record of their
    transaction (rules 2-3). One aggregate per half offset, not two anti-joins (a Spark
    job per exchange)."""
    keys = [*QUEUE_KEY, "queue_offset"]
    facts = merged(
        carried(evidence.half.filter(_in_window()).drop("h1"), keys),  # one record per offset
        _flag(named.withColumnRenamed(HALF_OFFSET, "queue_offset"), keys, "_named"),
        _flag(pending, keys, "_pending"),
        keys=keys,
    )
    return facts.filter(F.col("_named").isNull() & F.col("_pending").isNull()).drop(
        "_named", "_pending"
    )


def recheck_of_resolved(
    evidence: RoundEvidence, pending: DataFrame, params: RoundParams
) -> DataFrame:
    """Records in [h0, h1) resolved only through rules 2-3 (their own offset is named by no
    op record) that the broker, matching exact offsets, acts on: it checks, puts back or
    discards them, or stops at them. An immunity copy whose original (at or after h0) is
    named is skipped by the broker too (``checkPrepareQueueOffset``), so it is no finding."""
    named = named_offsets(evidence.op_items)
    broker_sees_unresolved = _unresolved_by_offset(evidence, named, pending).transform(
        with_round_class, params
    )
    skipped_by_broker = (F.col("round_class") == IMMUNE) & (
        F.col("prepared_queue_offset") >= F.col("h0")
    )
    # Repeated names are harmless to an anti-join: no distinct (a shuffle) first.
    named_prepared = named.select(
        F.col("broker").alias("_broker"),
        F.col("queue_id").alias("_queue_id"),
        F.col(HALF_OFFSET).alias("_prepared"),
    )
    original_named = (
        (F.col("broker") == F.col("_broker"))
        & (F.col("queue_id") == F.col("_queue_id"))
        & (F.col("prepared_queue_offset") == F.col("_prepared"))
        & skipped_by_broker
    )
    acted_on = broker_sees_unresolved.join(named_prepared, original_named, how="left_anti")
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
    return finding(
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
    return finding(
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
    return finding(
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


def _naming_times(records: DataFrame, op_items: DataFrame) -> DataFrame:
    """``broker, queue_id, transaction_key, op_at``: the store time of each op record naming
    one of ``records`` by its offset or as the original of an immunity copy (its prepared
    offset): ``resolving_offsets``, so that one join finds either."""
    offsets = records.select(*TRANSACTION, resolving_offsets().alias(HALF_OFFSET))
    return offsets.join(named_with_times(op_items), [*QUEUE_KEY, HALF_OFFSET], "inner").select(
        *TRANSACTION, F.col(OP_STORE_MS).alias("op_at")
    )


def _transaction_timings(evidence: RoundEvidence, pending: DataFrame) -> DataFrame:
    """Per transaction resolved in this round's window (a record of its in [h0, h1) is not
    pending) and named by an op record: ``producer_group`` (of its records in the window),
    ``born`` (its earliest born time), ``resolved_at`` (the store time of the first op record
    naming one of its records) and ``first_check_copy_at`` (the store time of its first
    check copy: a put-back with a counter and without ``TRAN_PREPARED_QUEUE_OFFSET``, which
    only immunity copies carry). One aggregate of the three parts (``transforms.merge``)."""
    check_copy = F.col("check_times").isNotNull() & F.col("prepared_queue_offset").isNull()
    in_window = _in_window()
    records = Facts(
        evidence.half,
        (
            F.min(F.when(in_window, F.col("producer_group"))).alias("producer_group"),
            F.min("born_timestamp_ms").alias("born"),
            F.min(F.when(check_copy, F.col("store_timestamp_ms"))).alias("first_check_copy_at"),
            F.collect_set(F.when(in_window, F.col("queue_offset"))).alias("window_offsets"),
        ),
    )
    still_pending = Facts(
        pending.select(*TRANSACTION, F.col("queue_offset").alias("_pending_offset")),
        (F.collect_set("_pending_offset").alias("pending_offsets"),),
    )
    naming = Facts(
        _naming_times(evidence.half, evidence.op_items), (F.min("op_at").alias("resolved_at"),)
    )
    facts = merged(records, still_pending, naming, keys=TRANSACTION)
    resolved_here = F.size(F.array_except("window_offsets", "pending_offsets")) > 0
    return facts.filter(resolved_here & F.col("resolved_at").isNotNull())


def slow_producer(evidence: RoundEvidence, pending: DataFrame, params: RoundParams) -> DataFrame:
    """Per producer group, over the transactions resolved in this run's window: the share
    resolved only after a check copy existed (the producer did not answer by itself in
    time), with p50/p99 of op store time - born time. A group with fewer transactions than
    ``slow_producer_min_transactions`` is not judged."""
    timings = _transaction_timings(evidence, pending)
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
    return finding(
        groups.filter(slow),
        SLOW_PRODUCER,
        F.lit(WARNING),
        percent,
        F.lit(params.slow_producer_percent),
        detail,
        producer_group=F.col("producer_group"),
    )


def op_backlog(evidence: RoundEvidence, params: RoundParams) -> DataFrame:
    """Op records from p0 to the op queue's end that name only half offsets below h1: the
    broker reads them again every round (ops naming offsets at or beyond h1 hold p0 back
    legitimately). Over ``op_backlog_records``: warning; over ten times that: critical."""
    # The largest item read from each body (a few op records from p0), not the op items
    # aggregated per op record and joined back: one aggregate per queue.
    naming = _from_p0(evidence.ops).withColumn("max_named", largest_item())
    per_queue = (
        naming.filter(F.col("max_named").isNotNull())
        .groupBy(*QUEUE_KEY, "p0", "h1")
        .agg(
            F.count(F.when(F.col("max_named") < F.col("h1"), 1)).alias("backlog"),
            (F.max("queue_offset") + 1).alias("op_end"),
        )
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
    return finding(
        per_queue.filter(F.col("backlog") > limit),
        OP_BACKLOG,
        severity.otherwise(F.lit(WARNING)),
        F.col("backlog"),
        F.lit(limit),
        detail,
        op_offset=F.col("p0"),
    )


def _op_offsets(ops: DataFrame) -> DataFrame:
    """Per op offset from p0 that is present or follows a present one (and p0 itself):
    ``present``, ``follows`` (its predecessor is present) and the queue's ``p0``. One
    aggregate of three projections of the op records from p0."""
    ahead = _from_p0(ops).select(*QUEUE_KEY, "queue_offset", "p0")
    rows = (
        ahead.withColumn("_present", F.lit(True))
        .unionByName(
            ahead.withColumn("queue_offset", F.col("queue_offset") + 1).withColumn(
                "_follows", F.lit(True)
            ),
            allowMissingColumns=True,
        )
        .unionByName(ahead.withColumn("queue_offset", F.col("p0")), allowMissingColumns=True)
    )
    return rows.groupBy(*QUEUE_KEY, "queue_offset").agg(
        F.coalesce(F.max("_present"), F.lit(False)).alias("present"),
        F.coalesce(F.max("_follows"), F.lit(False)).alias("follows"),
        F.max("p0").alias("p0"),
    )


def op_queue_gap(evidence: RoundEvidence) -> DataFrame:
    """One row per range of op offsets missing inside [p0, end) (deleted consume-queue
    files, RocketMQ #2133, or unreadable records). A gap starts at an absent offset whose
    predecessor is present (or at an absent p0) and ends at the next present offset, one
    whose predecessor is absent: both read from one aggregate per op offset, then the few
    starts paired with the few ends."""
    offsets = _op_offsets(evidence.ops)
    is_start = ~F.col("present") & (F.col("follows") | (F.col("queue_offset") == F.col("p0")))
    is_end = F.col("present") & ~F.col("follows") & (F.col("queue_offset") > F.col("p0"))
    starts = offsets.filter(is_start).select(*QUEUE_KEY, F.col("queue_offset").alias("gap_start"))
    ends = offsets.filter(is_end).select(*QUEUE_KEY, F.col("queue_offset").alias("gap_end"))
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
    return finding(
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
    first = flagged.groupBy(*TRANSACTION).agg(
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
    return finding(
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


def op_stall_4_9(evidence: RoundEvidence, params: RoundParams) -> DataFrame:
    """On a 4.9 broker, an op record with another tag than ``d`` at the new op offset p1: such
    a broker never marks it done, so its op offset stays there for good. p_safe does not
    stop at it, but stops before it when an op record before it names a half offset from
    h_safe on (done for h1, not for h_safe): ``detail`` says whether installing p_safe
    passes it."""
    ahead = _from_p0(evidence.ops)
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
    return finding(
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
    return finding(
        stuck,
        STALLED_OFFSET,
        F.lit(CRITICAL),
        F.lit(runs),
        F.lit(runs),
        detail,
        half_offset=F.when(is_half, F.col("t.offset")),
        op_offset=F.when(~is_half, F.col("t.offset")),
    )


def round_anomalies(evidence: RoundEvidence, pending: DataFrame, params: RoundParams) -> DataFrame:
    """Every rule that the round's own frames decide (all but ``stalled_offset``), as
    ``ANOMALY`` rows, over ``windowed`` evidence (``narrowed`` or not)."""
    parts = [
        recheck_of_resolved(evidence, pending, params),
        immunity_exhausts_checks(pending, params),
        slow_producer(evidence, pending, params),
        op_backlog(evidence, params),
        op_queue_gap(evidence),
        system_topic_or_delay(pending),
        op_stall_4_9(evidence, params),
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
    severity on the queue (0 when none). Columns in ``RUN_SUMMARY`` order. The counts are
    merged with the summary rows carried along, in one aggregate (joining the few summary
    rows with an aggregate of the anomalies shuffled both sides)."""
    counts = Facts(
        # A finding of no queue (null queue_id) counts on no row: the summary row of an
        # unknown queue (null queue_id) shows 0.
        anomalies.filter(F.col("queue_id").isNotNull()).select(*QUEUE_KEY, "severity"),
        tuple(
            F.count(F.when(F.col("severity") == severity, 1)).alias(column)
            for severity, column in zip(SEVERITIES, ANOMALY_COUNT_COLUMNS, strict=True)
        ),
    )
    joined = merged(carried(summary.drop(*ANOMALY_COUNT_COLUMNS)), counts)
    return joined.select(
        *[F.col(f.name).cast(f.dataType).alias(f.name) for f in RUN_SUMMARY.fields]
    )
