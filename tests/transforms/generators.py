"""Hypothesis strategies for whole reconciliation cases, and helpers to batch and shrink them.

A *case* is what one broker holds: half and op records of one or two queues (any store
time, duplicates, gaps) and its committed offsets. Cases are generated with the broker
name ``"case"``; :func:`with_broker` renames them so that many cases can run in one Spark
round, each as its own broker (brokers never influence each other).

The value pools aim at the edges of the spec: counters around ``check_max`` and around the
32-bit range, immunities that are ``0``, ``-1``, unparsable or overflow when multiplied by
1000, ages around the timeout and the reserved time and in the future, op items that are
below ``h0``, beyond the queue, duplicated, or unparsable in the ways Python's ``int()`` and
Spark's casts are lenient about (spaces, ``_``, non-ASCII digits, ``+``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from schemas.messages import HALF_TOPIC, OP_TOPIC, PROP_TRAN_MSG
from tests.transforms.builders import T, half, op
from transforms.params import RoundParams

CASE_BROKER = "case"


@dataclass(frozen=True)
class Case:
    records: tuple[dict[str, Any], ...]
    committed: tuple[tuple[str, str, int, int], ...]


def with_broker(case: Case, broker: str) -> Case:
    return Case(
        records=tuple({**record, "broker": broker} for record in case.records),
        committed=tuple(
            (broker, topic, queue, offset) for _, topic, queue, offset in case.committed
        ),
    )


# ---------------------------------------------------------------------------------------
# Value pools. Repeated entries weight the common, boring values.


# fmt: off
def _ages(params: RoundParams) -> list[int]:
    timeout, reserved = params.transaction_timeout_ms, params.reserved_ms
    return [
        -5_000, -1, 0, 1, 1_000, timeout - 1, timeout, timeout + 1, 30_000, 59_999, 60_000,
        61_000, 61_000, 120_000, 120_000, reserved - 1, reserved, reserved + 1, 2 * reserved,
    ]


def _counters(params: RoundParams) -> list[str | None]:
    cm = params.check_max
    return [
        None, None, None, None, "0", "1", "2", str(cm - 2), str(cm - 1), str(cm), str(cm + 1),
        "-1", f"+{cm - 1}", "2147483647", "2147483648", "-2147483649", "abc", " 1", "1.5",
        "\u0661", "1_0", "",
    ]


# Empty property values ("") mean an absent property (section 2: "a segment with an empty
# name or empty value is ignored"), whatever the source.
IMMUNITIES: list[str | None] = [
    None, None, None, None, None, "0", "60", "60", "-1", "-5", "5", "abc", "9223372036854775",
    "9223372036854776", "9223372036854775807", "-9223372036854775808", "99999999999999999999",
    " 60", "+60", "1.5", "",
]
KEYS: list[str | None] = [None, "K1", "K1", "K2", "K3", ""]
REAL_QIDS: list[str | None] = ["0", "0", "0", "3", None, "x", "2147483648", "-1", ""]
GROUPS: list[str | None] = ["PG", "PG", None, ""]
# T - store time: None = stored just after birth (before T); 0 = at T; negative = after T.
STORED_AGES: list[int | None] = [None, None, None, None, None, None, 1, 0, -1, -60_000]
# Fewer op records after T: one that is missing at T stops the op offset, hiding the rest.
OP_STORED_AGES: list[int | None] = [None] * 10 + [1, 0, -60_000]
BAD_ITEMS = [
    "x", "1.5", " 3", "3 ", "", "99999999999999999999", "-9223372036854775809", "+2", "-1",
    "\u0661", "0x1", "1_0", "9223372036854775807",
]
TAGS: list[str | None] = ["d", "d", "d", "d", "d", "d", "x", "D", None]
# fmt: on


# ---------------------------------------------------------------------------------------
# Strategies.


@st.composite
def _half_fields(draw: Any, params: RoundParams, lo: int, hi: int) -> dict[str, Any]:
    prepared_pool: list[str | None] = [None, None, None, "x", "-1", "99999999999999999999"]
    prepared_pool += [str(offset) for offset in range(max(lo - 1, 0), hi + 2)]
    fields = {
        "age_ms": draw(st.sampled_from(_ages(params))),
        "key": draw(st.sampled_from(KEYS)),
        "counter": draw(st.sampled_from(_counters(params))),
        "immunity": draw(st.sampled_from(IMMUNITIES)),
        "prepared": draw(st.sampled_from(prepared_pool)),
        "real_qid": draw(st.sampled_from(REAL_QIDS)),
        "group": draw(st.sampled_from(GROUPS)),
        "stored_age_ms": draw(st.sampled_from(STORED_AGES)),
        "store_host": draw(
            st.sampled_from(["10.0.0.1:10911", "10.0.0.1:10911", "[fe80::1]:10911"])
        ),
    }
    # What the operator columns show (KEYS, space-separated; the transaction id), derived
    # from the fields drawn rather than drawn: a new draw would change every generated
    # case and the edges the generator is known to reach.
    key = fields["key"]
    extra = {"KEYS": f" {key}  k-{fields['group']} "} if key else {"__transactionId__": "tx-1"}
    return {**fields, "extra_properties": extra}


@st.composite
def _op_fields(draw: Any, half_lo: int, half_hi: int, present: list[int]) -> dict[str, Any]:
    # Mostly offsets of half records that exist (resolution is the heart of the round),
    # some anywhere around the queue (below h0, past the end), some unparsable.
    offsets = [str(offset) for offset in range(max(half_lo - 2, 0), half_hi + 3)]
    item = st.sampled_from([str(offset) for offset in present] * 6 + offsets * 2 + BAD_ITEMS)
    shape = draw(
        st.sampled_from(["4.9", "batch", "batch", "batch", "no trailing comma", "none", "empty"])
    )
    if shape == "4.9":
        body: str | None = draw(item)
    elif shape in ("batch", "no trailing comma"):
        items = draw(st.lists(item, min_size=1, max_size=4))
        body = ",".join(items) + ("," if shape == "batch" else "")
    elif shape == "empty":
        body = ""
    else:
        body = None
    return {
        "body": body,
        "tag": draw(st.sampled_from(TAGS)),
        "stored_age_ms": draw(st.sampled_from(OP_STORED_AGES)),
        "age_ms": 1_000,
    }


# How a duplicate's commit-log offset relates to the original's. Ties are broken by
# (source, position): "a.parquet" sorts before the commit-log file, "z.parquet" after.
DUPLICATE_KINDS = [
    "smaller",
    "larger",
    "tie wins on source",
    "tie loses on source",
    "tie loses on position",
]


@st.composite
def _slots(
    draw: Any, fields: Any, base: int, max_size: int
) -> list[tuple[int, dict[str, Any], str | None, dict[str, Any] | None]]:
    """(offset, fields, duplicate kind, duplicate fields) per present offset, with gaps."""
    count = draw(st.integers(0, max_size))
    slots = []
    for index in range(count):
        kind = draw(st.sampled_from(["record"] * 7 + ["gap", "duplicate"]))
        if kind == "gap":
            continue
        record_fields = draw(fields)
        duplicate = draw(st.sampled_from(DUPLICATE_KINDS)) if kind == "duplicate" else None
        duplicate_fields = draw(fields) if duplicate else None
        slots.append((base + index, record_fields, duplicate, duplicate_fields))
    return slots


def _place(duplicate: str | None, commitlog: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Commit-log offset and provenance of an original and of its duplicate."""
    original = {
        "commitlog": commitlog,
        "source": "commitlog/00000000000000000000",
        "position": commitlog,
    }
    if duplicate == "smaller":
        return original, {**original, "commitlog": commitlog - 500, "position": commitlog - 500}
    if duplicate == "larger":
        return original, {**original, "commitlog": commitlog + 500, "position": commitlog + 500}
    if duplicate == "tie wins on source":
        return original, {**original, "source": "a.parquet", "position": 7}
    if duplicate == "tie loses on source":
        return original, {**original, "source": "z.parquet", "position": 7}
    return original, {**original, "position": commitlog + 1}  # tie loses on position


