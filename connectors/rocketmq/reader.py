"""Read RocketMQ broker stores (``--store [NAME=]DIR``) into the canonical schema, on Spark.

The driver lists files (names and sizes only) and cuts the work into *units*: a range of
entries of one consume-queue file, or one commit-log file to scan when a queue's consume
queue is missing. Units are packed into tasks and run by ``mapInArrow`` over
``spark.range(n_tasks)`` (one task per partition); each task memory-maps the files
read-only and decodes with ``codec`` (vectorised numpy/pyarrow), yielding Arrow record
batches of one combined schema: message columns plus ``reason``/``raw_hex`` (null for
readable records). That DataFrame is persisted and split into ``messages`` and
``bad_records``, so a run reads the store once. See ``docs/store-reader.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.errors import InputError
from connectors.rocketmq import codec
from connectors.rocketmq.offsets_file import (
    HALF_KEY,
    OP_KEY,
    committed_rows,
    load_store_offsets,
)
from connectors.rocketmq.store_kind import check_supported
from schemas.messages import (
    COMMITTED_OFFSET,
    HALF_TOPIC,
    LEAN_MESSAGE,
    OFFSET_UNIQUE,
    OP_TOPIC,
    PROPERTY_COLUMNS,
    SOURCED_MESSAGE,
    UNUSED_BY_ROUND,
)
from schemas.outputs import BAD_RECORD

TRANSACTION_TOPICS = (HALF_TOPIC, OP_TOPIC)

# Work sizes: a task decodes about this many records (consume-queue entries); records are
# decoded in chunks of at most this many records / stored bytes (bounds memory per batch).
TASK_ENTRIES = 200_000
# A small store is still cut into at least as many tasks as the session has cores (Spark's
# default parallelism), so every executor of a cluster reads, but no task below this size.
MIN_TASK_ENTRIES = 1_024
CHUNK_RECORDS = 65_536
CHUNK_BYTES = 64 << 20
SCAN_BYTES_PER_ENTRY = 128  # weight of a commit-log scan, in entries, per byte

# One pass produces both readable records and bad records.
_PROBLEM_FIELDS = [
    T.StructField("reason", T.StringType()),
    T.StructField("raw_hex", T.StringType()),
]
COMBINED = T.StructType([*SOURCED_MESSAGE.fields, *_PROBLEM_FIELDS])
# The job's lean path: the properties the round reads as columns, no map (LEAN_MESSAGE).
LEAN_COMBINED = T.StructType([*LEAN_MESSAGE.fields, *_PROBLEM_FIELDS])


def _combined_arrow(record_schema: pa.Schema, property_columns: Sequence[str] = ()) -> pa.Schema:
    """The Arrow twin of COMBINED / LEAN_COMBINED: same columns, same order."""
    tail = {"position", *property_columns}
    return pa.schema(
        [
            ("broker", pa.string()),
            *[(f.name, f.type) for f in record_schema if f.name not in tail],
            ("source", pa.string()),
            ("position", pa.int64()),
            *[(name, pa.string()) for name in property_columns],
            ("reason", pa.string()),
            ("raw_hex", pa.string()),
        ]
    )


COMBINED_ARROW = _combined_arrow(codec.RECORD_SCHEMA)
LEAN_COMBINED_ARROW = _combined_arrow(
    codec.lean_record_schema(PROPERTY_COLUMNS, UNUSED_BY_ROUND), tuple(PROPERTY_COLUMNS.values())
)
assert LEAN_COMBINED_ARROW.names == LEAN_COMBINED.fieldNames()
assert COMBINED_ARROW.names == COMBINED.fieldNames()


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


# --- result --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreRead:
    messages: DataFrame
    bad_records: DataFrame
    committed_offsets: DataFrame
    notes: list[tuple[str, int | None, str]]
    # The persisted one-pass DataFrame both of the above are cut from (``unpersist`` frees it).
    combined: DataFrame | None = field(default=None, repr=False, compare=False)
    # Per broker, the offsets file used and why the usual one was not
    # (``offsets_file.StoreOffsets``): the round names them in its warnings per queue.
    offsets_files: tuple[tuple[str, str, str | None], ...] = ()

    def unpersist(self) -> None:
        if self.combined is not None:
            self.combined.unpersist()


# --- planning (driver) -----------------------------------------------------------------------------


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


@dataclass(frozen=True)
class ReadOptions:
    verify_crc: bool = False
    body_topics: tuple[str, ...] | None = (OP_TOPIC,)  # None: every body
    lean: bool = False  # PROPERTY_COLUMNS instead of the properties map

    @property
    def property_columns(self) -> dict[str, str] | None:
        return PROPERTY_COLUMNS if self.lean else None

    @property
    def drop_columns(self) -> tuple[str, ...]:
        # stored_size is decoded even so: the consume-queue entry check compares it.
        return tuple(c for c in UNUSED_BY_ROUND if c != "stored_size") if self.lean else ()

    @property
    def arrow_schema(self) -> pa.Schema:
        return LEAN_COMBINED_ARROW if self.lean else COMBINED_ARROW


Unit = QueueUnit | ScanUnit


def _offset_files(directory: Path) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(name, start, size) of the 20-digit files of a directory, sorted; other names."""
    found, other = [], []
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


