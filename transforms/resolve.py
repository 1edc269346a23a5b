"""Resolution of half records (spec section 4): the anti-join of half offsets against op bodies.

A half record is resolved when (1) its queue offset is named by an op record, (2) its
``TRAN_PREPARED_QUEUE_OFFSET`` is named (an immunity copy whose original was resolved),
or (3) it shares its ``UNIQ_KEY`` with a record resolved by (1) or (2) in the same half
queue (a put-back copy of a transaction resolved through another copy). Rules 2 and 3 go
beyond the broker on purpose: the job reports what is really pending.

All three rules reduce to one question per *transaction*: did any of its records get
named? So the work is two semi-joins to find named transactions, then one anti-join.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from transforms.ops import HALF_OFFSET

TRANSACTION_KEY = "transaction_key"
# A record without UNIQ_KEY is its own transaction. NUL cannot start a real UNIQ_KEY
# (client ids are hex), so the synthetic key never collides with one.
_ORPHAN_PREFIX = "\u0000offset:"


def with_transaction_key(half: DataFrame) -> DataFrame:
    """Add ``transaction_key``: the UNIQ_KEY, or a key unique to the record when it has none."""
    orphan = F.concat(F.lit(_ORPHAN_PREFIX), F.col("queue_offset").cast("string"))
    return half.withColumn(TRANSACTION_KEY, F.coalesce(F.col("uniq_key"), orphan))


def resolved_transactions(
    half: DataFrame, named: DataFrame, of: DataFrame | None = None, small: bool = False
) -> DataFrame:
    """``broker, queue_id, transaction_key`` of every transaction with a named record.

    ``half`` must carry ``transaction_key`` and ``prepared_queue_offset``; ``named`` is
    ``broker, queue_id, half_offset``. With ``of`` (half records), only the transactions of
    those records are settled: every record of theirs is looked up in ``named``. ``small``
    says ``of`` is small enough to broadcast, so that neither ``half`` nor ``named`` is
    shuffled (they are only scanned).
    """
    keys = ["broker", "queue_id", TRANSACTION_KEY]
    if of is not None:
        wanted = of.select(*keys).distinct()
        half = half.join(F.broadcast(wanted) if small else wanted, keys, how="left_semi")
    if small:
        # Broadcast the few records and stream `named` past them; an offset named twice
        # repeats a key, which the distinct below removes.
        copies = F.broadcast(half.select(*keys, "queue_offset", "prepared_queue_offset"))
        # Renamed so that the join conditions name each side unambiguously (both sides may
        # come from the same cached records).
        naming = named.select(
            F.col("broker").alias("_named_broker"),
            F.col("queue_id").alias("_named_queue"),
            HALF_OFFSET,
        )
        same_queue = (F.col("_named_broker") == F.col("broker")) & (
            F.col("_named_queue") == F.col("queue_id")
        )
        rule_1 = naming.join(copies, same_queue & (F.col(HALF_OFFSET) == F.col("queue_offset")))
        rule_2 = naming.join(
            copies, same_queue & (F.col(HALF_OFFSET) == F.col("prepared_queue_offset"))
        )
        return rule_1.select(*keys).unionByName(rule_2.select(*keys)).distinct()
    by_offset = named.withColumnRenamed(HALF_OFFSET, "queue_offset")
    by_prepared = named.withColumnRenamed(HALF_OFFSET, "prepared_queue_offset")
    rule_1 = half.join(by_offset, ["broker", "queue_id", "queue_offset"], how="left_semi")
    rule_2 = half.join(
        by_prepared, ["broker", "queue_id", "prepared_queue_offset"], how="left_semi"
    )
    return rule_1.select(*keys).unionByName(rule_2.select(*keys)).distinct()


def unresolved_half(half: DataFrame, resolved: DataFrame) -> DataFrame:
    """Half records of no resolved transaction (rule 3 applied through the key)."""
    return half.join(resolved, ["broker", "queue_id", TRANSACTION_KEY], how="left_anti")
