"""A store as it grows: earlier states of a simulated store, for the runs that follow a
store over time (the mirror's equality tests, docs/simulator.md "A store that grows").

The simulator writes the commit log in store-time order, so the store as it was at an
earlier moment is a prefix of it: the commit log up to a record boundary (the rest of the
file unwritten, all zero, as a broker leaves it), each consume queue up to its last entry
inside that prefix, and the committed offsets no further than the queues' ends.
``copy_prefix`` writes that state over a store directory, so that a directory moves
forward stage by stage the way a broker's does; ``expire_head`` then removes the oldest
commit-log file the way the broker's retention does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from connectors.rocketmq.layout import CQ_DTYPE, CQ_PAD_SIZE
from connectors.rocketmq.offsets_file import (
    HALF_KEY,
    OP_KEY,
    read_consumer_offsets,
    write_consumer_offsets,
)
from connectors.rocketmq.probe import queue_span
from schemas.messages import HALF_TOPIC, OP_TOPIC

_OFFSETS = Path("config") / "consumerOffset.json"


def record_ends(store: Path, topic: str, queue_id: int = 0) -> np.ndarray:
    """The commit-log offset just after each record of a queue: record boundaries a
    prefix can end at."""
    ends = []
    directory = store / "consumequeue" / topic / str(queue_id)
    for file in sorted(directory.iterdir(), key=lambda f: int(f.name)):
        entries = np.frombuffer(file.read_bytes(), CQ_DTYPE)
        real = (entries["size"] != CQ_PAD_SIZE) & (entries["size"] > 0)
        ends.append(entries["offset"][real] + entries["size"][real])
    return np.concatenate(ends) if ends else np.empty(0, np.int64)


def _data_end(data: bytes, block: int = 1 << 20) -> int:
    """The length of ``data`` without its all-zero tail, found backwards a block at a time
    (a 1 GiB commit-log file is mostly written or mostly zero)."""
    view = np.frombuffer(data, dtype=np.uint8)
    end = len(view)
    while end > 0:
        begin = max(0, end - block)
        nonzero = np.flatnonzero(view[begin:end])
        if nonzero.size:
            return begin + int(nonzero[-1]) + 1
        end = begin
    return 0


def _write_if_changed(target: Path, data: bytes) -> None:
    """Write ``data`` at ``target`` unless it holds it already (a prefix's unchanged files
    keep their identity, as a broker's do). Its all-zero tail is left a hole, as in the
    broker's preallocated files (and the simulator's): a reader of the copy reads from disk
    what it would read of a broker's store, not the zeros."""
    if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    used = _data_end(data)
    with target.open("wb") as file:
        file.write(memoryview(data)[:used])
        file.truncate(len(data))


def _copy_commitlog(full: Path, dest: Path, cut: int) -> None:
    for file in sorted((full / "commitlog").iterdir()):
        start, target = int(file.name), dest / "commitlog" / file.name
        if start >= cut:
            target.unlink(missing_ok=True)
            continue
        data = bytearray(file.read_bytes())
        keep = cut - start
        data[keep:] = bytes(len(data) - min(keep, len(data)))
        _write_if_changed(target, bytes(data))


def _copy_queue(source: Path, target: Path, cut: int) -> None:
    """One queue's consume-queue files, up to its last entry before ``cut``."""
    for file in sorted(source.iterdir(), key=lambda f: int(f.name)):
        entries = np.frombuffer(file.read_bytes(), CQ_DTYPE).copy()
        real = entries["size"] != CQ_PAD_SIZE
        beyond = np.flatnonzero(real & (entries["offset"] + entries["size"] > cut))
        if beyond.size:
            entries[int(beyond[0]) :] = np.zeros(1, CQ_DTYPE)
        if not (entries["offset"] != 0).any() and beyond.size:
            (target / file.name).unlink(missing_ok=True)  # the broker has not made it yet
            continue
        _write_if_changed(target / file.name, entries.tobytes())


def copy_prefix(full: Path, dest: Path, cut: int) -> None:
    """Make ``dest`` the store ``full`` was when its commit log ended at ``cut`` (a record
    boundary: ``record_ends``); files ``dest`` holds already keep their bytes where they
    do not change."""
    _copy_commitlog(full, dest, cut)
    for topic_dir in sorted((full / "consumequeue").iterdir()):
        for queue_dir in sorted(topic_dir.iterdir()):
            target = dest / "consumequeue" / topic_dir.name / queue_dir.name
            target.mkdir(parents=True, exist_ok=True)
            _copy_queue(queue_dir, target, cut)
    table = read_consumer_offsets(full / _OFFSETS) or {}
    clamped: dict[str, dict[int, int]] = {}
    for key, topic in ((HALF_KEY, HALF_TOPIC), (OP_KEY, OP_TOPIC)):
        for queue_id, offset in table.get(key, {}).items():
            span = queue_span(dest, topic, queue_id)
            end = span[1] if span is not None else 0
            if min(offset, end):
                clamped.setdefault(key, {})[queue_id] = min(offset, end)
    (dest / "config").mkdir(parents=True, exist_ok=True)
    write_consumer_offsets(dest / _OFFSETS, clamped)


def expire_head(store: Path, files: int = 1) -> None:
    """Remove the oldest ``files`` commit-log files, and the consume-queue files whose every
    entry points below what is left, the way the broker's retention does (its last
    consume-queue file stays, as the broker keeps it)."""
    logs = sorted((store / "commitlog").iterdir(), key=lambda f: int(f.name))
    for file in logs[:files]:
        file.unlink()
    first = int(logs[files].name) if len(logs) > files else None
    for queue_dir in (store / "consumequeue").glob("*/*"):
        queue_files = sorted(queue_dir.iterdir(), key=lambda f: int(f.name))
        for file in queue_files[:-1]:
            entries = np.frombuffer(file.read_bytes(), CQ_DTYPE)
            real = entries["size"] != CQ_PAD_SIZE
            if first is None or not (entries["offset"][real] >= first).any():
                file.unlink()
