"""Vectorised decoding of RocketMQ commit-log records and consume-queue entries.

Pure numpy / pyarrow, no Spark (``docs/store-reader.md`` explains the design). The byte
layout is ``docs/spec/rocketmq-store.md``, owned in code by ``connectors.rocketmq.layout``;
a record's structure (walk, fixed fields, what is wrong) is ``structure``, its variable parts
(properties, hosts, compressed bodies) ``fields``; encoding (the simulator's writer) is
``simulator.encoding``.

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

import mmap
import os
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.rocketmq.arrays import be_ints, slices
from connectors.rocketmq.fields import as_utf8, decode_properties, decompress_body, format_hosts
from connectors.rocketmq.layout import (
    BORNHOST_V6_FLAG,
    CODEC_NAMES,
    COMPRESSED_FLAG,
    COMPRESSION_SHIFT,
    CQ_DTYPE,
    CQ_ENTRY_SIZE,
    MAGIC_CODE_V2,
    STOREHOST_V6_FLAG,
)

# Re-exported: the store reader reads these as ``codec.X`` (issue 12 owns reader.py and can
# import them from ``layout`` and ``structure`` directly when it next changes).
from connectors.rocketmq.layout import CQ_PAD_SIZE as CQ_PAD_SIZE
from connectors.rocketmq.layout import MIN_RECORD_SIZE as MIN_RECORD_SIZE
from connectors.rocketmq.layout import TRANSACTION_COMMIT_TYPE as TRANSACTION_COMMIT_TYPE
from connectors.rocketmq.layout import TRANSACTION_MASK as TRANSACTION_MASK
from connectors.rocketmq.layout import TRANSACTION_NOT_TYPE as TRANSACTION_NOT_TYPE
from connectors.rocketmq.layout import file_start_offset as file_start_offset
from connectors.rocketmq.structure import NOT_A_RECORD, ST_COMPRESSION, ST_CRC, Layout
from connectors.rocketmq.structure import OK as OK
from connectors.rocketmq.structure import _reason as _reason
from connectors.rocketmq.structure import record_layout as record_layout
from connectors.rocketmq.structure import topic_matches as topic_matches
from connectors.rocketmq.structure import walk_records as walk_records

# --- files -------------------------------------------------------------------------------------


def open_read_only(path: str | os.PathLike[str]) -> np.ndarray:
    """The file's bytes as a read-only ``uint8`` array (memory-mapped; empty files give an
    empty array). The file is opened ``O_RDONLY``: nothing can be written through it."""
    size = os.stat(path).st_size
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def release_pages(buf: np.ndarray, start: int, stop: int) -> None:
    """Unmap the pages of ``buf[start:stop]`` (a file opened by ``open_read_only``) from this
    process; the file and the page cache are untouched, and a later read of them maps them
    again. A worker that follows a queue through a 1 GiB commit-log file otherwise keeps every
    page it touched mapped until the file is done, which counts in its memory: on a large
    store, the run's peak. A no-op for other arrays."""
    mapped = getattr(buf, "_mmap", None)
    if mapped is None or not hasattr(mapped, "madvise") or stop <= start:
        return
    page = mmap.PAGESIZE
    begin = (max(start, 0) // page) * page
    end = min(stop, len(mapped))
    if end > begin:
        mapped.madvise(mmap.MADV_DONTNEED, begin, end - begin)


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
    view = buf.data if len(buf) else b""
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
    view = buf.data
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
    lo: Layout, file_offset: int, columns: Mapping[str, pa.Array], schema: pa.Schema
) -> pa.Table:
    """The decoded records as a table of ``schema`` (``RECORD_SCHEMA`` or a lean variant);
    ``columns`` holds the variable-length columns decoded already (topic, tags, properties,
    body, property columns). A fixed field is built only when ``schema`` has it: the hosts'
    text alone is a good part of a narrow read's cost."""
    fixed: dict[str, Callable[[], pa.Array]] = {
        "queue_id": lambda: pa.array(lo.queue_id.astype(np.int32)),
        "queue_offset": lambda: pa.array(lo.queue_offset),
        "commitlog_offset": lambda: pa.array(lo.pos + file_offset),
        "stored_size": lambda: pa.array(lo.total.astype(np.int32)),
        "sys_flag": lambda: pa.array(lo.sys_flag.astype(np.int32)),
        "body_crc": lambda: pa.array(lo.body_crc.astype(np.int32)),
        "flag": lambda: pa.array(lo.flag.astype(np.int32)),
        "born_timestamp_ms": lambda: pa.array(lo.born_ts),
        "born_host": lambda: _hosts(lo.born, (lo.sys_flag & BORNHOST_V6_FLAG) != 0),
        "store_timestamp_ms": lambda: pa.array(lo.store_ts),
        "store_host": lambda: _hosts(lo.store, (lo.sys_flag & STOREHOST_V6_FLAG) != 0),
        "reconsume_times": lambda: pa.array(lo.reconsume.astype(np.int32)),
        "prepared_transaction_offset": lambda: pa.array(lo.prepared),
        "magic_version": lambda: pa.array(
            np.where(lo.magic == MAGIC_CODE_V2, 2, 1).astype(np.int32)
        ),
        "position": lambda: pa.array(lo.pos),
    }
    return pa.table(
        {name: columns[name] if name in columns else fixed[name]() for name in schema.names},
        schema=schema,
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
    topics = as_utf8(slices(buf, lo.topic_start, lo.topic_len))
    extra: dict[int, str] = {}
    if verify_crc and len(ok):
        _mark_crc_mismatches(buf, lo, ok, status, extra)
    replacement = _decompress_bodies(buf, lo, ok, status, extra)
    schema = (
        RECORD_SCHEMA
        if property_columns is None
        else lean_record_schema(property_columns, drop_columns)
    )
    columns: dict[str, pa.Array] = {"topic": topics}
    if "body" in schema.names:
        columns["body"] = _bodies(buf, lo, _wanted_bodies(topics, body_topics), replacement)
    if property_columns is None or property_columns or "tags" in schema.names:
        # The properties are split only for a read that returns some of them.
        names = None if property_columns is None else list(property_columns)
        props, columns["tags"] = decode_properties(slices(buf, lo.props_start, lo.props_len), names)
        if property_columns is None:
            columns["properties"] = props
        else:
            columns.update({column: props[name] for name, column in property_columns.items()})
    table = _record_table(lo, file_offset, columns, schema)
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
