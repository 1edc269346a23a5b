"""Vectorised encoding of RocketMQ commit-log records and consume-queue entries: the
writer's side of ``connectors.rocketmq.codec`` (decoding), over the layout that
``connectors.rocketmq.layout`` owns. Used by the simulator's ``StoreWriter`` only; not
shipped to clusters.
"""

from __future__ import annotations

import ipaddress
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.rocketmq.arrays import binary_parts, slices, to_be_bytes
from connectors.rocketmq.layout import (
    BORNHOST_V6_FLAG,
    COMPRESSION_SHIFT,
    CQ_DTYPE,
    MAGIC_CODE_V1,
    MAGIC_CODE_V2,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    STOREHOST_V6_FLAG,
)

# --- hosts -------------------------------------------------------------------------------------


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
    kv = pc.binary_join_element_wise(kb, vb, pa.scalar(NAME_VALUE_SEPARATOR, pa.binary()))
    entries = pc.binary_join_element_wise(kv, empty, pa.scalar(PROPERTY_SEPARATOR, pa.binary()))
    if not entry_keep.all():
        entries = entries.filter(pa.array(entry_keep))
        rec = rec[entry_keep]
    e_off, e_data = binary_parts(entries)
    counts = np.bincount(rec, minlength=n) if len(rec) else np.zeros(n, dtype=np.int64)
    rec_first = np.concatenate([[0], np.cumsum(counts)])
    starts = e_off[rec_first[:-1]]
    stops = e_off[rec_first[1:]]
    lengths = stops - starts
    if not trailing_separator:
        lengths = np.where(lengths > 0, lengths - 1, 0)
    return slices(e_data, starts, lengths)


# --- consume queue -------------------------------------------------------------------------------


def encode_cq_entries(offsets: np.ndarray, sizes: np.ndarray, tags: np.ndarray) -> bytes:
    entries = np.zeros(len(offsets), dtype=CQ_DTYPE)
    entries["offset"] = offsets
    entries["size"] = sizes
    entries["tags"] = tags
    return entries.tobytes()


# --- commit log --------------------------------------------------------------------------------


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
    mat[:, 0:4] = to_be_bytes(sizes, 4)
    magic = np.where(magic_version == 2, MAGIC_CODE_V2, MAGIC_CODE_V1)
    mat[:, 4:8] = to_be_bytes(magic, 4)
    mat[:, 8:12] = to_be_bytes(body_crc, 4)
    mat[:, 12:16] = to_be_bytes(queue_id, 4)
    mat[:, 16:20] = to_be_bytes(flag, 4)
    mat[:, 20:28] = to_be_bytes(queue_offset, 8)
    mat[:, 28:36] = to_be_bytes(phys, 8)
    mat[:, 36:40] = to_be_bytes(sys_flag, 4)
    mat[:, 40:48] = to_be_bytes(born_ts, 8)
    born_v6 = (sys_flag & BORNHOST_V6_FLAG) != 0
    store_v6 = (sys_flag & STOREHOST_V6_FLAG) != 0
    rows = np.arange(n)[:, None]

    def put(offset: np.ndarray, values: np.ndarray) -> None:
        mat[rows, offset[:, None] + np.arange(values.shape[1])] = values

    born_bytes = np.zeros((n, 20), dtype=np.uint8)
    born_bytes[:, :16] = born_addr
    born_bytes[~born_v6, 4:8] = to_be_bytes(born_port[~born_v6], 4)
    born_bytes[born_v6, 16:20] = to_be_bytes(born_port[born_v6], 4)
    mat[:, 48:68] = born_bytes
    born_len = np.where(born_v6, 20, 8)
    at = 48 + born_len
    put(at, to_be_bytes(store_ts, 8))
    at = at + 8
    store_bytes = np.zeros((n, 20), dtype=np.uint8)
    store_bytes[:, :16] = store_addr
    store_bytes[~store_v6, 4:8] = to_be_bytes(store_port[~store_v6], 4)
    store_bytes[~store_v6, 8:20] = 0
    store_bytes[store_v6, 16:20] = to_be_bytes(store_port[store_v6], 4)
    # store host (8 or 20 bytes), then reconsume, prepared offset and body length
    put(at, store_bytes[:, :8])
    if store_v6.any():
        idx = np.flatnonzero(store_v6)
        mat[idx[:, None], (at[idx] + 8)[:, None] + np.arange(12)] = store_bytes[idx, 8:20]
    at = at + np.where(store_v6, 20, 8)
    put(at, to_be_bytes(reconsume, 4))
    put(at + 4, to_be_bytes(prepared, 8))
    body_lens = np.diff(binary_parts(bodies)[0])
    put(at + 12, to_be_bytes(body_lens, 4))
    prefix_len = at + 16
    prefix = slices(mat.reshape(-1), np.arange(n, dtype=np.int64) * width, prefix_len)
    topic_lens = np.diff(binary_parts(topics)[0])
    tl = np.zeros((n, 2), dtype=np.uint8)
    v2 = magic_version == 2
    tl[v2] = to_be_bytes(topic_lens[v2], 2)
    tl[~v2, 0] = to_be_bytes(topic_lens[~v2], 1)[:, 0]
    topic_len_bin = slices(tl.reshape(-1), np.arange(n, dtype=np.int64) * 2, np.where(v2, 2, 1))
    props_lens = np.diff(binary_parts(props)[0])
    pl = to_be_bytes(props_lens, 2).reshape(-1)
    props_len_bin = slices(pl, np.arange(n, dtype=np.int64) * 2, np.full(n, 2))
    joined = pc.binary_join_element_wise(
        prefix, bodies, topic_len_bin, topics, props_len_bin, props, pa.scalar(b"", pa.binary())
    )
    offsets, data = binary_parts(joined)
    out = data[offsets[0] : offsets[-1]]
    if not np.array_equal(np.diff(offsets), sizes):
        raise AssertionError("encoded record sizes differ from the computed sizes")
    return out
