"""The discard history of one run (spec section 6, ``discard_history``): the glue between
the reads (``connectors.rocketmq.discards``) and the pure rules (``transforms.discard_inputs``,
``transforms.discard_history``), and the lines the summary prints about it.

The one decision taken on the driver is which real queues to read: the discard records
name them, and only those are read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.mirror import MirrorRequest
from connectors.rocketmq.discards import (
    DiscardSource,
    RealQueue,
    commit_filters,
    discard_offsets,
    no_commits,
    read_discards,
    read_real_queues,
    readable_queues,
    unread_queue_notes,
)
from connectors.rocketmq.mirror_plan import QueueKey
from connectors.rocketmq.read_tasks import NO_RECORD_PLACE
from jobs.config import JobConfig
from jobs.materialize import SparkMaterializer
from schemas.decided_view import DecidedView
from schemas.outputs import ANOMALY, BAD_RECORD, DISCARD_HISTORY
from transforms.anomaly_rules.pending import discarded_without_check
from transforms.discard_final import final_rows, kept_rows, open_evidence
from transforms.discard_history import (
    OUTCOMES,
    UNRESOLVED,
    DiscardEvidence,
    discard_history,
    discard_rows,
    discarded_unchecked,
    evidence_from,
)
from transforms.discard_inputs import named_real_queues, not_reported, usable_discards
from transforms.discard_since import carried_keys, fresh_floors, since_evidence, with_carried
from transforms.round import RoundState


@dataclass(frozen=True)
class DiscardHistory:
    """One run's ``discard_history`` rows, its ``immunity_exhausts_checks`` findings
    (``ANOMALY`` rows without the run's columns) and the bad discard records the round did
    not report (``BAD_RECORD``), each held by the job's materializer; the reader's notes;
    ``release`` frees what the discard reads cached."""

    history: DataFrame
    unchecked: DataFrame
    bad_records: DataFrame
    notes: list[str]
    release: Callable[[], None]
    mirror_lines: list[str]  # what the reads through the discard and commits' mirrors printed
    view: DecidedView | None = None  # what this run decided against (read through the mirror)


@dataclass(frozen=True)
class Views:
    """What the discard history is decided against, read through the mirror: ``earlier``,
    the view of the run that last changed ``discard_history`` (``jobs.history.decided_view``;
    None: every row decided in full); this run's op queues (``op_read_ends``) and the brokers
    its read of the half and op records read again from the store (``rebuilt``)."""

    earlier: DecidedView | None
    op_read_ends: Mapping[QueueKey, int]
    rebuilt: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Named:
    """The driver's aggregate of the discard records before T (``_named_queues``)."""

    queues: list[RealQueue]  # the real queues the open records name, when read from stores
    records: int  # every discard record before T
    carried: int  # open records decided against what arrived since
    fresh: int  # open records decided in full


def _named_queues(
    usable: DataFrame,
    as_of_ms: int,
    stores: Sequence[str],
    kept: DataFrame | None,
    carried: DataFrame | None,
) -> _Named:
    """The real queues the open discard records before T name and the counts of ``_Named``:
    one aggregate for all, the one decision the discard history takes on the driver (which
    queues to read). A record whose row is final (``kept``) needs no read of its queue."""
    counted = named_real_queues(usable, as_of_ms, kept, carried).collect()  # a row per queue
    named = sorted(
        (row[0], row[1], row[2])
        for row in counted
        if row[1] is not None and row[2] is not None and row["open_records"]
    )
    carried_n = sum(row["carried_records"] for row in counted)
    fresh = sum(row["open_records"] for row in counted) - carried_n
    return _Named(named if stores else [], sum(row["records"] for row in counted), carried_n, fresh)


@dataclass(frozen=True)
class _Evidence:
    """The evidence of every discard record before T (``every``: the past anomalies read all
    of them), of the ones still open (``open``, with the real queues' commits), the real
    queues' bad records and their release."""

    every: DiscardEvidence
    open: DiscardEvidence
    real_bad: DataFrame
    release: Callable[[], None]
    mirror_lines: list[str]  # what the read through the commits' mirror printed
    commit_read_ends: dict[QueueKey, int]  # the real queues read through the commits' mirror


@dataclass(frozen=True)
class _Since:
    """The open rows decided against what arrived since ``view`` (``carried``:
    ``DISCARD_KEY``; the view holds no broker the read of the half and op records read
    again from its store)."""

    view: DecidedView
    carried: DataFrame


def _evidence(
    spark: SparkSession,
    source: DiscardSource,
    config: JobConfig,
    state: RoundState,
    usable: DataFrame,
    kept: DataFrame | None,
    named: _Named,
    queues: Sequence[RealQueue],
    since: _Since | None,
    materializer: SparkMaterializer,
) -> _Evidence:
    """The evidence of the discard records (``usable``, ``named``) whose real queues
    ``queues`` can be read; ``kept``: the final rows earlier runs decided; ``since``: the
    rows decided against what arrived since the last run's view."""
    params = state.params
    assert state.retained is not None  # checked by the caller
    # A discarded transaction has about check_max + 2 half records before T (its original,
    # its check copies, an immunity copy): that many rows per discard decide whether they
    # are broadcast against every op item and commit; the discard rows alone whether they
    # are broadcast against every half record.
    per_discard = params.check_max + 2
    few = named.records <= materializer.broadcast_rows
    small = named.records * per_discard <= materializer.broadcast_rows
    every = evidence_from(
        state.retained,
        usable,
        state.pending,
        no_commits(spark),
        queues,
        params.as_of_ms,
        materializer.kept,
        small,
        few,
    )
    decide = every
    if kept is not None:
        decide = open_evidence(every, kept)
    if since is not None:
        decide = replace(decide, linked=with_carried(decide.linked, since.carried))
    if decide is not every:  # the rules read the open rows' half records several times
        decide = replace(decide, linked=materializer.kept(decide.linked))
    # The real queues are read once the discarded transactions' half records are known:
    # their commit-log offsets say which commits are worth decoding (the mirror holds
    # every commit of a queue, decoded once).
    filters = {}
    if queues and source.mirror is None:
        filters = commit_filters(discard_offsets(decide.linked))
    real = read_real_queues(spark, source.stores, queues, config.verify_crc, filters, source.mirror)
    commits = replace(decide, commits=real.records)
    if since is not None:
        view = since.view.without(real.rebuilt)
        commits = since_evidence(commits, view, _floors(decide.linked, named))
    return _Evidence(
        every, commits, real.bad_records, real.release, real.mirror_lines, real.read_ends
    )


def _floors(linked: DataFrame, named: _Named) -> dict[str, int]:
    """Per broker with rows decided in full, the store time from which their evidence is
    read (``fresh_floors``): one aggregate of the held half records, which bounds the scans
    of every op item and commit (none when every open row is carried)."""
    if not named.fresh:
        return {}
    rows = fresh_floors(linked).collect()  # one row per broker
    return {row["broker"]: row["floor_ms"] for row in rows if row["floor_ms"] is not None}


def _kept(
    rows: DataFrame,
    earlier: DataFrame | None,
    as_of_ms: int,
    keep: Callable[[DataFrame], DataFrame],
) -> DataFrame | None:
    """The final rows earlier runs decided of the discard records before T (``rows``:
    ``discard_rows``; None without an earlier ``discard_history``)."""
    if earlier is None:
        return None
    return keep(kept_rows(rows, final_rows(earlier, as_of_ms)))


def _since(
    rows: DataFrame,
    earlier: DataFrame | None,
    views: Views | None,
    as_of_ms: int,
    keep: Callable[[DataFrame], DataFrame],
) -> _Since | None:
    """The rows decided against what arrived since the last run's view: none without an
    earlier ``discard_history`` or a view (a run without the mirror, ``--rebuild``), and
    none of a broker this run read again from its store (its old offsets say nothing)."""
    if earlier is None or views is None or views.earlier is None:
        return None
    view = views.earlier.without(views.rebuilt)
    carried = carried_keys(rows, earlier, view, as_of_ms)
    carried = carried.filter(~F.col("broker").isin(*sorted(views.rebuilt)))
    return _Since(view, keep(carried))


def build_discard_history(
    spark: SparkSession,
    source: DiscardSource,
    config: JobConfig,
    state: RoundState,
    earlier: DataFrame | None = None,
    views: Views | None = None,
) -> DiscardHistory:
    """Read the discard records and the evidence beside the round's own frames (``state``:
    its half, op and op-item records, pending rows and bad records), and decide the row of
    every discard record whose row is not final yet (``earlier``: the output root's
    ``discard_history``, ``jobs.history.earlier_discard_history``; its final rows are
    kept as they are). ``views``: read through the mirror (``Views``): the rows the last
    run left ``unresolved`` are decided against what arrived since, and the history
    carries this run's view."""
    params = state.params
    if state.retained is None:
        raise ValueError("the discard history reads the round's records: this round kept none")
    # The job's one way of caching a small frame several readers share (released below).
    materializer = SparkMaterializer.for_session(spark)
    keep = materializer.kept
    read = read_discards(spark, source, config.verify_crc)
    usable, bad = usable_discards(read.records, read.bad_records, params.as_of_ms)
    usable = keep(usable)
    # The discard rows the earlier rows are matched to (final and carried); each match is
    # held on its own, and the rows are a projection of the held discard records.
    rows = discard_rows(usable, params.as_of_ms)
    kept = _kept(rows, earlier, params.as_of_ms, keep)
    since = _since(rows, earlier, views, params.as_of_ms, keep)
    named = _named_queues(
        usable, params.as_of_ms, source.stores, kept, since.carried if since else None
    )
    queues = readable_queues(source.stores, named.queues)
    commit_ends: dict[QueueKey, int] = {}
    if not named.records:
        # Nothing discarded (the usual case): the evidence joins would read the round's
        # records for nothing, and no discard record names a real queue.
        history = spark.createDataFrame([], DISCARD_HISTORY)
        unchecked = spark.createDataFrame([], ANOMALY)
        real_bad, release_real = spark.createDataFrame([], BAD_RECORD), lambda: None
        commit_lines: list[str] = []
    else:
        evidence = _evidence(
            spark, source, config, state, usable, kept, named, queues, since, materializer
        )
        real_bad, release_real = evidence.real_bad, evidence.release
        commit_lines, commit_ends = evidence.mirror_lines, evidence.commit_read_ends
        history = keep(discard_history(evidence.open, params, kept))
        unchecked = keep(discarded_without_check(discarded_unchecked(evidence.every)))
    bad = bad.unionByName(real_bad.select(*BAD_RECORD.fieldNames()))
    bad = keep(not_reported(bad, state.bad_records, NO_RECORD_PLACE))

    def release() -> None:
        materializer.release()
        release_real()
        read.release()

    notes = [*read.notes, *unread_queue_notes(named.queues, queues)]
    lines = [*read.mirror_lines, *commit_lines]
    view = None
    if views is not None:
        view = DecidedView(params.run_id, params.as_of_ms, {**views.op_read_ends, **commit_ends})
        if since is not None:
            lines.append(
                f"mirror: {named.carried} open discard row(s) decided against what arrived"
                f" since run {since.view.run_id}"
            )
    return DiscardHistory(history, unchecked, bad, notes, release, lines, view)


def outcome_counts(history: DataFrame) -> DataFrame:
    """``outcome, resume_futile, n``: the summary's counts (at most a dozen rows)."""
    return history.groupBy("outcome", "resume_futile").agg(F.count(F.lit(1)).alias("n"))


def summary_lines(
    counts: Sequence[Mapping[str, Any]], notes: Sequence[str], output_root: str
) -> list[str]:
    """The printed lines: the rows by outcome (``outcome_counts``; unresolved ones split
    into resumable and futile), the reader's notes, and where the table is."""
    by_outcome: dict[str, int] = {}
    for row in counts:
        by_outcome[row["outcome"]] = by_outcome.get(row["outcome"], 0) + row["n"]
    futile = sum(
        row["n"] for row in counts if row["outcome"] == UNRESOLVED and row["resume_futile"]
    )
    total = sum(by_outcome.values())
    parts = "  ".join(f"{name}={by_outcome.get(name, 0)}" for name in OUTCOMES)
    table = Path(output_root).resolve() / "discard_history"
    lines = [
        f"discard history: {total} discard record(s) before T  {parts}"
        f"  (resumable {by_outcome.get(UNRESOLVED, 0) - futile}, resume futile {futile}):"
        f" rows in {table}"
    ]
    return lines + [f"  note: {note}" for note in notes]


def discard_source(
    stores: Sequence[str],
    path: str | None,
    fmt: str | None,
    broker: str | None,
    mirror: MirrorRequest | None = None,
) -> DiscardSource:
    """Where a run's discard records are: the stores (through their mirror when asked),
    else the ``--discards`` export."""
    if stores:
        return DiscardSource(stores=tuple(stores), mirror=mirror)
    return DiscardSource(path=path, fmt=fmt, broker=broker)


def discard_inputs(source: DiscardSource) -> list[str]:
    """The ``--discards`` export as run_summary's ``inputs`` names it (stores: nothing more,
    the store is named already)."""
    if source.path is None or source.stores:
        return []
    return [f"discards:{source.fmt}:{source.broker}:{Path(source.path).resolve()}"]
