"""The reconciliation round (spec sections 4-6) over any number of brokers and queues.

``classify_round`` composes the stages of ``transforms.round_stages`` (resolution and
classification, the heavy joins) into a ``RoundState``, so that a job can materialise what
several output tables share; ``transforms.outputs.shape_tables`` derives every output
table from it. Past the start offsets, its stages read the records from the floors of
``transforms.floors`` when those pay (all but the bad records: facts of every record).

Nothing here runs a Spark job by itself. Where the round would profit from caching a
frame several stages read, from bringing a per-queue frame to the driver, from
broadcasting the records from h0 or from reading from the floors, it asks a
``Materializer`` passed in: the job's
(``jobs.materialize``) checkpoints, caches and collects; ``LAZY`` (tests, notebooks that materialise
themselves) leaves every frame lazy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import DataFrame

from transforms.anomalies import (
    RoundEvidence,
)
from transforms.bad_records import may_be_bad_only
from transforms.broker_round import broker_round
from transforms.broker_view import BROKER_ROW_COLUMNS
from transforms.floors import (
    HALF_FLOOR,
    OP_FLOOR,
    linked_facts,
    reaching_facts,
    with_half_floors,
    with_op_floor,
)
from transforms.messages import is_half, is_op, stored_before
from transforms.offsets import (
    queue_starts,
    round_starts,
    window_facts,
    window_rows,
    with_h1,
    with_h_safe,
)
from transforms.ops import explode_op_items
from transforms.params import RoundParams
from transforms.queue_values import joined_floor, joined_values
from transforms.resolve import transaction_records
from transforms.round_stages import (
    NOTE,
    bad_record_facts,
    classified,
    marked_records,
    no_duplicates,
    note_facts,
    queue_summary,
    read_bounds,
    records_from_h0,
    round_bad_records,
    round_records,
    settled_from_h0,
    status_facts,
    stop_facts,
    unresolved,
    with_statuses,
)


@dataclass(frozen=True)
class ReadSizes:
    """What the round's reads are sized for; either answer of each gives the same round."""

    small: bool  # the records from h0 may be broadcast (else Spark shuffles)
    floors: bool  # the round finds its floors and reads from them


class Materializer(Protocol):
    """How a round's shared frames are materialised; decided by the caller (``jobs/``)."""

    def records(self, frame: DataFrame) -> DataFrame:
        """A record-level frame several stages read (the job computes it once, behind a
        plan of one leaf)."""
        ...

    def kept(self, frame: DataFrame) -> DataFrame:
        """A record-level frame filtered down to what several stages read, usually a few
        rows (the job holds it like ``records``, so that they do not filter every record
        again)."""
        ...

    def per_queue(self, frame: DataFrame) -> DataFrame:
        """A frame of one row per queue (or broker) that many joins read (the job brings
        it to the driver and back as a local relation)."""
        ...

    def sizes(self, bounds: DataFrame) -> ReadSizes:
        """From per-queue ``bounds`` (``read_bounds``: how many half records from h0 at
        most, about how many records below h0 and p0): whether the records from h0 may be
        broadcast (else Spark shuffles), and whether the round finds its floors
        (``transforms.floors``: two light scans and their jobs) and reads from them."""
        ...

    def attach(self, records: DataFrame, queues: DataFrame, columns: Sequence[str]) -> DataFrame:
        """``records`` of the queues of ``queues`` (a per-queue frame) with its ``columns``
        (``transforms.queue_values``: a join, or literals the records look up)."""
        ...

    def floored(self, records: DataFrame, queues: DataFrame, column: str) -> DataFrame:
        """``records`` of the queues of ``queues`` (a per-queue frame) at queue offsets >=
        their ``column`` (``transforms.queue_values``: a join, or a condition of literals
        that a scan of files takes as a pushed filter)."""
        ...

    def release(self) -> None:
        """Free whatever ``records`` and ``kept`` kept."""
        ...


