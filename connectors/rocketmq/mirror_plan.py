"""Planning a read through the mirror (docs/spec/reconcile.md section 10): for each queue
read through its consume queue, which entries the mirror holds, which this run decodes
into it and which the run decodes for itself; and whether the store still holds what the
mirror says it read. Driver only, read-only, a few reads per queue
(``probe.queue_bounds``); no Spark here.

A queue's entries fall into three ranges:

* **readable** (``probe.queue_bounds``: from its first to its last entry that holds a record
  of the queue): the round reads these rows from the mirror. The run decodes into the mirror
  those after its mark (the first entry it has not read); the rest it already holds.
* **before** (entries whose commit-log file expired, or an unreadable head) and **after**
  (an unreadable tail: a half-copied commit log) are decoded live, every run. They are bad
  records, or records the store does not hold whole yet: the mirror takes a record once
  it is readable, so that retention or a late copy never leaves a wrong row in it.

A queue rebuilt from the commit log (its consume queue is missing) is scanned live every
run: its records have no consume-queue position to be marked by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from connectors.rocketmq.layout import CQ_ENTRY_SIZE
from connectors.rocketmq.probe import CommitLogHeads, QueueBounds, entry_at, queue_bounds
from connectors.rocketmq.read_plan import QueueUnit, Unit
from schemas.messages import QueueKey


@dataclass(frozen=True)
class QueueMark:
    """How far the mirror has read a queue: ``next_offset`` is the first entry it has not
    read; the entry before it pointed at ``commitlog_offset`` (``size`` bytes), a record
    stored at ``store_timestamp_ms``: what the next run checks the store still holds."""

    next_offset: int
    commitlog_offset: int
    size: int
    store_timestamp_ms: int
    # The first entry the mirror holds: a store readable before it was restored or copied
    # again, and the mirror has a hole there.
    first_offset: int = 0


@dataclass(frozen=True)
class MirrorPlan:
    """One run's read through the mirror (``plan_mirror``)."""

    extend: list[QueueUnit]  # decoded into the mirror by this run (consume-queue ranges)
    live: list[Unit]  # decoded by this run for itself (module docstring)
    ranges: dict[QueueKey, tuple[int, int]]  # per queue, the [first, end) rows read from it
    marks: dict[QueueKey, QueueMark]  # the mirror's marks once this run extended it
    rebuilt: dict[str, str]  # broker -> why its mirror is read again from the store


def clip(unit: QueueUnit, begin: int, end: int) -> QueueUnit | None:
    """The part of ``unit`` whose entries' queue offsets are in ``[begin, end)``; None when
    no entry is."""
    base = unit.cq_start // CQ_ENTRY_SIZE
    first = max(unit.entry_begin, begin - base)
    stop = min(unit.entry_end, end - base)
    return replace(unit, entry_begin=first, entry_end=stop) if first < stop else None


def mark_mismatch(
    root: Path, log: CommitLogHeads, key: QueueKey, mark: QueueMark, bounds: QueueBounds | None
) -> str | None:
    """Why the store no longer holds what ``mark`` says the mirror read (a store replaced,
    reset, restored from an older copy or another broker's), or None when it does. An
    entry retention removed (its consume-queue file, or the commit log it points into)
    cannot be checked and is taken as read."""
    _, topic, queue_id = key
    last = mark.next_offset - 1
    where = f"{topic} queue {queue_id} offset {last}"
    if bounds is None:
        return f"{topic} queue {queue_id} has no consume-queue entry, the mirror read up to {last}"
    first, end = bounds.span
    if last >= end:
        return f"{topic} queue {queue_id} ends at offset {end}, the mirror read up to {last}"
    if bounds.readable is not None and bounds.readable[0] < mark.first_offset:
        return (
            f"{topic} queue {queue_id} holds readable records from offset"
            f" {bounds.readable[0]}, before the first the mirror read ({mark.first_offset})"
        )
    if last < first:
        return None  # the broker's retention removed the head past the mark
    entry = entry_at(root, topic, queue_id, last)
    if entry != (mark.commitlog_offset, mark.size):
        return (
            f"{where} points at {entry}, the mirror read (commit-log offset, size)"
            f" ({mark.commitlog_offset}, {mark.size})"
        )
    head = log.head(mark.commitlog_offset)
    if head is None:
        expired = bool(log.files) and mark.commitlog_offset < log.files[0].start
        return None if expired else f"{where}: no readable record at commit-log offset {entry[0]}"
    if (head.topic, head.queue_id, head.queue_offset) != (topic, queue_id, last):
        return f"{where}: the record there belongs to {head.topic} queue {head.queue_id}"
    if head.store_timestamp_ms != mark.store_timestamp_ms:
        return (
            f"{where}: the record there was stored at {head.store_timestamp_ms}, the one the"
            f" mirror read at {mark.store_timestamp_ms}"
        )
    return None


