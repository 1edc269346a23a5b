"""``settled_discards``: what the broker's own next round does to transactions that are
already settled. Read from ``run_summary``'s rows, as the picture's findings are: the count
comes from the broker's walk (``transforms.broker_round``), once per queue."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.outputs import INFO, SETTLED_DISCARDS
from transforms.anomaly_rules.evidence import finding


def settled_discards(summary: DataFrame) -> DataFrame:
    """One ``info`` row per queue whose next broker round discards transactions an op
    record already settled (``settled_discards`` > 0): harmless re-discards, which the
    broker still writes to ``TRANS_CHECK_MAX_TIME_TOPIC`` (spec section 4 rules 2-3: it
    matches exact offsets only)."""
    count = F.col("settled_discards")
    return finding(
        summary.filter(count > 0),
        SETTLED_DISCARDS,
        F.lit(INFO),
        count,
        F.lit(0),
        F.format_string(
            "%d discard(s) of the broker's next round are re-discards of transactions an op"
            " record already settled (table discards, really_pending = false): harmless,"
            " though the broker writes them to TRANS_CHECK_MAX_TIME_TOPIC again",
            count,
        ),
    )
