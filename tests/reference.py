"""A pure-Python reference of the reconciliation round, for tests only.

It restates ``docs/spec/reconcile.md`` sections 1, 3, 4 and 5 (plus the row contents
of section 6 and the bad records of section 7 that the round itself produces) as plainly as
possible: no Spark, no cleverness, one queue at a time, walking the queue in offset order.
Speed does not matter; every step should be checkable against a sentence of the spec.

Input records are dicts with the columns of ``schemas.messages.SOURCED_MESSAGE`` (see
``tests.transforms.builders``); committed offsets are ``(broker, topic, queue_id, offset)``
tuples. The result mirrors the output tables as lists of dicts.

Decisions taken where the spec leaves room (agreed with the lead):
- rule 3 is scoped to (broker, queue_id);
- one bad record per unparsable op item; only ``d`` op records stored before ``T`` are
  examined; property bad records only for half records stored before ``T`` that won the
  deduplication; an immunity property is never a bad record (unparsable, or overflowing
  when multiplied by 1000: it means the transaction timeout, section 5); a
  missing UNIQ_KEY or PGROUP is not a bad record;
- a deduplication loser is a bad record with its own source/position; ties in
  commitlog_offset are broken by (source, position), the smallest wins;
- the queue end, like everything after the deduplication, uses the winners only
  (duplicates are "settled ... before the as-of cut", section 7);
- run_summary has a row per (broker, queue_id) with records of either topic (any store
  time) or a committed offset of either topic; its ``bad_records`` counts the bad records
  (of both topics, including reader ones passed in) with that broker and queue_id.
"""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.messages import (
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_IMMUNITY_SECONDS,
    PROP_KEYS,
    PROP_PREPARED_QUEUE_OFFSET,
    PROP_PRODUCER_GROUP,
    PROP_REAL_QUEUE_ID,
    PROP_REAL_TOPIC,
    PROP_TRANSACTION_ID,
    PROP_UNIQ_KEY,
    REMOVE_TAG,
    TRANS_GROUP,
)
from schemas.outputs import (
    CHECK,
    CLASSES,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    NOT_REACHED,
    REASON_CHECK_MAX,
    REASON_EXPIRED,
    RESOLVED,
    TOO_YOUNG,
)
from transforms.params import RoundParams

Record = Mapping[str, Any]

# ---------------------------------------------------------------------------------------
# Numbers: Java's Long.parseLong / Integer.parseInt, restricted to ASCII digits (section 4).
# Python's int() is far more lenient (spaces, underscores, Unicode digits): never use it on
# raw text without the pattern check first.

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")


class _Unparsable:
    def __repr__(self) -> str:
        return "UNPARSABLE"


UNPARSABLE: Any = _Unparsable()


def parse_long(text: str | None, lo: int = INT64_MIN, hi: int = INT64_MAX) -> Any:
    """``None`` for ``None``; the value when ``text`` is a Java long in [lo, hi]; else UNPARSABLE."""
    if text is None:
        return None
    if _JAVA_INTEGER.fullmatch(text) is None:
        return UNPARSABLE
    value = int(text)
    return value if lo <= value <= hi else UNPARSABLE


def parse_int(text: str | None) -> Any:
    """Like :func:`parse_long` within the signed 32-bit range."""
    return parse_long(text, INT32_MIN, INT32_MAX)


def immunity_ms(raw: str | None, transaction_timeout_ms: int) -> int:
    """Effective immunity (section 5): raw x 1000 when it parses, is not -1 and fits in 64
    bits; otherwise the transaction timeout (also when the property is absent)."""
    seconds = parse_long(raw)
    if seconds is None or seconds is UNPARSABLE or seconds == -1:
        return transaction_timeout_ms
    product = seconds * 1000
    if not INT64_MIN <= product <= INT64_MAX:
        return transaction_timeout_ms
    return product


def offset_msg_id(store_host: str, commitlog_offset: int) -> str:
    """Upper-case hex of address bytes (4 or 16) + port (int32) + commit-log offset (int64)."""
    host, _, port = store_host.rpartition(":")
    address = ipaddress.ip_address(host.strip("[]"))
    raw = (
        address.packed
        + int(port).to_bytes(4, "big", signed=True)
        + commitlog_offset.to_bytes(8, "big", signed=True)
    )
    return raw.hex().upper()


