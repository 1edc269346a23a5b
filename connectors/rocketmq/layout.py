"""The RocketMQ store's byte layout: the one owner of its constants and rules.

``docs/spec/rocketmq-store.md`` is the layout in prose; this module is it in code, for the
decoder (``connectors.rocketmq.codec``) and for the simulator's writer alike: magic codes,
system flags, record sizes (``record_sizes``, RocketMQ's ``calMsgLength``), the end-of-file
rule (``fits_in_file``, ``place_records``), consume-queue entries, file names (and which
topic names can be a folder: ``topic_path_problem``) and the Java string hash of tags codes
and ``HashMap`` order. Every integer on disk is big-endian.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from connectors.rocketmq.arrays import binary_parts

# --- constants (RocketMQ MessageDecoder, CommitLog, ConsumeQueue, MessageSysFlag) ---------------

MAGIC_CODE_V1 = -626843481  # 0xDAA320A7
MAGIC_CODE_V2 = -626843477  # 0xDAA320AB (5.1+: 2-byte topic length)
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194, the end-of-file filler
END_FILE_MIN_BLANK_LENGTH = 8  # a record is placed only when 8 bytes stay free after it

CQ_ENTRY_SIZE = 20
CQ_PAD_SIZE = 0x7FFFFFFF  # size of the (0, 0x7FFFFFFF, 0) entries padding a late queue head

COMPRESSED_FLAG = 0x1
TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_COMMIT_TYPE = 0x8
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20
COMPRESSION_SHIFT = 8
CODEC_NAMES = {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}

# Properties are ``name NAME_VALUE_SEPARATOR value PROPERTY_SEPARATOR ...`` in UTF-8.
NAME_VALUE_SEPARATOR = b"\x01"
PROPERTY_SEPARATOR = b"\x02"
TAGS = "TAGS"  # the property whose Java hash is the consume-queue entry's tags code

# Fixed part of a record (IPv4 hosts, empty body/topic/properties, v1): 91 bytes.
FIXED_V1 = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2
MIN_RECORD_SIZE = FIXED_V1


# --- files -------------------------------------------------------------------------------------


def file_start_offset(name: str) -> int | None:
    """The offset a commit-log or consume-queue file name stands for (20 decimal digits)."""
    base = Path(name).name
    if len(base) != 20 or not base.isdigit():
        return None
    return int(base)


def offset_file_name(offset: int) -> str:
    return f"{offset:020d}"


# The longest name a folder can have on the file systems a store lives on (NAME_MAX), in bytes.
NAME_MAX_BYTES = 255


def topic_path_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be a folder of ``consumequeue/`` (None when it can). A topic
    named by a record (``REAL_TOPIC``) is any text of any length (a v2 record carries a
    two-byte topic length, and 5.x writes names longer than 127 characters): every such
    name is looked for, but one that is not exactly one folder name (empty, ``.``/``..``,
    a path separator, a NUL, too long for a file name) would lead out of the store or
    fail, so it is never joined to a path. The text completes "its name ..."."""
    if topic in ("", ".", ".."):
        return "is empty" if not topic else f"is {topic!r}"
    if "/" in topic or (os.altsep and os.altsep in topic) or os.sep in topic:
        return "holds a path separator"
    if "\x00" in topic:
        return "holds a NUL character"
    try:
        encoded = os.fsencode(topic)
    except UnicodeError:
        return "cannot be encoded as a file name"
    if len(encoded) > NAME_MAX_BYTES:
        return f"is {len(encoded)} bytes long, more than a file name can be ({NAME_MAX_BYTES})"
    return None


def topic_folder(root: Path, topic: str) -> Path:
    """``root/consumequeue/<topic>``; ValueError for a name ``topic_path_problem`` refuses
    (a caller checks names first and reports them)."""
    problem = topic_path_problem(topic)
    if problem is not None:
        raise ValueError(f"topic {topic!r}: its name {problem}; it is no folder of consumequeue/")
    return root / "consumequeue" / topic


# --- consume queue -------------------------------------------------------------------------------

CQ_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])


# --- record sizes and the end-of-file rule -------------------------------------------------------