@st.composite
def cases(draw: Any, params: RoundParams) -> Case:
    """One broker's worth of input: one or two queues (0 and/or 1) and committed offsets."""
    queues = draw(st.sampled_from([(0,), (0,), (0,), (0, 1), (1,)]))
    records: list[dict[str, Any]] = []
    committed: list[tuple[str, str, int, int]] = []
    next_commitlog = [10_000]

    def commitlog() -> int:
        next_commitlog[0] += 1_000
        return next_commitlog[0]

    for queue in queues:
        half_base = draw(st.sampled_from([0, 0, 1, 3]))
        half_slots = draw(_slots(_half_fields(params, half_base, half_base + 7), half_base, 7))
        op_base = draw(st.sampled_from([0, 0, 2]))
        half_hi = half_base + 7
        present = [offset for offset, *_ in half_slots]
        op_slots = draw(_slots(_op_fields(half_base, half_hi, present), op_base, 5))

        for offset, fields, duplicate, duplicate_fields in half_slots:
            original, copy = _place(duplicate, commitlog())
            records.append(
                half(offset, queue=queue, broker=CASE_BROKER, as_of=T, **fields, **original)
            )
            if duplicate:
                records.append(
                    half(
                        offset, queue=queue, broker=CASE_BROKER, as_of=T, **duplicate_fields, **copy
                    )
                )
        for offset, fields, duplicate, duplicate_fields in op_slots:
            original, copy = _place(duplicate, commitlog())
            records.append(
                op(offset, queue=queue, broker=CASE_BROKER, as_of=T, **fields, **original)
            )
            if duplicate:
                records.append(
                    op(offset, queue=queue, broker=CASE_BROKER, as_of=T, **duplicate_fields, **copy)
                )

        for topic, base, slots in (
            (HALF_TOPIC, half_base, half_slots),
            (OP_TOPIC, op_base, op_slots),
        ):
            end = slots[-1][0] + 1 if slots else base
            choice = draw(
                st.sampled_from(
                    [None, None, None, 0, base - 1, base, base, base + 1, 2, end, end + 3]
                )
            )
            if choice is not None and choice >= 0:
                committed.append((CASE_BROKER, topic, queue, choice))
    if draw(st.booleans()) and draw(st.booleans()):  # a queue known only from the offsets file
        committed.append(
            (
                CASE_BROKER,
                draw(st.sampled_from([HALF_TOPIC, OP_TOPIC])),
                2,
                draw(st.sampled_from([0, 4])),
            )
        )
    return Case(records=tuple(records), committed=tuple(committed))