def _new_mark(
    root: Path, log: CommitLogHeads, key: QueueKey, span: tuple[int, int]
) -> QueueMark | None:
    """The mark once the mirror holds the queue's entries ``span`` (first, last); None when
    the last entry or its record cannot be read now (the store changed under the run)."""
    entry = entry_at(root, key[1], key[2], span[1])
    head = log.head(entry[0]) if entry is not None else None
    if entry is None or head is None:
        return None
    return QueueMark(span[1] + 1, entry[0], entry[1], head.store_timestamp_ms, span[0])


def _readable(bounds: QueueBounds | None, parts: Sequence[QueueUnit]) -> tuple[int, int] | None:
    """The queue's readable entries that the plan's units cover: a broker that appends
    while the run plans leaves entries the units do not hold, the next run's."""
    if bounds is None or bounds.readable is None:
        return None
    planned_end = max(unit.cq_start // CQ_ENTRY_SIZE + unit.entry_end for unit in parts)
    first, last = bounds.readable
    last = min(last, planned_end - 1)
    return (first, last) if first <= last else None


def _queue_units(units: Sequence[Unit]) -> dict[QueueKey, list[QueueUnit]]:
    grouped: dict[QueueKey, list[QueueUnit]] = {}
    for unit in units:
        if isinstance(unit, QueueUnit):
            grouped.setdefault((unit.broker, unit.topic, unit.queue_id), []).append(unit)
    return grouped


def _split_queue(
    parts: Sequence[QueueUnit], readable: tuple[int, int], start: int, plan: MirrorPlan
) -> None:
    """Cut one queue's units into the plan: ``[start, last]`` into the mirror, what lies
    outside the readable range live."""
    first, last = readable
    for unit in parts:
        for begin, end, into in (
            (start, last + 1, plan.extend),
            (-1, first, plan.live),
            (last + 1, 1 << 62, plan.live),
        ):
            part = clip(unit, begin, end)
            if part is not None:
                into.append(part)


def plan_mirror(
    roots: Mapping[str, Path],
    units: Sequence[Unit],
    marks: Mapping[QueueKey, QueueMark],
    rebuild: Mapping[str, str],
) -> MirrorPlan:
    """The run's read through the mirror: ``units`` (the stores' plan, ``roots`` broker ->
    store root) against the mirror's ``marks``. A broker of ``rebuild`` (broker -> why) is
    read whole again, as is one whose store no longer holds what a mark says
    (``mark_mismatch``); the others go on from their marks."""
    plan = MirrorPlan([], [u for u in units if not isinstance(u, QueueUnit)], {}, {}, dict(rebuild))
    grouped = _queue_units(units)
    logs = {broker: CommitLogHeads.of(root) for broker, root in roots.items()}
    bounds = {
        key: queue_bounds(roots[key[0]], logs[key[0]], key[1], key[2])
        for key in {*grouped, *(k for k in marks if k[0] in roots)}
    }
    for key, mark in sorted(marks.items()):
        broker = key[0]
        if broker in roots and broker not in plan.rebuilt:
            why = mark_mismatch(roots[broker], logs[broker], key, mark, bounds[key])
            if why is not None:
                plan.rebuilt[broker] = why
    kept = {key: mark for key, mark in marks.items() if key[0] not in plan.rebuilt}
    plan.marks.update(kept)
    for key, parts in sorted(grouped.items()):
        readable = _readable(bounds[key], parts)
        previous = kept.get(key)
        held = (
            None
            if readable is None
            else (readable[0] if previous is None else previous.first_offset, readable[1])
        )
        after = None if held is None else _new_mark(roots[key[0]], logs[key[0]], key, held)
        if readable is None or after is None:
            plan.live.extend(parts)  # the mirror neither grows nor is read for this queue
            continue
        start = readable[0] if previous is None else max(readable[0], previous.next_offset)
        _split_queue(parts, readable, start, plan)
        plan.ranges[key] = (readable[0], readable[1] + 1)
        plan.marks[key] = after
    return plan
