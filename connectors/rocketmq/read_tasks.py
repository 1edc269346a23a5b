"""Decoding the units of a store read, in the Spark tasks (Python workers; no Spark here).

Each unit (``connectors.rocketmq.read_plan``) memory-maps its files read-only and decodes
with ``codec`` (vectorised numpy/pyarrow), yielding Arrow record batches of one combined
schema: message columns plus ``reason``/``raw_hex`` (null for readable records). One pass
over the bytes gives both the records and the bad records. See ``docs/store-reader.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.rocketmq import codec
from connectors.rocketmq.combined import Out, ReadOptions
from connectors.rocketmq.read_plan import QueueUnit, ScanUnit, Unit
from connectors.rocketmq.store_files import CommitLogFile

# Records are decoded in chunks of at most this many records / stored bytes (bounds memory
# per batch).
CHUNK_RECORDS = 65_536
CHUNK_BYTES = 64 << 20
# ... and spans at most this much of the file: what a worker keeps mapped while it decodes a
# chunk (``codec.release_pages`` unmaps it after). A queue's records are spread over the
# commit log among other queues' (a chunk of a few thousand op records can span most of a
# 1 GiB file).
CHUNK_SPAN = 128 << 20
# The reason of a consume-queue entry whose commit-log place holds no record: the entry is
# the bad record, and the place it names is in the text (a commit-log scan that meets the
# same bytes reports them there: transforms.discard_inputs.not_reported matches the two with NO_RECORD_PLACE).
NO_RECORD_AT = (
    "consume-queue entry points at no record in {source} at position {position}: {reason}"
)
NO_RECORD_PLACE = r"^consume-queue entry points at no record in (\S+) at position (\d+): "


def _chunks(positions: np.ndarray, sizes: np.ndarray) -> Iterator[slice]:
    """Slices of at most CHUNK_RECORDS records, about CHUNK_BYTES stored bytes and about
    CHUNK_SPAN bytes of the file (positions in file order; an out-of-order one counts
    from the furthest seen)."""
    n = len(positions)
    ends = np.cumsum(np.maximum(sizes, 0))
    furthest = np.maximum.accumulate(positions) if n else positions
    i = 0
    while i < n:
        before = int(ends[i - 1]) if i else 0
        j = int(np.searchsorted(ends, before + CHUNK_BYTES, side="right"))
        k = int(np.searchsorted(furthest, int(positions[i]) + CHUNK_SPAN, side="left"))
        j = min(max(min(j, k), i + 1), i + CHUNK_RECORDS, n)
        yield slice(i, j)
        i = j


def _release_chunk(buf: np.ndarray, at: np.ndarray, sizes: np.ndarray) -> None:
    """Once a chunk's batches are sent, its pages are unmapped (``codec.release_pages``)."""
    if len(at):
        codec.release_pages(buf, int(at.min()), int((at + np.maximum(sizes, 0)).max()))


# --- a consume-queue range: entries followed into the commit log ------------------------------------


class _Entries:
    """The entries of one consume-queue range, decoded, and how to report one of them."""

    def __init__(self, unit: QueueUnit, cq: np.ndarray, out: Out) -> None:
        self.unit, self.cq, self.out = unit, cq, out
        begin = unit.entry_begin * codec.CQ_ENTRY_SIZE
        stop = min(len(cq), unit.entry_end * codec.CQ_ENTRY_SIZE)
        raw = np.asarray(cq[begin:stop])
        self.phys, self.size, self.tags = codec.decode_cq_entries(raw)
        self.count = count = len(self.phys)
        self.entry_pos = begin + np.arange(count, dtype=np.int64) * codec.CQ_ENTRY_SIZE
        self.logical = (unit.cq_start + self.entry_pos) // codec.CQ_ENTRY_SIZE
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

    def bad(self, k: np.ndarray | int, reason: str) -> None:
        """A bad record at entry ``k`` (its 20 bytes, its queue offset)."""
        at = int(self.entry_pos[k])
        self.out.add_bad(
            self.unit.cq_name,
            at,
            reason,
            codec.raw_hex(self.cq, at, codec.CQ_ENTRY_SIZE),
            self.unit.topic,
            self.unit.queue_id,
            int(self.logical[k]),
        )


