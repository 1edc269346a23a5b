"""``stalled_offset``: the rule that spans runs. It needs earlier runs of the output root,
which ``jobs.anomalies`` reads; the rule itself is pure and lives here."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.outputs import (
    CHECK,
    CRITICAL,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    NOT_REACHED,
    STALLED_OFFSET,
    TOO_YOUNG,
)
from transforms.anomaly_rules.evidence import finding
from transforms.messages import QUEUE_KEY
from transforms.params import RoundParams


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
