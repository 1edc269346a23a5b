"""Vectorised decoding of RocketMQ commit-log records and consume-queue entries.

Pure numpy / pyarrow, no Spark (``docs/store-reader.md`` explains the design). The byte
layout is ``docs/spec/rocketmq-store.md``, owned in code by ``connectors.rocketmq.layout``;
encoding (the simulator's writer) is ``simulator.encoding``.

Decoding works on a whole file as a ``uint8`` array (``np.memmap(mode="r")``) and an array
of record positions: the fixed-offset fields of all records are gathered at once with fancy
indexing, the variable-length parts (topic, properties, body) are cut out of the file with
Arrow *binary views* (zero-copy slices of the mapped file, materialised by one C++ cast) and
the properties are split with numpy searches over the separator bytes. The only per-record
Python calls are those with no vectorised equivalent, and only on the records that need
them: ``zlib.crc32`` when CRC checking is asked for, decompression of compressed bodies,
formatting of IPv6 hosts (once per distinct host) and the description of a bad record.

Decoding never raises on arbitrary bytes: a position that does not hold a readable record is
reported in ``DecodeResult.bad`` with a reason.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.rocketmq.arrays import be_ints, binary_parts, gather, slices, to_be_bytes
from connectors.rocketmq.layout import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    CODEC_NAMES,
    COMPRESSED_FLAG,
    COMPRESSION_SHIFT,
    CQ_DTYPE,
    CQ_ENTRY_SIZE,
    MAGIC_CODE_V1,
    MAGIC_CODE_V2,
    MIN_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    STOREHOST_V6_FLAG,
    TAGS,
)

# Re-exported: the store reader reads these as ``codec.X`` (issue 12 owns reader.py and can
# import them from ``layout`` directly when it next changes).
from connectors.rocketmq.layout import CQ_PAD_SIZE as CQ_PAD_SIZE
from connectors.rocketmq.layout import TRANSACTION_COMMIT_TYPE as TRANSACTION_COMMIT_TYPE
from connectors.rocketmq.layout import TRANSACTION_MASK as TRANSACTION_MASK
from connectors.rocketmq.layout import TRANSACTION_NOT_TYPE as TRANSACTION_NOT_TYPE
from connectors.rocketmq.layout import file_start_offset as file_start_offset

# Largest body accepted after decompression (a guard against corrupt input; RocketMQ's own
# limit for a stored message is 4 MiB by default).
MAX_DECOMPRESSED_BODY = 256 << 20

_INT32_LIMIT = (1 << 31) - 1


# --- files -------------------------------------------------------------------------------------


def open_read_only(path: str | os.PathLike[str]) -> np.ndarray:
    """The file's bytes as a read-only ``uint8`` array (memory-mapped; empty files give an
    empty array). The file is opened ``O_RDONLY``: nothing can be written through it."""
    size = os.stat(path).st_size
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def _as_utf8(binary: pa.Array) -> pa.Array:
    """Binary -> string. Invalid UTF-8 is replaced with U+FFFD per value (what Java's
    ``new String(bytes, UTF_8)`` does); only values that fail take the slow path."""
    try:
        return binary.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowException):
        values = [
            None if v is None else v.decode("utf-8", errors="replace") for v in binary.to_pylist()
        ]
        return pa.array(values, type=pa.string())


# --- hosts -------------------------------------------------------------------------------------


def format_hosts(addr: np.ndarray, port: np.ndarray, is_v6: np.ndarray) -> pa.Array:
    """``ip:port`` strings (IPv6 as ``[compressed]:port``) from (n, 16) address bytes (IPv4 in
    the first 4), int ports and a v6 mask. Formatted once per distinct host."""
    n = len(port)
    if n == 0:
        return pa.array([], type=pa.string())
    packed = np.zeros((n, 21), dtype=np.uint8)
    packed[:, :16] = addr[:, :16]
    packed[~is_v6, 4:16] = 0
    packed[:, 16:20] = to_be_bytes(port, 4)
    packed[:, 20] = is_v6
    keys = pa.Array.from_buffers(
        pa.binary(21), n, [None, pa.py_buffer(np.ascontiguousarray(packed))]
    )
    encoded = pc.dictionary_encode(keys)  # hash-based: one pass, no sort
    texts = []
    for key in encoded.dictionary.to_pylist():
        raw = bytes(key)
        port_value = struct.unpack(">i", raw[16:20])[0]
        if raw[20]:
            texts.append(f"[{ipaddress.IPv6Address(raw[:16]).compressed}]:{port_value}")
        else:
            texts.append(f"{raw[0]}.{raw[1]}.{raw[2]}.{raw[3]}:{port_value}")
    inverse = encoded.indices
    return pa.array(texts, type=pa.string()).take(inverse)


# --- properties ----------------------------------------------------------------------------------


@dataclass
class _Entries:
    """The kept ``name\\x01value`` segments of a batch of property strings, in record order:
    positions in ``region`` (the batch's bytes) and the record of each."""

    region: np.ndarray
    rec: np.ndarray
    key_start: np.ndarray
    key_len: np.ndarray
    val_start: np.ndarray
    val_len: np.ndarray

    def subset(self, keep: np.ndarray) -> _Entries:
        return _Entries(
            self.region,
            self.rec[keep],
            self.key_start[keep],
            self.key_len[keep],
            self.val_start[keep],
            self.val_len[keep],
        )

    def keys(self) -> pa.BinaryArray:
        return slices(self.region, self.key_start, self.key_len)

    def values(self) -> pa.BinaryArray:
        return slices(self.region, self.val_start, self.val_len)


def _split_entries(props: pa.BinaryArray) -> _Entries:
    """Split every value on 0x02 and keep the segments with a non-empty name before their
    first 0x01 and a non-empty value after it."""
    props = props.fill_null(b"")
    if props.type != pa.binary():
        props = props.cast(pa.binary())
    parts = pc.split_pattern(props, pattern=PROPERTY_SEPARATOR)
    segments = pc.list_flatten(parts)
    seg_rec = pc.list_parent_indices(parts).to_numpy(zero_copy_only=False).astype(np.int64)
    seg_off, region = binary_parts(segments)
    seg_len = np.diff(seg_off)
    first = (
        pc.find_substring(segments, pattern=NAME_VALUE_SEPARATOR)
        .to_numpy(zero_copy_only=False)
        .astype(np.int64)
    )
    keep = (first > 0) & (first < seg_len - 1)
    key_start = seg_off[:-1][keep]
    key_len = first[keep]
    return _Entries(
        region=region,
        rec=seg_rec[keep],
        key_start=key_start,
        key_len=key_len,
        val_start=key_start + key_len + 1,
        val_len=seg_len[keep] - key_len - 1,
    )


def _earlier_duplicates(rec: np.ndarray, codes: np.ndarray, n: int, n_names: int) -> np.ndarray:
    """Indices of the entries whose name comes again later in the same record (Java's
    HashMap keeps the last). Flagged cheaply per record (a 64-bit set of hashed names,
    popcount < count), resolved exactly only for flagged records."""
    counts = np.bincount(rec, minlength=n)
    bits = np.left_shift(np.uint64(1), (codes % 64).astype(np.uint64))
    starts_nonempty = np.flatnonzero(counts)
    seg_offsets = np.concatenate([[0], np.cumsum(counts)])
    masks = np.zeros(n, dtype=np.uint64)
    masks[starts_nonempty] = np.bitwise_or.reduceat(bits, seg_offsets[:-1][starts_nonempty])
    suspects = np.bitwise_count(masks) < counts
    if not suspects.any():
        return np.zeros(0, dtype=np.int64)
    cand = np.flatnonzero(suspects[rec])
    combo = rec[cand] * (n_names + 1) + codes[cand]
    order = np.argsort(combo, kind="stable")
    sorted_combo = combo[order]
    earlier = np.zeros(len(cand), dtype=bool)
    earlier[order[:-1][sorted_combo[:-1] == sorted_combo[1:]]] = True
    return cand[earlier]


def _property_map(n: int, rec: np.ndarray, keys: pa.BinaryArray, values: pa.Array) -> pa.MapArray:
    """The map<string,string> per record from its entries (in record order)."""
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rec, minlength=n), out=map_offsets[1:])
    return pa.MapArray.from_arrays(pa.array(map_offsets), _as_utf8(keys), values)