def _plausible_entries(entries: _Entries, files: Sequence[CommitLogFile]) -> np.ndarray:
    """Entries that stand for a record (not padding, not the unwritten tail) with a size a
    record can have; the others with a live entry's size are reported."""
    phys, size, tags = entries.phys, entries.size, entries.tags
    unwritten = (phys == 0) & (size == 0) & (tags == 0)
    padding = (phys == 0) & (size == codec.CQ_PAD_SIZE) & (tags == 0)
    live = ~(unwritten | padding)
    max_size = int(max((f.size for f in files), default=0))
    bad_size = live & (
        (size < codec.MIN_RECORD_SIZE) | (size > max(max_size, codec.MIN_RECORD_SIZE))
    )
    for k in np.flatnonzero(bad_size):
        entries.bad(
            k,
            f"consume-queue entry has an invalid size {int(size[k])} (commit-log offset {int(phys[k])})",
        )
    return live & ~bad_size


def _locate_entries(
    entries: _Entries, files: Sequence[CommitLogFile]
) -> tuple[np.ndarray, np.ndarray]:
    """(index of the commit-log file each entry points into, entries that point inside a
    file); the entries that point nowhere are reported."""
    phys, count = entries.phys, entries.count
    live = _plausible_entries(entries, files)
    starts = np.array([f.start for f in files], dtype=np.int64)
    ends = np.array([f.start + f.size for f in files], dtype=np.int64)
    file_index = (
        np.searchsorted(starts, phys, side="right") - 1 if len(starts) else np.full(count, -1)
    )
    for k in np.flatnonzero(live & (file_index < 0)):
        if len(starts):
            entries.bad(
                k,
                f"commit-log offset {int(phys[k])} is below the first commit-log file ({int(starts[0])}): expired",
            )
        else:
            entries.bad(k, f"commit-log offset {int(phys[k])}: the store has no commit-log file")
    live &= file_index >= 0
    inside = np.zeros(count, dtype=bool)
    if len(starts):
        fi = np.maximum(file_index, 0)
        inside = live & (phys < ends[fi])
    for k in np.flatnonzero(live & ~inside):
        if int(file_index[k]) == len(files) - 1:
            entries.bad(
                k,
                f"commit-log offset {int(phys[k])} is past the end of the commit log ({int(ends[-1])})",
            )
        else:
            entries.bad(
                k, f"commit-log offset {int(phys[k])} lies in no commit-log file (missing file)"
            )
    return file_index, inside


def _matching_records(
    entries: _Entries,
    table: pa.Table,
    ks: np.ndarray,
    at: tuple[np.ndarray, np.ndarray],
    log: CommitLogFile,
) -> pa.Table:
    """The decoded records whose topic, queue id, queue offset and size are those of the
    entry that points at them (entries ``ks``; record ``r`` was decoded at
    ``positions[index[r]]`` for ``at`` = (positions, index)); each other entry is reported."""
    unit, size = entries.unit, entries.size
    positions, index = at
    matches = (
        pc.equal(table.column("topic"), unit.topic).to_numpy(zero_copy_only=False).astype(bool)
        & (table.column("queue_id").to_numpy() == unit.queue_id)
        & (table.column("queue_offset").to_numpy() == entries.logical[ks])
        & (table.column("stored_size").to_numpy() == size[ks])
    )
    if matches.all():
        return table
    for r in np.flatnonzero(~matches):
        row = {
            c: table.column(c)[int(r)].as_py()
            for c in ("topic", "queue_id", "queue_offset", "stored_size")
        }
        entries.bad(
            ks[r],
            f"consume-queue entry (size {int(size[ks[r]])}) does not match the record at {log.name} "
            f"position {int(positions[index[r]])}: topic {row['topic']}, queue {row['queue_id']}, "
            f"offset {row['queue_offset']}, size {row['stored_size']}",
        )
    return table.filter(pa.array(matches))