def record_sizes(
    sys_flag: np.ndarray,
    body_len: np.ndarray,
    topic_len: np.ndarray,
    props_len: np.ndarray,
    magic_version: np.ndarray,
) -> np.ndarray:
    """TOTALSIZE of records with these fields (RocketMQ ``calMsgLength``)."""
    born = np.where(sys_flag & BORNHOST_V6_FLAG, 20, 8)
    store = np.where(sys_flag & STOREHOST_V6_FLAG, 20, 8)
    topic_width = np.where(magic_version == 2, 2, 1)
    return (FIXED_V1 - 1 - 8 - 8) + born + store + topic_width + body_len + topic_len + props_len


def fits_in_file(size: int | np.ndarray, room: int | np.ndarray) -> bool | np.ndarray:
    """RocketMQ's end-of-file rule: a record of ``size`` bytes is placed in a commit-log file
    only when ``size + 8`` bytes are left (``room``); otherwise the rest of the file becomes
    a BLANK filler and the record starts the next file."""
    return size + END_FILE_MIN_BLANK_LENGTH <= room


def place_records(sizes: np.ndarray, position: int, file_size: int) -> tuple[np.ndarray, int]:
    """Commit-log offsets of records of ``sizes`` appended from ``position`` (absolute), by
    the end-of-file rule (``fits_in_file``). Loops once per file.

    Returns (offsets, position after the last record). Raises ValueError when a record
    does not fit even in an empty file."""
    n = len(sizes)
    offsets = np.empty(n, dtype=np.int64)
    done = 0
    while done < n:
        rest = sizes[done:]
        starts = position + np.concatenate(([0], np.cumsum(rest[:-1], dtype=np.int64)))
        file_end = (position // file_size + 1) * file_size
        # Every record before the first misfit lies in the current file (starts are increasing).
        misfit = np.flatnonzero(~fits_in_file(rest, file_end - starts))
        if misfit.size == 0:
            offsets[done:] = starts
            position = int(starts[-1] + rest[-1])
            break
        k = int(misfit[0])
        offsets[done : done + k] = starts[:k]
        done += k
        position = file_end  # BLANK filler up to the end of the file
        if not fits_in_file(int(sizes[done]), file_size):
            raise ValueError(
                f"a record of {int(sizes[done])} bytes does not fit in a commit-log file"
            )
    return offsets, position


# --- Java String.hashCode ------------------------------------------------------------------------


def java_string_hash_one(text: str) -> int:
    """Java ``String.hashCode()`` of one string (int32, over its UTF-16 code units)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def java_string_hash(strings: pa.Array) -> np.ndarray:
    """Java ``String.hashCode()`` of each value (int32; 0 for null or empty), vectorised for
    ASCII values; other values (UTF-16 code units differ from bytes) are hashed one by one."""
    if isinstance(strings, pa.ChunkedArray):
        strings = (
            pa.concat_arrays(strings.chunks) if strings.num_chunks else pa.array([], pa.string())
        )
    n = len(strings)
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out.astype(np.int32)
    filled = strings.fill_null("")
    offsets, data = binary_parts(filled.cast(pa.binary()))
    lengths = np.diff(offsets)
    total = int(offsets[-1] - offsets[0])
    if total:
        seg = data[offsets[0] : offsets[-1]].astype(np.uint64)
        local_end = np.repeat(offsets[1:] - offsets[0], lengths)
        exponent = (local_end - 1 - np.arange(total)).astype(np.int64)
        max_len = int(lengths.max())
        powers = np.ones(max_len, dtype=np.uint64)
        for i in range(1, max_len):
            powers[i] = (powers[i - 1] * np.uint64(31)) & np.uint64(0xFFFFFFFF)
        terms = (seg * powers[exponent]) & np.uint64(0xFFFFFFFF)
        nonempty = lengths > 0
        sums = (
            np.add.reduceat(terms, (offsets[:-1] - offsets[0])[nonempty])
            if nonempty.any()
            else np.zeros(0, np.uint64)
        )
        out[nonempty] = (sums & np.uint64(0xFFFFFFFF)).astype(np.int64)
        non_ascii = np.zeros(n, dtype=bool)
        high = np.flatnonzero(data[offsets[0] : offsets[-1]] >= 0x80)
        if len(high):
            rows = np.searchsorted(offsets[1:] - offsets[0], high, side="right")
            non_ascii[np.unique(rows)] = True
            for row in np.flatnonzero(non_ascii):
                out[row] = java_string_hash_one(filled[int(row)].as_py()) & 0xFFFFFFFF
    out = np.where(out >= (1 << 31), out - (1 << 32), out)
    return out.astype(np.int32)
