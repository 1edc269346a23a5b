"""Pending across runs (spec section 6, ``pending``): since when a transaction is pending.

A round only sees its own store. How long a transaction has been pending is a fact of the
output root's history: the pending rows that earlier runs wrote. The job reads the pending
rows of the latest earlier run of each broker (``jobs``; this module does no I/O) and this
module carries their ``first_seen_run_id`` / ``pending_since_ms`` over to the rows of the
same transaction now. Chaining from one earlier run keeps the cost proportional to what is
pending, not to the number of runs, and a rerun of a run id (which excludes itself) gives
the same values.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

FIRST_SEEN_RUN_ID = "first_seen_run_id"
PENDING_SINCE_MS = "pending_since_ms"
_KEY = "_pending_key"
_CARRIED = "_carried"


def transaction_key() -> Column:
    """Which rows are the same transaction within a broker: the producer's unique key, or,
    for a record without one, its place in the half queue (queue and offset)."""
    by_offset = F.concat_ws(":", F.lit("o"), F.col("queue_id"), F.col("half_offset"))
    return F.when(
        F.col("uniq_key").isNotNull(), F.concat(F.lit("k:"), F.col("uniq_key"))
    ).otherwise(by_offset)


def first_seen_now(run_id: str, as_of_ms: int) -> list[Column]:
    """The two columns for a transaction no earlier run had pending: this run and its T."""
    return [
        F.lit(run_id).cast(T.StringType()).alias(FIRST_SEEN_RUN_ID),
        F.lit(as_of_ms).cast(T.LongType()).alias(PENDING_SINCE_MS),
    ]


def earliest_sightings(earlier: DataFrame) -> DataFrame:
    """One row per (broker, transaction) of earlier pending rows: when it was first seen.

    Rows written before these columns existed have them null: such a row's own run is the
    first sighting known. Several rows of one transaction (the original and its check
    copies) keep the earliest sighting; ties go to the smaller run id, so the result does
    not depend on row order.
    """
    since = F.coalesce(F.col(PENDING_SINCE_MS), F.col("as_of_ms"))
    seen_in = F.coalesce(F.col(FIRST_SEEN_RUN_ID), F.col("run_id"))
    sighting = F.struct(since.alias(PENDING_SINCE_MS), seen_in.alias(FIRST_SEEN_RUN_ID))
    return (
        earlier.select("broker", transaction_key().alias(_KEY), sighting.alias(_CARRIED))
        .groupBy("broker", _KEY)
        .agg(F.min(_CARRIED).alias(_CARRIED))
    )


def carry_pending_since(pending: DataFrame, earlier: DataFrame) -> DataFrame:
    """``pending`` (this run's rows, with this run as their first sighting) with
    ``first_seen_run_id`` and ``pending_since_ms`` taken from ``earlier`` where the same
    transaction of the same broker was already pending. Columns and their order unchanged.

    ``earlier``: pending rows of earlier runs (at least ``broker``, ``queue_id``,
    ``half_offset``, ``uniq_key``, ``run_id``, ``as_of_ms`` and the two columns, which may
    be null), already limited by the caller to the runs to chain from.
    """
    sightings = earliest_sightings(earlier)
    joined = pending.withColumn(_KEY, transaction_key()).join(
        sightings, on=["broker", _KEY], how="left"
    )
    carried = {
        FIRST_SEEN_RUN_ID: F.coalesce(
            F.col(f"{_CARRIED}.{FIRST_SEEN_RUN_ID}"), F.col(FIRST_SEEN_RUN_ID)
        ),
        PENDING_SINCE_MS: F.coalesce(
            F.col(f"{_CARRIED}.{PENDING_SINCE_MS}"), F.col(PENDING_SINCE_MS)
        ),
    }
    return joined.select(*[carried.get(name, F.col(name)).alias(name) for name in pending.columns])