def _follow_into_file(
    entries: _Entries, members: np.ndarray, log: CommitLogFile, options: ReadOptions
) -> Iterator[pa.RecordBatch]:
    """Decode the records entries ``members`` point at in one commit-log file."""
    out = entries.out
    try:
        buf = codec.open_read_only(Path(entries.unit.root) / log.name)[: log.size]
    except OSError as exc:
        for k in members:
            entries.bad(k, f"cannot read {log.name}: {exc}")
        yield from out.flush_bad()
        return
    positions, sizes = entries.phys[members] - log.start, entries.size[members]
    for part in _chunks(positions, sizes):
        sel, at = members[part], positions[part]
        layout = codec.record_layout(buf, at, log.start)
        if options.commits_only:
            # The fixed fields say which records are commits, and which of those may be
            # wanted (their prepared-transaction offset); the others are not decoded
            # further (a broken record is still decoded, to be reported).
            tx = layout.sys_flag & codec.TRANSACTION_MASK
            commit = tx == codec.TRANSACTION_COMMIT_TYPE
            commit[commit] = options.wanted_commits(entries.unit.broker, layout.prepared[commit])
            wanted = np.flatnonzero((layout.status != codec.OK) | commit)
            sel, at, layout = sel[wanted], at[wanted], layout.subset(wanted)
        result = codec.decode_records(
            buf,
            at,
            file_offset=log.start,
            verify_crc=options.verify_crc,
            body_topics=options.body_topics,
            layout=layout,
            property_columns=options.property_columns,
            drop_columns=options.drop_columns,
        )
        for b in result.bad:
            k = sel[b.index]
            if b.no_record:
                entries.bad(
                    k,
                    NO_RECORD_AT.format(source=log.name, position=b.position, reason=b.reason),
                )
            else:
                raw = codec.raw_hex(buf, b.position)
                unit = entries.unit
                logical = int(entries.logical[k])
                out.add_bad(log.name, b.position, b.reason, raw, unit.topic, unit.queue_id, logical)
        table = result.records
        if table.num_rows:
            table = _matching_records(entries, table, sel[result.index], (at, result.index), log)
        yield from out.records(table, log.name)
        yield from out.flush_bad()
        _release_chunk(buf, positions[part], sizes[part])


def run_queue_unit(unit: QueueUnit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Follow the entries of a consume-queue range into the commit log."""
    out = Out(unit.broker, options.arrow_schema)
    try:
        cq = codec.open_read_only(Path(unit.root) / unit.cq_name)
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
    entries = _Entries(unit, cq, out)
    file_index, inside = _locate_entries(entries, unit.commitlog)
    yield from out.flush_bad()
    for fidx in np.unique(file_index[inside]):
        members = np.flatnonzero(inside & (file_index == fidx))
        yield from _follow_into_file(entries, members, unit.commitlog[int(fidx)], options)


# --- a commit-log file scanned for queues whose consume queue is missing ---------------------------


def _scan_chunk(
    unit: ScanUnit, buf: np.ndarray, chunk: np.ndarray, options: ReadOptions, out: Out
) -> Iterator[pa.RecordBatch]:
    """Decode the records of the wanted queues among the records at ``chunk``."""
    log = unit.file
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
        raw = codec.raw_hex(buf, b.position)
        out.add_bad(log.name, b.position, b.reason, raw, b.topic, b.queue_id, b.queue_offset)
    yield from out.records(result.records, log.name)
    yield from out.flush_bad()


def run_scan_unit(unit: ScanUnit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Walk one commit-log file and decode the records of the wanted queues."""
    log = unit.file
    out = Out(unit.broker, options.arrow_schema)
    try:
        buf = codec.open_read_only(Path(unit.root) / log.name)[: log.size]
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
    # The walk touched a header in every page; the chunks map back only what they decode.
    codec.release_pages(buf, 0, len(buf))
    positions = walk.positions
    sizes = np.zeros(len(positions), dtype=np.int64)
    if len(positions):
        sizes[:-1] = np.diff(positions)
        sizes[-1] = walk.stop - positions[-1]
    for part in _chunks(positions, sizes):
        yield from _scan_chunk(unit, buf, positions[part], options, out)
        _release_chunk(buf, positions[part], sizes[part])
    yield from out.flush_bad()


# --- one unit, one task -------------------------------------------------------------------------------


def run_unit(unit: Unit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Batches of ``COMBINED_ARROW`` for one unit. A failure that escapes the decoders (it
    should not happen) becomes a bad record naming the unit, never a failed task."""
    try:
        if isinstance(unit, QueueUnit):
            yield from run_queue_unit(unit, options)
        else:
            yield from run_scan_unit(unit, options)
    except Exception as exc:
        out = Out(unit.broker, options.arrow_schema)
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


def read_tasks(
    tasks: list[list[Unit]], options: ReadOptions, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: each input row is a task id; its units, decoded."""
    for batch in batches:
        for task_id in batch.column(0).to_pylist():
            for unit in tasks[int(task_id)]:
                yield from run_unit(unit, options)
