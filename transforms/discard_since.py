"""Open discard_history rows decided against what arrived since (spec section 6): a row the
last run left ``unresolved`` had no op record and no commit naming its transaction among the
records that run read before its T (its ``DecidedView``). A later run decides it against
the rest alone: the op records and commits outside that view. Rows decided in full (new
discard records, rows another run wrote, any other outcome) still read every record that
can name their half records.

Stages, in order:

1. ``carried_keys``: the open rows the view's run left ``unresolved`` (the same record, at
   a T not after this run's); ``with_carried`` flags them (``carried``) on any frame.
2. ``unseen_by``: the condition of a record the view's run did not decide against: outside
   the queues of the view, at or above its end, or stored at or after its T.
3. ``fresh_floors`` and ``since_evidence``: the evidence with only the op items and commits
   the rules need: the ones not seen, and the ones a row decided in full may need (stored
   at or after the earliest of its half records).

Why a carried row comes out as a full decision would decide it: each rule takes the
earliest end (``op_ms``, ``commit_ms``) over a set of records, and the records left out
(seen by the view's run) name none of the row's half records. They named none of the half
records that run saw, or the row would not be ``unresolved``; and a half record that run
did not see is one the store appended after its read, while an end record comes after the
half record it names in the commit log and a consume queue lists its records in commit-log
order, so an end record naming it is outside the view too. A row decided in full needs the
end records naming its half records, which come after the earliest of them in the commit
log: stored at or after its store time. The other rules (half records, pending copies,
the op queue's reach) read the same records as a full decision. Store times that never
go backwards in a broker's commit log (the broker stamps them under its put lock) are
assumed.

Pure ``DataFrame -> DataFrame``; ``jobs.discards`` reads the view and decides which rows
are carried.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import replace

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.decided_view import DecidedView
from schemas.messages import OP_TOPIC
from transforms.discard_final import kept_rows
from transforms.discard_history import DISCARD_KEY, UNRESOLVED, DiscardEvidence
from transforms.ops import OP_OFFSET, OP_STORE_MS

CARRIED = "carried"


def left_unresolved(earlier: DataFrame, view: DecidedView, as_of_ms: int) -> DataFrame:
    """The earlier ``discard_history`` rows the view's run wrote ``unresolved``; none when
    its T is after ``as_of_ms`` (a backfill decides in full)."""
    by_view = (F.col("run_id") == view.run_id) & (F.col("as_of_ms") == view.as_of_ms)
    in_time = F.lit(view.as_of_ms <= as_of_ms)
    return earlier.filter(by_view & (F.col("outcome") == UNRESOLVED) & in_time)


def carried_keys(
    rows: DataFrame, earlier: DataFrame, view: DecidedView, as_of_ms: int
) -> DataFrame:
    """``DISCARD_KEY`` of the rows (``rows``: discard rows with the record's identity) that
    are carried: the same record, left ``unresolved`` by the view's run."""
    return kept_rows(rows, left_unresolved(earlier, view, as_of_ms)).select(*DISCARD_KEY)


def with_carried(rows: DataFrame, carried: DataFrame) -> DataFrame:
    """``rows`` (anything keyed by ``DISCARD_KEY``) with ``carried`` (never null)."""
    marks = carried.select(*DISCARD_KEY, F.lit(True).alias("_carried"))
    flagged = rows.join(marks, on=DISCARD_KEY, how="left")
    return flagged.withColumn(CARRIED, F.coalesce(F.col("_carried"), F.lit(False))).drop("_carried")


def unseen_by(view: DecidedView, offset: str, stored: str, topic: str | None = None) -> Column:
    """True for a record the view's run did not decide against: outside every queue of the
    view (``broker``, ``queue_id`` and ``topic``, unless all records are of ``topic``) or
    at or above its end, or stored at or after the view's T; a null ``offset`` or
    ``stored`` counts as unseen. Plain comparisons joined by AND and OR (no NOT over the
    queues, no coalesce): the readers of the mirror take it as a pushed filter and skip the
    files the view's run read."""
    outside = []
    for (broker, queue_topic, queue_id), end in sorted(view.ends.items()):
        if topic is not None and queue_topic != topic:
            continue
        other = (F.col("broker") != broker) | (F.col("queue_id") != queue_id)
        if topic is None:
            other = other | (F.col("topic") != queue_topic)
        outside.append(other | (F.col(offset) >= end))
    if not outside:
        return F.lit(True)
    in_no_queue = functools.reduce(operator.and_, outside)
    unknown = F.col(offset).isNull() | F.col(stored).isNull()
    return in_no_queue | (F.col(stored) >= view.as_of_ms) | unknown


def fresh_floors(linked: DataFrame) -> DataFrame:
    """``broker, floor_ms``: per broker, the earliest store time of a half record of a row
    decided in full (``linked`` with ``carried``). An op record or a commit naming one of
    them was stored at or after it: the rules of those rows need nothing older (one row per
    broker, for the job to bound its scans with)."""
    fresh = linked.filter(~F.col(CARRIED))
    return fresh.groupBy("broker").agg(F.min("half_stored_ms").alias("floor_ms"))


def needed(records: DataFrame, unseen: Column, stored: str, floors: Mapping[str, int]) -> DataFrame:
    """The ``records`` (op items or commits) a rule needs: the ``unseen`` ones, and the
    ones of a broker stored at or after its floor (``fresh_floors``: what the rows decided
    in full need). A literal condition, which the reader of the mirror pushes into its
    scan."""
    needed_by_fresh = [
        (F.col("broker") == broker) & (F.col(stored) >= floor)
        for broker, floor in sorted(floors.items())
    ]
    fresh = functools.reduce(operator.or_, needed_by_fresh, F.lit(False))
    return records.filter(unseen | fresh)


def since_evidence(
    evidence: DiscardEvidence, view: DecidedView, floors: Mapping[str, int]
) -> DiscardEvidence:
    """``evidence`` whose op items and commits are the ones ``needed``; ``floors``: per
    broker with rows decided in full, the floor of ``fresh_floors``."""
    commits = needed(
        evidence.commits,
        unseen_by(view, "queue_offset", "store_timestamp_ms"),
        "store_timestamp_ms",
        floors,
    )
    op_items = needed(
        evidence.op_items,
        unseen_by(view, OP_OFFSET, OP_STORE_MS, topic=OP_TOPIC),
        OP_STORE_MS,
        floors,
    )
    return replace(evidence, commits=commits, op_items=op_items)