# ---------------------------------------------------------------------------------------
# Shrinking by hand (Spark rounds are too slow for Hypothesis' shrinker): candidates that
# are one step simpler than a case. Many candidates run in one Spark round, one per broker.


def simpler(case: Case) -> list[Case]:
    candidates = []
    for index in range(len(case.records)):
        candidates.append(
            dataclasses.replace(case, records=case.records[:index] + case.records[index + 1 :])
        )
    for index in range(len(case.committed)):
        candidates.append(
            dataclasses.replace(
                case, committed=case.committed[:index] + case.committed[index + 1 :]
            )
        )
    for index, record in enumerate(case.records):
        for name in record["properties"]:
            if name == PROP_TRAN_MSG or record["topic"] != HALF_TOPIC:
                continue
            properties = {k: v for k, v in record["properties"].items() if k != name}
            simplified = {**record, "properties": properties}
            candidates.append(
                dataclasses.replace(
                    case, records=(*case.records[:index], simplified, *case.records[index + 1 :])
                )
            )
        body = record["body"]
        if record["topic"] == OP_TOPIC and body:
            items = bytes(body).decode("utf-8").split(",")
            for drop in range(len(items)):
                fewer = ",".join(items[:drop] + items[drop + 1 :]).encode("utf-8")
                simplified = {**record, "body": fewer}
                candidates.append(
                    dataclasses.replace(
                        case,
                        records=(*case.records[:index], simplified, *case.records[index + 1 :]),
                    )
                )
    return candidates


def describe(case: Case) -> str:
    """A readable listing of a case, relative to T."""
    lines = []
    for record in sorted(
        case.records,
        key=lambda r: (r["queue_id"], r["topic"], r["queue_offset"], r["commitlog_offset"]),
    ):
        kind = "half" if record["topic"] == HALF_TOPIC else "op  "
        store = T - record["store_timestamp_ms"]
        details = (
            {k: v for k, v in record["properties"].items() if k != PROP_TRAN_MSG}
            if kind == "half"
            else {"tags": record["tags"], "body": record["body"]}
        )
        lines.append(
            f"  q{record['queue_id']} {kind} offset={record['queue_offset']} commitlog={record['commitlog_offset']} "
            f"src={record['source']}@{record['position']} age={T - record['born_timestamp_ms']} "
            f"stored_age={store} host={record['store_host']} {details}"
        )
    for _, topic, queue, offset in case.committed:
        lines.append(f"  committed q{queue} {topic} = {offset}")
    return "\n".join(lines) or "  (empty)"


def generate(round_params: RoundParams, count: int) -> list[Case]:
    """``count`` cases from Hypothesis, deterministic (derandomized), without running Spark.

    The value pools are relative to the parameters (counters around check_max, ages around
    the timeout), so two parameter sets would get isomorphic cases from the same derandomized
    stream; a leading draw that depends on the parameters shifts the stream apart.
    """
    collected: list[Case] = []
    salt = st.tuples(*[st.integers(0, 255)] * (round_params.check_max % 7))

    @settings(
        max_examples=count,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(salt, cases(round_params))
    def collect(_salt: tuple[int, ...], case: Case) -> None:
        collected.append(case)

    collect()
    return collected