def decode_properties(
    props: pa.BinaryArray, names: Sequence[str] | None = None
) -> tuple[pa.MapArray | dict[str, pa.Array], pa.Array]:
    """Parse ``name\\x01value\\x02…`` per value (spec §2, RocketMQ ``string2messageProperties``):
    split on 0x02, drop segments without a 0x01 after a non-empty name or with an empty value,
    value = everything after the first 0x01. A name given twice: the last one wins (as in
    Java's HashMap). Returns the map<string,string> array (or, with ``names``, a string
    array per name: its value or null) and the ``TAGS`` value (or null)."""
    n = len(props)
    if n == 0:
        empty = pa.array([], type=pa.string())
        none = pa.array([], type=pa.map_(pa.string(), pa.string()))
        return ({name: empty for name in names} if names is not None else none), empty
    entries = _split_entries(props)
    keys = entries.keys()
    codes = np.zeros(0, dtype=np.int64)
    code_of: dict[bytes, int] = {}
    if len(keys):
        encoded = pc.dictionary_encode(keys)
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        names_found = encoded.dictionary.to_pylist()
        drop = _earlier_duplicates(entries.rec, codes, n, len(names_found))
        if len(drop):
            keep = np.ones(len(entries.rec), dtype=bool)
            keep[drop] = False
            entries, codes = entries.subset(keep), codes[keep]
            keys = entries.keys()
        code_of = {name: i for i, name in enumerate(names_found)}
    val_str = _as_utf8(entries.values())

    def value_of(name: str) -> pa.Array:
        """Each record's value of ``name`` (names are unique per record by now), or null."""
        index = np.full(n, -1, dtype=np.int64)
        code = code_of.get(name.encode())
        if code is not None:
            where = np.flatnonzero(codes == code)
            index[entries.rec[where]] = where
        return val_str.take(pa.array(index, mask=index < 0))

    tags = value_of(TAGS)
    if names is not None:
        return {name: value_of(name) for name in names}, tags
    return _property_map(n, entries.rec, keys, val_str), tags


