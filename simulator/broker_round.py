"""The simulator's check round, replayed on an arbitrary store snapshot (the reference model).

``replay_round`` performs one ``TransactionalMessageServiceImpl.check()`` round of a broker
over the decoded half and op queues of a store (queue 0), at an instant ``T``, with the
broker's settings, and returns what the broker does: the check copies, immunity copies and
discards it appends (as multisets on ``(uniq_key, counter)``), and the committed half/op
offsets after it. It is the rule set of ``simulator.simulation`` (``_round``, the
walk into the round's own copies, ``_commit_op_offset``; see ``docs/simulator.md``), written
as a literal per-message loop so that it also runs on stores the simulator did not write:

- ``op_window=None`` is the simulator's round: the whole op queue is loaded before any
  decision. ``op_window=32`` (the broker: ``OP_MSG_PULL_NUMS``, a pull never crosses a
  consume-queue file end) loads op records 32 at a time, and only when a message needs a
  check (RocketMQ #8311), so discards, immunity put-backs and skips are decided on the op
  records loaded so far.
- Numbers are read like the broker reads them: ``Integer.parseInt`` / ``Long.parseLong`` with
  -1 on failure (an unparsable counter makes the copy carry 0), an immunity ``× 1000`` in
  Java ``long`` arithmetic (it wraps).
- ``version="4.9"``: op bodies are one decimal (the whole body is parsed), an op record with
  another tag than ``d`` is never done (the 4.9 stall); ``"5"``: bodies split on ``,``.
  In both, a later op record naming the same half offset replaces the earlier one in
  ``removeMap`` (the earlier is then not done this round: spec C14).

Not shipped with the job: the job never runs this. Decoding is the store reader's
(``connectors.rocketmq.reader.read_batches`` over ``codec``), so there is one decoder.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from connectors.rocketmq.offsets_file import (
    HALF_KEY,
    OFFSETS_RELATIVE_PATH,
    OP_KEY,
    read_consumer_offsets,
)
from schemas.messages import (
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_IMMUNITY_SECONDS,
    PROP_PREPARED_QUEUE_OFFSET,
    PROP_UNIQ_KEY,
    REMOVE_TAG,
)

OP_MSG_PULL_NUMS = 32
VERSIONS = ("5", "4.9")
_INT64 = 1 << 64
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def java_parse(text: str | None, lo: int = _INT64_MIN, hi: int = _INT64_MAX) -> int:
    """``Long.parseLong`` (or ``Integer.parseInt`` with the int range), -1 on failure."""
    if text is None or not text:
        return -1
    digits = text[1:] if text[0] in "+-" else text
    if not digits or not all("0" <= ch <= "9" for ch in digits):
        return -1
    value = int(text)
    return value if lo <= value <= hi else -1


def java_long(value: int) -> int:
    """``value`` wrapped to a Java ``long``."""
    value %= _INT64
    return value - _INT64 if value > _INT64_MAX else value


@dataclass(frozen=True)
class HalfRecord:
    offset: int
    uniq_key: str | None
    check_times_raw: str | None
    immunity_raw: str | None
    prepared_raw: str | None
    born_ms: int
    store_ms: int


@dataclass(frozen=True)
class OpRecord:
    offset: int
    tags: str | None
    body: bytes | None
    store_ms: int = 0


@dataclass(frozen=True)
class Snapshot:
    """Queue 0 of the half and op topics, and the committed offsets (None: no key)."""

    half: dict[int, HalfRecord]
    ops: dict[int, OpRecord]
    half_committed: int | None
    op_committed: int | None
    bad_records: int = 0

    def at(self, as_of_ms: int) -> Snapshot:
        """The records stored before ``as_of_ms`` (the as-of cut), same offsets."""
        return replace(
            self,
            half={k: v for k, v in self.half.items() if v.store_ms < as_of_ms},
            ops={k: v for k, v in self.ops.items() if v.store_ms < as_of_ms},
        )


@dataclass(frozen=True)
class BrokerSettings:
    check_max: int = 15
    transaction_timeout_ms: int = 6000
    file_reserved_hours: int = 72
    version: str = "5"
    cq_file_entries: int = 300_000  # consume-queue entries per file (op pulls stop at a file end)

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}, not {self.version!r}")


@dataclass(frozen=True)
class Entry:
    """One record a round appends (a copy or a discard)."""

    source_offset: int  # the half offset it was made from
    uniq_key: str | None
    counter: int | None  # TRANSACTION_CHECK_TIMES it carries
    reason: str = ""  # discards: check_max | expired; copies: check | immunity
    same_round: bool = False  # made from a copy this round appended


@dataclass
class RoundOutcome:
    checks: list[Entry] = field(default_factory=list)
    immunity: list[Entry] = field(default_factory=list)
    discards: list[Entry] = field(default_factory=list)
    resolved: dict[int, int] = field(default_factory=dict)  # half offset -> op offset
    prepared_skips: list[int] = field(default_factory=list)  # immunity copies skipped
    h0: int = 0
    p0: int = 0
    h1: int = 0
    p1: int = 0
    half_end: int = 0  # end of the half queue before the round
    stop: str = ""  # why the walk stopped
    spin: bool = False  # the broker would spin to its 60 s limit here

    def multiset(self, kind: str) -> Counter:
        return Counter((e.uniq_key, e.counter) for e in getattr(self, kind))


# -- decoding ---------------------------------------------------------------------------------


def load_snapshot(root: str | Path, as_of_ms: int | None = None) -> Snapshot:
    """Queue 0 of the half and op queues of a store, through the store reader (no Spark).
    Records stored at or after ``as_of_ms`` do not exist (the job's as-of cut)."""
    from connectors.rocketmq.reader import StoreSpec, read_batches

    root = Path(root)
    half: dict[int, HalfRecord] = {}
    ops: dict[int, OpRecord] = {}
    bad = 0
    spec = StoreSpec(broker=root.name or "broker", root=root)
    for batch in read_batches([spec], topics=(HALF_TOPIC, OP_TOPIC)):
        for row in batch.to_pylist():
            if row["reason"] is not None:
                bad += 1
                continue
            if row["queue_id"] != 0:
                continue
            offset = int(row["queue_offset"])
            if row["topic"] == HALF_TOPIC:
                if offset in half:  # the smaller commit-log offset wins (spec section 7)
                    continue
                props = dict(row["properties"] or [])
                half[offset] = HalfRecord(
                    offset,
                    props.get(PROP_UNIQ_KEY),
                    props.get(PROP_CHECK_TIMES),
                    props.get(PROP_IMMUNITY_SECONDS),
                    props.get(PROP_PREPARED_QUEUE_OFFSET),
                    int(row["born_timestamp_ms"]),
                    int(row["store_timestamp_ms"]),
                )
            elif offset not in ops:
                ops[offset] = OpRecord(
                    offset, row["tags"], row["body"], int(row["store_timestamp_ms"])
                )
    table = read_consumer_offsets(root / OFFSETS_RELATIVE_PATH) or {}
    snap = Snapshot(half, ops, table.get(HALF_KEY, {}).get(0), table.get(OP_KEY, {}).get(0), bad)
    return snap if as_of_ms is None else snap.at(as_of_ms)


def op_items(op: OpRecord, version: str) -> list[int] | None:
    """Half offsets an op record names as the broker parses them; None: a tag other than
    ``d`` (4.9 never marks it done)."""
    if op.body is None:
        return []
    if op.tags != REMOVE_TAG:
        return None if version == "4.9" else []
    text = op.body.decode("utf-8", errors="replace")
    if version == "4.9":
        return [java_parse(text)]
    parts = text.split(",")
    while len(parts) > 1 and parts[-1] == "":  # Java's split drops trailing empty strings
        parts.pop()
    return [java_parse(part) for part in parts]


# -- the round --------------------------------------------------------------------------------


class _OpLoader:
    """fillOpRemoveMap: loads op records window by window into removeMap / opMsgMap."""

    def __init__(self, snap: Snapshot, p0: int, h0: int, settings: BrokerSettings, window):
        self.snap, self.h0, self.settings, self.window = snap, h0, settings, window
        self.next = p0
        self.end = max(snap.ops) + 1 if snap.ops else p0
        self.remove: dict[int, int] = {}
        self.pending: dict[int, set[int]] = {}
        self.done: list[int] = []
        self.exhausted = False

    def pull(self) -> None:
        if self.next >= self.end:
            self.exhausted = True
            return
        if self.window is None:
            stop = self.end
        else:
            file_end = (self.next // self.settings.cq_file_entries + 1) * (
                self.settings.cq_file_entries
            )
            stop = min(self.end, self.next + self.window, file_end)
        for offset in range(self.next, stop):
            op = self.snap.ops.get(offset)
            if op is not None:
                self._add(op)
        self.next = stop

    def _add(self, op: OpRecord) -> None:
        items = op_items(op, self.settings.version)
        if items is None:
            return  # 4.9: another tag; never done
        if self.settings.version == "4.9":
            for item in items:
                if item < self.h0:
                    self.done.append(op.offset)
                else:
                    self.remove[item] = op.offset
            return
        kept = {item for item in items if item >= self.h0}
        for item in items:
            if item >= self.h0:
                self.remove[item] = op.offset
        if kept:
            self.pending[op.offset] = kept
        else:
            self.done.append(op.offset)

    def take(self, half_offset: int) -> int | None:
        """removeMap.remove(i), with the op's bookkeeping."""
        op_offset = self.remove.pop(half_offset, None)
        if op_offset is None:
            return None
        if self.settings.version == "4.9":
            self.done.append(op_offset)
        else:
            rest = self.pending.get(op_offset)
            if rest is not None:
                rest.discard(half_offset)
                if not rest:
                    del self.pending[op_offset]
                    self.done.append(op_offset)
        return op_offset


def calculate_op_offset(done: Iterable[int], p0: int) -> int:
    """The broker's calculateOpOffset: a gap-free run of done op offsets from ``p0``."""
    new = p0
    for value in sorted(done):
        if value != new:
            break
        new += 1
    return new


def _parses(text: str, bits: int) -> bool:
    limit = 1 << (bits - 1)
    return java_parse(text, -limit, limit - 1) != -1 or text.lstrip("+") == "-1"


def _immunity_ms(raw: str, timeout: int, java: bool = True) -> int:
    value = java_parse(raw)
    if value == -1:
        return timeout
    if java:
        return java_long(value * 1000)
    product = value * 1000  # the spec: a product beyond 64 bits means the default
    return product if _INT64_MIN <= product <= _INT64_MAX else timeout


def job_op_offset(snap: Snapshot, p0: int, h0: int, h1: int) -> int:
    """The spec's p1: the first op offset >= p0 that is missing or names an offset >= h0
    that is not < h1 (5.x parsing of bodies; spec section 3)."""
    end = max(snap.ops) + 1 if snap.ops else p0
    p = p0
    while p < end:
        op = snap.ops.get(p)
        if op is None:
            return p
        items = op_items(op, "5") if op.tags == REMOVE_TAG else []
        if any(item >= h0 and not item < h1 for item in items or []):
            return p
        p += 1
    return max(p, p0)


@dataclass(frozen=True)
class Variant:
    """Switches that turn the broker's round, one difference by design at a time, into the
    job's prediction (``tests/broker`` names each difference by the switch that removes it).

    ``op_window``: op records loaded per pull (32: the broker, #8311; None: all at once, the
    simulator). ``also_resolved``: half offsets resolved besides removeMap (the job's spec
    rules 2-3). ``walk_own_copies``: the walk goes on into the copies this round appended
    (the broker; the job appends none). ``winner_done``: an op record is done only where
    it is removeMap's entry for each offset it names, and a 4.9 op of another tag never is
    (the broker, spec C14); False: the job's rule (every offset it names >= h0 is < h1).
    ``java_counter`` / ``java_immunity``: numbers read like the broker (an unparsable counter
    is -1, so the copy carries 0; immunity × 1000 wraps) or like the spec."""

    op_window: int | None = OP_MSG_PULL_NUMS
    also_resolved: frozenset[int] = frozenset()
    walk_own_copies: bool = True
    winner_done: bool = True
    java_counter: bool = True
    java_immunity: bool = True
    # The walk reaches a copy appended this round only once the store's dispatch thread has
    # written its consume-queue entry; a real broker can find the k-th copy not yet there
    # and stop (NO_NEW_MSG): a timing the snapshot cannot tell. None: every copy is there.
    own_copies_limit: int | None = None


BROKER = Variant()
SIMULATOR = Variant(op_window=None)


def replay_round(
    snap: Snapshot,
    as_of_ms: int,
    settings: BrokerSettings,
    op_window: int | None = OP_MSG_PULL_NUMS,
    variant: Variant | None = None,
) -> RoundOutcome:
    """One check round at ``as_of_ms`` (``now`` of every age test and the round's start).
    ``variant`` (default: the broker with ``op_window``) switches differences by design."""
    v = variant if variant is not None else Variant(op_window=op_window)
    half = snap.half
    smallest = min(half) if half else 0
    h0 = snap.half_committed if snap.half_committed is not None else smallest
    p0 = snap.op_committed if snap.op_committed is not None else (min(snap.ops) if snap.ops else 0)
    end = max(half) + 1 if half else h0
    out = RoundOutcome(h0=h0, p0=p0, half_end=end)
    ops = _OpLoader(snap, p0, h0, settings, v.op_window)
    ops.pull()
    appended: dict[int, tuple[HalfRecord, bool]] = {}  # this round's copies, by offset
    next_offset = end
    reserved = settings.file_reserved_hours * 3_600_000
    i, null_count = h0, 1
    while True:
        op_offset = ops.take(i)
        if op_offset is not None or i in v.also_resolved:
            out.resolved[i] = -1 if op_offset is None else op_offset
            i += 1
            continue
        msg = half.get(i)
        fresh = False
        if (
            msg is None
            and i in appended
            and v.walk_own_copies
            and (v.own_copies_limit is None or i - end < v.own_copies_limit)
        ):
            msg, fresh = appended[i][0], True
        if msg is None:
            if null_count > 1 or i >= next_offset:
                out.stop = "end"
                break
            null_count += 1
            later = [k for k in half if k > i]
            if not later:
                out.stop = "end"
                break
            i = min(later)
            continue
        # needDiscard / needSkip
        counter_raw = msg.check_times_raw
        counter = 1 if counter_raw is None else java_parse(counter_raw, _INT32_MIN, _INT32_MAX)
        if not v.java_counter and counter_raw is not None and not _parses(counter_raw, 32):
            counter_raw, counter = None, 1  # the spec: unparsable counts as absent
        age = as_of_ms - msg.born_ms
        if counter_raw is not None and counter >= settings.check_max:
            out.discards.append(Entry(i, msg.uniq_key, counter, "check_max", fresh))
            i += 1
            continue
        bumped = counter if counter_raw is None else counter + 1
        if age > reserved:
            out.discards.append(Entry(i, msg.uniq_key, bumped, "expired", fresh))
            i += 1
            continue
        if fresh or msg.store_ms >= as_of_ms:
            out.stop = "fresh"
            break
        immunity = settings.transaction_timeout_ms
        if msg.immunity_raw is not None:
            immunity = _immunity_ms(
                msg.immunity_raw, settings.transaction_timeout_ms, v.java_immunity
            )
            if age < immunity:
                prepared = msg.prepared_raw
                if prepared is not None and java_parse(prepared) == -1:
                    pass  # checkPrepareQueueOffset returns false: falls through
                else:
                    if prepared is not None:
                        op_offset = ops.remove.pop(java_parse(prepared), None)
                        if op_offset is not None:
                            ops.done.append(op_offset)
                            out.prepared_skips.append(i)
                            i += 1
                            continue
                    copy_prepared = prepared if prepared is not None else str(i)
                    copy = HalfRecord(
                        next_offset,
                        msg.uniq_key,
                        str(bumped),
                        msg.immunity_raw,
                        copy_prepared,
                        msg.born_ms,
                        as_of_ms,
                    )
                    appended[next_offset] = (copy, True)
                    next_offset += 1
                    out.immunity.append(Entry(i, msg.uniq_key, bumped, "immunity"))
                    i += 1
                    continue
        elif 0 <= age < immunity:
            out.stop = "too_young"
            break
        # isNeedCheck: with ops still to load, load them first (the same i is re-read)
        if not ops.exhausted:
            ops.pull()
            continue
        if not (age > immunity or age <= -1):
            out.stop = "spin"  # the broker re-pulls ops until its 60 s limit
            out.spin = True
            break
        copy = HalfRecord(
            next_offset,
            msg.uniq_key,
            str(bumped),
            msg.immunity_raw,
            msg.prepared_raw,
            msg.born_ms,
            as_of_ms,
        )
        appended[next_offset] = (copy, True)
        next_offset += 1
        out.checks.append(Entry(i, msg.uniq_key, bumped, "check"))
        i += 1
    out.h1 = i
    out.p1 = calculate_op_offset(ops.done, p0) if v.winner_done else job_op_offset(snap, p0, h0, i)
    return out
