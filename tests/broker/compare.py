"""The two comparisons of a recorded broker round (issue 10), as plain functions.

1. ``simulator_vs_broker``: the simulator's round (``broker_round.replay_round`` with the
   broker's 32-record op windows) on the snapshot must equal the recorded round.
2. ``job_vs_broker``: the job's prediction against the recorded round. The difference is
   explained by a *ladder* of replays, each switching off one difference by design
   (``broker_round.Variant``): the broker's round -> no op windows -> the job's rules 2-3
   -> no walk into the round's own copies -> the job's op-done rule -> the spec's number
   parsing. The last step must equal the job's output exactly (offsets included); every
   record that differs between the broker and the job is named by the step that changes it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass, field

from schemas.messages import HALF_TOPIC, OP_TOPIC, REMOVE_TAG
from simulator.broker_round import (
    BROKER,
    RoundOutcome,
    Snapshot,
    Variant,
    java_parse,
    op_items,
    replay_round,
)

# The differences by design (issue 10), in ladder order, and the spec candidates.
OP_WINDOWS = "op windows of 32 (RocketMQ #8311)"
RULES_2_3 = "rules 2-3 re-checks (spec section 4)"
SAME_ROUND = "same-round discard of put-back copies"
OVERWRITE = "op overwrite: removeMap keeps the last op (spec C14)"
SPEC_COUNTER = "spec candidate: unparsable counter read as -1 (copy carries 0)"
SPEC_IMMUNITY = "spec candidate: immunity x 1000 wraps in Java long"
NO_COPIES = "no copies appended by the job"
BY_DESIGN = (OP_WINDOWS, RULES_2_3, SAME_ROUND, OVERWRITE, SPEC_COUNTER, SPEC_IMMUNITY, NO_COPIES)
KINDS = ("checks", "immunity", "discards")
CLASSES = (
    "rule1",
    "rule2",
    "rule3",
    "check",
    "immune",
    "discard_check_max",
    "discard_expired",
    "too_young",
    "not_reached",
)


@dataclass(frozen=True)
class Difference:
    name: str
    what: str  # e.g. "checks +(KEY, 2)" (+: the broker has it, the job not), "h1 12 -> 10"


@dataclass
class JobRound:
    """The job's prediction for one snapshot, collected (rounds are small)."""

    checks: Counter
    immunity: Counter
    discards: Counter
    by_offset: dict[int, tuple[str, str | None, int | None]]  # half offset -> (status, key, ctr)
    h0: int
    h1: int
    p0: int
    p1: int
    # consume_offsets' broker_offset_after (half, op) and broker_copies of queue 0.
    broker_h1: int | None = None
    broker_p1: int | None = None
    broker_copies: int | None = None
    # check_requests and discards of queue 0: the broker's round, (uniq_key, check_times).
    broker_checks: Counter = field(default_factory=Counter)
    broker_discards: Counter = field(default_factory=Counter)

    @staticmethod
    def from_outputs(outputs) -> JobRound:
        pending = outputs.pending.select("half_offset", "status", "uniq_key", "check_times")
        rows = pending.collect()
        summary = outputs.run_summary.select("queue_id", "h0", "h1", "p0", "p1").collect()
        offsets = outputs.consume_offsets.select(*OFFSET_COLUMNS).collect()
        actions = [
            [r.asDict() for r in frame.select(*ACTION_COLUMNS).collect()]
            for frame in (outputs.check_requests, outputs.discards)
        ]
        return JobRound.from_rows(
            [r.asDict() for r in rows],
            [s.asDict() for s in summary],
            [o.asDict() for o in offsets],
            *actions,
        )

    @staticmethod
    def from_rows(
        pending: list[dict],
        summary: list[dict],
        offsets: list[dict] | None = None,
        check_requests: list[dict] | None = None,
        discards: list[dict] | None = None,
    ) -> JobRound:
        def multiset(*statuses: str) -> Counter:
            return Counter(
                (r["uniq_key"], r["check_times"]) for r in pending if r["status"] in statuses
            )

        q0 = [s for s in summary if s["queue_id"] == 0]
        assert len(q0) == 1, f"run_summary: expected one row for queue 0, got {summary}"
        s = q0[0]
        return JobRound(
            checks=multiset("check"),
            immunity=multiset("immune"),
            discards=multiset("discard_check_max", "discard_expired"),
            by_offset={
                int(r["half_offset"]): (r["status"], r["uniq_key"], r["check_times"])
                for r in pending
            },
            h0=int(s["h0"]),
            h1=int(s["h1"]),
            p0=int(s["p0"]),
            p1=int(s["p1"]),
            **_broker_offsets(offsets or []),
            broker_checks=_actions(check_requests or []),
            broker_discards=_actions(discards or []),
        )


