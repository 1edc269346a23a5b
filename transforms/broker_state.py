"""What the broker holds while it walks one queue in a check round (``transforms.broker_walk``):
the half queue with the copies the round appends, the op records loaded pull by pull into
removeMap, and Java's number parsing.

Pure Python over pyarrow columns: the column work (the as-of cut, sorting, parsing each
distinct property value once) is vectorised; what stays per record is a list lookup.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.messages import REMOVE_TAG

OP_MSG_PULL_NUMS = 32
CQ_FILE_ENTRIES = 300_000  # consume-queue entries per file (mappedFileSizeConsumeQueue / 20)
VERSIONS = ("5", "4.9")

INT32 = (-(1 << 31), (1 << 31) - 1)  # Integer.parseInt's range
INT64 = (-(1 << 63), (1 << 63) - 1)  # Long.parseLong's


@dataclass(frozen=True)
class BrokerSettings:
    """The broker configuration the walk reads. ``version``: "5" (5.1+) or "4.9"."""

    check_max: int
    transaction_timeout_ms: int
    file_reserved_hours: int
    version: str = "5"
    cq_file_entries: int = CQ_FILE_ENTRIES
    op_window: int = OP_MSG_PULL_NUMS

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}, not {self.version!r}")
        if self.op_window < 1 or self.cq_file_entries < 1:
            raise ValueError("op_window and cq_file_entries must be >= 1")


def java_parse(text: str | None, bounds: tuple[int, int] = INT64) -> int:
    """``Long.parseLong`` (``Integer.parseInt`` with ``INT32``), -1 when it would throw.
    Java's ``Character.digit`` also takes the other Unicode decimal digits of the BMP."""
    if not text:
        return -1
    digits = text[1:] if text[0] in "+-" else text
    # isdecimal: no sign, space or "_" (which int() would take); a Java char is 16 bits.
    if not digits.isdecimal() or not (digits.isascii() or max(digits) <= "\uffff"):
        return -1
    value = int(text)
    return value if bounds[0] <= value <= bounds[1] else -1