@dataclass(frozen=True)
class Lazy:
    """The identity ``Materializer``: every frame stays lazy; ``small`` and ``floors`` are
    its ``sizes``."""

    small: bool = False
    floors: bool = True

    def records(self, frame: DataFrame) -> DataFrame:
        return frame

    def kept(self, frame: DataFrame) -> DataFrame:
        return frame

    def per_queue(self, frame: DataFrame) -> DataFrame:
        return frame

    def sizes(self, bounds: DataFrame) -> ReadSizes:
        return ReadSizes(self.small, self.floors)

    def attach(self, records: DataFrame, queues: DataFrame, columns: Sequence[str]) -> DataFrame:
        return joined_values(records, queues, columns)

    def floored(self, records: DataFrame, queues: DataFrame, column: str) -> DataFrame:
        return joined_floor(records, queues, column)

    def release(self) -> None:
        return None


LAZY = Lazy()


@dataclass(frozen=True)
class RoundState:
    """What the output tables are shaped from.

    Attributes:
        pending: one row per unresolved half record at offsets >= h0 (half fields,
            ``status``, ``counter_after``, ``immunity_ms``, ``age_ms``).
        queues: one row per (broker, queue_id) of the domain: committed offsets,
            h0/h1/h_safe, p0/p1/p_safe, class counts, warnings.
        bad_records: ``schemas.outputs.BAD_RECORD`` rows (reader's and round's).
        broker: the broker's own next round per queue (``transforms.broker_round``),
            walked from the same start offsets.
        materialize: what materialised the round's frames (its ``release`` frees them).
        evidence: the half and op records the anomaly rules read (``transforms.anomalies``),
            from the floors; None: no anomaly is looked for.
        retained: every readable half and op record stored before T (and ``linked``), which
            the discard history reads (its transactions lie below the floors); None: no
            history is decided.
    """

    pending: DataFrame
    queues: DataFrame
    bad_records: DataFrame
    params: RoundParams
    broker: DataFrame
    materialize: Materializer = LAZY
    evidence: RoundEvidence | None = None
    retained: RoundEvidence | None = None

    def unpersist(self) -> None:
        self.materialize.release()


