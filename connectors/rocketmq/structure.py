"""The structure of commit-log records: walking a file's record chain, gathering every
record's fixed fields and where its variable parts lie, and naming what is wrong with a
position that holds no readable record (``connectors.rocketmq.codec`` decodes on top).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

import numpy as np

from connectors.rocketmq.arrays import be_ints, gather
from connectors.rocketmq.layout import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    MAGIC_CODE_V1,
    MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    STOREHOST_V6_FLAG,
)

# --- commit log: walking and decoding -----------------------------------------------------------

_HEAD = struct.Struct(">ii")


@dataclass
class Walk:
    """Record starts found by following TOTALSIZE from a position, and why the walk ended:
    ``error`` is None for a clean end (BLANK filler, zero tail, end of file)."""

    positions: np.ndarray
    stop: int
    error: str | None


def walk_records(buf: np.ndarray, start: int = 0) -> Walk:
    """Follow the record chain of one commit-log file (sequential by nature: each record's
    size gives the next record's place). Only the first 8 bytes of each record are read; the
    records themselves are decoded later, in bulk."""
    length = len(buf)
    found = array("q")
    append = found.append
    unpack = _HEAD.unpack_from
    view = buf.data if length else b""
    pos = start
    error = None
    while pos + 8 <= length:
        size, magic = unpack(view, pos)
        if magic in (MAGIC_CODE_V1, MAGIC_CODE_V2):
            if size < MIN_RECORD_SIZE or pos + size > length:
                error = f"record size {size} out of bounds ({length - pos} bytes left in the file)"
                break
            append(pos)
            pos += size
            continue
        if magic == BLANK_MAGIC_CODE:
            break
        if size == 0 and magic == 0:
            break
        error = f"bad magic code 0x{magic & 0xFFFFFFFF:08X}"
        break
    else:
        if pos < length and np.any(np.asarray(buf[pos:length]) != 0):
            error = f"truncated record header ({length - pos} bytes left in the file)"
    return Walk(
        np.frombuffer(found, dtype=np.int64).copy() if found else np.zeros(0, np.int64), pos, error
    )


# Status codes of a position.
OK = 0
NOT_A_RECORD = (1, 2, 3, 4)  # the position holds no record start at all
ST_TRUNCATED, ST_BLANK, ST_EMPTY, ST_MAGIC, ST_SIZE, ST_LENGTHS, ST_PHYS, ST_CRC, ST_COMPRESSION = (
    range(1, 10)
)


@dataclass
class Layout:
    """Structure of the records at ``pos``: every fixed field and where the variable parts
    lie. ``status`` is OK or the first structural problem."""

    pos: np.ndarray
    status: np.ndarray
    total: np.ndarray
    magic: np.ndarray
    body_crc: np.ndarray
    queue_id: np.ndarray
    flag: np.ndarray
    queue_offset: np.ndarray
    phys: np.ndarray
    sys_flag: np.ndarray
    born_ts: np.ndarray
    born: np.ndarray  # (n, 20) address bytes + port
    store_ts: np.ndarray
    store: np.ndarray  # (n, 20)
    reconsume: np.ndarray
    prepared: np.ndarray
    body_start: np.ndarray
    body_len: np.ndarray
    topic_start: np.ndarray
    topic_len: np.ndarray
    props_start: np.ndarray
    props_len: np.ndarray
    expected: np.ndarray

    def subset(self, index: np.ndarray) -> Layout:
        return Layout(**{name: getattr(self, name)[index] for name in self.__dataclass_fields__})


def _structure_status(
    pos: np.ndarray,
    length: int,
    total: np.ndarray,
    magic: np.ndarray,
    lengths_ok: np.ndarray,
    phys_in_file: np.ndarray,
) -> np.ndarray:
    """The first structural problem of each record (OK when none), checked in this order:
    header within the file, BLANK filler, zero bytes, magic code, size within the file, the
    variable parts' lengths adding up to the size, the physical offset naming the position."""
    status = np.zeros(len(pos), dtype=np.int8)

    def mark(condition: np.ndarray, code: int) -> None:
        status[(status == OK) & condition] = code

    mark((pos < 0) | (pos + 8 > length), ST_TRUNCATED)
    mark(magic == BLANK_MAGIC_CODE, ST_BLANK)
    mark((total == 0) & (magic == 0), ST_EMPTY)
    mark((magic != MAGIC_CODE_V1) & (magic != MAGIC_CODE_V2), ST_MAGIC)
    mark((total < MIN_RECORD_SIZE) | (pos + total > length), ST_SIZE)
    mark(~lengths_ok, ST_LENGTHS)
    mark(phys_in_file != pos, ST_PHYS)
    return status


def record_layout(buf: np.ndarray, positions: np.ndarray, file_offset: int = 0) -> Layout:
    """Gather the fixed fields of the records starting at ``positions`` in one file and check
    their structure (magic, size within the file, lengths adding up, physical offset)."""
    pos = np.asarray(positions, dtype=np.int64)
    head = gather(buf, pos, 48)
    total = be_ints(head, 0, 4)
    magic = be_ints(head, 4, 4)
    sys_flag = be_ints(head, 36, 4)
    born_len = np.where(sys_flag & BORNHOST_V6_FLAG, 20, 8)
    born = gather(buf, pos + 48, 20)
    born_v4 = born_len == 8
    born[born_v4, 8:20] = 0
    b = pos + 48 + born_len
    block = gather(buf, b, 44)
    store_v6 = (sys_flag & STOREHOST_V6_FLAG) != 0
    store = block[:, 8:28].copy()
    store[~store_v6, 8:20] = 0
    # fields after the store host, for both host widths
    after4 = block[:, 16:44]
    after6 = np.zeros_like(after4)
    after6[:, :16] = block[:, 28:44]
    tail = np.where(store_v6[:, None], after6, after4)
    reconsume = be_ints(tail, 0, 4)
    prepared = be_ints(tail, 4, 8)
    body_len = be_ints(tail, 12, 4)
    body_start = b + np.where(store_v6, 28, 16) + 16
    is_v2 = magic == MAGIC_CODE_V2
    topic_at = body_start + np.maximum(body_len, 0)
    tmat = gather(buf, topic_at, 2)
    topic_len = np.where(is_v2, be_ints(tmat, 0, 2), be_ints(tmat, 0, 1))
    topic_start = topic_at + np.where(is_v2, 2, 1)
    props_at = topic_start + np.maximum(topic_len, 0)
    props_len = be_ints(gather(buf, props_at, 2), 0, 2)
    props_start = props_at + 2
    expected = props_start + np.maximum(props_len, 0) - pos

    phys = be_ints(head, 28, 8)
    lengths_ok = (body_len >= 0) & (topic_len >= 0) & (props_len >= 0) & (expected == total)
    return Layout(
        pos=pos,
        status=_structure_status(pos, len(buf), total, magic, lengths_ok, phys - file_offset),
        total=total,
        magic=magic,
        body_crc=be_ints(head, 8, 4),
        queue_id=be_ints(head, 12, 4),
        flag=be_ints(head, 16, 4),
        queue_offset=be_ints(head, 20, 8),
        phys=phys,
        sys_flag=sys_flag,
        born_ts=be_ints(head, 40, 8),
        born=born,
        store_ts=be_ints(block, 0, 8),
        store=store,
        reconsume=reconsume,
        prepared=prepared,
        body_start=body_start,
        body_len=body_len,
        topic_start=topic_start,
        topic_len=topic_len,
        props_start=props_start,
        props_len=props_len,
        expected=expected,
    )


def topic_matches(buf: np.ndarray, layout: Layout, topic: str) -> np.ndarray:
    """Mask of records (structurally OK) whose topic is exactly ``topic``."""
    wanted = np.frombuffer(topic.encode("utf-8"), dtype=np.uint8)
    mask = (layout.status == OK) & (layout.topic_len == len(wanted))
    if mask.any() and len(wanted):
        idx = np.flatnonzero(mask)
        mat = gather(buf, layout.topic_start[idx], len(wanted))
        mask[idx] = np.all(mat == wanted[None, :], axis=1)
    return mask


def _reason(
    layout: Layout, i: int, code: int, buf_len: int, file_offset: int, extra: str = ""
) -> str:
    total = int(layout.total[i])
    pos = int(layout.pos[i])
    if code == ST_TRUNCATED:
        return "truncated record header (fewer than 8 bytes in the file)"
    if code == ST_BLANK:
        return "BLANK end-of-file filler, not a message"
    if code == ST_EMPTY:
        return "no record (zero bytes)"
    if code == ST_MAGIC:
        return f"bad magic code 0x{int(layout.magic[i]) & 0xFFFFFFFF:08X}"
    if code == ST_SIZE:
        return f"record size {total} out of bounds ({buf_len - pos} bytes left in the file, minimum {MIN_RECORD_SIZE})"
    if code == ST_LENGTHS:
        return (
            f"inconsistent record lengths: total size {total}, fields add up to {int(layout.expected[i])} "
            f"(body {int(layout.body_len[i])}, topic {int(layout.topic_len[i])}, properties {int(layout.props_len[i])})"
        )
    if code == ST_PHYS:
        return f"physical offset field {int(layout.phys[i])} does not match the record's place {file_offset + pos}"
    return extra
