"""A Bloom filter of commit-log offsets (numpy and Arrow, no Spark).

The discard history looks in the business queues for the committed message of each
discarded transaction: a commit whose prepared-transaction offset is the commit-log offset
of one of its half records. The real queues hold every committed message of the store
(far more than the discarded transactions), and decoding and caching them all would be
the discard history's largest stage. A filter of the wanted offsets, built from the
discarded transactions' half records, lets a read task decode only the commits that may
be wanted, reading no more than the fixed fields of the others.

A Bloom filter has no false negative: every wanted commit is decoded, and the join after
the read drops the false positives (well under 1 % of the others), so the rows are those
of an unfiltered read. Its size is the driver's cost (one row per broker, about
``BITS_PER_KEY`` bits per offset: megabytes for millions of offsets), not the records'.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Bits per offset before rounding up to a power of two (12 to 24 after it), and probes per
# offset: a false-positive rate of at most about 0.7 % (at 12 bits and 4 probes).
BITS_PER_KEY = 12
PROBES = 4
# The schema of ``filter_batches``: one row per broker.
FILTER_SCHEMA = pa.schema([("broker", pa.string()), ("bits", pa.binary())])

# splitmix64's finaliser: spreads offsets that differ in a few low bits over all 64.
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_MULTIPLIERS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mixed(values: np.ndarray) -> np.ndarray:
    z = values.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _SHIFTS[0])) * _MULTIPLIERS[0]
        z = (z ^ (z >> _SHIFTS[1])) * _MULTIPLIERS[1]
    return z ^ (z >> _SHIFTS[2])


def _probes(offsets: np.ndarray, size_bits: int) -> Iterator[np.ndarray]:
    """The bit positions of each offset, one array per probe (double hashing)."""
    first = _mixed(offsets)
    step = _mixed(first) | np.uint64(1)
    mask = np.uint64(size_bits - 1)
    with np.errstate(over="ignore"):
        for i in range(PROBES):
            yield (first + np.uint64(i) * step) & mask


@dataclass(frozen=True, eq=False)
class OffsetFilter:
    """The set of offsets a filter was built from, or a few more; ``bits`` packed, big-end
    first within each byte (``np.packbits``), a power of two of them."""

    bits: bytes

    @classmethod
    def of(cls, offsets: np.ndarray) -> OffsetFilter:
        size = max(64, 1 << int(max(1, len(offsets) * BITS_PER_KEY) - 1).bit_length())
        flags = np.zeros(size, dtype=bool)
        for positions in _probes(offsets, size):
            flags[positions] = True
        return cls(np.packbits(flags).tobytes())

    def might_contain(self, offsets: np.ndarray) -> np.ndarray:
        """A boolean per offset: false only for an offset the filter was not built from."""
        packed = np.frombuffer(self.bits, dtype=np.uint8)
        found = np.ones(len(offsets), dtype=bool)
        for positions in _probes(offsets, len(packed) * 8):
            byte = packed[(positions >> np.uint64(3)).astype(np.int64)]
            shift = (np.uint64(7) - (positions & np.uint64(7))).astype(np.uint8)
            found &= ((byte >> shift) & 1).astype(bool)
        return found


def filter_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` over ``broker, offset`` rows, all in one task: one ``FILTER_SCHEMA``
    row per broker, the filter of its offsets (sized from their count, known only once
    every row is in). The brokers are compared as Arrow strings: a batch's few names,
    never a Python string per row."""
    offsets: dict[str, list[np.ndarray]] = {}
    for batch in batches:
        brokers = batch.column(batch.schema.get_field_index("broker"))
        values = batch.column(batch.schema.get_field_index("offset"))
        for broker in pc.unique(brokers).to_pylist():
            chosen = pc.filter(values, pc.equal(brokers, broker))
            offsets.setdefault(broker, []).append(chosen.to_numpy(zero_copy_only=False))
    names = sorted(offsets)
    bits = [OffsetFilter.of(np.concatenate(offsets[name])).bits for name in names]
    yield pa.RecordBatch.from_arrays(
        [pa.array(names, pa.string()), pa.array(bits, pa.binary())], schema=FILTER_SCHEMA
    )
