"""Vectorised decoding and encoding of RocketMQ commit-log records and consume-queue entries.

Pure numpy / pyarrow, no Spark (``docs/store-reader.md`` explains the design). The byte
layout is ``docs/spec/rocketmq-store.md``: every integer is big-endian.

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
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# --- constants (RocketMQ MessageDecoder, CommitLog, ConsumeQueue, MessageSysFlag) ---------------

MAGIC_CODE_V1 = -626843481  # 0xDAA320A7
MAGIC_CODE_V2 = -626843477  # 0xDAA320AB (5.1+: 2-byte topic length)
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194, the end-of-file filler
END_FILE_MIN_BLANK_LENGTH = 8  # a record is placed only when 8 bytes stay free after it

CQ_ENTRY_SIZE = 20
CQ_PAD_SIZE = 0x7FFFFFFF  # size of the (0, 0x7FFFFFFF, 0) entries padding a late queue head

COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20
COMPRESSION_SHIFT = 8
COMPRESSION_MASK = 0x7 << COMPRESSION_SHIFT
CODEC_NAMES = {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}

NAME_VALUE_SEPARATOR = 1
PROPERTY_SEPARATOR = 2
TAGS = "TAGS"

# Fixed part of a record (IPv4 hosts, empty body/topic/properties, v1): 91 bytes.
_FIXED_V1 = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2
MIN_RECORD_SIZE = _FIXED_V1

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


def file_start_offset(name: str) -> int | None:
    """The offset a commit-log or consume-queue file name stands for (20 decimal digits)."""
    base = Path(name).name
    if len(base) != 20 or not base.isdigit():
        return None
    return int(base)


def offset_file_name(offset: int) -> str:
    return f"{offset:020d}"


# --- small vectorised helpers --------------------------------------------------------------------


def _gather(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """``buf[pos[i] : pos[i] + width]`` for every i as an (n, width) matrix; bytes outside
    the buffer read as 0. Rows are copied from a sliding-window view (one fancy index on the
    first axis); only rows running past either end of the buffer take the slower path."""
    n = len(pos)
    out = np.zeros((n, width), dtype=np.uint8)
    length = len(buf)
    if n == 0 or length == 0:
        return out
    pos = np.asarray(pos, dtype=np.int64)
    if length >= width:
        window = np.lib.stride_tricks.sliding_window_view(buf, width)
        full = (pos >= 0) & (pos <= length - width)
        if full.all():
            return np.asarray(window[pos])
        out[full] = window[pos[full]]
        partial = np.flatnonzero(~full & (pos < length) & (pos > -width))
    else:
        partial = np.flatnonzero((pos < length) & (pos > -width))
    if len(partial):
        idx = pos[partial][:, None] + np.arange(width, dtype=np.int64)
        inside = (idx >= 0) & (idx < length)
        np.clip(idx, 0, length - 1, out=idx)
        values = np.asarray(buf[idx])
        values[~inside] = 0
        out[partial] = values
    return out


_BE_TYPES = {1: np.dtype("i1"), 2: np.dtype(">i2"), 4: np.dtype(">i4"), 8: np.dtype(">i8")}


def _be(mat: np.ndarray, start: int, width: int) -> np.ndarray:
    """Signed big-endian integers from columns ``[start, start+width)`` of a byte matrix, as
    native int64."""
    col = np.ascontiguousarray(mat[:, start : start + width])
    return col.view(_BE_TYPES[width]).reshape(-1).astype(np.int64)


def _to_be_bytes(values: np.ndarray, width: int) -> np.ndarray:
    """(n, width) big-endian bytes of integer values (two's complement, truncated)."""
    dtype = {1: np.dtype("u1"), 2: np.dtype(">u2"), 4: np.dtype(">u4"), 8: np.dtype(">u8")}[width]
    wrapped = np.asarray(values, dtype=np.int64).view(np.uint64)
    if width < 8:
        wrapped = wrapped & np.uint64((1 << (8 * width)) - 1)
    return np.ascontiguousarray(wrapped.astype(dtype)).view(np.uint8).reshape(-1, width)


def slices(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    """A binary array of ``buf[starts[i] : starts[i] + lengths[i]]`` (all within ``buf``).

    No numpy index of every byte is built. Disjoint slices (the usual case: fields of
    distinct records, or parts of one region) become the even pieces of a binary array whose
    offsets cut the buffer at every slice boundary (zero copy), taken in C++. Overlapping
    slices go through an Arrow binary-*view* array over the buffer, cast to binary."""
    n = len(starts)
    if n == 0:
        return pa.array([], type=pa.binary())
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(buf) == 0:
        return pa.array([b""] * n, type=pa.binary())
    ends = starts + lengths
    rank = None
    s, e = starts, ends
    if n > 1 and not np.all(starts[1:] >= ends[:-1]):
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
        if not np.all(s[1:] >= e[:-1]):
            return _slices_by_view(buf, starts, lengths)
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
    bounds = np.empty(2 * n + 1, dtype=np.int64)
    bounds[0 : 2 * n : 2] = s
    bounds[1 : 2 * n : 2] = e
    bounds[2 * n] = e[-1]
    large = bounds[-1] > _INT32_LIMIT
    pieces = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        2 * n,
        [None, pa.py_buffer(bounds if large else bounds.astype(np.int32)), pa.py_buffer(buf)],
    )
    take = 2 * (np.arange(n, dtype=np.int64) if rank is None else rank)
    out = pieces.take(pa.array(take))
    return out.cast(pa.binary()) if large else out


def _slices_by_view(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    n = len(starts)
    window = 1 << 30
    views = np.empty((n, 16), dtype=np.uint8)
    views[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
    head = _gather(buf, starts, 12)
    head[np.arange(12)[None, :] >= lengths[:, None]] = 0
    views[:, 4:16] = head  # inline data (<= 12 bytes) or, for longer values, the prefix
    long_rows = np.flatnonzero(lengths > 12)
    if len(long_rows):
        long_starts = starts[long_rows]
        buffer_index = long_starts // window
        tail = np.empty((len(long_rows), 2), dtype="<i4")
        tail[:, 0] = buffer_index
        tail[:, 1] = long_starts - buffer_index * window
        views[long_rows, 8:16] = tail.view(np.uint8).reshape(-1, 8)
    # Overlapping windows of (2 GiB - 1) every 1 GiB: any slice shorter than 1 GiB lies
    # within the window its start falls in, and view offsets stay int32.
    data_buffers = []
    for w in range(max(1, (len(buf) + window - 1) // window)):
        data_buffers.append(pa.py_buffer(buf[w * window : w * window + _INT32_LIMIT]))
    array = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), *data_buffers])
    return array.cast(pa.binary())


def _binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets as int64 of length n+1, data bytes) of a binary/string array without nulls."""
    if isinstance(array, pa.ChunkedArray):
        array = pa.concat_arrays(array.chunks) if array.num_chunks != 1 else array.chunk(0)
    if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type):
        off_dtype = np.int64
    else:
        off_dtype = np.int32
    buffers = array.buffers()
    n = len(array)
    offsets = np.frombuffer(
        buffers[1], dtype=off_dtype, count=n + 1, offset=array.offset * np.dtype(off_dtype).itemsize
    ).astype(np.int64)
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    return offsets, data


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


# --- Java String.hashCode ------------------------------------------------------------------------


def _java_hash_py(text: str) -> int:
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
    offsets, data = _binary_parts(filled.cast(pa.binary()))
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
                out[row] = _java_hash_py(filled[int(row)].as_py()) & 0xFFFFFFFF
    out = np.where(out >= (1 << 31), out - (1 << 32), out)
    return out.astype(np.int32)


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
    packed[:, 16:20] = _to_be_bytes(port, 4)
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


def _parse_host(text: str | None) -> tuple[bytes, int, bool]:
    if text is None or text == "":
        return b"\x00" * 4, 0, False
    text = text.strip()
    if text.startswith("["):
        addr, _, port = text[1:].partition("]:")
        return ipaddress.IPv6Address(addr).packed, int(port), True
    addr, _, port = text.rpartition(":")
    if not addr:
        raise ValueError(f"host {text!r} is not ip:port")
    ip = ipaddress.ip_address(addr)
    return ip.packed, int(port), ip.version == 6


def parse_hosts(hosts: pa.Array | None, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, 16) address bytes, int32 ports and v6 mask from ``ip:port`` / ``[v6]:port`` strings
    (null -> 0.0.0.0:0). Parsed once per distinct value."""
    addr = np.zeros((n, 16), dtype=np.uint8)
    port = np.zeros(n, dtype=np.int64)
    v6 = np.zeros(n, dtype=bool)
    if hosts is None or n == 0:
        return addr, port, v6
    encoded = pc.dictionary_encode(hosts.cast(pa.string()) if hosts.type != pa.string() else hosts)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    dictionary = encoded.dictionary.to_pylist()
    indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    table_addr = np.zeros((len(dictionary) + 1, 16), dtype=np.uint8)
    table_port = np.zeros(len(dictionary) + 1, dtype=np.int64)
    table_v6 = np.zeros(len(dictionary) + 1, dtype=bool)
    for i, text in enumerate(dictionary):
        raw, p, is6 = _parse_host(text)
        table_addr[i, : len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        table_port[i] = p
        table_v6[i] = is6
    return table_addr[indices], table_port[indices], table_v6[indices]


# --- properties ----------------------------------------------------------------------------------


def decode_properties(
    props: pa.BinaryArray, names: Sequence[str] | None = None
) -> tuple[pa.MapArray | dict[str, pa.Array], pa.Array]:
    """Parse ``name\\x01value\\x02…`` per value (spec §2, RocketMQ ``string2messageProperties``):
    split on 0x02, drop segments without a 0x01 after a non-empty name or with an empty value,
    value = everything after the first 0x01. A name given twice: the last one wins (as in
    Java's HashMap). Returns the map<string,string> array (or, with ``names``, a string
    array per name: its value or null) and the ``TAGS`` value (or null)."""
    n = len(props)
    map_type = pa.map_(pa.string(), pa.string())
    if n == 0:
        empty = pa.array([], type=pa.string())
        return (
            {name: empty for name in names} if names is not None else pa.array([], type=map_type)
        ), empty
    props = props.fill_null(b"")
    if props.type != pa.binary():
        props = props.cast(pa.binary())
    parts = pc.split_pattern(props, pattern=b"\x02")
    segments = pc.list_flatten(parts)
    seg_rec = pc.list_parent_indices(parts).to_numpy(zero_copy_only=False).astype(np.int64)
    seg_off, region = _binary_parts(segments)
    seg_len = np.diff(seg_off)
    first = (
        pc.find_substring(segments, pattern=b"\x01").to_numpy(zero_copy_only=False).astype(np.int64)
    )
    # A kept segment has a non-empty name before its first 0x01 and a non-empty value after.
    keep = (first > 0) & (first < seg_len - 1)
    seg_rec = seg_rec[keep]
    key_start = seg_off[:-1][keep]
    key_len = first[keep]
    val_start = key_start + key_len + 1
    val_len = seg_len[keep] - key_len - 1
    keys = slices(region, key_start, key_len)
    # Duplicate names within a value: flagged cheaply per record (a 64-bit set of hashed
    # names, popcount < count), resolved exactly only for flagged records.
    if len(keys):
        encoded = pc.dictionary_encode(keys)
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        dictionary = encoded.dictionary
        counts = np.bincount(seg_rec, minlength=n)
        bits = np.left_shift(np.uint64(1), (codes % 64).astype(np.uint64))
        starts_nonempty = np.flatnonzero(counts)
        seg_offsets = np.concatenate([[0], np.cumsum(counts)])
        masks = np.zeros(n, dtype=np.uint64)
        masks[starts_nonempty] = np.bitwise_or.reduceat(bits, seg_offsets[:-1][starts_nonempty])
        suspects = np.bitwise_count(masks) < counts
        if suspects.any():
            cand = np.flatnonzero(suspects[seg_rec])
            combo = seg_rec[cand] * (len(dictionary) + 1) + codes[cand]
            order2 = np.argsort(combo, kind="stable")
            sorted_combo = combo[order2]
            earlier = np.zeros(len(cand), dtype=bool)
            earlier[order2[:-1][sorted_combo[:-1] == sorted_combo[1:]]] = True
            drop = cand[earlier]
            if len(drop):
                keep2 = np.ones(len(seg_rec), dtype=bool)
                keep2[drop] = False
                seg_rec, key_start, key_len = seg_rec[keep2], key_start[keep2], key_len[keep2]
                val_start, val_len, codes = val_start[keep2], val_len[keep2], codes[keep2]
                keys = slices(region, key_start, key_len)
        code_of = {name: i for i, name in enumerate(dictionary.to_pylist())}
    else:
        codes = np.zeros(0, dtype=np.int64)
        code_of = {}
    values = slices(region, val_start, val_len)
    val_str = _as_utf8(values)

    def value_of(name: str) -> pa.Array:
        """Each record's value of ``name`` (names are unique per record by now), or null."""
        index = np.full(n, -1, dtype=np.int64)
        code = code_of.get(name.encode())
        if code is not None:
            where = np.flatnonzero(codes == code)
            index[seg_rec[where]] = where
        return val_str.take(pa.array(index, mask=index < 0))

    tags = value_of(TAGS)
    if names is not None:
        return {name: value_of(name) for name in names}, tags
    key_str = _as_utf8(keys)
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(seg_rec, minlength=n), out=map_offsets[1:])
    maps = pa.MapArray.from_arrays(pa.array(map_offsets), key_str, val_str)
    return maps, tags


def encode_properties(props: pa.Array, *, trailing_separator: bool = True) -> pa.BinaryArray:
    """``name\\x01value\\x02…`` bytes for a map<string,string> array (null map -> empty;
    entries with a null value are left out, as RocketMQ never writes them)."""
    if isinstance(props, pa.ChunkedArray):
        props = pa.concat_arrays(props.chunks) if props.num_chunks else pa.array([], props.type)
    n = len(props)
    if n == 0:
        return pa.array([], type=pa.binary())
    offsets = np.frombuffer(
        props.buffers()[1], dtype=np.int32, count=n + 1, offset=props.offset * 4
    ).astype(np.int64)
    if props.null_count:
        valid = np.asarray(props.is_valid().to_numpy(zero_copy_only=False))
    else:
        valid = np.ones(n, dtype=bool)
    keys = props.keys
    items = props.items
    first, last = int(offsets[0]), int(offsets[-1])
    keys = keys.slice(first, last - first)
    items = items.slice(first, last - first)
    rec = np.repeat(np.arange(n), np.diff(offsets))
    entry_keep = valid[rec] if len(rec) else np.zeros(0, bool)
    if items.null_count:
        entry_keep &= np.asarray(items.is_valid().to_numpy(zero_copy_only=False))
    empty = pa.scalar(b"", pa.binary())
    kb = keys.cast(pa.binary()).fill_null(b"")
    vb = items.cast(pa.binary()).fill_null(b"")
    kv = pc.binary_join_element_wise(kb, vb, pa.scalar(b"\x01", pa.binary()))
    entries = pc.binary_join_element_wise(kv, empty, pa.scalar(b"\x02", pa.binary()))
    if not entry_keep.all():
        entries = entries.filter(pa.array(entry_keep))
        rec = rec[entry_keep]
    e_off, e_data = _binary_parts(entries)
    counts = np.bincount(rec, minlength=n) if len(rec) else np.zeros(n, dtype=np.int64)
    rec_first = np.concatenate([[0], np.cumsum(counts)])
    starts = e_off[rec_first[:-1]]
    stops = e_off[rec_first[1:]]
    lengths = stops - starts
    if not trailing_separator:
        lengths = np.where(lengths > 0, lengths - 1, 0)
    return slices(e_data, starts, lengths)


# --- consume queue -------------------------------------------------------------------------------


CQ_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])


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


