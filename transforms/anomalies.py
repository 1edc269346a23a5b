"""The anomalies table (docs/spec/anomalies.md): what the broker gets wrong or will waste, one row
per finding, with the number each rule measured and the threshold it was compared with.

The rules live in ``transforms.anomaly_rules``, one module per family of what they read;
each is a function over the round's own frames (``RoundEvidence``, each record with its
queue's window attached once by ``windowed``, beside the pending records): joins and
aggregates only, facts of one key merged in one aggregate (``transforms.merge``), each
ending in ``finding``, the ``ANOMALY`` schema contract, so that their rows union by name
as they are. Here: the evidence they read (``windowed``, ``narrowed``), the round's rules
together (``round_anomalies``) and the table's and run_summary's columns.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.outputs import ANOMALY, ANOMALY_COUNT_COLUMNS, RUN_SUMMARY, SEVERITIES
from transforms.anomaly_rules.evidence import (
    HALF_WINDOW,
    OP_WINDOW,
    RoundEvidence,
    contract,
    finding,
    from_p0,
    in_window,
)
from transforms.anomaly_rules.op_queue import op_backlog, op_queue_gap, op_stall_4_9
from transforms.anomaly_rules.pending import (
    immunity_exhausts_checks,
    recheck_of_resolved,
    system_topic_or_delay,
    unparsable_immunity,
)
from transforms.anomaly_rules.producer import slow_producer
from transforms.merge import Facts, carried, merged
from transforms.messages import QUEUE_KEY
from transforms.ops import HALF_OFFSET
from transforms.params import RoundParams
from transforms.queue_values import Attach, joined_values
from transforms.resolve import TRANSACTION, resolving_offsets

# Imported from here by the job, the picture and the discard history.
__all__ = [
    "RoundEvidence",
    "finding",
    "narrowed",
    "round_anomalies",
    "windowed",
    "with_anomaly_counts",
    "with_run_columns",
]


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
    transactions = evidence.half.filter(in_window()).select(*TRANSACTION).distinct()
    half = keep(evidence.half.join(transactions, TRANSACTION, how="left_semi"))
    ops = keep(from_p0(evidence.ops))
    offsets = half.select(*QUEUE_KEY, resolving_offsets().alias(HALF_OFFSET))
    op_items = keep(
        evidence.op_items.join(
            offsets.filter(F.col(HALF_OFFSET).isNotNull()).distinct(),
            [*QUEUE_KEY, HALF_OFFSET],
            how="left_semi",
        )
    )
    return RoundEvidence(half, ops, op_items, half)


def round_anomalies(evidence: RoundEvidence, pending: DataFrame, params: RoundParams) -> DataFrame:
    """Every rule that the round's own frames decide (all but ``stalled_offset``), as
    ``ANOMALY`` rows, over ``windowed`` evidence (``narrowed`` or not): one plan, the rules'
    rows unioned as they are (each ends in the ``ANOMALY`` contract, so no column is missing
    or out of order)."""
    found = recheck_of_resolved(evidence, pending, params)
    for part in (
        immunity_exhausts_checks(pending, params),
        slow_producer(evidence, pending, params),
        op_backlog(evidence, params),
        op_queue_gap(evidence),
        system_topic_or_delay(pending),
        op_stall_4_9(evidence, params),
        unparsable_immunity(pending, params),
    ):
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
    return joined.selectExpr(*contract(RUN_SUMMARY))
