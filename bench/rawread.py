"""The raw read floor: how fast can the bytes the job decodes be read at all?

"Those bytes" are the used part of the consume-queue files of the two transaction topics and
the commit-log records their entries point at (adjacent records coalesced into one range).
Each pass reads them from the page cache (a warm-up pass comes first) and sums every byte, in
2 processes to match the job's ``local[2]``, with the work split in two halves by bytes.

The commit log is memory-mapped and the ranges are gathered with one Arrow ``take`` over a
binary array whose offsets are the range boundaries (the trick the store reader itself
uses): a loop of ``os.pread`` per range would measure Python's per-call overhead (~1 µs
per range, about a million ranges per 1M transactions) rather than memory bandwidth.
Planning (decoding the consume-queue entries into ranges) is done before the clock starts:
it is the floor of moving the bytes, not of a reader.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.stores import TOPICS, cq_files, read_cq_entries, used_bytes, valid_entries

GATHER_BYTES = 64 << 20  # bytes copied per take: bounds the worker's memory


@dataclass
class Piece:
    """Byte ranges of one file, sorted and disjoint."""

    path: str
    starts: np.ndarray
    lengths: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())


@dataclass
class Plan:
    pieces: list[Piece] = field(default_factory=list)
    records: int = 0
    record_bytes: int = 0  # sum of the records' sizes
    cq_bytes: int = 0  # used consume-queue bytes

    @property
    def nbytes(self) -> int:
        return sum(piece.nbytes for piece in self.pieces)


def coalesce(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge touching or overlapping ranges (two entries may point at one record)."""
    if len(starts) == 0:
        return starts, lengths
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], starts[order] + lengths[order]
    reach = np.maximum.accumulate(ends)
    new_run = np.ones(len(starts), dtype=bool)
    new_run[1:] = starts[1:] > reach[:-1]
    run_id = np.cumsum(new_run) - 1
    run_starts = starts[new_run]
    run_ends = np.zeros(len(run_starts), dtype=np.int64)
    np.maximum.at(run_ends, run_id, ends)
    return run_starts, run_ends - run_starts


def _commitlog_files(store: Path) -> tuple[list[Path], np.ndarray]:
    files = sorted(p for p in (store / "commitlog").iterdir() if p.is_file() and p.name.isdigit())
    return files, np.array([int(p.name) for p in files], dtype=np.int64)


def plan_store(store: Path) -> Plan:
    """Ranges to read for one store: used consume-queue bytes, then the records."""
    plan = Plan()
    offsets, sizes = [], []
    for topic in TOPICS:
        for path in cq_files(store, topic):
            entries = read_cq_entries(path)
            used = used_bytes(entries)
            plan.pieces.append(
                Piece(str(path), np.array([0], np.int64), np.array([used], np.int64))
            )
            plan.cq_bytes += used
            valid = entries[valid_entries(entries)]
            offsets.append(valid["offset"].astype(np.int64))
            sizes.append(valid["size"].astype(np.int64))
    offsets_all = np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
    sizes_all = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    plan.records, plan.record_bytes = len(offsets_all), int(sizes_all.sum())
    files, file_starts = _commitlog_files(store)
    which = np.searchsorted(file_starts, offsets_all, side="right") - 1
    for index, path in enumerate(files):
        mine = which == index
        if mine.any():
            starts, lengths = coalesce(offsets_all[mine] - file_starts[index], sizes_all[mine])
            plan.pieces.append(Piece(str(path), starts, lengths))
    return plan


def split_plan(plans: list[Plan], parts: int) -> list[list[Piece]]:
    """Cut all pieces into ``parts`` shares of about equal bytes (ranges are not cut)."""
    pieces = [piece for plan in plans for piece in plan.pieces]
    total = sum(piece.nbytes for piece in pieces)
    shares: list[list[Piece]] = [[] for _ in range(parts)]
    done = 0
    for piece in pieces:
        # Share of each range: where its middle byte falls in the running total.
        before = done + np.concatenate([[0], np.cumsum(piece.lengths)[:-1]])
        middle = before + piece.lengths // 2
        share = np.minimum(middle * parts // max(total, 1), parts - 1)
        for k in np.unique(share):
            mine = share == k
            shares[k].append(Piece(piece.path, piece.starts[mine], piece.lengths[mine]))
        done += piece.nbytes
    return shares


def _gather(buffer: pa.Buffer, starts: np.ndarray, lengths: np.ndarray) -> pa.Buffer:
    """Copy the ranges (sorted, disjoint) out of ``buffer`` back to back, in C++."""
    bounds = np.empty(2 * len(starts), dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, starts + lengths
    # Values 0, 2, 4, ... of this array are the ranges, the odd ones the gaps between.
    array = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), buffer]
    )
    taken = pc.take(array, pa.array(np.arange(0, len(bounds), 2, dtype=np.int64)))
    return taken.buffers()[2] or pa.py_buffer(b"")