# --- consume queue -------------------------------------------------------------------------------


def decode_cq_entries(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(commit-log offset int64, size int64, tags code int64) of the whole 20-byte entries in
    ``raw`` (a trailing partial entry is ignored: see ``len(raw) % 20``)."""
    count = len(raw) // CQ_ENTRY_SIZE
    entries = np.frombuffer(
        np.ascontiguousarray(raw[: count * CQ_ENTRY_SIZE]).tobytes(), dtype=CQ_DTYPE
    )
    return (
        entries["offset"].astype(np.int64),
        entries["size"].astype(np.int64),
        entries["tags"].astype(np.int64),
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
    view = memoryview(buf) if length else b""
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


def decompress_body(data: bytes, sys_flag: int) -> bytes:
    """Decompress a body per the sysflag codec (0/3 zlib, 1 LZ4 frame, 2 zstd frame: what
    RocketMQ's ``ZlibCompressor``, ``Lz4Compressor`` (lz4-java ``LZ4FrameOutputStream``) and
    ``ZstdCompressor`` (zstd-jni ``ZstdOutputStream``) write). Raises ValueError."""
    codec = (sys_flag >> COMPRESSION_SHIFT) & 0x7
    try:
        if codec in (0, 3):
            inflater = zlib.decompressobj()
            out = inflater.decompress(data, MAX_DECOMPRESSED_BODY)
            if inflater.unconsumed_tail:
                raise ValueError(f"body larger than {MAX_DECOMPRESSED_BODY} bytes")
            if not inflater.eof:
                raise ValueError("incomplete zlib stream")
            return out
        if codec == 1:
            import lz4.frame

            decompressor = lz4.frame.LZ4FrameDecompressor()
            out = decompressor.decompress(data, max_length=MAX_DECOMPRESSED_BODY)
            if not decompressor.eof:
                raise ValueError("incomplete LZ4 frame or body too large")
            return out
        if codec == 2:
            import zstandard

            dobj = zstandard.ZstdDecompressor().decompressobj()
            out = dobj.decompress(data)
            if not dobj.eof:
                raise ValueError("incomplete zstd frame")
            return out
    except ValueError:
        raise
    except Exception as exc:  # zlib.error, RuntimeError (lz4), ZstdError, MemoryError...
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    raise ValueError(f"unknown compression codec {codec}")


RECORD_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("commitlog_offset", pa.int64()),
        ("stored_size", pa.int32()),
        ("sys_flag", pa.int32()),
        ("body_crc", pa.int32()),
        ("flag", pa.int32()),
        ("born_timestamp_ms", pa.int64()),
        ("born_host", pa.string()),
        ("store_timestamp_ms", pa.int64()),
        ("store_host", pa.string()),
        ("reconsume_times", pa.int32()),
        ("prepared_transaction_offset", pa.int64()),
        ("tags", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
        ("magic_version", pa.int32()),
        ("position", pa.int64()),
    ]
)


def lean_record_schema(property_columns: Mapping[str, str], drop: Iterable[str] = ()) -> pa.Schema:
    """``RECORD_SCHEMA`` with string columns for the given properties instead of the map,
    without the ``drop`` columns."""
    unwanted = {"properties", *drop}
    fields = [f for f in RECORD_SCHEMA if f.name not in unwanted]
    return pa.schema(
        fields + [pa.field(column, pa.string()) for column in property_columns.values()]
    )


@dataclass
class Bad:
    """A position that did not decode. ``no_record``: nothing that looks like a record
    starts there (bad magic, BLANK, zeros, truncated), as opposed to a damaged record.
    topic/queue_id/queue_offset are set when the record's header is trustworthy."""

    index: int
    position: int
    reason: str
    no_record: bool
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None


@dataclass
class DecodeResult:
    records: pa.Table  # RECORD_SCHEMA, one row per decoded record
    index: np.ndarray  # for each row, its index in the input positions
    bad: list[Bad] = field(default_factory=list)


def _mark_crc_mismatches(
    buf: np.ndarray, lo: Layout, ok: np.ndarray, status: np.ndarray, extra: dict[int, str]
) -> None:
    """Mark (in ``status``, reason in ``extra``) the records whose body as stored does not
    match its CRC (RocketMQ checks it only for a non-empty body)."""
    view = memoryview(buf) if len(buf) else b""
    for j in np.flatnonzero(lo.body_len > 0):
        s = int(lo.body_start[j])
        crc = zlib.crc32(view[s : s + int(lo.body_len[j])]) & 0x7FFFFFFF
        if crc != int(lo.body_crc[j]):
            status[ok[j]] = ST_CRC
            extra[int(ok[j])] = f"body CRC mismatch: stored {int(lo.body_crc[j])}, computed {crc}"


def _decompress_bodies(
    buf: np.ndarray, lo: Layout, ok: np.ndarray, status: np.ndarray, extra: dict[int, str]
) -> dict[int, bytes]:
    """The decompressed body of each compressed record (by its index in ``lo``); a body that
    does not decompress marks its record bad (in ``status``, reason in ``extra``)."""
    compressed = np.flatnonzero(
        ((lo.sys_flag & COMPRESSED_FLAG) != 0) & (lo.body_len > 0) & (status[ok] == OK)
    )
    replacement: dict[int, bytes] = {}
    view = memoryview(buf)
    for j in compressed:
        s = int(lo.body_start[j])
        try:
            replacement[int(j)] = decompress_body(
                bytes(view[s : s + int(lo.body_len[j])]), int(lo.sys_flag[j])
            )
        except ValueError as exc:
            codec = CODEC_NAMES.get((int(lo.sys_flag[j]) >> COMPRESSION_SHIFT) & 7, "unknown codec")
            status[ok[j]] = ST_COMPRESSION
            extra[int(ok[j])] = f"cannot decompress body ({codec}): {exc}"
    return replacement


def _wanted_bodies(topics: pa.Array, body_topics: Iterable[str] | None) -> np.ndarray:
    """Mask of the records whose body is returned: every one, or those of ``body_topics``."""
    if body_topics is None:
        return np.ones(len(topics), dtype=bool)
    if not len(topics):
        return np.zeros(0, bool)
    want_topics = pa.array(sorted(set(body_topics)), type=pa.string())
    return pc.is_in(topics, value_set=want_topics).to_numpy(zero_copy_only=False).astype(bool)


def _bodies(
    buf: np.ndarray, lo: Layout, want: np.ndarray, replacement: dict[int, bytes]
) -> pa.Array:
    """The wanted bodies (slices of the file, compressed ones replaced by their decompressed
    bytes); null where not wanted."""
    n = len(want)
    bodies = slices(buf, lo.body_start, np.where(want, lo.body_len, 0))
    keys = [j for j in replacement if want[j]]
    if keys:
        extra_arr = pa.array([replacement[j] for j in keys], type=pa.binary())
        take = np.arange(n, dtype=np.int64)
        take[keys] = n + np.arange(len(keys))
        bodies = pa.concat_arrays([bodies, extra_arr]).take(pa.array(take))
    return pc.if_else(pa.array(want), bodies, pa.scalar(None, pa.binary())) if n else bodies


def _hosts(address: np.ndarray, is_v6: np.ndarray) -> pa.Array:
    """``ip:port`` strings of (n, 20) host fields (IPv4: 4 address bytes then the port;
    IPv6: 16 then the port)."""
    if not len(address):
        return format_hosts(address, np.zeros(0, np.int64), is_v6)
    port = np.where(is_v6, be_ints(address, 16, 4), be_ints(address, 4, 4))
    return format_hosts(address, port, is_v6)


def _record_table(
    lo: Layout,
    file_offset: int,
    columns: dict[str, pa.Array],
    property_columns: Mapping[str, str] | None,
    drop_columns: Iterable[str],
) -> pa.Table:
    """The decoded records as a table of ``RECORD_SCHEMA`` (or its lean variant with one
    string column per wanted property); ``columns`` holds topic, tags, properties, body."""
    props = columns["properties"]
    lean = property_columns is not None
    return pa.table(
        {
            "topic": columns["topic"],
            "queue_id": pa.array(lo.queue_id.astype(np.int32)),
            "queue_offset": pa.array(lo.queue_offset),
            "commitlog_offset": pa.array(lo.pos + file_offset),
            "stored_size": pa.array(lo.total.astype(np.int32)),
            "sys_flag": pa.array(lo.sys_flag.astype(np.int32)),
            "body_crc": pa.array(lo.body_crc.astype(np.int32)),
            "flag": pa.array(lo.flag.astype(np.int32)),
            "born_timestamp_ms": pa.array(lo.born_ts),
            "born_host": _hosts(lo.born, (lo.sys_flag & BORNHOST_V6_FLAG) != 0),
            "store_timestamp_ms": pa.array(lo.store_ts),
            "store_host": _hosts(lo.store, (lo.sys_flag & STOREHOST_V6_FLAG) != 0),
            "reconsume_times": pa.array(lo.reconsume.astype(np.int32)),
            "prepared_transaction_offset": pa.array(lo.prepared),
            "tags": columns["tags"],
            **({} if lean else {"properties": props}),
            "body": columns["body"],
            "magic_version": pa.array(np.where(lo.magic == MAGIC_CODE_V2, 2, 1).astype(np.int32)),
            "position": pa.array(lo.pos),
            **({column: props[name] for name, column in property_columns.items()} if lean else {}),
        },
        schema=lean_record_schema(property_columns, drop_columns) if lean else RECORD_SCHEMA,
    )


def _bad_records(
    layout: Layout,
    status: np.ndarray,
    ok: np.ndarray,
    topics: pa.Array,
    buf_len: int,
    file_offset: int,
    extra: dict[int, str],
) -> list[Bad]:
    """One ``Bad`` per position whose status is not OK. Records whose structure was sound
    (a CRC mismatch, a body that does not decompress) name their topic and queue."""
    bad: list[Bad] = []
    for i in np.flatnonzero(status != OK):
        code = int(status[i])
        trusted = code in (ST_CRC, ST_COMPRESSION)
        topic = qid = qoff = None
        if trusted:
            j = int(np.searchsorted(ok, i))
            topic = topics[j].as_py()
            qid = int(layout.queue_id[i])
            qoff = int(layout.queue_offset[i])
        bad.append(
            Bad(
                index=int(i),
                position=int(layout.pos[i]),
                reason=_reason(layout, int(i), code, buf_len, file_offset, extra.get(int(i), "")),
                no_record=code in NOT_A_RECORD,
                topic=topic,
                queue_id=qid,
                queue_offset=qoff,
            )
        )
    return bad


def decode_records(
    buf: np.ndarray,
    positions: np.ndarray | Sequence[int],
    *,
    file_offset: int = 0,
    verify_crc: bool = False,
    body_topics: Iterable[str] | None = None,
    layout: Layout | None = None,
    property_columns: Mapping[str, str] | None = None,
    drop_columns: Iterable[str] = (),
) -> DecodeResult:
    """Decode the records starting at ``positions`` of one commit-log file.

    ``file_offset``: the file's first physical offset (its name). ``body_topics``: topics
    whose bodies are returned (decompressed); None returns every body. Compressed bodies are
    always decompressed (a body that does not decompress makes the record bad whether or not
    the body is returned). ``property_columns`` (property name -> column name): return
    those properties as string columns (after ``position``) instead of the ``properties``
    map, and leave out ``drop_columns``. Never raises on arbitrary bytes."""
    positions = np.asarray(positions, dtype=np.int64)
    if layout is None:
        layout = record_layout(buf, positions, file_offset)
    status = layout.status.copy()
    ok = np.flatnonzero(status == OK)
    lo = layout.subset(ok)
    topics = _as_utf8(slices(buf, lo.topic_start, lo.topic_len))
    extra: dict[int, str] = {}
    if verify_crc and len(ok):
        _mark_crc_mismatches(buf, lo, ok, status, extra)
    replacement = _decompress_bodies(buf, lo, ok, status, extra)
    bodies = _bodies(buf, lo, _wanted_bodies(topics, body_topics), replacement)
    names = list(property_columns) if property_columns is not None else None
    props, tags = decode_properties(slices(buf, lo.props_start, lo.props_len), names)
    columns = {"topic": topics, "tags": tags, "properties": props, "body": bodies}
    table = _record_table(lo, file_offset, columns, property_columns, drop_columns)
    final_ok = status[ok] == OK
    if not final_ok.all():
        table = table.filter(pa.array(final_ok))
    bad = _bad_records(layout, status, ok, topics, len(buf), file_offset, extra)
    return DecodeResult(records=table, index=ok[final_ok], bad=bad)


def raw_hex(buf: np.ndarray, position: int, limit: int = 64) -> str:
    """Hex of at most ``limit`` bytes from ``position`` (empty outside the buffer)."""
    if position < 0 or position >= len(buf):
        return ""
    return bytes(np.asarray(buf[position : position + limit])).hex().upper()