def encode_cq_entries(offsets: np.ndarray, sizes: np.ndarray, tags: np.ndarray) -> bytes:
    entries = np.zeros(len(offsets), dtype=CQ_DTYPE)
    entries["offset"] = offsets
    entries["size"] = sizes
    entries["tags"] = tags
    return entries.tobytes()


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


def record_layout(buf: np.ndarray, positions: np.ndarray, file_offset: int = 0) -> Layout:
    """Gather the fixed fields of the records starting at ``positions`` in one file and check
    their structure (magic, size within the file, lengths adding up, physical offset)."""
    pos = np.asarray(positions, dtype=np.int64)
    length = len(buf)
    head = _gather(buf, pos, 48)
    total = _be(head, 0, 4)
    magic = _be(head, 4, 4)
    sys_flag = _be(head, 36, 4)
    born_len = np.where(sys_flag & BORNHOST_V6_FLAG, 20, 8)
    born = _gather(buf, pos + 48, 20)
    born_v4 = born_len == 8
    born[born_v4, 8:20] = 0
    b = pos + 48 + born_len
    block = _gather(buf, b, 44)
    store_v6 = (sys_flag & STOREHOST_V6_FLAG) != 0
    store = block[:, 8:28].copy()
    store[~store_v6, 8:20] = 0
    # fields after the store host, for both host widths
    after4 = block[:, 16:44]
    after6 = np.zeros_like(after4)
    after6[:, :16] = block[:, 28:44]
    tail = np.where(store_v6[:, None], after6, after4)
    reconsume = _be(tail, 0, 4)
    prepared = _be(tail, 4, 8)
    body_len = _be(tail, 12, 4)
    body_start = b + np.where(store_v6, 28, 16) + 16
    is_v2 = magic == MAGIC_CODE_V2
    topic_at = body_start + np.maximum(body_len, 0)
    tmat = _gather(buf, topic_at, 2)
    topic_len = np.where(is_v2, _be(tmat, 0, 2), _be(tmat, 0, 1))
    topic_start = topic_at + np.where(is_v2, 2, 1)
    props_at = topic_start + np.maximum(topic_len, 0)
    props_len = _be(_gather(buf, props_at, 2), 0, 2)
    props_start = props_at + 2
    expected = props_start + np.maximum(props_len, 0) - pos

    status = np.zeros(len(pos), dtype=np.int8)

    def mark(condition: np.ndarray, code: int) -> None:
        status[(status == OK) & condition] = code

    mark((pos < 0) | (pos + 8 > length), ST_TRUNCATED)
    mark(magic == BLANK_MAGIC_CODE, ST_BLANK)
    mark((total == 0) & (magic == 0), ST_EMPTY)
    mark((magic != MAGIC_CODE_V1) & (magic != MAGIC_CODE_V2), ST_MAGIC)
    mark((total < MIN_RECORD_SIZE) | (pos + total > length), ST_SIZE)
    mark((body_len < 0) | (topic_len < 0) | (props_len < 0) | (expected != total), ST_LENGTHS)
    phys = _be(head, 28, 8)
    mark(phys != file_offset + pos, ST_PHYS)
    return Layout(
        pos=pos,
        status=status,
        total=total,
        magic=magic,
        body_crc=_be(head, 8, 4),
        queue_id=_be(head, 12, 4),
        flag=_be(head, 16, 4),
        queue_offset=_be(head, 20, 8),
        phys=phys,
        sys_flag=sys_flag,
        born_ts=_be(head, 40, 8),
        born=born,
        store_ts=_be(block, 0, 8),
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
        mat = _gather(buf, layout.topic_start[idx], len(wanted))
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


def compress_body(data: bytes, sys_flag: int, level: int = 5) -> bytes:
    """The writer's side of ``decompress_body``."""
    codec = (sys_flag >> COMPRESSION_SHIFT) & 0x7
    if codec in (0, 3):
        return zlib.compress(data, level)
    if codec == 1:
        import lz4.frame

        return lz4.frame.compress(data)
    if codec == 2:
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
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
    buf_len = len(buf)
    bad: list[Bad] = []
    status = layout.status.copy()
    ok = np.flatnonzero(status == OK)
    lo = layout.subset(ok)
    topics = _as_utf8(slices(buf, lo.topic_start, lo.topic_len))
    # CRC of the body as stored (RocketMQ checks it only for a non-empty body).
    extra: dict[int, str] = {}
    if verify_crc and len(ok):
        view = memoryview(buf) if buf_len else b""
        for j in np.flatnonzero(lo.body_len > 0):
            s = int(lo.body_start[j])
            crc = zlib.crc32(view[s : s + int(lo.body_len[j])]) & 0x7FFFFFFF
            if crc != int(lo.body_crc[j]):
                status[ok[j]] = ST_CRC
                extra[int(ok[j])] = (
                    f"body CRC mismatch: stored {int(lo.body_crc[j])}, computed {crc}"
                )
    # Bodies: slices of the file, compressed ones replaced by their decompressed bytes.
    if body_topics is None:
        want = np.ones(len(ok), dtype=bool)
    else:
        want_topics = pa.array(sorted(set(body_topics)), type=pa.string())
        want = (
            pc.is_in(topics, value_set=want_topics).to_numpy(zero_copy_only=False).astype(bool)
            if len(ok)
            else np.zeros(0, bool)
        )
    compressed = np.flatnonzero(
        ((lo.sys_flag & COMPRESSED_FLAG) != 0) & (lo.body_len > 0) & (status[ok] == OK)
    )
    replacement: dict[int, bytes] = {}
    if len(compressed):
        view = memoryview(buf)
        for j in compressed:
            s = int(lo.body_start[j])
            try:
                replacement[int(j)] = decompress_body(
                    bytes(view[s : s + int(lo.body_len[j])]), int(lo.sys_flag[j])
                )
            except ValueError as exc:
                codec = CODEC_NAMES.get(
                    (int(lo.sys_flag[j]) >> COMPRESSION_SHIFT) & 7, "unknown codec"
                )
                status[ok[j]] = ST_COMPRESSION
                extra[int(ok[j])] = f"cannot decompress body ({codec}): {exc}"
    body_len = np.where(want, lo.body_len, 0)
    bodies = slices(buf, lo.body_start, body_len)
    if replacement:
        keys = [j for j in replacement if want[j]]
        if keys:
            extra_arr = pa.array([replacement[j] for j in keys], type=pa.binary())
            take = np.arange(len(ok), dtype=np.int64)
            take[keys] = len(ok) + np.arange(len(keys))
            bodies = pa.concat_arrays([bodies, extra_arr]).take(pa.array(take))
    bodies = pc.if_else(pa.array(want), bodies, pa.scalar(None, pa.binary())) if len(ok) else bodies
    names = list(property_columns) if property_columns is not None else None
    props, tags = decode_properties(slices(buf, lo.props_start, lo.props_len), names)
    born_v6 = (lo.sys_flag & BORNHOST_V6_FLAG) != 0
    store_v6 = (lo.sys_flag & STOREHOST_V6_FLAG) != 0
    born_port = (
        np.where(born_v6, _be(lo.born, 16, 4), _be(lo.born, 4, 4))
        if len(ok)
        else np.zeros(0, np.int64)
    )
    store_port = (
        np.where(store_v6, _be(lo.store, 16, 4), _be(lo.store, 4, 4))
        if len(ok)
        else np.zeros(0, np.int64)
    )
    table = pa.table(
        {
            "topic": topics,
            "queue_id": pa.array(lo.queue_id.astype(np.int32)),
            "queue_offset": pa.array(lo.queue_offset),
            "commitlog_offset": pa.array(lo.pos + file_offset),
            "stored_size": pa.array(lo.total.astype(np.int32)),
            "sys_flag": pa.array(lo.sys_flag.astype(np.int32)),
            "body_crc": pa.array(lo.body_crc.astype(np.int32)),
            "flag": pa.array(lo.flag.astype(np.int32)),
            "born_timestamp_ms": pa.array(lo.born_ts),
            "born_host": format_hosts(lo.born, born_port, born_v6),
            "store_timestamp_ms": pa.array(lo.store_ts),
            "store_host": format_hosts(lo.store, store_port, store_v6),
            "reconsume_times": pa.array(lo.reconsume.astype(np.int32)),
            "prepared_transaction_offset": pa.array(lo.prepared),
            "tags": tags,
            **({"properties": props} if property_columns is None else {}),
            "body": bodies,
            "magic_version": pa.array(np.where(lo.magic == MAGIC_CODE_V2, 2, 1).astype(np.int32)),
            "position": pa.array(lo.pos),
            **(
                {column: props[name] for name, column in property_columns.items()}
                if property_columns is not None
                else {}
            ),
        },
        schema=RECORD_SCHEMA
        if property_columns is None
        else lean_record_schema(property_columns, drop_columns),
    )
    final_ok = status[ok] == OK
    if not final_ok.all():
        table = table.filter(pa.array(final_ok))
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
    return DecodeResult(records=table, index=ok[final_ok], bad=bad)


def raw_hex(buf: np.ndarray, position: int, limit: int = 64) -> str:
    """Hex of at most ``limit`` bytes from ``position`` (empty outside the buffer)."""
    if position < 0 or position >= len(buf):
        return ""
    return bytes(np.asarray(buf[position : position + limit])).hex().upper()


# --- commit log: encoding ---------------------------------------------------------------------------


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
    return (_FIXED_V1 - 1 - 8 - 8) + born + store + topic_width + body_len + topic_len + props_len


def encode_records(
    *,
    phys: np.ndarray,
    sizes: np.ndarray,
    magic_version: np.ndarray,
    body_crc: np.ndarray,
    queue_id: np.ndarray,
    flag: np.ndarray,
    queue_offset: np.ndarray,
    sys_flag: np.ndarray,
    born_ts: np.ndarray,
    born_addr: np.ndarray,
    born_port: np.ndarray,
    store_ts: np.ndarray,
    store_addr: np.ndarray,
    store_port: np.ndarray,
    reconsume: np.ndarray,
    prepared: np.ndarray,
    bodies: pa.BinaryArray,
    topics: pa.BinaryArray,
    props: pa.BinaryArray,
) -> np.ndarray:
    """The records' bytes back to back (``sizes`` each), built column-wise: fixed fields are
    scattered into a byte matrix, then the variable parts are joined in one Arrow call."""
    n = len(phys)
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    width = 112  # longest prefix: header 48 + born 20 + store ts 8 + store 20 + 16
    mat = np.zeros((n, width), dtype=np.uint8)
    mat[:, 0:4] = _to_be_bytes(sizes, 4)
    magic = np.where(magic_version == 2, MAGIC_CODE_V2, MAGIC_CODE_V1)
    mat[:, 4:8] = _to_be_bytes(magic, 4)
    mat[:, 8:12] = _to_be_bytes(body_crc, 4)
    mat[:, 12:16] = _to_be_bytes(queue_id, 4)
    mat[:, 16:20] = _to_be_bytes(flag, 4)
    mat[:, 20:28] = _to_be_bytes(queue_offset, 8)
    mat[:, 28:36] = _to_be_bytes(phys, 8)
    mat[:, 36:40] = _to_be_bytes(sys_flag, 4)
    mat[:, 40:48] = _to_be_bytes(born_ts, 8)
    born_v6 = (sys_flag & BORNHOST_V6_FLAG) != 0
    store_v6 = (sys_flag & STOREHOST_V6_FLAG) != 0
    rows = np.arange(n)[:, None]

    def put(offset: np.ndarray, values: np.ndarray) -> None:
        mat[rows, offset[:, None] + np.arange(values.shape[1])] = values

    born_bytes = np.zeros((n, 20), dtype=np.uint8)
    born_bytes[:, :16] = born_addr
    born_bytes[~born_v6, 4:8] = _to_be_bytes(born_port[~born_v6], 4)
    born_bytes[born_v6, 16:20] = _to_be_bytes(born_port[born_v6], 4)
    mat[:, 48:68] = born_bytes
    born_len = np.where(born_v6, 20, 8)
    at = 48 + born_len
    put(at, _to_be_bytes(store_ts, 8))
    at = at + 8
    store_bytes = np.zeros((n, 20), dtype=np.uint8)
    store_bytes[:, :16] = store_addr
    store_bytes[~store_v6, 4:8] = _to_be_bytes(store_port[~store_v6], 4)
    store_bytes[~store_v6, 8:20] = 0
    store_bytes[store_v6, 16:20] = _to_be_bytes(store_port[store_v6], 4)
    # store host (8 or 20 bytes), then reconsume, prepared offset and body length
    put(at, store_bytes[:, :8])
    if store_v6.any():
        idx = np.flatnonzero(store_v6)
        mat[idx[:, None], (at[idx] + 8)[:, None] + np.arange(12)] = store_bytes[idx, 8:20]
    at = at + np.where(store_v6, 20, 8)
    put(at, _to_be_bytes(reconsume, 4))
    put(at + 4, _to_be_bytes(prepared, 8))
    body_lens = np.diff(_binary_parts(bodies)[0])
    put(at + 12, _to_be_bytes(body_lens, 4))
    prefix_len = at + 16
    prefix = slices(mat.reshape(-1), np.arange(n, dtype=np.int64) * width, prefix_len)
    topic_lens = np.diff(_binary_parts(topics)[0])
    tl = np.zeros((n, 2), dtype=np.uint8)
    v2 = magic_version == 2
    tl[v2] = _to_be_bytes(topic_lens[v2], 2)
    tl[~v2, 0] = _to_be_bytes(topic_lens[~v2], 1)[:, 0]
    topic_len_bin = slices(tl.reshape(-1), np.arange(n, dtype=np.int64) * 2, np.where(v2, 2, 1))
    props_lens = np.diff(_binary_parts(props)[0])
    pl = _to_be_bytes(props_lens, 2).reshape(-1)
    props_len_bin = slices(pl, np.arange(n, dtype=np.int64) * 2, np.full(n, 2))
    joined = pc.binary_join_element_wise(
        prefix, bodies, topic_len_bin, topics, props_len_bin, props, pa.scalar(b"", pa.binary())
    )
    offsets, data = _binary_parts(joined)
    out = data[offsets[0] : offsets[-1]]
    if not np.array_equal(np.diff(offsets), sizes):
        raise AssertionError("encoded record sizes differ from the computed sizes")
    return out