def plan_store(
    spec: StoreSpec, topics: Sequence[str] = TRANSACTION_TOPICS, offsets: dict | None = None
) -> tuple[list[Unit], list[tuple[str, int | None, str]]]:
    """Units of work and notes for one store (file names and sizes only are read)."""
    root = spec.root
    broker = spec.broker
    notes: list[tuple[str, int | None, str]] = []
    commitlog, other = list_commitlog(root)
    if other:
        notes.append(
            (
                broker,
                None,
                f"commitlog/: ignored {len(other)} file(s) not named by an offset: {', '.join(other[:5])}",
            )
        )
    present: dict[str, dict[int, list[tuple[str, int, int]]]] = {}
    for topic in topics:
        queues: dict[int, list[tuple[str, int, int]]] = {}
        topic_dir = root / "consumequeue" / topic
        if topic_dir.is_dir():
            for entry in sorted(os.scandir(topic_dir), key=lambda e: e.name):
                if entry.is_dir() and entry.name.isdigit():
                    files, _ = _offset_files(Path(entry.path))
                    queues[int(entry.name)] = files
        present[topic] = queues
    committed: set[int] = set()
    if offsets:
        for key, topic in ((HALF_KEY, HALF_TOPIC), (OP_KEY, OP_TOPIC)):
            if topic in topics:
                committed.update(offsets.get(key, {}).keys())

    units: list[Unit] = []
    # Executors open the files by this path from their own working directory (a cluster
    # worker's, not the driver's): a relative --store must not reach them as it was given.
    absolute = str(root.absolute())
    for topic in topics:
        for queue_id, files in present[topic].items():
            for name, start, size in files:
                entries = (size + codec.CQ_ENTRY_SIZE - 1) // codec.CQ_ENTRY_SIZE
                rel = f"consumequeue/{topic}/{queue_id}/{name}"
                for begin in range(0, entries, TASK_ENTRIES):
                    units.append(
                        QueueUnit(
                            broker,
                            absolute,
                            topic,
                            queue_id,
                            rel,
                            start,
                            begin,
                            min(entries, begin + TASK_ENTRIES),
                            size,
                            commitlog,
                        )
                    )

    wanted: list[tuple[str, int | None]] = []
    if not any(present[t] for t in topics) and not committed:
        wanted = [(t, None) for t in topics]
        if commitlog:
            notes.append(
                (
                    broker,
                    None,
                    f"no consume queue for {', '.join(topics)}: queues rebuilt by scanning the commit log",
                )
            )
    else:
        for topic in topics:
            expected = set(present[topic])
            if topic in TRANSACTION_TOPICS:
                for sibling in TRANSACTION_TOPICS:
                    if sibling in topics:
                        expected |= set(present[sibling])
                expected |= committed
            for queue_id in sorted(expected - set(present[topic])):
                wanted.append((topic, queue_id))
                notes.append(
                    (
                        broker,
                        queue_id,
                        f"consume queue consumequeue/{topic}/{queue_id} missing: queue rebuilt from the commit log",
                    )
                )
    if wanted:
        units.extend(ScanUnit(broker, absolute, f, tuple(wanted)) for f in commitlog)
    if not commitlog and any(present[t] for t in topics):
        notes.append((broker, None, "no commit-log file: every consume-queue entry points nowhere"))
    return units, notes


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