def classify_round(
    messages: DataFrame,
    committed_offsets: DataFrame,
    params: RoundParams,
    bad_input: DataFrame | None = None,
    notes: DataFrame | None = None,
    *,
    materialize: Materializer,
    offsets_unique: bool = False,
    bounds: DataFrame | None = None,
) -> RoundState:
    """Resolve and classify every half record of every queue in ``messages``.

    Args:
        messages: readable records (``SOURCED_MESSAGE``, or the store reader's lean
            records) of the half and op topics, any store time, duplicates allowed; an
            ``offset_unique`` column (the store reader's) spares them the duplicate check.
        committed_offsets: ``COMMITTED_OFFSET`` rows.
        params: T, run id, broker configuration.
        bad_input: ``BAD_RECORD`` rows the readers produced (optional).
        notes: reader warnings (``NOTE``), shown in ``run_summary.warnings``.
        materialize: caching, per-queue collection and the broadcast choice; the result
            does not depend on it. A whole round needs one that cuts the lineage of its
            per-queue frames (with ``LAZY`` their consumers inline the plans that made them,
            past what a driver can optimise: 1 GiB of heap); ``LAZY`` suits single stages.
        offsets_unique: no record's queue offset can repeat (every ``offset_unique``
            flag is true): the deduplicated records are the input itself, not materialised.
        bounds: ``round_bounds`` at T, local rows the job read T from; None: read here.
    """
    m = materialize
    marked = marked_records(round_records(messages, params))
    # Materialised once, so that the duplicate check is not redone per consumer, unless
    # no offset can repeat: then they are a projection of the read's own cache.
    marked = marked if offsets_unique else m.records(marked)
    readable = no_duplicates(marked)
    current = readable.filter(stored_before(params.as_of_ms))
    every_half, every_op = current.filter(is_half()), current.filter(is_op())
    starts = _starts(readable, committed_offsets, params.as_of_ms, bounds, m)
    # Only records from h0 on are classified, and only their transactions resolved; every
    # later stage but the bad records reads the records from the floors on.
    from_h0, small, half, ops = _from_floors(every_half, every_op, starts, m)
    # Op bodies are split and parsed once: named offsets, done-ness.
    op_items = m.records(explode_op_items(ops))
    # Every half record of the transactions from h0: resolution reads them, and so do the
    # anomaly rules (their transactions have a record in [h0, h1)). Held for both.
    linked = m.records(transaction_records(half, from_h0, small))
    # Records from h0, their class and the op that settled them (null: really pending). Held:
    # the stop offsets are aggregated before statuses are set; the broker's walk reads all.
    settled = m.records(classified(settled_from_h0(linked, op_items, from_h0, small), params))
    candidates = unresolved(settled)
    h1s = m.per_queue(with_h1(starts, stop_facts(candidates)))
    # Kept: counted per queue now, then read by every table, the rules and the history.
    pending = m.kept(with_statuses(candidates, h1s, m.attach))
    safe = m.per_queue(with_h_safe(h1s, status_facts(pending, params)))
    every_item = explode_op_items(every_op)  # read by the history
    # Found once (usually a few) in every record: counted per queue below, then written.
    bad_records = m.kept(_bad_records(marked, every_half, every_op, bad_input))
    note_rows = notes if notes is not None else messages.sparkSession.createDataFrame([], NOTE)
    rows = window_rows(half, ops, op_items, safe, params, m.attach)  # the end offsets' records
    queues = queue_summary(
        safe, window_facts(rows), bad_record_facts(bad_records), note_facts(note_rows)
    )
    # Lazy: their consumers hold them. The discard history reaches below the floors.
    evidence = RoundEvidence(half, ops, op_items, linked)
    retained = RoundEvidence(every_half, every_op, every_item, linked)
    # The broker's own round from the same starts (each action with its record's columns).
    # Held: check_requests, discards and the small tables read it.
    walked = broker_round(settled, ops, starts, params, attach=m.attach, carried=BROKER_ROW_COLUMNS)
    broker = m.kept(walked)
    return RoundState(pending, queues, bad_records, params, broker, m, evidence, retained)


def _bad_records(
    marked: DataFrame, half: DataFrame, ops: DataFrame, bad_input: DataFrame | None
) -> DataFrame:
    """``round_bad_records`` of the records stored before T (``half``, ``ops``), read in
    the ones the mirror does not know to hold none (``may_be_bad_only``)."""
    items = explode_op_items(may_be_bad_only(ops))
    return round_bad_records(marked, items, may_be_bad_only(half), bad_input)


def _starts(
    readable: DataFrame,
    committed: DataFrame,
    as_of_ms: int,
    bounds: DataFrame | None,
    m: Materializer,
) -> DataFrame:
    """h0 and p0 per queue (``round_starts``): from ``bounds`` when the job read them with
    T (a projection of local rows, no query of its own), else from the records."""
    if bounds is not None:
        return queue_starts(bounds)
    return m.per_queue(round_starts(readable, committed, as_of_ms))


def _from_floors(
    half: DataFrame, ops: DataFrame, starts: DataFrame, m: Materializer
) -> tuple[DataFrame, bool, DataFrame, DataFrame]:
    """The half records from h0 (held), whether they may be broadcast, and the half and op
    records from their queues' floors (``transforms.floors``: two per-queue frames, each
    an aggregate of one light scan) when those pay, else every one."""
    from_h0 = m.records(records_from_h0(half, starts, m.floored))
    sizes = m.sizes(read_bounds(starts))
    small = sizes.small
    if not sizes.floors:
        return from_h0, small, half, ops
    half_floors = m.per_queue(with_half_floors(starts, linked_facts(half, from_h0, small)))
    floors = m.per_queue(with_op_floor(half_floors, reaching_facts(ops, half_floors, m.attach)))
    return from_h0, small, m.floored(half, floors, HALF_FLOOR), m.floored(ops, floors, OP_FLOOR)
