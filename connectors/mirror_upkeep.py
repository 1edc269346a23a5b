"""Upkeep of the store's mirror (docs/spec/reconcile.md section 10, "Maintenance"):
``python -m jobs.maintenance mirror --output OUT [--store NAME=DIR ...]``.

Stages, in order, per mirror table:

1. ``stale_cuts``: per queue of the given stores, the first entry the store holds readable
   now. A run reads only the mirror's rows from there on (``plan_mirror``), so the rows
   below it are never read again. A broker whose store no longer holds what the marks say
   (replaced, reset, another broker's) is left alone: its next run rebuilds it.
2. ``prune``: one Delta delete of those rows.
3. ``compact``: the small files a run writes per (broker, topic) rewritten into fewer.

Each stage is one Delta commit that carries the mirror's state forward (the marks, with
``first_offset`` moved up to the cut), made under the output root's commit lock, so no run
extends the mirror across it and the next run finds its marks in the newest commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from deltalake import CommitProperties, DeltaTable

from connectors.delta_commit import commit_lock
from connectors.errors import InputError
from connectors.mirror import STATE_KEY, MirrorKind, MirrorState, load_state, state_text
from connectors.rocketmq.mirror_plan import QueueKey, mark_mismatch
from connectors.rocketmq.probe import CommitLogHeads, queue_bounds


@dataclass(frozen=True)
class Upkeep:
    """What the upkeep of one mirror table did."""

    table: str
    pruned_rows: int
    files_removed: int  # by the compaction
    files_added: int
    skipped: tuple[str, ...]  # brokers not pruned, with why


def stale_cuts(
    state: MirrorState, stores: Mapping[str, Path]
) -> tuple[dict[QueueKey, int], list[str]]:
    """(per queue of ``stores``' brokers, the first entry its store holds readable now, when
    the mirror holds rows below it; a line per broker left alone). A queue none of whose
    entries is readable because the commit log below it expired whole loses every row."""
    cuts: dict[QueueKey, int] = {}
    skipped: list[str] = []
    for broker, root in sorted(stores.items()):
        part = state.get(broker)
        if part is None:
            continue  # this table holds nothing of it (no real queue named, say)
        log = CommitLogHeads.of(root)
        found: dict[QueueKey, int] = {}
        for (topic, queue_id), mark in sorted(part.marks.items()):
            key = (broker, topic, queue_id)
            bounds = queue_bounds(root, log, topic, queue_id)
            why = mark_mismatch(root, log, key, mark, bounds)
            if why is not None:
                skipped.append(f"{broker}: {why} (its next run reads it whole again)")
                found = {}
                break
            assert bounds is not None  # a queue without entries is a mismatch
            if bounds.readable is not None:
                first = bounds.readable[0]
            elif bounds.expired:
                first = mark.next_offset
            else:
                continue  # unreadable for another reason: its rows may still be needed
            if first > mark.first_offset:
                found[key] = first
        cuts.update(found)
    return cuts, skipped


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def prune_predicate(cuts: Mapping[QueueKey, int]) -> str:
    """The Delta delete predicate of the rows below each queue's cut."""
    return " OR ".join(
        f"(broker = {_quoted(broker)} AND topic = {_quoted(topic)}"
        f" AND queue_id = {queue_id} AND queue_offset < {first})"
        for (broker, topic, queue_id), first in sorted(cuts.items())
    )


def cut_state(state: MirrorState, cuts: Mapping[QueueKey, int]) -> MirrorState:
    """``state`` with each cut queue's ``first_offset`` moved up to its cut: the first entry
    the mirror holds now."""
    moved = dict(state)
    for (broker, topic, queue_id), first in cuts.items():
        part = moved[broker]
        marks = dict(part.marks)
        marks[(topic, queue_id)] = replace(marks[(topic, queue_id)], first_offset=first)
        moved[broker] = replace(part, marks=marks)
    return moved


def _carrying(state: MirrorState) -> CommitProperties:
    return CommitProperties(custom_metadata={STATE_KEY: state_text(state)})


def upkeep(
    root: Path, kind: MirrorKind, stores: Mapping[str, Path], compact: bool = True
) -> Upkeep:
    """Prune (``stores``: the brokers to prune) and compact one mirror table under the
    output root ``root``.

    Raises:
        InputError: its newest commit carries no state this release reads.
    """
    path = root / kind.table
    with commit_lock(str(root)):
        state = load_state(path)
        if state is None:
            raise InputError(
                f"{path}: its newest commit carries no mirror state; a run with --mirror reads"
                " its stores whole again and writes one"
            )
        cuts, skipped = stale_cuts(state, stores)
        pruned = 0
        if cuts:
            state = cut_state(state, cuts)
            deleted = DeltaTable(str(path)).delete(
                prune_predicate(cuts), commit_properties=_carrying(state)
            )
            pruned = int(deleted.get("num_deleted_rows", 0))
        removed = added = 0
        if compact:
            metrics = DeltaTable(str(path)).optimize.compact(commit_properties=_carrying(state))
            removed, added = int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])
    return Upkeep(kind.table, pruned, removed, added, tuple(skipped))
