"""Cutting the planned units (``connectors.rocketmq.read_plan``) into Spark tasks: the task
size for the session's parallelism, consume-queue ranges cut to it and where they cross
into the next commit-log file, put in commit-log order and packed into tasks of about
``TASK_ENTRIES`` entries (``reader.read_stores`` runs them; docs/store-reader.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import operator
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from connectors.rocketmq import codec
from connectors.rocketmq.read_plan import TASK_ENTRIES, QueueUnit, Unit
from connectors.rocketmq.store_files import CommitLogFile

# A small store is still cut into at least as many tasks as the session has cores (Spark's
# default parallelism), so every executor of a cluster reads, but no task below this size.
MIN_TASK_ENTRIES = 1_024


def task_size(units: Sequence[Unit], min_tasks: int) -> int:
    """Entries per task: ``TASK_ENTRIES``, or less so that the units make at least
    ``min_tasks`` tasks (never below ``MIN_TASK_ENTRIES``)."""
    total = sum(unit.weight for unit in units)
    return max(MIN_TASK_ENTRIES, min(TASK_ENTRIES, total // max(1, min_tasks)))


def split_units(units: Sequence[Unit], size: int) -> list[Unit]:
    """Consume-queue ranges cut into ranges of at most ``size`` entries (a commit-log scan
    stays whole: its records are found by walking the file from its start)."""
    pieces: list[Unit] = []
    for unit in units:
        if isinstance(unit, QueueUnit) and unit.weight > size:
            pieces.extend(
                dataclasses.replace(
                    unit, entry_begin=begin, entry_end=min(unit.entry_end, begin + size)
                )
                for begin in range(unit.entry_begin, unit.entry_end, size)
            )
        else:
            pieces.append(unit)
    return pieces


def pack_tasks(units: Sequence[Unit], target: int = TASK_ENTRIES) -> list[list[Unit]]:
    """Consecutive units grouped into tasks of about ``target`` entries."""
    tasks: list[list[Unit]] = []
    current: list[Unit] = []
    weight = 0
    for unit in units:
        if current and weight + unit.weight > target:
            tasks.append(current)
            current, weight = [], 0
        current.append(unit)
        weight += unit.weight
    if current:
        tasks.append(current)
    return tasks


def in_log_order(units: Sequence[Unit]) -> list[Unit]:
    """Consume-queue ranges cut where their entries cross into the next commit-log file,
    then ordered by broker and the commit-log position of their first entry (commit-log
    scans first, in their own order). Packed in this order, the tasks of a read walk each
    commit-log file about once, while its pages are in the page cache, instead of once per
    queue: each queue's records lie among every other queue's (the half and op records
    among the business messages), so a read in queue order faults the commit log in again
    for each queue when it is larger than the page cache (docs/store-reader.md).

    Only the entries at the cuts are read (a binary search over the read-only mapped
    consume-queue file). Entries out of order (a damaged consume queue) only make the
    order less useful: the pieces still hold each entry of ``units`` exactly once."""
    unordered: list[Unit] = []  # commit-log scans and empty ranges, first, as they came
    pieces: list[tuple[int, QueueUnit]] = []  # (commit-log offset of the first entry, piece)
    for unit in units:
        if not isinstance(unit, QueueUnit) or unit.weight <= 0:
            unordered.append(unit)
            continue
        try:
            offsets = _entry_offsets(unit)
        except (OSError, TypeError, ValueError):
            # Unreadable or shorter than planned here: left whole, for its task to report.
            pieces.append((-1, unit))
            continue
        # Binary searches, one per file boundary the range spans: a few entries read per
        # cut (numpy's searchsorted would copy the whole range first).
        cuts = [bisect.bisect_left(offsets, log.start) for log in _spanned(unit, offsets)]
        # Ranges in entry order even where the offsets are not.
        cuts = list(itertools.accumulate([0, *cuts, len(offsets)], max))
        for begin, end in itertools.pairwise(cuts):
            if end > begin:
                piece = dataclasses.replace(
                    unit, entry_begin=unit.entry_begin + begin, entry_end=unit.entry_begin + end
                )
                pieces.append((int(offsets[begin]), piece))
    pieces.sort(key=lambda item: (item[1].broker, item[0]))
    return unordered + [piece for _, piece in pieces]


def _spanned(unit: QueueUnit, offsets: np.ndarray) -> Sequence[CommitLogFile]:
    """The commit-log files that start after the range's first entry and at or before its
    last: where it crosses into a next file (none if its ends are out of order: a damaged
    range stays whole)."""
    start = operator.attrgetter("start")
    begin = bisect.bisect_right(unit.commitlog, int(offsets[0]), key=start)
    end = bisect.bisect_right(unit.commitlog, int(offsets[-1]), key=start)
    return unit.commitlog[begin:end]


def _entry_offsets(unit: QueueUnit) -> np.ndarray:
    """The commit-log offsets of the unit's entries, as a strided view of the mapped file
    (nothing is read until an element is)."""
    buf = codec.open_read_only(Path(unit.root) / unit.cq_name)
    return np.ndarray(
        (unit.weight,),
        dtype=">i8",
        buffer=buf,
        offset=unit.entry_begin * codec.CQ_ENTRY_SIZE,
        strides=(codec.CQ_ENTRY_SIZE,),
    )
