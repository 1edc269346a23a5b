"""The store's files as the driver sees them, before any record is read: the ``--store``
argument (``StoreSpec``: broker name and directory) and its check, the offset-named files of
a directory (the commit log's, a consume queue's) and how many entries of a consume-queue
file are written. ``connectors.rocketmq.read_plan`` plans units from them;
``connectors.rocketmq.probe`` reads single entries of them.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from connectors.errors import InputError
from connectors.rocketmq import codec
from connectors.rocketmq.store_kind import check_supported

_TAIL_BLOCK = 1 << 16  # bytes read at a time in the search for a file's last entry (a full
# file: one block, so a store of a few hundred files costs a few MB of reads)

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


def checked_stores(args: Sequence[str]) -> list[StoreSpec]:
    """The ``[NAME=]DIR`` arguments as stores, each checked (``validate_store``); InputError
    for a broker name given twice."""
    specs: dict[str, StoreSpec] = {}
    for arg in args:
        spec = parse_store_arg(arg)
        validate_store(spec)
        if spec.broker in specs:
            raise InputError(f"broker name '{spec.broker}' given twice; name stores NAME=DIR")
        specs[spec.broker] = spec
    return list(specs.values())


# --- the store's layout ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitLogFile:
    name: str  # relative to the store root, e.g. commitlog/00000000000000000000
    start: int
    size: int


def offset_files(directory: Path) -> tuple[list[OffsetFile], list[str]]:
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
    files, other = offset_files(root / "commitlog")
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
