"""Planning a store read on the driver: the ``--store`` argument, then the units of work
found from the store's layout (file names and sizes, and the end of what each consume-queue
file holds, and a few consume-queue entries where ranges are cut at commit-log files; no
record is read here).

A unit is a range of entries of one consume-queue file (``QueueUnit``), or one commit-log
file to scan when a queue's consume queue is missing (``ScanUnit``). Units are cut, put in
commit-log order and packed into tasks of about ``TASK_ENTRIES`` entries;
``connectors.rocketmq.read_tasks`` decodes them in the Spark tasks. See
``docs/store-reader.md``.
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import itertools
import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from connectors.errors import InputError
from connectors.rocketmq import codec, layout
from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY
from connectors.rocketmq.store_kind import check_supported
from schemas.messages import HALF_TOPIC, OP_TOPIC

TRANSACTION_TOPICS = (HALF_TOPIC, OP_TOPIC)

# Work sizes: a task decodes about this many records (consume-queue entries).
TASK_ENTRIES = 200_000
# A small store is still cut into at least as many tasks as the session has cores (Spark's
# default parallelism), so every executor of a cluster reads, but no task below this size.
MIN_TASK_ENTRIES = 1_024
SCAN_BYTES_PER_ENTRY = 128  # weight of a commit-log scan, in entries, per byte
_TAIL_BLOCK = 1 << 16  # bytes read at a time in the search for a file's last entry (a full
# file: one block, so a store of a few hundred files costs a few MB of reads)

Note = tuple[str, int | None, str]  # (broker, queue id or None, text)
OffsetFile = tuple[str, int, int]  # (file name, start offset, size)


# --- store arguments -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreSpec:
    broker: str
    root: Path


def parse_store_arg(arg: str) -> StoreSpec:
    """``[NAME=]DIR``: the broker name defaults to the directory's base name. A ``NAME`` is
    the text before the first ``=`` when it has no path separator."""
    name, sep, rest = arg.partition("=")
    if sep and name and "/" not in name and os.sep not in name:
        directory = rest
    else:
        name, directory = "", arg
    if not directory:
        raise InputError(f"--store {arg!r}: no directory given")
    root = Path(directory).expanduser()
    broker = name or root.name or root.resolve().name
    if not broker:
        raise InputError(f"--store {arg!r}: cannot derive a broker name, use NAME=DIR")
    return StoreSpec(broker=broker, root=root)


def validate_store(spec: StoreSpec) -> None:
    """InputError (one line naming the path) unless ``spec.root`` is a store directory."""
    root = spec.root
    if not root.exists():
        raise InputError(f"{root}: store directory does not exist")
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    if not (root / "commitlog").is_dir() and not (root / "consumequeue").is_dir():
        raise InputError(
            f"{root}: not a RocketMQ store (neither commitlog/ nor consumequeue/ found)"
        )
    check_supported(root)  # RocksDB, DLedger, several commit-log paths, a slave: exit 2


# --- units of work -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitLogFile:
    name: str  # relative to the store root, e.g. commitlog/00000000000000000000
    start: int
    size: int


@dataclass(frozen=True)
class QueueUnit:
    """Entries ``[entry_begin, entry_end)`` of one consume-queue file."""

    broker: str
    root: str
    topic: str
    queue_id: int
    cq_name: str  # relative to the store root
    cq_start: int  # byte offset the file name stands for
    entry_begin: int
    entry_end: int
    cq_size: int
    commitlog: tuple[CommitLogFile, ...]

    @property
    def weight(self) -> int:
        return self.entry_end - self.entry_begin


@dataclass(frozen=True)
class ScanUnit:
    """One commit-log file walked record by record, keeping ``wanted`` (topic, queue id or
    None for every queue): the rebuild of queues whose consume queue is missing."""

    broker: str
    root: str
    file: CommitLogFile
    wanted: tuple[tuple[str, int | None], ...]

    @property
    def weight(self) -> int:
        return max(1, self.file.size // SCAN_BYTES_PER_ENTRY)


Unit = QueueUnit | ScanUnit


# --- the store's layout ---------------------------------------------------------------------------


def _offset_files(directory: Path) -> tuple[list[OffsetFile], list[str]]:
    """(name, start, size) of the 20-digit files of a directory, sorted; other names."""
    found: list[OffsetFile] = []
    other: list[str] = []
    if not directory.is_dir():
        return found, other
    for entry in os.scandir(directory):
        start = codec.file_start_offset(entry.name)
        if start is None or not entry.is_file():
            other.append(entry.name)
            continue
        found.append((entry.name, start, entry.stat().st_size))
    found.sort(key=lambda item: item[1])
    return found, sorted(other)


def list_commitlog(root: Path) -> tuple[tuple[CommitLogFile, ...], list[str]]:
    files, other = _offset_files(root / "commitlog")
    result = []
    for i, (name, start, size) in enumerate(files):
        if i + 1 < len(files):  # a file never extends into the next one
            size = min(size, files[i + 1][1] - start)
        result.append(CommitLogFile(f"commitlog/{name}", start, size))
    return tuple(result), other


def _data_end(fd: int, size: int) -> int:
    """Where the file's last data region ends: a preallocated file is sparse (its
    unwritten tail is a hole), so the search for its last entry starts there. The file's
    size where the file system cannot say."""
    end, position = 0, 0
    try:
        while position < size:
            data = os.lseek(fd, position, os.SEEK_DATA)
            position = end = os.lseek(fd, data, os.SEEK_HOLE)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: no data after ``position``
            return size
    except AttributeError:  # no SEEK_DATA on this platform
        return size
    return min(end, size)


def written_entries(path: Path, size: int) -> int:
    """How many entries of a consume-queue file come before its all-zero tail (the
    unwritten part of the preallocated file): its last entry with a byte that is not zero,
    found backwards from the end of its data. Read-only; a few blocks of a written file."""
    with path.open("rb") as file:
        end = _data_end(file.fileno(), size)
        while end > 0:
            begin = max(0, end - _TAIL_BLOCK)
            file.seek(begin)
            nonzero = np.flatnonzero(np.frombuffer(file.read(end - begin), dtype=np.uint8))
            if nonzero.size:
                return (begin + int(nonzero[-1])) // codec.CQ_ENTRY_SIZE + 1
            end = begin
    return 0


def _present_queues(root: Path, topics: Sequence[str]) -> dict[str, dict[int, list[OffsetFile]]]:
    """Topic -> queue id -> the files of its consume-queue directory (ValueError for a
    topic name that cannot be a folder: ``layout.topic_folder``)."""
    present: dict[str, dict[int, list[OffsetFile]]] = {}
    for topic in topics:
        queues: dict[int, list[OffsetFile]] = {}
        topic_dir = layout.topic_folder(root, topic)
        if topic_dir.is_dir():
            for entry in sorted(os.scandir(topic_dir), key=lambda e: e.name):
                if entry.is_dir() and entry.name.isdigit():
                    files, _ = _offset_files(Path(entry.path))
                    queues[int(entry.name)] = files
        present[topic] = queues
    return present


def _committed_queues(offsets: Mapping | None, topics: Sequence[str]) -> set[int]:
    """Queue ids the offsets file has a committed offset for (transaction topics)."""
    committed: set[int] = set()
    if offsets:
        for key, topic in ((HALF_KEY, HALF_TOPIC), (OP_KEY, OP_TOPIC)):
            if topic in topics:
                committed.update(offsets.get(key, {}).keys())
    return committed


def _queue_units(
    spec: StoreSpec,
    absolute: str,
    topics: Sequence[str],
    present: Mapping[str, Mapping[int, list[OffsetFile]]],
    commitlog: tuple[CommitLogFile, ...],
) -> list[Unit]:
    """One unit per ``TASK_ENTRIES`` written entries of each consume-queue file: the all-zero
    tail of a preallocated file (``written_entries``) holds no record, so a small queue is
    one small unit, not 300 000 entries of work. The entries are the file's as planned: one
    the broker writes into the tail afterwards is the next run's."""
    units: list[Unit] = []
    for topic in topics:
        for queue_id, files in present[topic].items():
            for name, start, size in files:
                rel = f"consumequeue/{topic}/{queue_id}/{name}"
                written = written_entries(spec.root / rel, size)
                for begin in range(0, written, TASK_ENTRIES):
                    end = min(written, begin + TASK_ENTRIES)
                    units.append(
                        QueueUnit(
                            spec.broker,
                            absolute,
                            topic,
                            queue_id,
                            rel,
                            start,
                            begin,
                            end,
                            size,
                            commitlog,
                        )
                    )
    return units