# --- execution (Python workers) ----------------------------------------------------------------------


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


def offset_unique_flag(units: Sequence[Unit]) -> Column:
    """The round's ``offset_unique`` column: true for records whose queue offset cannot
    repeat (``unique_offset_queues``). A literal when it is the same for every record, so
    that Spark's optimizer drops the duplicate check's branch it never needs."""
    queues = unique_offset_queues(units)
    if not queues:
        return F.lit(False)
    if not any(isinstance(u, ScanUnit) for u in units) and len(queues) == len(
        {(u.broker, u.topic, u.queue_id) for u in units}
    ):
        return F.lit(True)
    key = F.concat_ws("\u0000", F.col("broker"), F.col("topic"), F.col("queue_id").cast("string"))
    flag = key.isin(
        [f"{broker}\u0000{topic}\u0000{queue_id}" for broker, topic, queue_id in queues]
    )
    return F.coalesce(flag, F.lit(False))


def _repeat(value: str, n: int) -> pa.Array:
    return pa.array([value], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64)))


class _Out:
    """Collects bad rows of a unit and turns decoded record tables into combined batches."""

    def __init__(self, broker: str, schema: pa.Schema = COMBINED_ARROW) -> None:
        self.broker = broker
        self.schema = schema
        self.bad: list[dict] = []

    def add_bad(
        self,
        source: str,
        position: int,
        reason: str,
        raw: str,
        topic: str | None = None,
        queue_id: int | None = None,
        queue_offset: int | None = None,
    ) -> None:
        self.bad.append(
            {
                "broker": self.broker,
                "source": source,
                "position": int(position),
                "topic": topic,
                "queue_id": None if queue_id is None else int(queue_id),
                "queue_offset": None if queue_offset is None else int(queue_offset),
                "reason": reason,
                "raw_hex": raw,
            }
        )

    def records(self, table: pa.Table, source: str) -> Iterator[pa.RecordBatch]:
        if table.num_rows == 0:
            return
        n = table.num_rows
        columns = []
        for f in self.schema:
            if f.name == "broker":
                columns.append(_repeat(self.broker, n))
            elif f.name == "source":
                columns.append(_repeat(source, n))
            elif f.name in ("reason", "raw_hex"):
                columns.append(pa.nulls(n, pa.string()))
            else:
                columns.append(table.column(f.name))
        yield from pa.Table.from_arrays(columns, schema=self.schema).to_batches()

    def flush_bad(self) -> Iterator[pa.RecordBatch]:
        if not self.bad:
            return
        rows = self.bad
        self.bad = []
        table = pa.Table.from_pylist(
            rows, schema=pa.schema([self.schema.field(k) for k in rows[0]])
        )
        n = table.num_rows
        columns = [
            table.column(f.name) if f.name in table.column_names else pa.nulls(n, f.type)
            for f in self.schema
        ]
        yield from pa.Table.from_arrays(columns, schema=self.schema).to_batches()


def _chunks(positions: np.ndarray, sizes: np.ndarray) -> Iterator[slice]:
    """Slices of at most CHUNK_RECORDS records and about CHUNK_BYTES stored bytes."""
    n = len(positions)
    ends = np.cumsum(np.maximum(sizes, 0))
    i = 0
    while i < n:
        before = int(ends[i - 1]) if i else 0
        j = int(np.searchsorted(ends, before + CHUNK_BYTES, side="right"))
        j = min(max(j, i + 1), i + CHUNK_RECORDS, n)
        yield slice(i, j)
        i = j


