"""Resolution of half records (spec section 4): the anti-join of half offsets against op bodies.

A half record is resolved when (1) its queue offset is named by an op record, (2) its
``TRAN_PREPARED_QUEUE_OFFSET`` is named (an immunity copy whose original was resolved),
or (3) it shares its ``UNIQ_KEY`` with a record resolved by (1) or (2) in the same half
queue (a put-back copy of a transaction resolved through another copy). Rules 2 and 3 go
beyond the broker on purpose: the job reports what is really pending.

All three rules reduce to one question per *transaction*: did any of its records get
named? So the work is to find the named transactions (one join of the named offsets
with the few records' two offsets, or two semi-joins when they are many), then one
anti-join.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from transforms.ops import HALF_OFFSET

TRANSACTION_KEY = "transaction_key"
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
    record; a key may repeat (its consumers test membership with semi or anti joins, so
    removing repeats would cost a shuffle for nothing).

    ``half`` must carry ``transaction_key`` and ``prepared_queue_offset`` (every record of
    the transactions to settle: ``transaction_records``); ``named`` is ``broker, queue_id,
    half_offset``. ``small`` says ``half`` is small enough to broadcast, so that ``named``
    is not shuffled (only scanned).
    """
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
        )
        same_offset = (
            (F.col("_named_broker") == F.col("broker"))
            & (F.col("_named_queue") == F.col("queue_id"))
            & (F.col(HALF_OFFSET) == F.col("_resolving"))
        )
        return naming.join(copies, same_offset).select(*TRANSACTION)
    by_offset = named.withColumnRenamed(HALF_OFFSET, "queue_offset")
    by_prepared = named.withColumnRenamed(HALF_OFFSET, "prepared_queue_offset")
    rule_1 = half.join(by_offset, ["broker", "queue_id", "queue_offset"], how="left_semi")
    rule_2 = half.join(
        by_prepared, ["broker", "queue_id", "prepared_queue_offset"], how="left_semi"
    )
    return rule_1.select(*TRANSACTION).unionByName(rule_2.select(*TRANSACTION))


def unresolved_half(half: DataFrame, resolved: DataFrame) -> DataFrame:
    """Half records of no resolved transaction (rule 3 applied through the key)."""
    return half.join(resolved, ["broker", "queue_id", TRANSACTION_KEY], how="left_anti")