def _byte_sum(buffer: pa.Buffer) -> int:
    data = np.frombuffer(buffer, dtype=np.uint8)
    words = len(data) // 8
    return int(data[: words * 8].view(np.uint64).sum()) + int(
        data[words * 8 :].sum(dtype=np.uint64)
    )


def read_pieces(pieces: list[Piece]) -> tuple[int, int]:
    """Read and sum every byte of the pieces; (bytes read, checksum)."""
    nbytes, checksum = 0, 0
    for piece in pieces:
        if piece.nbytes == 0:
            continue
        mapped = np.memmap(piece.path, dtype=np.uint8, mode="r")
        buffer = pa.py_buffer(mapped)
        cum = np.cumsum(piece.lengths)
        start = 0
        while start < len(piece.starts):
            # Ranges up to GATHER_BYTES from here (at least one).
            base = cum[start - 1] if start else 0
            stop = max(start + 1, int(np.searchsorted(cum, base + GATHER_BYTES, side="right")))
            gathered = _gather(buffer, piece.starts[start:stop], piece.lengths[start:stop])
            nbytes += gathered.size
            checksum = (checksum + _byte_sum(gathered)) % (1 << 64)
            start = stop
        del buffer, mapped
    return nbytes, checksum


def _disk_read_bytes() -> int:
    """Bytes this process made the kernel fetch from storage (not from the page cache)."""
    import psutil  # the bench extra; the pure parts of this module are tested without it

    try:
        return psutil.Process().io_counters().read_bytes
    except (psutil.Error, AttributeError):
        return 0


def _reader(share: list[Piece], passes: int, barrier, results) -> None:
    """One reading process: a warm-up pass, then ``passes`` passes, each started by the
    barrier so that both processes read at the same time. Each result says how many bytes
    came from the disk: the pass is meant to read the page cache, and on a machine with too
    little memory for the largest size it cannot."""
    started = time.perf_counter()
    read_pieces(share)
    warmup = time.perf_counter() - started
    for _ in range(passes):
        barrier.wait()
        cpu, disk = time.process_time(), _disk_read_bytes()
        nbytes, checksum = read_pieces(share)
        results.put(
            (nbytes, checksum, time.process_time() - cpu, _disk_read_bytes() - disk, warmup)
        )


def measure_raw_read(stores: dict[str, Path], passes: int, processes: int = 2) -> dict:
    """Warm-up pass, then ``passes`` timed passes of reading the half/op bytes of ``stores``.

    One process per share, started (spawn: each receives only its own share) and warmed up
    before the clock; a pass is timed from the barrier that releases all of them to the
    last result.
    """
    plans = [plan_store(path) for path in stores.values()]
    shares = split_plan(plans, processes)
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    workers = [
        context.Process(target=_reader, args=(share, passes, barrier, results)) for share in shares
    ]
    for worker in workers:
        worker.start()
    runs = []
    try:
        for _ in range(passes):
            barrier.wait()
            started = time.perf_counter()
            done = [results.get() for _ in workers]
            wall = time.perf_counter() - started
            runs.append(
                {
                    "wall_s": wall,
                    "cpu_s": sum(r[2] for r in done),
                    "bytes": sum(r[0] for r in done),
                    "checksum": sum(r[1] for r in done) % (1 << 64),
                    "disk_read_bytes": sum(r[3] for r in done),
                    "warmup_wall_s": max(r[4] for r in done),
                }
            )
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
                worker.join()
    records = sum(plan.records for plan in plans)
    for run in runs:
        run["records_per_s"] = records / run["wall_s"]
        run["bytes_per_s"] = run["bytes"] / run["wall_s"]
    return {
        "processes": processes,
        "records": records,
        "record_bytes": sum(plan.record_bytes for plan in plans),
        "cq_bytes": sum(plan.cq_bytes for plan in plans),
        "bytes": sum(plan.nbytes for plan in plans),
        "ranges": sum(len(piece.starts) for plan in plans for piece in plan.pieces),
        "share_bytes": [sum(piece.nbytes for piece in share) for share in shares],
        "runs": runs,
    }
