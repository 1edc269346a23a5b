"""``slow_producer``: per producer group, how often the broker had to check before the
producer answered, from the window's transactions, their check copies and the op records
naming them."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.outputs import SLOW_PRODUCER, WARNING
from transforms.anomaly_rules.evidence import RoundEvidence, finding, in_window
from transforms.merge import Facts, merged
from transforms.messages import QUEUE_KEY
from transforms.ops import HALF_OFFSET, OP_STORE_MS, named_with_times
from transforms.params import RoundParams
from transforms.resolve import TRANSACTION, resolving_offsets


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
    windowed_record = in_window()
    records = Facts(
        evidence.half,
        (
            F.min(F.when(windowed_record, F.col("producer_group"))).alias("producer_group"),
            F.min("born_timestamp_ms").alias("born"),
            F.min(F.when(check_copy, F.col("store_timestamp_ms"))).alias("first_check_copy_at"),
            F.collect_set(F.when(windowed_record, F.col("queue_offset"))).alias("window_offsets"),
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
