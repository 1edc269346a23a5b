"""The anomaly rules over the op records from p0: what the broker reads again every round
(``op_backlog``), op offsets missing inside [p0, end) (``op_queue_gap``) and, on a 4.9
broker, an op record that holds its op offset for good (``op_stall_4_9``)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.outputs import CRITICAL, OP_BACKLOG, OP_QUEUE_GAP, OP_STALL_4_9, WARNING
from transforms.anomaly_rules.evidence import RoundEvidence, finding, from_p0
from transforms.messages import QUEUE_KEY
from transforms.ops import is_remove_op, largest_item
from transforms.params import RoundParams

OP_PULL_SIZE = 32  # op records per pull of the broker's check (OP_MSG_PULL_NUMS)
BACKLOG_CRITICAL_FACTOR = 10


def op_backlog(evidence: RoundEvidence, params: RoundParams) -> DataFrame:
    """Op records from p0 to the op queue's end that name only half offsets below h1: the
    broker reads them again every round (ops naming offsets at or beyond h1 hold p0 back
    legitimately). Over ``op_backlog_records``: warning; over ten times that: critical."""
    # The largest item read from each body (a few op records from p0), not the op items
    # aggregated per op record and joined back: one aggregate per queue.
    naming = from_p0(evidence.ops).withColumn("max_named", largest_item())
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
    ahead = from_p0(ops).select(*QUEUE_KEY, "queue_offset", "p0")
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


def op_stall_4_9(evidence: RoundEvidence, params: RoundParams) -> DataFrame:
    """On a 4.9 broker, an op record with another tag than ``d`` at the new op offset p1: such
    a broker never marks it done, so its op offset stays there for good. p_safe does not
    stop at it, but stops before it when an op record before it names a half offset from
    h_safe on (done for h1, not for h_safe): ``detail`` says whether installing p_safe
    passes it."""
    ahead = from_p0(evidence.ops)
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