# ---------------------------------------------------------------------------------------
# Bad-record reasons. The texts follow the lead's wording; tests compare only the kind.

KIND_DUPLICATE = "duplicate"
KIND_OP_BODY = "op_body"
PROPERTY_KINDS = (
    PROP_CHECK_TIMES,
    PROP_REAL_QUEUE_ID,
    PROP_PREPARED_QUEUE_OFFSET,
)


def reason_kind(reason: str | None) -> str:
    """The coarse kind of a bad-record reason: duplicate, op_body, or the property name."""
    text = reason or ""
    if "duplicate" in text.lower():
        return KIND_DUPLICATE
    if "op body" in text.lower():
        return KIND_OP_BODY
    for name in PROPERTY_KINDS:
        if name in text:
            return name
    return f"other: {text}"


def _bad(record: Record, reason: str) -> dict[str, Any]:
    return {
        "broker": record["broker"],
        "source": record["source"],
        "position": record["position"],
        "topic": record["topic"],
        "queue_id": record["queue_id"],
        "queue_offset": record["queue_offset"],
        "reason": reason,
        "raw_hex": None,
    }


# ---------------------------------------------------------------------------------------
# Result


@dataclass
class QueueSummary:
    broker: str
    queue_id: int
    h0: int
    h1: int
    h_safe: int
    p0: int
    p1: int
    p_safe: int
    half_committed: int | None
    op_committed: int | None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    bad_records: int = 0
    warnings: list[str] = field(default_factory=list)
    offset_hold: str | None = None


