"""Write a RocketMQ broker store (commit log + consume queues) from canonical message rows.

The byte layout is the broker's (``docs/spec/rocketmq-store.md``): commit-log files named by
their first physical offset, a record placed only when 8 bytes stay free after it (else a
BLANK filler and the next file), consume-queue files of ``cq_file_entries`` 20-byte entries,
a queue that starts late padded with ``(0, 0x7FFFFFFF, 0)`` entries. Files are created at
their full size (sparse, zero tail), like the broker's mapped files.

Encoding is vectorised per batch (``simulator.encoding.encode_records``); the Python loops are per batch,
per commit-log file and per queue. The per-record calls left are ``zlib.crc32`` for rows
without a ``body_crc`` and compression of bodies whose sysflag says compressed: neither has
a vectorised equivalent.

``config/consumerOffset.json`` is not written here: use
``offsets_file.write_consumer_offsets(root / "config/consumerOffset.json", table)``.
"""

from __future__ import annotations

import itertools
import os
import zlib
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.rocketmq import fields, layout
from connectors.rocketmq.arrays import binary_parts
from simulator import encoding

REQUIRED_COLUMNS = ("topic", "queue_id", "born_timestamp_ms", "store_timestamp_ms")
ASSIGNED_SCHEMA = pa.schema(
    [("commitlog_offset", pa.int64()), ("queue_offset", pa.int64()), ("stored_size", pa.int32())]
)
_CHUNK_BYTES = 64 << 20  # records encoded per chunk: bounds the writer's memory
_MAX_TOPIC_V1 = 127
_MAX_SHORT = 32767


def _column(table: pa.Table, name: str) -> pa.Array | None:
    if name not in table.column_names:
        return None
    column = table.column(name)
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _ints(table: pa.Table, name: str, default: int = 0) -> np.ndarray:
    column = _column(table, name)
    if column is None:
        return np.full(table.num_rows, default, dtype=np.int64)
    return (
        column.cast(pa.int64()).fill_null(default).to_numpy(zero_copy_only=False).astype(np.int64)
    )


def _binary(column: pa.Array | None, n: int) -> pa.Array:
    if column is None:
        return pa.array([b""] * n, type=pa.binary()) if n else pa.array([], pa.binary())
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.cast(pa.binary()).fill_null(b"")