# What JobRound reads of check_requests and discards.
ACTION_COLUMNS = ("queue_id", "uniq_key", "check_times")


def _actions(rows: list[dict]) -> Counter:
    return Counter((r["uniq_key"], r["check_times"]) for r in rows if r["queue_id"] == 0)


# What JobRound reads of consume_offsets.
OFFSET_COLUMNS = ("topic", "queue_id", "broker_offset_after", "broker_copies")


def _broker_offsets(offsets: list[dict]) -> dict[str, int | None]:
    """``broker_h1``, ``broker_p1``, ``broker_copies`` of queue 0 from consume_offsets rows."""
    by_topic = {o["topic"]: o for o in offsets if o["queue_id"] == 0}
    half, op = by_topic.get(HALF_TOPIC, {}), by_topic.get(OP_TOPIC, {})
    return {
        "broker_h1": half.get("broker_offset_after"),
        "broker_p1": op.get("broker_offset_after"),
        "broker_copies": half.get("broker_copies"),
    }


@dataclass
class Comparison:
    differences: list[Difference] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    classes: set[str] = field(default_factory=set)

    @property
    def agrees(self) -> bool:
        return not self.unexplained


def _multisets(outcome: RoundOutcome) -> dict[str, Counter]:
    return {kind: outcome.multiset(kind) for kind in KINDS}


def _diff(before: dict[str, Counter], after: dict[str, Counter]) -> list[str]:
    lines = []
    for kind in KINDS:
        for item, n in (before[kind] - after[kind]).items():
            lines += [f"{kind} +{item}"] * n
        for item, n in (after[kind] - before[kind]).items():
            lines += [f"{kind} -{item}"] * n
    return lines


def simulator_vs_broker(
    snap: Snapshot, recorded, broker: Variant = BROKER
) -> tuple[RoundOutcome, list[str]]:
    """Comparison 1: the replayed round and every mismatch with the recorded one.
    ``broker``: SIMULATOR when the recorded round is the simulator's own (no op windows)."""
    out = replay_round(snap, recorded.as_of_ms, recorded.settings, variant=broker)
    problems = []
    real = {"checks": recorded.checks, "immunity": recorded.immunity, "discards": recorded.discards}
    mine = _multisets(out)
    for kind in KINDS:
        if mine[kind] != real[kind]:
            problems.append(
                f"{kind}: broker only {dict(real[kind] - mine[kind])}, "
                f"simulator only {dict(mine[kind] - real[kind])}"
            )
    h1_real = recorded.half_committed_after
    if (h1_real if h1_real is not None else out.h0) != out.h1:
        problems.append(f"half offset after: broker {h1_real}, simulator {out.h1}")
    p1_real = recorded.op_committed_after
    if (p1_real if p1_real is not None else out.p0) != out.p1:
        problems.append(f"op offset after: broker {p1_real}, simulator {out.p1}")
    if recorded.half_max_before is not None and recorded.half_max_after is not None:
        appended = recorded.half_max_after - recorded.half_max_before
        if appended != len(out.checks) + len(out.immunity):
            problems.append(
                f"half queue grew by {appended}, simulator appended "
                f"{len(out.checks) + len(out.immunity)}"
            )
    return out, problems


def broker_variant(snap: Snapshot, recorded, broker: Variant = BROKER) -> Variant:
    """``broker``, or ``broker`` with the walk into this round's own copies cut after k
    copies when that is what the recorded round shows (its half offset stopped k entries past
    the queue's old end: the k+1-th copy was not dispatched to the consume queue yet when the
    walk got there). Only a cut that makes the whole round equal counts."""
    full = replay_round(snap, recorded.as_of_ms, recorded.settings, variant=broker)
    h1 = recorded.half_committed_after
    same_round = sum(e.same_round for e in full.discards)
    if h1 is None or not same_round or not full.half_end <= h1 < full.h1:
        return broker
    return dataclasses.replace(broker, own_copies_limit=h1 - full.half_end)


