"""Decoding of a record's variable parts: properties (``name\\x01value\\x02…``), hosts and
compressed bodies (``connectors.rocketmq.codec`` cuts them out of the file and calls these).
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.rocketmq.arrays import binary_parts, slices, to_be_bytes
from connectors.rocketmq.layout import (
    COMPRESSION_SHIFT,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TAGS,
)

# Largest body accepted after decompression (a guard against corrupt input; RocketMQ's own
# limit for a stored message is 4 MiB by default).
MAX_DECOMPRESSED_BODY = 256 << 20


def as_utf8(binary: pa.Array) -> pa.Array:
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
    return pa.MapArray.from_arrays(pa.array(map_offsets), as_utf8(keys), values)


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
    val_str = as_utf8(entries.values())

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