class StoreWriter:
    """Appends message rows to a new store under ``root``; use as a context manager.

    ``append`` takes columns named like ``schemas.messages.MESSAGE`` (any subset; ``topic``,
    ``queue_id``, ``born_timestamp_ms`` and ``store_timestamp_ms`` required), in commit-log
    order. ``properties`` is a map<string,string> (encoded in map order, with a trailing
    0x02 unless ``properties_trailing_separator=False``) or ``properties_raw`` binary (written
    as given; wins over ``properties``). ``body`` is the uncompressed body: it is compressed
    when ``sys_flag`` has the compressed bit (codec from bits 8-10). ``body_crc`` is computed
    over the stored body when null. Host columns are ``ip:port`` / ``[v6]:port`` strings; the
    IPv6 bits 0x10/0x20 of ``sys_flag`` are set from them. ``magic_version`` (column or
    default) 1 or 2; a v1 record whose topic is over 127 bytes is written as v2, as the
    broker does. ``tags`` is ignored: TAGS lives in the properties. ``commitlog_offset`` and
    ``stored_size`` are assigned.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        commitlog_file_size: int = 1 << 30,
        cq_file_entries: int = 300_000,
        magic_version: int = 1,
        properties_trailing_separator: bool = True,
    ) -> None:
        if magic_version not in (1, 2):
            raise ValueError(f"magic_version must be 1 or 2, not {magic_version}")
        if not layout.fits_in_file(layout.MIN_RECORD_SIZE, commitlog_file_size):
            raise ValueError(f"commitlog_file_size {commitlog_file_size} is too small")
        if cq_file_entries < 1:
            raise ValueError("cq_file_entries must be positive")
        self.root = Path(root)
        self.commitlog_file_size = int(commitlog_file_size)
        self.cq_file_entries = int(cq_file_entries)
        self.magic_version = magic_version
        self.properties_trailing_separator = properties_trailing_separator
        commitlog = self.root / "commitlog"
        if commitlog.exists() and any(commitlog.iterdir()):
            raise ValueError(f"{commitlog}: not empty; StoreWriter writes a new store")
        commitlog.mkdir(parents=True, exist_ok=True)
        (self.root / "consumequeue").mkdir(parents=True, exist_ok=True)
        self._file_start = 0
        self._pos = 0
        self._fd: int | None = None
        self._next_offset: dict[tuple[str, int], int] = {}
        self._cq_fds: dict[tuple[str, int], tuple[int, int]] = {}  # queue -> (file index, fd)
        self._cq_started: set[tuple[str, int]] = set()
        self._closed = False

    # -- context manager ----------------------------------------------------------------------

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def next_queue_offsets(self) -> dict[tuple[str, int], int]:
        """The next queue offset of every (topic, queue id) written so far."""
        return dict(self._next_offset)

    @property
    def commitlog_end(self) -> int:
        """Physical offset right after the last record written."""
        return self._file_start + self._pos

    # -- files ----------------------------------------------------------------------------------

    def _commitlog_fd(self) -> int:
        if self._fd is None:
            path = self.root / "commitlog" / layout.offset_file_name(self._file_start)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(self._fd, self.commitlog_file_size)
        return self._fd

    def _next_file(self) -> None:
        """Write the BLANK filler at the current position and move to the next file."""
        fd = self._commitlog_fd()
        left = self.commitlog_file_size - self._pos
        blank = int(left).to_bytes(4, "big", signed=True) + layout.BLANK_MAGIC_CODE.to_bytes(
            4, "big", signed=True
        )
        os.pwrite(fd, blank, self._pos)
        os.close(fd)
        self._fd = None
        self._file_start += self.commitlog_file_size
        self._pos = 0

    def _cq_fd(self, topic: str, queue_id: int, file_index: int) -> int:
        """The queue's consume-queue file number ``file_index`` (one open file per queue)."""
        current = self._cq_fds.get((topic, queue_id))
        if current is not None:
            if current[0] == file_index:
                return current[1]
            os.close(current[1])
            del self._cq_fds[(topic, queue_id)]
        file_bytes = self.cq_file_entries * layout.CQ_ENTRY_SIZE
        path = (
            self.root
            / "consumequeue"
            / topic
            / str(queue_id)
            / layout.offset_file_name(file_index * file_bytes)
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(fd).st_size < file_bytes:
            os.ftruncate(fd, file_bytes)
        self._cq_fds[(topic, queue_id)] = (file_index, fd)
        return fd

    # -- append ---------------------------------------------------------------------------------

    def append(self, batch: pa.RecordBatch | pa.Table) -> pa.Table:
        """Append rows; return (commitlog_offset, queue_offset, stored_size) per row."""
        if self._closed:
            raise ValueError("StoreWriter is closed")
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        n = table.num_rows
        for name in REQUIRED_COLUMNS:
            column = _column(table, name)
            if column is None:
                raise ValueError(f"column {name!r} is required")
            if n and column.null_count:
                raise ValueError(f"column {name!r} has nulls")
        if n == 0:
            return ASSIGNED_SCHEMA.empty_table()

        topics_str = _column(table, "topic").cast(pa.string())
        topics = topics_str.cast(pa.binary())
        queue_id = _ints(table, "queue_id")
        sys_flag = _ints(table, "sys_flag")
        born_addr, born_port, born_v6 = encoding.parse_hosts(_column(table, "born_host"), n)
        store_addr, store_port, store_v6 = encoding.parse_hosts(_column(table, "store_host"), n)
        sys_flag = (
            (sys_flag & ~(layout.BORNHOST_V6_FLAG | layout.STOREHOST_V6_FLAG))
            | np.where(born_v6, layout.BORNHOST_V6_FLAG, 0)
            | np.where(store_v6, layout.STOREHOST_V6_FLAG, 0)
        )

        magic = _ints(table, "magic_version", self.magic_version)
        if not np.isin(magic, (1, 2)).all():
            raise ValueError("magic_version must be 1 or 2")
        topic_lens = np.diff(binary_parts(topics)[0])
        magic = np.where((magic == 1) & (topic_lens > _MAX_TOPIC_V1), 2, magic)
        if (topic_lens > _MAX_SHORT).any():
            raise ValueError("a topic is longer than 32767 bytes")

        raw = _column(table, "properties_raw")
        mapped = _column(table, "properties")
        if mapped is not None:
            props = encoding.encode_properties(
                mapped, trailing_separator=self.properties_trailing_separator
            )
            if raw is not None:
                props = pc.if_else(raw.is_valid(), raw.cast(pa.binary()), props)
        else:
            props = _binary(raw, n)
        props_lens = np.diff(binary_parts(props)[0])
        if (props_lens > _MAX_SHORT).any():
            raise ValueError("properties longer than 32767 bytes")

        bodies = _binary(_column(table, "body"), n)
        compressed = np.flatnonzero((sys_flag & layout.COMPRESSED_FLAG) != 0)
        if len(compressed):
            plain = bodies.take(pa.array(compressed)).to_pylist()
            packed = [
                encoding.compress_body(b, int(f))
                for b, f in zip(plain, sys_flag[compressed], strict=True)
            ]
            take = np.arange(n, dtype=np.int64)
            take[compressed] = n + np.arange(len(compressed))
            bodies = pa.concat_arrays([bodies, pa.array(packed, type=pa.binary())]).take(
                pa.array(take)
            )
        body_offsets, body_data = binary_parts(bodies)
        body_lens = np.diff(body_offsets)

        crc_column = _column(table, "body_crc")
        body_crc = _ints(table, "body_crc")
        missing_crc = (
            np.ones(n, dtype=bool)
            if crc_column is None
            else crc_column.is_null().to_numpy(zero_copy_only=False).astype(bool)
        )
        if missing_crc.any():
            view = memoryview(body_data) if len(body_data) else b""
            rows = np.flatnonzero(missing_crc)
            starts, stops = body_offsets[rows].tolist(), body_offsets[rows + 1].tolist()
            body_crc[rows] = [
                zlib.crc32(view[a:b]) & 0x7FFFFFFF for a, b in zip(starts, stops, strict=True)
            ]

        sizes = layout.record_sizes(sys_flag, body_lens, topic_lens, props_lens, magic)
        if not layout.fits_in_file(sizes, self.commitlog_file_size).all():
            raise ValueError(
                f"a record of {int(sizes.max())} bytes does not fit in a {self.commitlog_file_size}-byte commit-log file"
            )

        queue_offset = self._assign_queue_offsets(table, topics_str, queue_id, sys_flag)
        phys, file_of = self._place(sizes)

        # Encode and write, chunk by chunk, each chunk split at commit-log file changes.
        flag = _ints(table, "flag")
        born_ts = _ints(table, "born_timestamp_ms")
        store_ts = _ints(table, "store_timestamp_ms")
        reconsume = _ints(table, "reconsume_times")
        prepared = _ints(table, "prepared_transaction_offset")
        ends = np.cumsum(sizes)
        i = 0
        while i < n:
            limit = (ends[i - 1] if i else 0) + _CHUNK_BYTES
            j = max(i + 1, int(np.searchsorted(ends, limit, side="right")))
            j = min(j, n)
            part = slice(i, j)
            data = encoding.encode_records(
                phys=phys[part],
                sizes=sizes[part],
                magic_version=magic[part],
                body_crc=body_crc[part],
                queue_id=queue_id[part],
                flag=flag[part],
                queue_offset=queue_offset[part],
                sys_flag=sys_flag[part],
                born_ts=born_ts[part],
                born_addr=born_addr[part],
                born_port=born_port[part],
                store_ts=store_ts[part],
                store_addr=store_addr[part],
                store_port=store_port[part],
                reconsume=reconsume[part],
                prepared=prepared[part],
                bodies=bodies.slice(i, j - i),
                topics=topics.slice(i, j - i),
                props=props.slice(i, j - i),
            )
            self._write_records(data, phys[part], file_of[part], sizes[part])
            i = j

        dispatched = self._dispatched(sys_flag)
        if mapped is not None and raw is None:
            tags = pc.map_lookup(mapped, pa.scalar(layout.TAGS, mapped.type.key_type), "last")
        else:
            tags = fields.decode_properties(props)[1]
        tag_codes = layout.java_string_hash(tags).astype(np.int64)
        self._write_cq(topics_str, queue_id, queue_offset, phys, sizes, tag_codes, dispatched)
        return pa.table(
            {
                "commitlog_offset": pa.array(phys, pa.int64()),
                "queue_offset": pa.array(queue_offset, pa.int64()),
                "stored_size": pa.array(sizes.astype(np.int32), pa.int32()),
            },
            schema=ASSIGNED_SCHEMA,
        )

    @staticmethod
    def _dispatched(sys_flag: np.ndarray) -> np.ndarray:
        tx = sys_flag & layout.TRANSACTION_MASK
        return (tx == layout.TRANSACTION_NOT_TYPE) | (tx == layout.TRANSACTION_COMMIT_TYPE)

    def _assign_queue_offsets(
        self, table: pa.Table, topics: pa.Array, queue_id: np.ndarray, sys_flag: np.ndarray
    ) -> np.ndarray:
        n = table.num_rows
        column = _column(table, "queue_offset")
        given = _ints(table, "queue_offset")
        explicit = (
            np.zeros(n, dtype=bool)
            if column is None
            else column.is_valid().to_numpy(zero_copy_only=False).astype(bool)
        )
        result = np.where(explicit, given, 0)
        dispatched = self._dispatched(sys_flag)
        rows = np.flatnonzero(dispatched)
        if len(rows) == 0:
            return result
        encoded = pc.dictionary_encode(topics.take(pa.array(rows)))
        names = encoded.dictionary.to_pylist()
        topic_code = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        key = topic_code * (1 << 32) + (queue_id[rows] & 0xFFFFFFFF)
        unique, inverse = np.unique(key, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(unique)))])
        for g, k in enumerate(unique):
            members = rows[order[bounds[g] : bounds[g + 1]]]
            name = (names[int(k >> 32)], int(np.int32(np.uint32(k & 0xFFFFFFFF))))
            start = self._next_offset.get(name, 0)
            p = np.arange(len(members))
            is_explicit = explicit[members]
            last = np.maximum.accumulate(np.where(is_explicit, p, -1))
            values = np.where(
                is_explicit,
                given[members],
                np.where(last >= 0, given[members][np.maximum(last, 0)] + p - last, start + p),
            )
            result[members] = values
            self._next_offset[name] = int(values[-1]) + 1
        return result

    def _place(self, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Physical offsets of the records and the file start of each, by the layout's
        end-of-file rule (the BLANK filler is written when the writer moves on,
        ``_next_file``)."""
        size = self.commitlog_file_size
        phys, _ = layout.place_records(sizes, self._file_start + self._pos, size)
        return phys, phys - phys % size

    def _write_records(
        self, data: np.ndarray, phys: np.ndarray, file_of: np.ndarray, sizes: np.ndarray
    ) -> None:
        n = len(phys)
        change = np.flatnonzero(np.diff(file_of)) + 1
        bounds = [0, *change.tolist(), n]
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        for a, b in itertools.pairwise(bounds):
            start = int(file_of[a])
            while self._file_start < start:
                self._next_file()
            fd = self._commitlog_fd()
            pos = int(phys[a]) - start
            os.pwrite(fd, memoryview(data[offsets[a] : offsets[b]]), pos)
            self._pos = pos + int(offsets[b] - offsets[a])

    def _write_cq(
        self,
        topics: pa.Array,
        queue_id: np.ndarray,
        queue_offset: np.ndarray,
        phys: np.ndarray,
        sizes: np.ndarray,
        tag_codes: np.ndarray,
        dispatched: np.ndarray,
    ) -> None:
        rows = np.flatnonzero(dispatched)
        if len(rows) == 0:
            return
        encoded = pc.dictionary_encode(topics.take(pa.array(rows)))
        names = encoded.dictionary.to_pylist()
        topic_code = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        file_index = queue_offset[rows] // self.cq_file_entries
        key = np.stack([topic_code, queue_id[rows], file_index, queue_offset[rows]])
        order = np.lexsort(key[::-1])
        rows = rows[order]
        key = key[:, order]
        group_change = np.flatnonzero(np.any(np.diff(key[:3], axis=1) != 0, axis=0)) + 1
        bounds = [0, *group_change.tolist(), len(rows)]
        for a, b in itertools.pairwise(bounds):
            topic = names[int(key[0, a])]
            qid = int(key[1, a])
            findex = int(key[2, a])
            members = rows[a:b]
            offsets = queue_offset[members]
            fd = self._cq_fd(topic, qid, findex)
            first_entry = findex * self.cq_file_entries
            name = (topic, qid)
            if name not in self._cq_started:
                self._cq_started.add(name)
                pad = int(offsets[0]) - first_entry
                if pad > 0:
                    blank = encoding.encode_cq_entries(
                        np.zeros(pad, np.int64),
                        np.full(pad, layout.CQ_PAD_SIZE),
                        np.zeros(pad, np.int64),
                    )
                    os.pwrite(fd, blank, 0)
            runs = np.flatnonzero(np.diff(offsets) != 1) + 1
            run_bounds = [0, *runs.tolist(), len(members)]
            for ra, rb in itertools.pairwise(run_bounds):
                sel = members[ra:rb]
                entries = encoding.encode_cq_entries(phys[sel], sizes[sel], tag_codes[sel])
                os.pwrite(fd, entries, (int(offsets[ra]) - first_entry) * layout.CQ_ENTRY_SIZE)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for _, fd in self._cq_fds.values():
            os.close(fd)
        self._cq_fds.clear()
