"""The broker's own next check round over one queue: ``TransactionalMessageServiceImpl.check()``
as the broker will run it, one (broker, queue) at a time, over pyarrow data (no Spark).

The job's round (``transforms.round``) predicts what is *really* pending; this walk predicts
what the broker itself will do in its next round, with the rules the job's round documents as
differences by design (spec section 5):

- removeMap: an op record names half offsets; the walk matches exact offsets only. Items
  below the committed half offset h0 are dropped at load (5.x: the op is done when none is
  left; 4.9: the op is done). A later op naming the same offset replaces the earlier one,
  which is then not done this round.
- Op records are loaded in pulls of ``op_window`` (OP_MSG_PULL_NUMS = 32) that never cross a
  consume-queue file end: one pull before the walk, the next only when a record reaches the
  check decision with pulls left (RocketMQ #8311: discards, immunity put-backs and the stop
  tests are decided on the op records loaded so far).
- Per record, in the broker's order: removeMap -> needDiscard (counter at check_max) ->
  needSkip (born more than file_reserved_hours ago) -> fresh stop (stored at or after T) ->
  immunity: put back a copy, or resolved through removeMap by the prepared offset
  (checkPrepareQueueOffset), else the too-young stop -> the check decision (isNeedCheck:
  the op records are pulled to their end first, except for a record born after T, which
  is checked at once). A missing record is passed once; the second miss ends the walk.
- The copies the round appends (check and immunity copies, with their counters) are records
  of the queue from the half queue's end on, walked like any other: each is fresh, unless
  its counter has reached check_max (discarded in the same round).
- Numbers are parsed like Java's ``Integer.parseInt`` / ``Long.parseLong`` with -1 on failure
  (an unparsable counter makes the copy carry 0); an immunity × 1000 wraps as a Java long.
- 4.9: an op body is one decimal, an op record with another tag than ``d`` is never done;
  5.x: bodies are split on ``,``.
- After the walk: h1 is the first offset not processed; p1 is ``calculateOpOffset``, the
  gap-free run of done op offsets from p0 (a duplicate in the done list ends it, as in Java).

What the walk cannot know offline, and assumes: every pull returns its 32 records (a broker
whose op records are cold on disk pulls 8), the round does not reach the broker's 60 s limit
per queue (the ``spin`` stop is where the broker would spin until that limit), and every
appended copy is already dispatched to the consume queue when the walk reaches it.
Sequential by nature: one call per queue (``transforms.broker_round`` runs one per task).
What the broker holds meanwhile (the half queue with its copies, removeMap and the op pulls,
Java's number parsing) is ``transforms.broker_state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from schemas.outputs import CHECK, DISCARD_CHECK_MAX, DISCARD_EXPIRED, RESOLVED
from transforms.broker_state import BrokerSettings, HalfQueue, OpLoader, calculate_op_offset

MS_PER_HOUR = 3_600_000

# The broker's actions, one row each (``ACTIONS``): an offset resolved through removeMap; a
# record resolved through removeMap by its prepared offset (no copy); a check (a copy is
# appended and the producer asked); an immunity put-back (a copy, no check); the discards.
IMMUNITY_PUT_BACK = "immunity_put_back"
RESOLVED_BY_PREPARED = "resolved_by_prepared"
BROKER_ACTIONS = (
    RESOLVED,
    RESOLVED_BY_PREPARED,
    CHECK,
    IMMUNITY_PUT_BACK,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
)
# Why the walk stopped: no record at the offset (the queue's end, or a second hole), a
# record stored at or after T (a copy of this round, normally), a record too young to check,
# or a record the broker can neither check nor pass (it re-pulls ops until its 60 s limit).
STOP_END, STOP_FRESH, STOP_TOO_YOUNG, STOP_SPIN = "end", "fresh", "too_young", "spin"
STOPS = (STOP_END, STOP_FRESH, STOP_TOO_YOUNG, STOP_SPIN)

# Rows of ``walk_queue``'s action table, in the order the broker acts.
ACTIONS = pa.schema(
    [
        pa.field("step", pa.int64()),  # 0, 1, ... within the queue
        pa.field("half_offset", pa.int64()),  # the offset the broker read
        pa.field("uniq_key", pa.string()),
        pa.field("action", pa.string()),
        pa.field("counter", pa.int32()),  # TRANSACTION_CHECK_TIMES the copy/discard carries
        pa.field("op_offset", pa.int64()),  # the op record that resolved it (resolved*)
        pa.field("copy_offset", pa.int64()),  # where the appended copy is (check, put-back)
        pa.field("own_copy", pa.bool_()),  # the record read is a copy this round appended
        # The stored record the action is about: ``half_offset``, or for a copy this round
        # appended the stored record it copies (its fields are that record's).
        pa.field("record_offset", pa.int64()),
        # The copy a check or put-back appends is discarded later in this same round.
        pa.field("copy_discarded", pa.bool_()),
    ]
)

_ADVANCE, _AGAIN = "advance", "again"  # what a record's decision does besides stopping


@dataclass(frozen=True)
class WalkEnd:
    """Where the round leaves the queue: the committed offsets after it (h1, p1), the copies
    it appended (check copies and immunity put-backs, from ``half_end`` on), why it stopped
    (``STOPS``) and ``op_next``, the op offset its next pull would have started at."""

    h0: int
    p0: int
    h1: int
    p1: int
    half_end: int
    copies: int
    stop: str
    op_next: int


class _Walk:
    """The main loop of check() for one queue; ``rows`` collects ``ACTIONS`` columns."""

    def __init__(
        self, half: HalfQueue, ops: OpLoader, h0: int, as_of_ms: int, s: BrokerSettings
    ) -> None:
        self.half, self.ops, self.as_of_ms, self.s = half, ops, as_of_ms, s
        self.reserved_ms = s.file_reserved_hours * MS_PER_HOUR
        self.i = h0
        self.null_count = 1
        self.rows: list[tuple[Any, ...]] = []  # ``ACTIONS`` rows

    def run(self) -> str:
        """Walk from h0 until a stop; returns the stop (``STOPS``); ``self.i`` is h1."""
        while True:
            op = self.ops.take(self.i)
            if op is not None:
                self._emit(RESOLVED, self.half.row.get(self.i), op_offset=op)
                self.i += 1
                continue
            row = self.half.row.get(self.i)
            if row is None:
                if not self._past_hole():
                    return STOP_END
                continue
            outcome = self._record(row)
            if outcome == _ADVANCE:
                self.i += 1
            elif outcome != _AGAIN:
                return outcome

    def _past_hole(self) -> bool:
        """No record at i: the second such miss, or the queue's end, stops the walk; the
        first miss inside the queue goes on at the next record (the pull's next offset)."""
        beyond = self.half.end + len(self.half.offsets) - self.half.originals
        if self.null_count > 1 or self.i >= beyond:
            return False
        self.null_count += 1
        later = self.half.next_original(self.i)
        if later is None:
            return False
        self.i = later
        return True

    def _record(self, row: int) -> str:
        """needDiscard, needSkip, the fresh stop, then the immunity and check decisions."""
        h, s = self.half, self.s
        counter = h.counters[row]
        if counter is not None and counter >= s.check_max:
            self._emit(DISCARD_CHECK_MAX, row, counter=counter)
            return _ADVANCE
        bumped = 1 if counter is None else counter + 1
        age = self.as_of_ms - h.born[row]
        if age > self.reserved_ms:
            self._emit(DISCARD_EXPIRED, row, counter=bumped)
            return _ADVANCE
        if h.store[row] >= self.as_of_ms:
            return STOP_FRESH
        immunity = h.immunity[row]
        if immunity is None:
            if 0 <= age < s.transaction_timeout_ms:
                return STOP_TOO_YOUNG
            return self._need_check(row, bumped, age, s.transaction_timeout_ms)
        if age < immunity and self._immune(row, bumped):
            return _ADVANCE
        return self._need_check(row, bumped, age, immunity)

    def _immune(self, row: int, bumped: int) -> bool:
        """checkPrepareQueueOffset: False when the prepared offset does not parse (the
        record falls through to the check decision); else resolved by the op naming the
        prepared offset, or put back (the copy keeps the prepared offset, or gets i)."""
        prepared = self.half.prepared[row]
        if prepared == -1:
            return False
        if prepared is not None:
            op = self.ops.take_prepared(prepared)
            if op is not None:
                self._emit(RESOLVED_BY_PREPARED, row, op_offset=op)
                return True
        keep = prepared if prepared is not None else self.i
        copy = self.half.append(row, bumped, keep, self.as_of_ms)
        self._emit(IMMUNITY_PUT_BACK, row, counter=bumped, copy_offset=copy)
        return True

    def _need_check(self, row: int, bumped: int, age: int, immunity: int) -> str:
        """isNeedCheck: a record born in the future is checked at once; otherwise the op
        records are pulled to their end first (the same offset is read again after each
        pull), then a record past its immunity is checked. The third clause (the last op
        pulled was born more than the timeout after the round's start) cannot hold for op
        records stored before T."""
        if age <= -1 or (self.ops.exhausted and age > immunity):
            copy = self.half.append(row, bumped, self.half.prepared[row], self.as_of_ms)
            self._emit(CHECK, row, counter=bumped, copy_offset=copy)
            return _ADVANCE
        if not self.ops.exhausted:
            self.ops.pull()
            return _AGAIN
        return STOP_SPIN

    def _emit(
        self,
        action: str,
        row: int | None,
        *,
        counter: int | None = None,
        op_offset: int | None = None,
        copy_offset: int | None = None,
    ) -> None:
        own = row is not None and row >= self.half.originals
        key = None if row is None else self.half.keys[row]
        source = None if row is None else self.half.sources[row]
        self.rows.append(
            (len(self.rows), self.i, key, action, counter, op_offset, copy_offset, own, source)
        )

    def table(self) -> pa.Table:
        """``rows`` as ``ACTIONS``, with ``copy_discarded`` from the own copies discarded."""
        names = [name for name in ACTIONS.names if name != "copy_discarded"]  # set below
        by_column = list(zip(*self.rows, strict=True)) or [()] * len(names)
        columns = dict(zip(names, by_column, strict=True))
        discarded = {
            offset
            for offset, action, own in zip(
                columns["half_offset"], columns["action"], columns["own_copy"], strict=True
            )
            if own and action in (DISCARD_CHECK_MAX, DISCARD_EXPIRED)
        }
        columns["copy_discarded"] = tuple(copy in discarded for copy in columns["copy_offset"])
        return pa.table(columns, schema=ACTIONS)


def walk_queue(
    half: pa.Table,
    ops: pa.Table,
    h0: int,
    p0: int,
    as_of_ms: int,
    settings: BrokerSettings,
) -> tuple[pa.Table, WalkEnd]:
    """The broker's next check round over one (broker, queue) at T = ``as_of_ms``.

    Args:
        half: the queue's half records (deduplicated: one per offset), at least those from
            h0 on: ``queue_offset``, ``uniq_key``, ``check_times_raw``, ``immunity_raw``,
            ``prepared_queue_offset_raw`` (raw property text, null when absent),
            ``born_timestamp_ms``, ``store_timestamp_ms``. Other columns are ignored.
        ops: the queue's op records, at least those from p0 on: ``queue_offset``, ``tags``,
            ``body`` (binary), ``store_timestamp_ms``.
        h0, p0: the committed half and op offsets the round starts from.
        as_of_ms: T, the round's start and ``now`` of every age test; records stored at or
            after T do not exist (the as-of cut).
        settings: the broker's configuration.

    Returns:
        The actions (``ACTIONS`` rows, in the broker's order) and the queue's ``WalkEnd``.
    """
    queue = HalfQueue(half, h0, as_of_ms, settings)
    loader = OpLoader(ops, p0, h0, as_of_ms, settings)
    loader.pull()
    walk = _Walk(queue, loader, h0, as_of_ms, settings)
    stop = walk.run()
    end = WalkEnd(
        h0=h0,
        p0=p0,
        h1=walk.i,
        p1=calculate_op_offset(loader.done, p0),
        half_end=queue.end,
        copies=len(queue.offsets) - queue.originals,
        stop=stop,
        op_next=loader.next,
    )
    return walk.table(), end
