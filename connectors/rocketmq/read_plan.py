"""Planning a store read on the driver: the units of work found from the store's layout
(``connectors.rocketmq.store_files``: file names and sizes, and the end of what each
consume-queue file holds; no record is read here), the notes on what the plan had to work
around, and which queues' offsets cannot repeat.

A unit is a range of entries of one consume-queue file (``QueueUnit``), or one commit-log
file to scan when a queue's consume queue is missing (``ScanUnit``).
``connectors.rocketmq.task_packing`` cuts them, puts them in commit-log order and packs them
into tasks of about ``TASK_ENTRIES`` entries; ``connectors.rocketmq.read_tasks`` decodes
them in the Spark tasks. See ``docs/store-reader.md``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from connectors.rocketmq import codec, layout
from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY
from connectors.rocketmq.store_files import (
    CommitLogFile,
    OffsetFile,
    StoreSpec,
    list_commitlog,
    offset_files,
    written_entries,
)
from schemas.messages import HALF_TOPIC, OP_TOPIC

TRANSACTION_TOPICS = (HALF_TOPIC, OP_TOPIC)

# Work sizes: a task decodes about this many records (consume-queue entries).
TASK_ENTRIES = 200_000
SCAN_BYTES_PER_ENTRY = 128  # weight of a commit-log scan, in entries, per byte

Note = tuple[str, int | None, str]  # (broker, queue id or None, text)


# --- units of work -------------------------------------------------------------------------------


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
                    files, _ = offset_files(Path(entry.path))
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
        everything: list[tuple[str, int | None]] = [(t, None) for t in topics]
        text = (
            f"no consume queue for {', '.join(topics)}: queues rebuilt by scanning the commit log"
        )
        return everything, [(broker, None, text)] if has_commitlog else []
    wanted: list[tuple[str, int | None]] = []
    notes: list[Note] = []
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