@dataclass
class RoundResult:
    check_requests: list[dict[str, Any]] = field(default_factory=list)
    discards: list[dict[str, Any]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)
    consume_offsets: list[dict[str, Any]] = field(default_factory=list)
    summaries: dict[tuple[str, int], QueueSummary] = field(default_factory=dict)
    bad_records: list[dict[str, Any]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------
# Section 7: duplicates are settled among all readable records, before the as-of cut.


def settle_duplicates(records: Iterable[Record]) -> tuple[list[Record], list[dict[str, Any]]]:
    """Keep, per (broker, topic, queue_id, queue_offset), the record with the smallest
    commitlog_offset (ties: smallest (source, position)); the others are bad records."""
    slots: dict[tuple[Any, ...], list[Record]] = defaultdict(list)
    for record in records:
        slots[
            (record["broker"], record["topic"], record["queue_id"], record["queue_offset"])
        ].append(record)
    winners: list[Record] = []
    bad: list[dict[str, Any]] = []
    for slot in slots.values():
        ranked = sorted(slot, key=lambda r: (r["commitlog_offset"], r["source"], r["position"]))
        winners.append(ranked[0])
        for loser in ranked[1:]:
            bad.append(
                _bad(
                    loser,
                    f"duplicate queue offset {loser['queue_offset']} (kept commitlog offset {ranked[0]['commitlog_offset']})",
                )
            )
    return winners, bad


# ---------------------------------------------------------------------------------------
# Section 1: where a queue starts.


def start_offset(
    committed: int | None, all_offsets: list[int], offsets_before_t: list[int], what: str
) -> tuple[int, str | None]:
    """h0 (or p0) after the rules of section 1, and the warning when one was corrected."""
    if not all_offsets:  # no readable record: nothing to correct against
        return (committed if committed is not None else 0), None
    smallest = min(all_offsets)
    end = max(offsets_before_t) + 1 if offsets_before_t else smallest
    if committed is None:
        return smallest, None
    if committed < smallest:
        return (
            smallest,
            f"{what}: committed offset {committed} is below the smallest available offset {smallest}; starting at {smallest}",
        )
    if committed > end:
        return (
            end,
            f"{what}: committed offset {committed} is beyond the queue end {end}; starting at {end}",
        )
    return committed, None


def queue_end(all_offsets: list[int], offsets_before_t: list[int], start: int) -> int:
    """1 + the largest offset stored before T; the smallest available offset when none is;
    the start itself when the queue has no readable record."""
    if not all_offsets:
        return start
    if not offsets_before_t:
        return min(all_offsets)
    return max(offsets_before_t) + 1


# ---------------------------------------------------------------------------------------
# Section 3: op bodies.


def op_items(record: Record) -> tuple[list[int], list[str]]:
    """(named half offsets, unparsable items) of an op record.

    Bytes that are not UTF-8 decode to U+FFFD, as Java's decoder does, so their item is
    unparsable: a bad record, never a failed run (section 7)."""
    if record["tags"] != REMOVE_TAG or record["body"] is None:
        return [], []
    named: list[int] = []
    unparsable: list[str] = []
    for item in bytes(record["body"]).decode("utf-8", errors="replace").split(","):
        if item == "":
            continue
        value = parse_long(item)
        if value is UNPARSABLE:
            unparsable.append(item)
        else:
            named.append(value)
    return named, unparsable


# ---------------------------------------------------------------------------------------
# Half record fields (section 2) with their property problems (section 7).


def half_properties(record: Record) -> dict[str, str]:
    """The record's properties without empty values: "a segment with an empty name or empty
    value is ignored" (section 2), so an empty value is an absent property, whatever the
    source."""
    return {name: value for name, value in (record["properties"] or {}).items() if name and value}


@dataclass
class Half:
    record: Record
    offset: int
    uniq_key: str | None
    check_times: int | None  # null when absent or unparsable
    immunity_raw: str | None
    immunity_ms: int
    prepared_queue_offset: int | None
    real_queue_id: int | None
    age_ms: int
    problems: list[str]


def decode_half(record: Record, params: RoundParams) -> Half:
    properties = half_properties(record)
    problems: list[str] = []

    def parsed(name: str, parser: Any) -> Any:
        value = parser(properties.get(name))
        if value is UNPARSABLE:
            problems.append(f"unparsable {name} {properties[name]!r}")
            return None
        return value

    check_times = parsed(PROP_CHECK_TIMES, parse_int)
    prepared = parsed(PROP_PREPARED_QUEUE_OFFSET, parse_long)
    real_queue_id = parsed(PROP_REAL_QUEUE_ID, parse_int)
    raw_immunity = properties.get(PROP_IMMUNITY_SECONDS)
    return Half(
        record=record,
        offset=record["queue_offset"],
        uniq_key=properties.get(PROP_UNIQ_KEY),
        check_times=check_times,
        immunity_raw=raw_immunity,
        immunity_ms=immunity_ms(raw_immunity, params.transaction_timeout_ms),
        prepared_queue_offset=prepared,
        real_queue_id=real_queue_id,
        age_ms=params.as_of_ms - record["born_timestamp_ms"],
        problems=problems,
    )


def classify(half: Half, params: RoundParams) -> str:
    """The first class of section 5's table that applies to an unresolved record."""
    if half.check_times is not None and half.check_times >= params.check_max:
        return DISCARD_CHECK_MAX
    if half.age_ms > params.reserved_ms:
        return DISCARD_EXPIRED
    if half.immunity_raw is not None and half.age_ms < half.immunity_ms:
        return IMMUNE
    if half.immunity_raw is None and 0 <= half.age_ms < params.transaction_timeout_ms:
        return TOO_YOUNG
    return CHECK


def counter_after(half: Half, status: str) -> int | None:
    """check_times in the output rows: the counter after this round's effect."""
    if status in (DISCARD_EXPIRED, IMMUNE, CHECK):
        return 1 if half.check_times is None else half.check_times + 1
    return half.check_times  # discard_check_max, too_young, not_reached: unchanged


def half_row(half: Half, params: RoundParams, check_times: int | None) -> dict[str, Any]:
    record = half.record
    properties = half_properties(record)
    return {
        "broker": record["broker"],
        "queue_id": record["queue_id"],
        "half_offset": half.offset,
        "commitlog_offset": record["commitlog_offset"],
        "offset_msg_id": offset_msg_id(record["store_host"], record["commitlog_offset"]),
        "uniq_key": half.uniq_key,
        "producer_group": properties.get(PROP_PRODUCER_GROUP),
        "real_topic": properties.get(PROP_REAL_TOPIC),
        "real_queue_id": half.real_queue_id,
        "born_timestamp_ms": record["born_timestamp_ms"],
        "store_timestamp_ms": record["store_timestamp_ms"],
        "age_ms": half.age_ms,
        "check_times": check_times,
        "immunity_ms": half.immunity_ms,
        "keys": [key for key in (properties.get(PROP_KEYS) or "").split(" ") if key],
        "tags": record["tags"],
        "transaction_id": properties.get(PROP_TRANSACTION_ID),
        "born_host": record["born_host"],
        "born_at": instant(record["born_timestamp_ms"]),
        "stored_at": instant(record["store_timestamp_ms"]),
        "as_of": instant(params.as_of_ms),
        "run_id": params.run_id,
        "as_of_ms": params.as_of_ms,
    }


_MIN_MS, _MAX_MS = -62_135_596_800_000, 253_402_300_799_999  # years 1 to 9999


def instant(ms: int) -> datetime | None:
    """An epoch-ms time as an aware UTC datetime; None outside what a timestamp holds."""
    if not _MIN_MS <= ms <= _MAX_MS:
        return None
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def forecast(
    rows: list[dict[str, Any]], stopped: bool, params: RoundParams
) -> dict[int, tuple[int, int | None]]:
    """Per half offset of one queue's unresolved rows: (checks_left, discard_at_ms), the
    broker's next rounds played out with nobody answering."""
    T, interval = params.as_of_ms, params.check_interval_ms
    # When the walk did not stop, the broker's loop goes on into this round's copies in
    # the order it appended them: it discards each copy at the maximum, and the first
    # copy below it is fresh and ends the loop.
    reached: set[int] = set()
    if not stopped:
        for row in sorted(rows, key=lambda r: r["half_offset"]):
            if row["status"] not in (CHECK, IMMUNE):
                continue
            if row["check_times"] < params.check_max:
                break
            reached.add(row["half_offset"])
    result = {}
    for row in rows:
        offset, counter = row["half_offset"], row["check_times"]
        if row["status"] in (DISCARD_CHECK_MAX, DISCARD_EXPIRED):
            result[offset] = (0, T)
            continue
        left = max(0, params.check_max - (counter or 0))
        left = left if left <= INT32_MAX else None  # a garbage counter: more than an int
        if offset in reached:
            result[offset] = (left, T)
            continue
        # Round k (at T + k x interval) compares counter + k - 1 with the maximum; a
        # record without a counter gets 1 in round 1 without a comparison.
        if counter is None:
            by_count = max(2, params.check_max + 1)
        else:
            by_count = max(1, params.check_max - counter + 1)
        # Round k discards for age when T + k x interval - born > retention.
        room = row["born_timestamp_ms"] + params.reserved_ms - T
        by_age = max(1, room // interval + 1)
        at = T + min(by_count, by_age) * interval
        result[offset] = (left, at if INT64_MIN <= at <= INT64_MAX else None)
    return result


# ---------------------------------------------------------------------------------------
# The round.


def reconcile(
    records: Iterable[Record],
    committed_offsets: Iterable[tuple[str, str, int, int]],
    params: RoundParams,
    bad_input: Iterable[Mapping[str, Any]] = (),
    hold: bool = True,
) -> RoundResult:
    """Run one round over all brokers and queues; see the module docstring. ``hold``
    False: the round's offsets as computed, before the holds of section 5 (what the DuckDB
    peer models)."""
    result = RoundResult()
    records = [r for r in records if r["topic"] in (HALF_TOPIC, OP_TOPIC)]

    winners, duplicate_bad = settle_duplicates(records)
    result.bad_records.extend(duplicate_bad)

    committed: dict[tuple[str, str, int], int] = {}
    for broker, topic, queue_id, offset in committed_offsets:
        if topic in (HALF_TOPIC, OP_TOPIC):
            committed[(broker, topic, queue_id)] = offset

    queues = {(r["broker"], r["queue_id"]) for r in records}
    queues |= {(broker, queue_id) for broker, _, queue_id in committed}

    for broker, queue_id in sorted(queues):
        _queue_round(broker, queue_id, winners, committed, params, result)

    result.bad_records.extend(dict(row) for row in bad_input)
    for bad in result.bad_records:
        summary = result.summaries.get((bad["broker"], bad["queue_id"]))
        if summary is not None:
            summary.bad_records += 1
    for summary in result.summaries.values():
        if hold:
            _hold(summary, result)
    return result


def summary_row(summary: QueueSummary) -> dict[str, Any]:
    """The queue's ``run_summary`` values: a held queue's h_safe and p_safe are null."""
    row = {**vars(summary), **summary.counts}
    if summary.offset_hold is not None:
        row["h_safe"] = row["p_safe"] = None
    return row


# ---------------------------------------------------------------------------------------
# Section 5, "Offsets only move forward": a held queue proposes no offset.

HOLD_MISSING = "no committed offset in the offsets file: where the broker stands is unknown"
HOLD_BAD = (
    "bad records at or after the committed offset: the broker will read records the round"
    " could not (table bad_records)"
)


def _bad_after(summary: QueueSummary, bad_records: list[dict[str, Any]]) -> bool:
    committed = {HALF_TOPIC: summary.half_committed or 0, OP_TOPIC: summary.op_committed or 0}
    for bad in bad_records:
        if (bad["broker"], bad["queue_id"]) != (summary.broker, summary.queue_id):
            continue
        if bad["topic"] not in (HALF_TOPIC, OP_TOPIC, None):
            continue
        if bad["queue_offset"] is None or bad["queue_offset"] >= committed[bad["topic"]]:
            return True
    return False


def _hold(summary: QueueSummary, result: RoundResult) -> None:
    """Set the queue's hold, and null the offsets of ``consume_offsets`` it must not
    propose (``run_summary`` shows ``h_safe``/``p_safe`` null then: ``summary_row``)."""
    h, p = summary.half_committed, summary.op_committed
    reasons = []
    if h is None or p is None:
        reasons.append(HOLD_MISSING)
    half_back = h is not None and min(summary.h1, summary.h_safe) < h
    op_back = p is not None and min(summary.p1, summary.p_safe) < p
    if half_back or op_back:
        shown = {None: "null"}
        reasons.append(
            f"the round ends below the committed offsets (half {shown.get(h, h)} ->"
            f" {summary.h1}, safe {summary.h_safe}; op {shown.get(p, p)} -> {summary.p1}, safe"
            f" {summary.p_safe}): T is before what the broker already passed, or the store's"
            " tail is damaged or half-copied"
        )
    if _bad_after(summary, result.bad_records):
        reasons.append(HOLD_BAD)
    summary.offset_hold = "; ".join(reasons) or None
    for row in result.consume_offsets:
        if (row["broker"], row["queue_id"]) == (summary.broker, summary.queue_id):
            row["offset_hold"] = summary.offset_hold
            if summary.offset_hold is not None:
                row["offset_after"] = row["offset_safe"] = None


def _queue_round(
    broker: str,
    queue_id: int,
    winners: list[Record],
    committed: dict[tuple[str, str, int], int],
    params: RoundParams,
    result: RoundResult,
) -> None:
    """Sections 1, 3, 4 and 5 for one (broker, queue_id); appends to ``result``."""
    T = params.as_of_ms

    def of_topic(topic: str, rs: list[Record]) -> list[Record]:
        return [
            r
            for r in rs
            if r["broker"] == broker and r["queue_id"] == queue_id and r["topic"] == topic
        ]

    half_all = of_topic(HALF_TOPIC, winners)
    op_all = of_topic(OP_TOPIC, winners)
    # Only records stored before T exist for the round.
    half_now = {r["queue_offset"]: r for r in half_all if r["store_timestamp_ms"] < T}
    op_now = {r["queue_offset"]: r for r in op_all if r["store_timestamp_ms"] < T}
    half_offsets = [r["queue_offset"] for r in half_all]
    op_offsets = [r["queue_offset"] for r in op_all]

    # Section 1: start offsets.
    half_committed = committed.get((broker, HALF_TOPIC, queue_id))
    op_committed = committed.get((broker, OP_TOPIC, queue_id))
    warnings = []
    h0, warning = start_offset(
        half_committed, half_offsets, list(half_now), f"{broker} {HALF_TOPIC} queue {queue_id}"
    )
    warnings += [warning] if warning else []
    p0, warning = start_offset(
        op_committed, op_offsets, list(op_now), f"{broker} {OP_TOPIC} queue {queue_id}"
    )
    warnings += [warning] if warning else []
    half_end = queue_end(half_offsets, list(half_now), h0)
    op_end = queue_end(op_offsets, list(op_now), p0)

    # Section 3: named offsets, from every op record stored before T.
    named: set[int] = set()
    op_named: dict[int, list[int]] = {}
    for offset, record in sorted(op_now.items()):
        items, unparsable = op_items(record)
        op_named[offset] = items
        named.update(items)
        for item in unparsable:
            result.bad_records.append(_bad(record, f"unparsable op body item {item!r}"))

    # Half records stored before T (any offset) with their property problems.
    halves = {offset: decode_half(record, params) for offset, record in half_now.items()}
    for half in halves.values():
        for problem in half.problems:
            result.bad_records.append(_bad(half.record, problem))

    # Section 4: rules 1-2, then rule 3 through the uniq_key of those.
    def by_rule_1_or_2(half: Half) -> bool:
        return half.offset in named or (
            half.prepared_queue_offset is not None and half.prepared_queue_offset in named
        )

    resolved_keys = {
        h.uniq_key for h in halves.values() if by_rule_1_or_2(h) and h.uniq_key is not None
    }

    def is_resolved(half: Half) -> bool:
        return by_rule_1_or_2(half) or (
            half.uniq_key is not None and half.uniq_key in resolved_keys
        )

    # Section 5: walk from h0 in offset order; missing offsets are simply not there.
    counts = dict.fromkeys(CLASSES, 0)
    stopped_at: int | None = None
    unresolved_before_h1: list[int] = []
    for offset in sorted(o for o in halves if o >= h0):
        half = halves[offset]
        resolved = is_resolved(half)
        if stopped_at is not None:
            if not resolved:
                counts[NOT_REACHED] += 1
                result.pending.append(
                    {**half_row(half, params, half.check_times), "status": NOT_REACHED}
                )
            continue
        if resolved:
            counts[RESOLVED] += 1
            continue
        status = classify(half, params)
        counts[status] += 1
        row = half_row(half, params, counter_after(half, status))
        result.pending.append({**row, "status": status})
        if status == CHECK:
            result.check_requests.append(row)
        elif status == DISCARD_CHECK_MAX:
            result.discards.append({**row, "reason": REASON_CHECK_MAX})
        elif status == DISCARD_EXPIRED:
            result.discards.append({**row, "reason": REASON_EXPIRED})
        if status in (CHECK, IMMUNE, DISCARD_CHECK_MAX, DISCARD_EXPIRED):
            unresolved_before_h1.append(offset)
        if status == TOO_YOUNG:
            stopped_at = offset

    queue_rows = [r for r in result.pending if (r["broker"], r["queue_id"]) == (broker, queue_id)]
    forecasts = forecast(queue_rows, stopped_at is not None, params)
    for table in (result.pending, result.check_requests, result.discards):
        for row in table:
            if (row["broker"], row["queue_id"]) == (broker, queue_id):
                row["checks_left"], row["discard_at_ms"] = forecasts[row["half_offset"]]

    h1 = stopped_at if stopped_at is not None else max(h0, half_end)
    h_safe = min([h1, *unresolved_before_h1])

    # Done op records and the new op offsets.
    def op_offset_with(half_bound: int) -> int:
        for p in range(p0, op_end):
            if p not in op_now:  # missing
                return p
            if not all(x < half_bound for x in op_named[p] if x >= h0):  # not done
                return p
        return max(p0, op_end)

    p1 = op_offset_with(h1)
    p_safe = op_offset_with(h_safe)

    result.summaries[(broker, queue_id)] = QueueSummary(
        broker=broker,
        queue_id=queue_id,
        h0=h0,
        h1=h1,
        h_safe=h_safe,
        p0=p0,
        p1=p1,
        p_safe=p_safe,
        half_committed=half_committed,
        op_committed=op_committed,
        counts=counts,
        warnings=warnings,
    )
    for topic, before, after, safe, value in (
        (HALF_TOPIC, h0, h1, h_safe, half_committed),
        (OP_TOPIC, p0, p1, p_safe, op_committed),
    ):
        result.consume_offsets.append(
            {
                "broker": broker,
                "topic": topic,
                "queue_id": queue_id,
                "group": TRANS_GROUP,
                "offset_committed": value,
                "offset_before": before,
                "offset_after": after,
                "offset_safe": safe,
            }
        )
