"""The anomaly rules over the pending records and the window's half records: what the
broker checks, puts back or discards that it should not (``recheck_of_resolved``,
``immunity_exhausts_checks`` and its past evidence ``discarded_without_check``), the
immunity it reads as the transaction timeout (``unparsable_immunity``), and the
transactions it never delivers as sent (``system_topic_or_delay``)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.outputs import (
    CHECK,
    CRITICAL,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    IMMUNITY_EXHAUSTS_CHECKS,
    NOT_REACHED,
    RECHECK_OF_RESOLVED,
    SYSTEM_TOPIC_OR_DELAY,
    TOO_YOUNG,
    UNPARSABLE_IMMUNITY,
    WARNING,
)
from transforms.anomaly_rules.evidence import (
    RoundEvidence,
    finding,
    in_window,
    sql_array,
    sql_map,
)
from transforms.classify import with_round_class
from transforms.merge import Facts, carried, merged
from transforms.messages import QUEUE_KEY
from transforms.ops import HALF_OFFSET, named_offsets
from transforms.params import RoundParams
from transforms.parsing import is_unparsable, parse_java_long
from transforms.resolve import TRANSACTION

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
BROKER_ACTIONS = {
    DISCARD_CHECK_MAX: "discards it (counter at check_max)",
    DISCARD_EXPIRED: "discards it (older than the retention)",
    IMMUNE: "puts it back without a check (immunity)",
    CHECK: "checks it again",
    TOO_YOUNG: "stops its round at it (too young)",
}
# What ``recheck_of_resolved`` reads of a half record beyond its key: the class the broker
# gives it (``with_round_class``), whether it is an immunity copy of a named original, and
# the finding's columns.
_RECHECK_READS = (
    "h0",
    "check_times",
    "immunity_raw",
    "born_timestamp_ms",
    "prepared_queue_offset",
    "uniq_key",
    "producer_group",
)
# The delay and timer properties a record may carry, by their column.
_TIMERS = (
    ("TIMER_DELIVER_MS", "timer_deliver_ms_raw"),
    ("TIMER_DELAY_SEC", "timer_delay_sec_raw"),
    ("TIMER_DELAY_MS", "timer_delay_ms_raw"),
)


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
    # Only what the rule reads is carried through the aggregate: each carried column is an
    # aggregate of its own (and a column of the shuffle).
    records = evidence.half.filter(in_window()).select(*keys, *_RECHECK_READS)
    facts = merged(
        carried(records, keys),  # one record per offset
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
    action = F.element_at(sql_map(BROKER_ACTIONS), F.col("round_class"))
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


def unparsable_immunity(pending: DataFrame, params: RoundParams) -> DataFrame:
    """Pending records whose ``CHECK_IMMUNITY_TIME_IN_SECONDS`` does not parse as a long
    (``1e3``, ``60s``): the broker reads it as the transaction timeout (its ``getLong``
    gives -1), and so does the round (spec section 5), so the record takes part in the
    round; but the immunity its producer asked for is not the one it gets. Resolved
    records and records before h0 are no finding: no round reads their immunity again."""
    raw = F.col("immunity_raw")
    unparsable = is_unparsable(raw, parse_java_long(raw))
    detail = F.format_string(
        'half offset %d: CHECK_IMMUNITY_TIME_IN_SECONDS "%s" is not a whole number of'
        " seconds; the broker reads the transaction timeout (%d ms) instead",
        F.col("queue_offset"),
        F.substring(raw, 1, 64),
        F.lit(params.transaction_timeout_ms),
    )
    return finding(
        pending.filter(unparsable),
        UNPARSABLE_IMMUNITY,
        F.lit(WARNING),
        F.col("immunity_ms"),
        F.lit(None),
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


def _delay_property() -> Column:
    """``name=value`` of the first delay or timer property a record carries (a delay level
    of 0 means no delay), else null (``concat`` of a null is null). One parse of SQL text
    built from ``_TIMERS``, not a Py4J call per column and literal."""
    timers = (f"concat('{name}=', `{column}`)" for name, column in _TIMERS)
    level = "CASE WHEN delay_level_raw != '0' THEN concat('DELAY=', delay_level_raw) END"
    return F.expr(f"coalesce({level}, {', '.join(timers)})")


def system_topic_or_delay(pending: DataFrame) -> DataFrame:
    """Pending transactions whose real topic is a system topic (RocketMQ's reserved names,
    the ``rmq_sys_`` prefix) or that carry a delay or timer property (RocketMQ #1540: such a
    message loops between the schedule topic and the half topic). One row per transaction:
    its first pending record."""
    system = F.array_contains(sql_array(SYSTEM_TOPICS), F.col("real_topic")) | F.col(
        "real_topic"
    ).startswith(SYSTEM_TOPIC_PREFIX)
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
