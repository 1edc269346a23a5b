"""The end rules of the discard history (spec section 6): per discard row, the earliest
commit (``commit_ms``) and op record (``op_ms``) naming one of its transaction's half
records. The joins of the discard side with every op item and commit live here, and so
does the choice of which side each join broadcasts: the half records, the end records or
neither, always decided by the job from counts it knows, never by Spark's estimate.

Pure ``DataFrame -> DataFrame``; ``transforms.discard_history`` merges the facts.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from transforms.merge import Facts
from transforms.messages import stored_before

# Transaction bits of a commit-log record's sysflag (MessageSysFlag): a committed real
# message is stored with TRANSACTION_COMMIT_TYPE.
_TRANSACTION_MASK = 0xC
_COMMIT_TYPE = 0x8

DISCARD_KEY = ["broker", "discard_offset"]


@dataclass(frozen=True)
class EndEvidence:
    """Half records of discard rows (``linked`` rows) and the end records that may name
    them: ``commits`` and ``op_items`` as in ``DiscardEvidence``. ``small``: the half
    records are broadcast (``broadcast_or_merge``); ``few_ends``: the end records are
    (``small`` wins when both are set)."""

    linked: DataFrame
    commits: DataFrame
    op_items: DataFrame
    small: bool = False
    few_ends: bool = False


def broadcast_or_merge(discard_side: DataFrame, small: bool) -> DataFrame:
    """The discard side of a join with every half record, op item or commit: broadcast
    when ``small``, else a sort-merge join. Never left to Spark's estimate: a store read is
    a Python map over a few task ids, whose estimate is a few bytes whatever it returns,
    so Spark would plan a broadcast of millions of commits and run the driver out of heap."""
    return F.broadcast(discard_side) if small else discard_side.hint("merge")


def _end_join(ends: DataFrame, part: EndEvidence, on: list[str]) -> DataFrame:
    """``ends`` joined to the part's half records: the half records broadcast when
    ``small``, else the end records when ``few_ends``, else a sort-merge join."""
    if part.few_ends and not part.small:
        return F.broadcast(ends).join(part.linked, on=on, how="inner")
    return ends.join(broadcast_or_merge(part.linked, part.small), on=on, how="inner")


def commit_times(parts: Sequence[EndEvidence], as_of_ms: int) -> Facts:
    """Per discard row: ``commit_ms``, the earliest store time of a committed message in
    its real queue whose prepared-transaction offset is the commit-log offset of one of its
    half records (each part's half records against its own commits)."""
    rows = [_commit_rows(part, as_of_ms) for part in parts]
    return Facts(_union(rows), (F.min("_commit_ms").alias("commit_ms"),))


def _commit_rows(part: EndEvidence, as_of_ms: int) -> DataFrame:
    """``DISCARD_KEY, _commit_ms``: a row per committed message naming a half record."""
    is_commit = (F.col("sys_flag").bitwiseAND(_TRANSACTION_MASK)) == _COMMIT_TYPE
    committed = part.commits.filter(stored_before(as_of_ms) & is_commit).select(
        "broker",
        F.col("topic").alias("real_topic"),
        F.col("queue_id").alias("real_queue_id"),
        F.col("prepared_transaction_offset").alias("half_commitlog_offset"),
        F.col("store_timestamp_ms").alias("_commit_ms"),
    )
    on = ["broker", "real_topic", "real_queue_id", "half_commitlog_offset"]
    return _end_join(committed, part, on).select(*DISCARD_KEY, "_commit_ms")


def op_times(parts: Sequence[EndEvidence], as_of_ms: int) -> Facts:
    """Per discard row: ``op_ms``, the earliest store time of an op record stored before T
    naming one of its half records (each part's half records against its own op items)."""
    rows = [_op_rows(part, as_of_ms) for part in parts]
    return Facts(_union(rows), (F.min("_op_ms").alias("op_ms"),))


def _op_rows(part: EndEvidence, as_of_ms: int) -> DataFrame:
    """``DISCARD_KEY, _op_ms``: a row per op item naming a half record."""
    named = part.op_items.filter(F.col("op_store_ms") < F.lit(as_of_ms)).select(
        "broker",
        F.col("queue_id").alias("half_queue_id"),
        "half_offset",
        F.col("op_store_ms").alias("_op_ms"),
    )
    on = ["broker", "half_queue_id", "half_offset"]
    return _end_join(named, part, on).select(*DISCARD_KEY, "_op_ms")


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    return functools.reduce(lambda left, right: left.unionByName(right), frames)