def _expected_queues(
    topic: str,
    topics: Sequence[str],
    present: Mapping[str, Mapping[int, list[OffsetFile]]],
    committed: set[int],
) -> set[int]:
    """The queues a topic should have: its own directories and, for the transaction topics,
    the sibling topic's directories and the committed offsets (a half queue ``q`` implies
    an op queue ``q`` and the other way round)."""
    expected = set(present[topic])
    if topic in TRANSACTION_TOPICS:
        for sibling in TRANSACTION_TOPICS:
            if sibling in topics:
                expected |= set(present[sibling])
        expected |= committed
    return expected


def _rebuilt_queues(
    broker: str,
    topics: Sequence[str],
    present: Mapping[str, Mapping[int, list[OffsetFile]]],
    committed: set[int],
    has_commitlog: bool,
) -> tuple[list[tuple[str, int | None]], list[Note]]:
    """The (topic, queue id or None for all) to rebuild by scanning the commit log, and
    the notes that say so."""
    if not any(present[t] for t in topics) and not committed:
        wanted: list[tuple[str, int | None]] = [(t, None) for t in topics]
        text = (
            f"no consume queue for {', '.join(topics)}: queues rebuilt by scanning the commit log"
        )
        return wanted, [(broker, None, text)] if has_commitlog else []
    wanted, notes = [], []
    for topic in topics:
        for queue_id in sorted(
            _expected_queues(topic, topics, present, committed) - set(present[topic])
        ):
            wanted.append((topic, queue_id))
            notes.append(
                (
                    broker,
                    queue_id,
                    f"consume queue consumequeue/{topic}/{queue_id} missing: queue rebuilt from the commit log",
                )
            )
    return wanted, notes