def spec_resolution(snap: Snapshot) -> dict[int, str]:
    """Half offsets resolved by spec section 4 (rule1/rule2/rule3), from every op record."""
    named: set[int] = set()
    for op in snap.ops.values():
        if op.tags == REMOVE_TAG and op.body is not None:
            named.update(item for item in (op_items(op, "5") or []) if item >= 0)
    rule: dict[int, str] = {}
    for offset, rec in snap.half.items():
        if offset in named:
            rule[offset] = "rule1"
        elif rec.prepared_raw is not None and java_parse(rec.prepared_raw) in named - {-1}:
            rule[offset] = "rule2"
    keys = {snap.half[o].uniq_key for o in rule if snap.half[o].uniq_key is not None}
    for offset, rec in snap.half.items():
        if offset not in rule and rec.uniq_key is not None and rec.uniq_key in keys:
            rule[offset] = "rule3"
    return rule


def ladder(
    snap: Snapshot, as_of_ms: int, settings, broker: Variant = BROKER
) -> list[tuple[str, RoundOutcome]]:
    """The broker's round, then one difference by design switched off per step."""
    rules = spec_resolution(snap)
    also = frozenset(o for o, r in rules.items() if r != "rule1")
    # Each step changes the previous one (a dispatch cut of the broker's walk into its own
    # copies stays until the walk itself is switched off).
    windows = dataclasses.replace(broker, op_window=None)
    rules_2_3 = dataclasses.replace(windows, also_resolved=also)
    steps = [
        ("broker", broker),
        (OP_WINDOWS, windows),
        (RULES_2_3, rules_2_3),
        (SAME_ROUND, dataclasses.replace(rules_2_3, walk_own_copies=False)),
    ]
    last = steps[-1][1]
    for name, change in (
        (OVERWRITE, {"winner_done": False}),
        (SPEC_COUNTER, {"java_counter": False}),
        (SPEC_IMMUNITY, {"java_immunity": False}),
    ):
        last = dataclasses.replace(last, **change)
        steps.append((name, last))
    return [(name, replay_round(snap, as_of_ms, settings, variant=v)) for name, v in steps]


def job_vs_broker(snap: Snapshot, recorded, job: JobRound, broker: Variant = BROKER) -> Comparison:
    """Comparison 2. ``snap``: the snapshot cut at T; ``job``: the job's round on it."""
    result = Comparison()
    steps = ladder(snap, recorded.as_of_ms, recorded.settings, broker)
    broker_model = steps[0][1]
    real = {"checks": recorded.checks, "immunity": recorded.immunity, "discards": recorded.discards}
    if _diff(real, _multisets(broker_model)):
        result.unexplained.append(
            "the simulator's round differs from the broker (comparison 1): nothing can be named"
        )
    for (_, before), (name, after) in itertools.pairwise(steps):
        for line in _diff(_multisets(before), _multisets(after)):
            result.differences.append(Difference(name, line))
        if before.h1 != after.h1:
            result.differences.append(Difference(name, f"h1 {before.h1} -> {after.h1}"))
        if before.p1 != after.p1:
            result.differences.append(Difference(name, f"p1 {before.p1} -> {after.p1}"))
    copies = len(broker_model.checks) + len(broker_model.immunity)
    if copies:
        result.differences.append(Difference(NO_COPIES, f"half queue +{copies} copies"))
    final = steps[-1][1]
    mine = _multisets(final)
    theirs = {"checks": job.checks, "immunity": job.immunity, "discards": job.discards}
    for line in _diff(theirs, mine):
        result.unexplained.append(f"job vs its model: {line}")
    for what, got, want in (
        ("h0", job.h0, final.h0),
        ("h1", job.h1, final.h1),
        ("p0", job.p0, final.p0),
        ("p1", job.p1, final.p1),
    ):
        if got != want:
            result.unexplained.append(f"job {what} {got}, its model {want}")
    result.classes = job_classes(snap, job)
    return result


def job_classes(snap: Snapshot, job: JobRound) -> set[str]:
    """Classes the job gave in this round: its statuses, and the rule of every resolved
    record it walked over."""
    classes = {status for status, _, _ in job.by_offset.values()}
    rules = spec_resolution(snap)
    for offset in range(job.h0, job.h1):
        if offset in snap.half and offset not in job.by_offset and offset in rules:
            classes.add(rules[offset])
    return classes
