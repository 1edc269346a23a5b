"""Resolution of half records (spec section 4): half offsets against the offsets op bodies name.

A half record is resolved when (1) its queue offset is named by an op record, (2) its
``TRAN_PREPARED_QUEUE_OFFSET`` is named (an immunity copy whose original was resolved),
or (3) it shares its ``UNIQ_KEY`` with a record resolved by (1) or (2) in the same half
queue (a put-back copy of a transaction resolved through another copy). Rules 2 and 3 go
beyond the broker on purpose: the job reports what is really pending.

All three rules reduce to one question per *transaction*: did any of its records get
named? So the work is to find the named transactions (one join of the named offsets
with the few records' two offsets, or two joins when they are many), then one left join
that gives each record the first op that settled its transaction (null: really pending,
the anti-join of spec section 4).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from transforms.ops import HALF_OFFSET, OP_OFFSET

TRANSACTION_KEY = "transaction_key"
# The op record that settled a record's transaction (rules 1-3): the smallest op offset
# naming one of its records; null for a transaction that is really pending.
SETTLED_BY = "settled_by_op_offset"
TRANSACTION = ["broker", "queue_id", TRANSACTION_KEY]  # a transaction of one queue
# A record without UNIQ_KEY is its own transaction. NUL cannot start a real UNIQ_KEY
# (client ids are hex), so the synthetic key never collides with one.
_ORPHAN_PREFIX = "\u0000offset:"


def resolving_offsets() -> Column:
    """Each half record as the two offsets an op record resolves it by (rules 1 and 2): its
    own and, for an immunity copy, its original's (``prepared_queue_offset``; null for
    other records). One row each after ``explode``: a single join finds either."""
    return F.explode(F.array(F.col("queue_offset"), F.col("prepared_queue_offset")))


def with_transaction_key(half: DataFrame) -> DataFrame:
    """Add ``transaction_key``: the UNIQ_KEY, or a key unique to the record when it has none."""
    orphan = F.concat(F.lit(_ORPHAN_PREFIX), F.col("queue_offset").cast("string"))
    return half.withColumn(TRANSACTION_KEY, F.coalesce(F.col("uniq_key"), orphan))


def transaction_records(half: DataFrame, of: DataFrame, small: bool = False) -> DataFrame:
    """Every record of ``half`` of a transaction of a record of ``of`` (both carry
    ``transaction_key``): what settles those transactions, rule 3 reaching through the key
    to records outside ``of``. ``small`` says ``of`` may be broadcast (``half`` is only
    scanned)."""
    # A semi join ignores repeated keys on its right: a broadcast needs no distinct.
    wanted = F.broadcast(of.select(*TRANSACTION)) if small else of.select(*TRANSACTION).distinct()
    return half.join(wanted, TRANSACTION, how="left_semi")


def resolved_transactions(half: DataFrame, named: DataFrame, small: bool = False) -> DataFrame:
    """``broker, queue_id, transaction_key`` of every transaction of ``half`` with a named
    record, and the other columns of ``named`` (the op offset, say) of each naming; a key
    may repeat (its consumers test membership with semi or anti joins, or aggregate, so
    removing repeats would cost a shuffle for nothing).

    ``half`` must carry ``transaction_key`` and ``prepared_queue_offset`` (every record of
    the transactions to settle: ``transaction_records``); ``named`` is ``broker, queue_id,
    half_offset`` and any other columns. ``small`` says ``half`` is small enough to
    broadcast, so that ``named`` is not shuffled (only scanned).
    """
    extra = [name for name in named.columns if name not in ("broker", "queue_id", HALF_OFFSET)]
    if small:
        # Broadcast the few records and stream `named` past them. Each record stands for
        # both offsets that resolve it (rules 1 and 2): one broadcast, not one per rule
        # (each is a Spark job). An offset named twice repeats a key.
        resolving = resolving_offsets().alias("_resolving")
        copies = F.broadcast(
            half.select(*TRANSACTION, resolving).filter(F.col("_resolving").isNotNull())
        )
        # Renamed so that the join conditions name each side unambiguously (both sides may
        # come from the same cached records).
        naming = named.select(
            F.col("broker").alias("_named_broker"),
            F.col("queue_id").alias("_named_queue"),
            HALF_OFFSET,
            *extra,
        )
        same_offset = (
            (F.col("_named_broker") == F.col("broker"))
            & (F.col("_named_queue") == F.col("queue_id"))
            & (F.col(HALF_OFFSET) == F.col("_resolving"))
        )
        return naming.join(copies, same_offset, how="inner").select(*TRANSACTION, *extra)
    by_offset = named.withColumnRenamed(HALF_OFFSET, "queue_offset")
    by_prepared = named.withColumnRenamed(HALF_OFFSET, "prepared_queue_offset")
    # Inner joins when ``named`` carries columns to keep; membership alone is a semi join.
    how = "inner" if extra else "left_semi"
    keep = [*TRANSACTION, *extra]
    rule_1 = half.join(by_offset, ["broker", "queue_id", "queue_offset"], how=how)
    rule_2 = half.join(by_prepared, ["broker", "queue_id", "prepared_queue_offset"], how=how)
    return rule_1.select(*keep).unionByName(rule_2.select(*keep))


def with_settled_by(records: DataFrame, settling: DataFrame, small: bool = False) -> DataFrame:
    """``records`` (carrying ``transaction_key``) with ``settled_by_op_offset``: the
    smallest op offset of ``settling`` (``resolved_transactions`` with the naming op's
    ``op_offset``) for its transaction, null when its transaction is unresolved (really
    pending). ``small``: the settled transactions are few enough to broadcast."""
    first = settling.groupBy(*TRANSACTION).agg(F.min(OP_OFFSET).alias(SETTLED_BY))
    first = F.broadcast(first) if small else first
    return records.join(first, TRANSACTION, how="left").select(*records.columns, SETTLED_BY)