def plan_store(
    spec: StoreSpec, topics: Sequence[str] = TRANSACTION_TOPICS, offsets: dict | None = None
) -> tuple[list[Unit], list[Note]]:
    """Units of work and notes for one store (file names and sizes are read, and the end
    of each consume-queue file's written entries)."""
    notes: list[Note] = []
    commitlog, other = list_commitlog(spec.root)
    if other:
        notes.append(
            (
                spec.broker,
                None,
                f"commitlog/: ignored {len(other)} file(s) not named by an offset: {', '.join(other[:5])}",
            )
        )
    present = _present_queues(spec.root, topics)
    committed = _committed_queues(offsets, topics)
    # Executors open the files by this path from their own working directory (a cluster
    # worker's, not the driver's): a relative --store must not reach them as it was given.
    absolute = str(spec.root.absolute())
    units = _queue_units(spec, absolute, topics, present, commitlog)
    wanted, rebuilt = _rebuilt_queues(spec.broker, topics, present, committed, bool(commitlog))
    notes.extend(rebuilt)
    if wanted:
        units.extend(ScanUnit(spec.broker, absolute, f, tuple(wanted)) for f in commitlog)
    if not commitlog and any(present[t] for t in topics):
        notes.append(
            (spec.broker, None, "no commit-log file: every consume-queue entry points nowhere")
        )
    return units, notes


# --- tasks ------------------------------------------------------------------------------------------


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


def unique_offset_queues(units: Sequence[Unit]) -> list[tuple[str, str, int]]:
    """(broker, topic, queue_id) of the queues whose queue offsets are unique by
    construction: every record is reached through an entry of the queue's consume queue, at
    the offset the entry's place stands for, and the queue's files do not overlap. A queue
    rebuilt from the commit log (records found by scanning) is never in the list."""
    scanned: set[tuple[str, str, int | None]] = set()
    spans: dict[tuple[str, str, int], set[tuple[int, int]]] = {}
    for unit in units:
        if isinstance(unit, ScanUnit):
            scanned.update((unit.broker, topic, queue_id) for topic, queue_id in unit.wanted)
        else:
            spans.setdefault((unit.broker, unit.topic, unit.queue_id), set()).add(
                (unit.cq_start, unit.cq_size)
            )
    unique = []
    for key, files in sorted(spans.items()):
        if key in scanned or (key[0], key[1], None) in scanned:
            continue
        ordered = sorted(files)
        entries = [
            (start, start + -(-size // codec.CQ_ENTRY_SIZE) * codec.CQ_ENTRY_SIZE)
            for start, size in ordered
        ]
        if all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(entries)):
            unique.append(key)
    return unique