def java_long(value: int) -> int:
    """``value`` wrapped to a Java ``long`` (two's complement, 64 bits)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value > INT64[1] else value


def calculate_op_offset(done: list[int], p0: int) -> int:
    """``calculateOpOffset``: from ``p0``, one step per sorted done offset equal to it."""
    offset = p0
    for value in sorted(done):
        if value != offset:
            break
        offset += 1
    return offset


def _mapped(column: Any, parse: Callable[[str], int]) -> list[int | None]:
    """``parse`` of each value of a string column (null stays null), parsed once per
    distinct value: counters and immunities take a handful of values."""
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks() if encoded.num_chunks else pa.array([], encoded.type)
    values = pa.array([parse(v) for v in encoded.dictionary.to_pylist()], pa.int64())
    return values.take(encoded.indices).to_pylist()


def _cut(table: pa.Table, start: int, as_of_ms: int) -> pa.Table:
    """The records at offsets >= ``start`` stored before T, in offset order."""
    kept = pc.and_(
        pc.greater_equal(table["queue_offset"], start),
        pc.less(table["store_timestamp_ms"], as_of_ms),
    )
    return table.filter(kept).sort_by("queue_offset")


class HalfQueue:
    """The half records from h0 (stored before T), then the copies the round appends, as
    parallel lists indexed by row; ``row[offset]`` finds a record."""

    def __init__(self, half: pa.Table, h0: int, as_of_ms: int, settings: BrokerSettings) -> None:
        records = _cut(half, h0, as_of_ms)
        timeout = settings.transaction_timeout_ms

        def immunity_ms(raw: str) -> int:
            seconds = java_parse(raw)
            return timeout if seconds == -1 else java_long(seconds * 1000)

        self.offsets: list[int] = records["queue_offset"].to_pylist()
        self.keys: list[str | None] = records["uniq_key"].to_pylist()
        self.counters = _mapped(records["check_times_raw"], lambda raw: java_parse(raw, INT32))
        self.immunity = _mapped(records["immunity_raw"], immunity_ms)
        self.prepared = _mapped(records["prepared_queue_offset_raw"], java_parse)
        self.born: list[int] = records["born_timestamp_ms"].to_pylist()
        self.store: list[int] = records["store_timestamp_ms"].to_pylist()
        self.originals = len(self.offsets)
        # The stored record each row is (a copy: the stored record it copies).
        self.sources: list[int] = list(self.offsets)
        self.row: dict[int, int] = {}
        for row, offset in enumerate(self.offsets):
            self.row.setdefault(offset, row)  # the caller's records are deduplicated
        self.end = self.offsets[-1] + 1 if self.offsets else h0

    def next_original(self, offset: int) -> int | None:
        """The first record of the queue after ``offset`` (where a pull past a hole goes)."""
        at = bisect_right(self.offsets, offset, hi=self.originals)
        return self.offsets[at] if at < self.originals else None

    def append(self, row: int, counter: int, prepared: int | None, as_of_ms: int) -> int:
        """A copy of ``row`` (renewHalfMessageInner: the same properties with the counter it
        carries, the same born time) stored now; returns its offset."""
        offset = self.end + len(self.offsets) - self.originals
        self.row[offset] = len(self.offsets)
        self.offsets.append(offset)
        self.keys.append(self.keys[row])
        self.sources.append(self.sources[row])
        self.counters.append(counter)
        self.immunity.append(self.immunity[row])
        self.prepared.append(prepared)
        self.born.append(self.born[row])
        self.store.append(as_of_ms)
        return offset


class OpLoader:
    """fillOpRemoveMap: op records from p0 (stored before T), loaded pull by pull into
    ``remove`` (half offset -> op offset), ``pending`` (5.x opMsgMap: op offset -> the
    offsets it still names) and ``done`` (doneOpOffset, a list as in Java)."""

    def __init__(
        self, ops: pa.Table, p0: int, h0: int, as_of_ms: int, settings: BrokerSettings
    ) -> None:
        records = _cut(ops, p0, as_of_ms)
        self.offsets: list[int] = records["queue_offset"].to_pylist()
        self.tags: list[str | None] = records["tags"].to_pylist()
        self.bodies: list[bytes | None] = records["body"].to_pylist()
        self.h0, self.settings = h0, settings
        self.next = p0
        self.end = self.offsets[-1] + 1 if self.offsets else p0
        self.remove: dict[int, int] = {}
        self.pending: dict[int, set[int]] = {}
        self.done: list[int] = []
        self.exhausted = False  # the last pull found nothing (Java: its message list is null)

    def pull(self) -> None:
        """One pull of up to ``op_window`` offsets, cut at the consume-queue file's end."""
        if self.next >= self.end:
            self.exhausted = True
            return
        entries = self.settings.cq_file_entries
        file_end = (self.next // entries + 1) * entries
        stop = min(self.end, self.next + self.settings.op_window, file_end)
        first = bisect_left(self.offsets, self.next)
        for row in range(first, bisect_left(self.offsets, stop)):
            if row == first or self.offsets[row] != self.offsets[row - 1]:
                self._add(self.offsets[row], self.tags[row], self.bodies[row])
        self.next = stop

    def _add(self, op: int, tags: str | None, body: bytes | None) -> None:
        if self.settings.version == "4.9":
            # One decimal per body, parsed before the tag is looked at. (A 4.9 broker throws
            # on an op without a body and ends the whole round; here it names nothing.)
            if body is None or tags != REMOVE_TAG:
                return  # another tag: never done
            named = java_parse(body.decode("utf-8", errors="replace"))
            if named < self.h0:
                self.done.append(op)
            else:
                self.remove[named] = op
            return
        kept = set()
        if body is not None and tags == REMOVE_TAG:
            for item in _java_split(body.decode("utf-8", errors="replace")):
                named = java_parse(item)
                if named >= self.h0:
                    self.remove[named] = op  # a later op naming it replaces an earlier one
                    kept.add(named)
        if kept:
            self.pending[op] = kept
        else:
            self.done.append(op)

    def take(self, half_offset: int) -> int | None:
        """``removeMap.remove(i)``: the op naming ``half_offset``, with its bookkeeping."""
        op = self.remove.pop(half_offset, None)
        if op is None:
            return None
        if self.settings.version == "4.9":
            self.done.append(op)
            return op
        rest = self.pending.get(op)
        if rest is not None:
            rest.discard(half_offset)
            if not rest:
                del self.pending[op]
                self.done.append(op)
        return op

    def take_prepared(self, prepared: int) -> int | None:
        """checkPrepareQueueOffset's lookup: the op is done at once (opMsgMap untouched)."""
        op = self.remove.pop(prepared, None)
        if op is not None:
            self.done.append(op)
        return op


def _java_split(text: str) -> list[str]:
    """``String.split(",")``: no separator gives the text itself; trailing empties go."""
    if "," not in text:
        return [text]
    parts = text.split(",")
    while parts and parts[-1] == "":
        parts.pop()
    return parts
