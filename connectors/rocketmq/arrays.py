"""Vectorised byte helpers shared by decoding (``codec``) and encoding (the simulator's
``encoding``): gathering fixed-width fields of many records at once, big-endian integers
in and out of byte matrices, and zero-copy Arrow slices of a buffer. No RocketMQ knowledge.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_INT32_LIMIT = (1 << 31) - 1


def gather(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
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


_BE_TYPES: dict[int, np.dtype] = {
    1: np.dtype("i1"),
    2: np.dtype(">i2"),
    4: np.dtype(">i4"),
    8: np.dtype(">i8"),
}


def be_ints(mat: np.ndarray, start: int, width: int) -> np.ndarray:
    """Signed big-endian integers from columns ``[start, start+width)`` of a byte matrix, as
    native int64."""
    col = np.ascontiguousarray(mat[:, start : start + width])
    return col.view(_BE_TYPES[width]).reshape(-1).astype(np.int64)


def to_be_bytes(values: np.ndarray, width: int) -> np.ndarray:
    """(n, width) big-endian bytes of integer values (two's complement, truncated)."""
    dtypes: dict[int, np.dtype] = {
        1: np.dtype("u1"),
        2: np.dtype(">u2"),
        4: np.dtype(">u4"),
        8: np.dtype(">u8"),
    }
    dtype = dtypes[width]
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
    head = gather(buf, starts, 12)
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


def binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets as int64 of length n+1, data bytes) of a binary/string array without nulls."""
    if isinstance(array, pa.ChunkedArray):
        array = pa.concat_arrays(array.chunks) if array.num_chunks != 1 else array.chunk(0)
    if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type):
        off_dtype: type[np.int32] | type[np.int64] = np.int64
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
