"""A driver-side, read-only probe of a store's queues: a few consume-queue entries and the
fixed fields of the records they point at, without Spark and without reading a queue whole.

The job asks it, before Spark starts, for the oldest and newest store time of a store's
half and op records (``transaction_times``): the ``--as-of`` checks and ``--as-of auto``
(docs/spec/reconcile.md section 1). Indexes are consume-queue entry indexes, i.e. queue
offsets: a file named by byte offset ``S`` holds the entries from ``S / 20``. Every file is
opened read-only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from connectors.rocketmq import codec
from connectors.rocketmq.layout import CQ_DTYPE, CQ_ENTRY_SIZE, CQ_PAD_SIZE, file_start_offset
from connectors.rocketmq.read_plan import TRANSACTION_TOPICS
from connectors.rocketmq.store_files import CommitLogFile, list_commitlog, written_entries
from connectors.rocketmq.structure import OK, record_layout

# Entries tried one by one from each end of a queue before the probe samples and bisects:
# a handful of reads for a live store, about log2(entries) more for a damaged one.
WALK_ENTRIES = 64
SAMPLES = 16  # evenly spaced entries tried when both ends are unreadable
_HEAD_BLOCK = 4096  # entries read at a time past the pad entries of a late queue head


@dataclass(frozen=True)
class RecordHead:
    """The fixed fields of one commit-log record."""

    commitlog_offset: int
    queue_id: int
    queue_offset: int
    store_timestamp_ms: int
    born_timestamp_ms: int
    topic: str


@dataclass(frozen=True)
class StoreTimes:
    """The oldest and newest store time among the half and op records at each transaction
    queue's first and last readable entries (None: no such record). ``unreadable_tail``:
    how many entries after the last readable one of each queue, summed over the queues,
    point at no readable record (a truncated or half-copied commit log)."""

    oldest_ms: int | None
    newest_ms: int | None
    unreadable_tail: int = 0


@dataclass(frozen=True)
class _CqFile:
    path: Path
    first: int  # entry index its name stands for
    count: int  # whole entries the file holds


def _queue_files(root: Path, topic: str, queue_id: int) -> list[_CqFile]:
    """The consume-queue files of one queue, in entry order."""
    directory = root / "consumequeue" / topic / str(queue_id)
    if not directory.is_dir():
        return []
    files = []
    for entry in os.scandir(directory):
        start = file_start_offset(entry.name)
        if start is not None and entry.is_file():
            files.append(
                _CqFile(
                    Path(entry.path),
                    start // CQ_ENTRY_SIZE,
                    entry.stat().st_size // CQ_ENTRY_SIZE,
                )
            )
    return sorted(files, key=lambda f: f.first)


def _is_pad(entries: np.ndarray) -> np.ndarray:
    return (entries["offset"] == 0) & (entries["size"] == CQ_PAD_SIZE) & (entries["tags"] == 0)


def _first_entry(cq: _CqFile) -> int:
    """The index of the file's first entry that is not a pad entry (a queue created late
    starts its first file with ``(0, 0x7FFFFFFF, 0)`` entries up to its first offset)."""
    with cq.path.open("rb") as file:
        done = 0
        while done < cq.count:
            block = file.read(min(_HEAD_BLOCK, cq.count - done) * CQ_ENTRY_SIZE)
            entries = np.frombuffer(block[: len(block) // CQ_ENTRY_SIZE * CQ_ENTRY_SIZE], CQ_DTYPE)
            if not len(entries):
                break
            real = np.flatnonzero(~_is_pad(entries))
            if real.size:
                return cq.first + done + int(real[0])
            done += len(entries)
    return cq.first + done


def queue_span(root: Path, topic: str, queue_id: int) -> tuple[int, int] | None:
    """(first, end) entry indexes of a queue: ``first`` is the first entry of its first
    consume-queue file after the pad entries of a late queue head, ``end`` is 1 + its last
    written entry (the all-zero tail of the preallocated last file is unwritten:
    ``store_files.written_entries``). None when the queue has no consume-queue file."""
    files = _queue_files(root, topic, queue_id)
    if not files:
        return None
    first = _first_entry(files[0])
    last = files[-1]
    end = last.first + written_entries(last.path, last.count * CQ_ENTRY_SIZE)
    return first, max(first, end)


def _entry(files: list[_CqFile], index: int) -> tuple[int, int] | None:
    for cq in files:
        if cq.first <= index < cq.first + cq.count:
            fd = os.open(cq.path, os.O_RDONLY)
            try:
                raw = os.pread(fd, CQ_ENTRY_SIZE, (index - cq.first) * CQ_ENTRY_SIZE)
            finally:
                os.close(fd)
            if len(raw) < CQ_ENTRY_SIZE:
                return None
            entry = np.frombuffer(raw, CQ_DTYPE)
            if _is_pad(entry)[0] or not any(raw):
                return None
            return int(entry["offset"][0]), int(entry["size"][0])
    return None


def entry_at(root: Path, topic: str, queue_id: int, index: int) -> tuple[int, int] | None:
    """(commit-log offset, size) of the queue's entry ``index``; None when no file holds
    it, or it is a pad entry or unwritten (all zero)."""
    return _entry(_queue_files(root, topic, queue_id), index)


@dataclass
class CommitLogHeads:
    """A store's commit-log files, each mapped read-only once and only when a record in it
    is read."""

    root: Path
    files: tuple[CommitLogFile, ...] = ()
    mapped: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, root: Path) -> CommitLogHeads:
        return cls(root, list_commitlog(root)[0])

    def head(self, offset: int) -> RecordHead | None:
        found = [f for f in self.files if f.start <= offset < f.start + f.size]
        if not found:
            return None
        log = found[0]
        if log.name not in self.mapped:
            self.mapped[log.name] = codec.open_read_only(self.root / log.name)
        buf = self.mapped[log.name]
        layout = record_layout(buf, np.array([offset - log.start], np.int64), log.start)
        if int(layout.status[0]) != OK:
            return None
        start, length = int(layout.topic_start[0]), int(layout.topic_len[0])
        return RecordHead(
            commitlog_offset=offset,
            queue_id=int(layout.queue_id[0]),
            queue_offset=int(layout.queue_offset[0]),
            store_timestamp_ms=int(layout.store_ts[0]),
            born_timestamp_ms=int(layout.born_ts[0]),
            topic=bytes(buf[start : start + length]).decode("utf-8", errors="replace"),
        )


def record_head(root: Path, commitlog_offset: int) -> RecordHead | None:
    """The fixed fields of the record at ``commitlog_offset``; None when no readable record
    starts there (no commit-log file holds it, truncated, bad magic, sizes that do not add
    up, a physical offset field naming another place)."""
    return CommitLogHeads.of(root).head(commitlog_offset)


def _bisect(readable: Callable[[int], bool], good: int, bad: int) -> int:
    """The readable index next to the boundary between ``good`` (readable) and ``bad``
    (not): the last readable one when ``good < bad``, the first when ``good > bad``. The
    unreadable entries are assumed to be one run at the queue's end (a truncated or
    half-copied commit log) or start (expired commit-log files)."""
    while abs(bad - good) > 1:
        middle = (good + bad) // 2
        if readable(middle):
            good = middle
        else:
            bad = middle
    return good


def _readable_ends(first: int, end: int, readable: Callable[[int], bool]) -> tuple[int, int] | None:
    """(first, last) readable entry index of the span ``[first, end)``, or None when none
    of the entries tried is readable: ``WALK_ENTRIES`` from each end, then, when one end is
    unreadable throughout, a bisection from a readable entry (the other end's, or one of
    ``SAMPLES`` evenly spaced in between)."""
    front = range(first, min(end, first + WALK_ENTRIES))
    low = next((i for i in front if readable(i)), None)
    back = range(end - 1, max(first if low is None else low, end - WALK_ENTRIES) - 1, -1)
    high = next((i for i in back if readable(i)), None)
    if low is not None and high is not None:
        return low, high
    anchor = low if low is not None else high
    if anchor is None and end - first > 2 * WALK_ENTRIES:
        middle = np.linspace(first + WALK_ENTRIES, end - WALK_ENTRIES - 1, SAMPLES, dtype=np.int64)
        anchor = next((int(i) for i in np.unique(middle) if readable(int(i))), None)
    if anchor is None:
        return None
    # The front walk's last entry and the back walk's last one are unreadable here: each
    # boundary lies between one of them and the anchor.
    low = low if low is not None else _bisect(readable, anchor, front.stop - 1)
    high = high if high is not None else _bisect(readable, anchor, end - WALK_ENTRIES)
    return low, high


_Ends = tuple[RecordHead | None, RecordHead | None, int]


@dataclass(frozen=True)
class QueueBounds:
    """Where a queue's readable records are: ``span`` is its (first, end) entry indexes
    (``queue_span``), ``readable`` the (first, last) entry indexes that hold a record of
    the queue, None when none of the entries tried does; ``heads`` the records there."""

    span: tuple[int, int]
    readable: tuple[int, int] | None
    heads: tuple[RecordHead, RecordHead] | None
    expired: bool  # no entry readable because the commit log below it expired whole


def queue_bounds(root: Path, log: CommitLogHeads, topic: str, queue_id: int) -> QueueBounds | None:
    """The queue's span and its first and last readable entries (``_readable_ends``: a few
    reads from each end, a bisection when an end is unreadable); None for a queue with no
    entry."""
    span = queue_span(root, topic, queue_id)
    if span is None or span[0] >= span[1]:
        return None
    files = _queue_files(root, topic, queue_id)
    heads: dict[int, RecordHead | None] = {}

    def readable(index: int) -> bool:
        if index not in heads:
            entry = _entry(files, index)
            head = log.head(entry[0]) if entry is not None else None
            ours = head is not None and head.topic == topic and head.queue_id == queue_id
            heads[index] = head if ours else None
        return heads[index] is not None

    ends = _readable_ends(span[0], span[1], readable)
    if ends is None:
        # Expired whole (its last entry points below the first commit-log file) is the
        # broker's retention at work, not an unreadable tail.
        last = _entry(files, span[1] - 1)
        expired = last is not None and bool(log.files) and last[0] < log.files[0].start
        return QueueBounds(span, None, None, expired)
    low, high = heads[ends[0]], heads[ends[1]]
    assert low is not None and high is not None  # _readable_ends returns readable indexes
    return QueueBounds(span, ends, (low, high), False)


def _queue_ends(root: Path, log: CommitLogHeads, topic: str, queue_id: int) -> _Ends | None:
    """The records at the queue's first and last readable entries and how many entries
    follow the last one (None, None and the whole span when no entry tried is readable,
    unless the queue expired whole); None for a queue with no entry."""
    bounds = queue_bounds(root, log, topic, queue_id)
    if bounds is None:
        return None
    first, end = bounds.span
    if bounds.readable is None or bounds.heads is None:
        return None, None, 0 if bounds.expired else end - first
    return bounds.heads[0], bounds.heads[1], end - 1 - bounds.readable[1]


def _transaction_queues(root: Path) -> list[tuple[str, int]]:
    queues: list[tuple[str, int]] = []
    for topic in TRANSACTION_TOPICS:
        topic_dir = root / "consumequeue" / topic
        if topic_dir.is_dir():
            ids = (int(e.name) for e in os.scandir(topic_dir) if e.is_dir() and e.name.isdigit())
            queues.extend((topic, queue_id) for queue_id in sorted(ids))
    return queues


def transaction_times(root: Path) -> StoreTimes:
    """The oldest and newest store time among the half and op records at each transaction
    queue's first and last readable entries (a handful of reads per queue, read-only). An
    entry is readable when a record of its topic and queue starts where it points; a queue
    none of whose entries tried is readable counts whole in ``unreadable_tail``."""
    log = CommitLogHeads.of(root)
    oldest: list[int] = []
    newest: list[int] = []
    unreadable = 0
    for topic, queue_id in _transaction_queues(root):
        ends = _queue_ends(root, log, topic, queue_id)
        if ends is None:
            continue
        low, high, tail = ends
        unreadable += tail
        if low is not None and high is not None:
            oldest.append(low.store_timestamp_ms)
            newest.append(high.store_timestamp_ms)
    return StoreTimes(min(oldest, default=None), max(newest, default=None), unreadable)