def run_queue_unit(unit: QueueUnit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Follow the entries of a consume-queue range into the commit log."""
    root = Path(unit.root)
    out = _Out(unit.broker, options.arrow_schema)
    try:
        cq = codec.open_read_only(root / unit.cq_name)
    except OSError as exc:
        out.add_bad(
            unit.cq_name,
            unit.entry_begin * codec.CQ_ENTRY_SIZE,
            f"cannot read consume-queue file: {exc}",
            "",
            unit.topic,
            unit.queue_id,
        )
        yield from out.flush_bad()
        return
    begin = unit.entry_begin * codec.CQ_ENTRY_SIZE
    stop = min(len(cq), unit.entry_end * codec.CQ_ENTRY_SIZE)
    raw = np.asarray(cq[begin:stop])
    phys, size, tags = codec.decode_cq_entries(raw)
    count = len(phys)
    entry_pos = begin + np.arange(count, dtype=np.int64) * codec.CQ_ENTRY_SIZE
    logical = (unit.cq_start + entry_pos) // codec.CQ_ENTRY_SIZE
    if len(raw) % codec.CQ_ENTRY_SIZE:
        tail_at = begin + count * codec.CQ_ENTRY_SIZE
        if np.any(raw[count * codec.CQ_ENTRY_SIZE :] != 0):
            out.add_bad(
                unit.cq_name,
                tail_at,
                "truncated consume-queue entry at the end of the file",
                codec.raw_hex(cq, tail_at),
                unit.topic,
                unit.queue_id,
                (unit.cq_start + tail_at) // codec.CQ_ENTRY_SIZE,
            )

    def entry_bad(k: np.ndarray | int, reason: str) -> None:
        at = int(entry_pos[k])
        out.add_bad(
            unit.cq_name,
            at,
            reason,
            codec.raw_hex(cq, at, codec.CQ_ENTRY_SIZE),
            unit.topic,
            unit.queue_id,
            int(logical[k]),
        )

    unwritten = (phys == 0) & (size == 0) & (tags == 0)
    padding = (phys == 0) & (size == codec.CQ_PAD_SIZE) & (tags == 0)
    live = ~(unwritten | padding)
    files = unit.commitlog
    starts = np.array([f.start for f in files], dtype=np.int64)
    ends = np.array([f.start + f.size for f in files], dtype=np.int64)
    max_size = int(max((f.size for f in files), default=0))
    bad_size = live & (
        (size < codec.MIN_RECORD_SIZE) | (size > max(max_size, codec.MIN_RECORD_SIZE))
    )
    for k in np.flatnonzero(bad_size):
        entry_bad(
            k,
            f"consume-queue entry has an invalid size {int(size[k])} (commit-log offset {int(phys[k])})",
        )
    live &= ~bad_size
    file_index = (
        np.searchsorted(starts, phys, side="right") - 1 if len(starts) else np.full(count, -1)
    )
    for k in np.flatnonzero(live & (file_index < 0)):
        if len(starts):
            entry_bad(
                k,
                f"commit-log offset {int(phys[k])} is below the first commit-log file ({int(starts[0])}): expired",
            )
        else:
            entry_bad(k, f"commit-log offset {int(phys[k])}: the store has no commit-log file")
    live &= file_index >= 0
    inside = np.zeros(count, dtype=bool)
    if len(starts):
        fi = np.maximum(file_index, 0)
        inside = live & (phys < ends[fi])
    for k in np.flatnonzero(live & ~inside):
        if int(file_index[k]) == len(files) - 1:
            entry_bad(
                k,
                f"commit-log offset {int(phys[k])} is past the end of the commit log ({int(ends[-1])})",
            )
        else:
            entry_bad(
                k, f"commit-log offset {int(phys[k])} lies in no commit-log file (missing file)"
            )
    yield from out.flush_bad()

    for fidx in np.unique(file_index[inside]):
        log = files[int(fidx)]
        members = np.flatnonzero(inside & (file_index == fidx))
        try:
            buf = codec.open_read_only(root / log.name)[: log.size]
        except OSError as exc:
            for k in members:
                entry_bad(k, f"cannot read {log.name}: {exc}")
            yield from out.flush_bad()
            continue
        positions = phys[members] - log.start
        for part in _chunks(positions, size[members]):
            sel = members[part]
            result = codec.decode_records(
                buf,
                positions[part],
                file_offset=log.start,
                verify_crc=options.verify_crc,
                body_topics=options.body_topics,
                property_columns=options.property_columns,
                drop_columns=options.drop_columns,
            )
            for b in result.bad:
                k = sel[b.index]
                if b.no_record:
                    entry_bad(
                        k,
                        f"consume-queue entry points at no record in {log.name} at position {b.position}: {b.reason}",
                    )
                else:
                    out.add_bad(
                        log.name,
                        b.position,
                        b.reason,
                        codec.raw_hex(buf, b.position),
                        unit.topic,
                        unit.queue_id,
                        int(logical[k]),
                    )
            table = result.records
            if table.num_rows:
                ks = sel[result.index]
                matches = (
                    pc.equal(table.column("topic"), unit.topic)
                    .to_numpy(zero_copy_only=False)
                    .astype(bool)
                    & (table.column("queue_id").to_numpy() == unit.queue_id)
                    & (table.column("queue_offset").to_numpy() == logical[ks])
                    & (table.column("stored_size").to_numpy() == size[ks])
                )
                if not matches.all():
                    for r in np.flatnonzero(~matches):
                        row = {
                            c: table.column(c)[int(r)].as_py()
                            for c in ("topic", "queue_id", "queue_offset", "stored_size")
                        }
                        entry_bad(
                            ks[r],
                            f"consume-queue entry (size {int(size[ks[r]])}) does not match the record at {log.name} "
                            f"position {int(positions[part][result.index[r]])}: topic {row['topic']}, queue {row['queue_id']}, "
                            f"offset {row['queue_offset']}, size {row['stored_size']}",
                        )
                    table = table.filter(pa.array(matches))
            yield from out.records(table, log.name)
            yield from out.flush_bad()


def run_scan_unit(unit: ScanUnit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Walk one commit-log file and decode the records of the wanted queues."""
    root = Path(unit.root)
    log = unit.file
    out = _Out(unit.broker, options.arrow_schema)
    try:
        buf = codec.open_read_only(root / log.name)[: log.size]
    except OSError as exc:
        out.add_bad(log.name, 0, f"cannot read commit-log file: {exc}", "")
        yield from out.flush_bad()
        return
    walk = codec.walk_records(buf)
    if walk.error:
        out.add_bad(
            log.name,
            walk.stop,
            f"{walk.error}; rest of the file skipped",
            codec.raw_hex(buf, walk.stop),
        )
    positions = walk.positions
    sizes = np.zeros(len(positions), dtype=np.int64)
    if len(positions):
        sizes[:-1] = np.diff(positions)
        sizes[-1] = walk.stop - positions[-1]
    for part in _chunks(positions, sizes):
        chunk = positions[part]
        layout = codec.record_layout(buf, chunk, log.start)
        for i in np.flatnonzero(layout.status != codec.OK):
            reason = codec._reason(layout, int(i), int(layout.status[i]), len(buf), log.start)
            out.add_bad(log.name, int(chunk[i]), reason, codec.raw_hex(buf, int(chunk[i])))
        tx = layout.sys_flag & codec.TRANSACTION_MASK
        dispatched = (tx == codec.TRANSACTION_NOT_TYPE) | (tx == codec.TRANSACTION_COMMIT_TYPE)
        keep = np.zeros(len(chunk), dtype=bool)
        for topic, queue_id in unit.wanted:
            mask = codec.topic_matches(buf, layout, topic)
            if queue_id is not None:
                mask &= layout.queue_id == queue_id
            keep |= mask
        keep &= dispatched & (layout.status == codec.OK)
        idx = np.flatnonzero(keep)
        result = codec.decode_records(
            buf,
            chunk[idx],
            file_offset=log.start,
            verify_crc=options.verify_crc,
            body_topics=options.body_topics,
            layout=layout.subset(idx),
            property_columns=options.property_columns,
            drop_columns=options.drop_columns,
        )
        for b in result.bad:
            out.add_bad(
                log.name,
                b.position,
                b.reason,
                codec.raw_hex(buf, b.position),
                b.topic,
                b.queue_id,
                b.queue_offset,
            )
        yield from out.records(result.records, log.name)
        yield from out.flush_bad()
    yield from out.flush_bad()


def run_unit(unit: Unit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Batches of ``COMBINED_ARROW`` for one unit. A failure that escapes the decoders (it
    should not happen) becomes a bad record naming the unit, never a failed task."""
    runner = run_queue_unit if isinstance(unit, QueueUnit) else run_scan_unit
    try:
        yield from runner(unit, options)
    except Exception as exc:
        out = _Out(unit.broker, options.arrow_schema)
        if isinstance(unit, QueueUnit):
            out.add_bad(
                unit.cq_name,
                unit.entry_begin * codec.CQ_ENTRY_SIZE,
                f"unreadable consume-queue range: {type(exc).__name__}: {exc}",
                "",
                unit.topic,
                unit.queue_id,
            )
        else:
            out.add_bad(
                unit.file.name, 0, f"unreadable commit-log file: {type(exc).__name__}: {exc}", ""
            )
        yield from out.flush_bad()


def _read_tasks(
    tasks: list[list[Unit]], options: ReadOptions, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for task_id in batch.column(0).to_pylist():
            for unit in tasks[int(task_id)]:
                yield from run_unit(unit, options)


def read_batches(
    stores: Sequence[StoreSpec],
    *,
    verify_crc: bool = False,
    include_half_body: bool = False,
    topics: Sequence[str] = TRANSACTION_TOPICS,
) -> Iterator[pa.RecordBatch]:
    """The reader without Spark (tests, small tools): every combined batch of the stores."""
    options = ReadOptions(
        verify_crc=verify_crc, body_topics=None if include_half_body else (OP_TOPIC,)
    )
    for spec in stores:
        validate_store(spec)
        offsets = load_store_offsets(spec.root).table
        units, _ = plan_store(spec, tuple(topics), offsets)
        for unit in units:
            yield from run_unit(unit, options)


def read_stores(
    spark: SparkSession,
    stores: Sequence[StoreSpec],
    *,
    verify_crc: bool = False,
    include_half_body: bool = False,
    topics: Sequence[str] = TRANSACTION_TOPICS,
    lean: bool = False,
) -> StoreRead:
    """Read the half and op queues (or ``topics``) of every store; see the module doc.

    ``lean``: records carry ``PROPERTY_COLUMNS`` instead of the properties map
    (``LEAN_MESSAGE``), what the job reads; the default gives ``SOURCED_MESSAGE``.

    Raises InputError (before any Spark job) for a path that is not a store, two stores with
    the same broker name, or a malformed ``config/consumerOffset.json``."""
    topics = tuple(topics)
    names = [s.broker for s in stores]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InputError(f"--store: broker name {duplicated[0]!r} given twice")
    units: list[Unit] = []
    notes: list[tuple[str, int | None, str]] = []
    committed: list[tuple[str, str, int, int]] = []
    offsets_files: list[tuple[str, str, str | None]] = []
    for spec in stores:
        validate_store(spec)
        loaded = load_store_offsets(spec.root)
        offsets_files.append((spec.broker, loaded.used, loaded.note))
        offsets = loaded.table
        committed.extend(committed_rows(spec.broker, offsets))
        store_units, store_notes = plan_store(spec, topics, offsets)
        units.extend(store_units)
        notes.extend(store_notes)
    size = task_size(units, spark.sparkContext.defaultParallelism)
    tasks = pack_tasks(split_units(units, size), size)
    options = ReadOptions(
        verify_crc=verify_crc, body_topics=None if include_half_body else (OP_TOPIC,), lean=lean
    )
    ranges = spark.range(0, len(tasks), 1, max(1, len(tasks)))
    combined = ranges.mapInArrow(
        functools.partial(_read_tasks, tasks, options), LEAN_COMBINED if lean else COMBINED
    )
    combined = combined.persist(StorageLevel.MEMORY_AND_DISK)
    message_schema = LEAN_MESSAGE if lean else SOURCED_MESSAGE
    # The lean records are the round's input contract: what it reads, and whether each
    # record's queue offset can repeat (``transforms.round_stages.OFFSET_UNIQUE``).
    flag = [offset_unique_flag(units).alias(OFFSET_UNIQUE)] if lean else []
    messages = combined.where(F.col("reason").isNull()).select(*message_schema.fieldNames(), *flag)
    bad_records = combined.where(F.col("reason").isNotNull()).select(*BAD_RECORD.fieldNames())
    committed_offsets = spark.createDataFrame(committed, COMMITTED_OFFSET)
    return StoreRead(
        messages=messages,
        bad_records=bad_records,
        committed_offsets=committed_offsets,
        notes=notes,
        combined=combined,
        offsets_files=tuple(offsets_files),
    )
