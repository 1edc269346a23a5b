"""The broker's own round over one queue (transforms.broker_walk.walk_queue), without Spark.

Against the reference model (simulator.broker_round.replay_round with the broker's op
windows) on every round of simulated runs, at several instants and settings; against the
real brokers' recorded rounds (tests/fixtures/real-broker); and rule by rule on small
hand-built queues (each also replayed by the model, where the model agrees).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from simulator.broker_round import BrokerSettings as ModelSettings
from simulator.broker_round import HalfRecord, OpRecord, Snapshot, load_snapshot, replay_round
from tests.broker.runs import FIXTURES, load_run, small_run_config, write_simulated_run
from transforms.broker_state import BrokerSettings, java_long, java_parse
from transforms.broker_walk import (
    IMMUNITY_PUT_BACK,
    RESOLVED_BY_PREPARED,
    STOP_END,
    STOP_FRESH,
    STOP_SPIN,
    STOP_TOO_YOUNG,
    walk_queue,
)

T = 1_750_000_000_000
S = 1000
DISCARDS = ("discard_check_max", "discard_expired")


# -- inputs: the model's records as the job's columns ----------------------------------------


def half_table(records) -> pa.Table:
    records = sorted(records, key=lambda r: r.offset)
    return pa.table(
        {
            "queue_offset": pa.array([r.offset for r in records], pa.int64()),
            "uniq_key": pa.array([r.uniq_key for r in records], pa.string()),
            "check_times_raw": pa.array([r.check_times_raw for r in records], pa.string()),
            "immunity_raw": pa.array([r.immunity_raw for r in records], pa.string()),
            "prepared_queue_offset_raw": pa.array([r.prepared_raw for r in records], pa.string()),
            "born_timestamp_ms": pa.array([r.born_ms for r in records], pa.int64()),
            "store_timestamp_ms": pa.array([r.store_ms for r in records], pa.int64()),
        }
    )


def op_table(records) -> pa.Table:
    records = sorted(records, key=lambda r: r.offset)
    return pa.table(
        {
            "queue_offset": pa.array([r.offset for r in records], pa.int64()),
            "tags": pa.array([r.tags for r in records], pa.string()),
            "body": pa.array([r.body for r in records], pa.binary()),
            "store_timestamp_ms": pa.array([r.store_ms for r in records], pa.int64()),
        }
    )


def job_settings(s: ModelSettings, window: int = 32) -> BrokerSettings:
    return BrokerSettings(
        check_max=s.check_max,
        transaction_timeout_ms=s.transaction_timeout_ms,
        file_reserved_hours=s.file_reserved_hours,
        version=s.version,
        cq_file_entries=s.cq_file_entries,
        op_window=window,
    )


def walk_snapshot(snap: Snapshot, as_of_ms: int, settings: ModelSettings, h0: int, p0: int):
    """walk_queue over every record of the snapshot (the walk cuts at h0, p0 and T itself)."""
    half = half_table(snap.half.values())
    ops = op_table(snap.ops.values())
    return walk_queue(half, ops, h0, p0, as_of_ms, job_settings(settings))


def multisets(actions: pa.Table) -> dict[str, Counter]:
    rows = actions.to_pylist()

    def of(*kinds):
        return Counter((r["uniq_key"], r["counter"]) for r in rows if r["action"] in kinds)

    return {"checks": of("check"), "immunity": of(IMMUNITY_PUT_BACK), "discards": of(*DISCARDS)}


def mismatches(snap: Snapshot, as_of_ms: int, settings: ModelSettings):
    """What the walk and the model disagree on (the three multisets, h1, p1, the stop,
    the copies appended), with the walk's result."""
    model = replay_round(snap, as_of_ms, settings, op_window=32)
    actions, end = walk_snapshot(snap, as_of_ms, settings, model.h0, model.p0)
    mine = multisets(actions)
    problems = [
        f"{kind}: walk {dict(mine[kind] - model.multiset(kind))}, "
        f"model {dict(model.multiset(kind) - mine[kind])}"
        for kind in mine
        if mine[kind] != model.multiset(kind)
    ]
    if (end.h1, end.p1, end.stop) != (model.h1, model.p1, model.stop):
        problems.append(f"end: walk {end}, model h1={model.h1} p1={model.p1} {model.stop}")
    if end.copies != len(model.checks) + len(model.immunity):
        problems.append(f"copies: walk {end.copies}")
    return problems, actions, end


# -- the reference model on simulated runs ---------------------------------------------------

RUNS = {
    "5.x-600-s1": dict(transactions=600, seed=1, op_style="5.x"),
    "4.9-600-s2": dict(transactions=600, seed=2, op_style="4.9"),
    "5.x-1500-s3-skew": dict(transactions=1500, seed=3, op_style="5.x", clock_skew_ms=8000),
    "4.9-1500-s4-skew": dict(transactions=1500, seed=4, op_style="4.9", clock_skew_ms=8000),
    "5.x-2000-s5": dict(transactions=2000, seed=5, op_style="5.x", cq_file_entries=50),
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def simulated_run(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"walk-{request.param}")
    return write_simulated_run(out, small_run_config(**RUNS[request.param]))


# Instants after each round's start (ms) and settings changed from the run's: the round as
# played; later, with copies and newer records about; an idle broker an hour on (the walk
# reaches its own copies; with a one-hour file reservation part of the queue has expired).
VARIANTS = (
    (0, {}),
    (2_500, {}),
    (2_500, {"check_max": 1}),
    (3_660_000, {"file_reserved_hours": 1}),
    (3_660_000, {"check_max": 1}),
)


def test_the_walk_is_the_model_on_every_round_of_simulated_runs(simulated_run):
    seen, stops, cases = Counter(), Counter(), 0
    for recorded in load_run(simulated_run):
        whole = load_snapshot(recorded.snapshot)
        for delay, changes in VARIANTS:
            as_of_ms = recorded.as_of_ms + delay
            settings = dataclasses.replace(recorded.settings, **changes)
            problems, actions, end = mismatches(whole.at(as_of_ms), as_of_ms, settings)
            assert not problems, f"round {recorded.number} +{delay} ms {changes}: {problems}"
            seen.update(actions.column("action").to_pylist())
            seen.update(own_copy=sum(actions.column("own_copy").to_pylist()))
            stops[end.stop] += 1
            cases += 1
    assert cases >= 100
    for kind in ("resolved", "check", IMMUNITY_PUT_BACK, *DISCARDS, "own_copy"):
        assert seen[kind] > 0, seen
    assert stops[STOP_TOO_YOUNG] and stops[STOP_FRESH], stops


@pytest.mark.parametrize("version", ["4.9.7", "5.3.3"])
def test_the_walk_is_what_a_real_broker_did(version):
    """Every recorded round of a real broker: the same copies, discards and offsets."""
    rounds = load_run(FIXTURES / version)
    assert rounds
    for recorded in rounds:
        snap = load_snapshot(recorded.snapshot, recorded.as_of_ms)
        model = replay_round(snap, recorded.as_of_ms, recorded.settings, op_window=32)
        actions, end = walk_snapshot(snap, recorded.as_of_ms, recorded.settings, model.h0, model.p0)
        real = {"checks": recorded.checks, "immunity": recorded.immunity}
        real["discards"] = recorded.discards
        assert multisets(actions) == real
        assert (end.h1, end.p1) == (recorded.half_committed_after, recorded.op_committed_after)
        grown = recorded.half_max_after - recorded.half_max_before
        assert end.copies == grown


# -- rule by rule, on hand-built queues ------------------------------------------------------

SETTINGS = ModelSettings(check_max=3, transaction_timeout_ms=6000, file_reserved_hours=72)


def _half(offset, age_s, counter=None, immunity=None, prepared=None, stored_age_s=None):
    born = T - int(age_s * S)
    stored = T - int((stored_age_s if stored_age_s is not None else age_s) * S)
    return HalfRecord(offset, f"K{offset}", counter, immunity, prepared, born, stored)


def _op(offset, body, tags="d", age_s=1):
    return OpRecord(offset, tags, None if body is None else body.encode(), T - age_s * S)


def _walk(half, ops=(), h0=0, p0=0, settings=SETTINGS, model=True, **changes):
    """walk_queue on the records; with ``model``, the model must agree on the same queue."""
    settings = dataclasses.replace(settings, **changes)
    snap = Snapshot({h.offset: h for h in half}, {o.offset: o for o in ops}, h0, p0)
    if model:
        problems, _, _ = mismatches(snap.at(T), T, settings)
        assert not problems, problems
    actions, end = walk_snapshot(snap, T, settings, h0, p0)
    rows = [(r["half_offset"], r["action"], r["counter"]) for r in actions.to_pylist()]
    return rows, end, actions


def test_an_op_resolves_exactly_the_offset_it_names():
    rows, end, _ = _walk([_half(0, 60), _half(1, 60), _half(2, 60)], [_op(0, "1")])
    assert rows == [(0, "check", 1), (1, "resolved", None), (2, "check", 1)]
    assert (end.h1, end.p1, end.stop, end.copies) == (3, 1, STOP_FRESH, 2)


@pytest.mark.parametrize("version", ["5", "4.9"])
def test_op_items_below_h0_are_done_when_loaded(version):
    body = "3,5," if version == "5" else "3"
    rows, end, _ = _walk([_half(5, 60)], [_op(0, body), _op(1, "5")], h0=5, version=version)
    assert rows[0] == (5, "resolved", None)
    # 5.x: op 0 still names 5 (>= h0) but op 1 replaced it in removeMap: op 0 is not done.
    assert end.p1 == (0 if version == "5" else 2)


@pytest.mark.parametrize("version", ["5", "4.9"])
def test_a_later_op_for_the_same_offset_replaces_the_earlier_one(version):
    rows, end, actions = _walk([_half(0, 60)], [_op(0, "0"), _op(1, "0")], version=version)
    assert rows == [(0, "resolved", None)]
    assert actions.column("op_offset").to_pylist() == [1]
    assert end.p1 == 0  # op 0 is never done this round


def test_a_5x_batch_is_done_once_every_offset_it_names_is_taken():
    whole = _walk([_half(0, 60), _half(1, 60), _half(2, 1)], [_op(0, "1,0,")])
    assert whole[1].p1 == 1 and whole[1].stop == STOP_TOO_YOUNG
    partial = _walk([_half(0, 60), _half(1, 1)], [_op(0, "0,9,")])
    assert partial[1].p1 == 0


def test_an_immune_record_is_put_back_with_its_counter():
    rows, end, actions = _walk([_half(0, 30, immunity="60")])
    assert rows == [(0, IMMUNITY_PUT_BACK, 1)]
    assert actions.column("copy_offset").to_pylist() == [1]
    assert (end.h1, end.stop, end.copies) == (1, STOP_FRESH, 1)


def test_an_immune_record_whose_prepared_offset_an_op_names_is_resolved_without_a_copy():
    rows, end, actions = _walk([_half(0, 30, immunity="60", prepared="7")], [_op(0, "7")])
    assert rows == [(0, RESOLVED_BY_PREPARED, None)]
    assert actions.column("op_offset").to_pylist() == [0]
    assert (end.p1, end.copies) == (1, 0)
    rows, _, _ = _walk([_half(0, 30, immunity="60", prepared="7")], [_op(0, "8")])
    assert rows == [(0, IMMUNITY_PUT_BACK, 1)]


def test_an_unparsable_prepared_offset_falls_through_and_the_broker_spins():
    """checkPrepareQueueOffset is false; no check is needed yet (age < immunity): the broker
    pulls ops until its time limit."""
    rows, end, _ = _walk([_half(0, 30, immunity="60", prepared="x")], [_op(0, "9")])
    assert rows == [] and (end.h1, end.stop, end.op_next) == (0, STOP_SPIN, 1)


@pytest.mark.parametrize(
    ("immunity", "age_s", "action"),
    [
        ("abc", 30, "check"),  # unparsable: the transaction timeout (6 s)
        ("-1", 30, "check"),  # -1 is also the timeout
        ("9223372036854775807", 30, "check"),  # × 1000 wraps to -1000 ms
        ("60", 60, None),  # age == immunity: neither immune (<) nor past it (>): spin
        ("60", 59.999, IMMUNITY_PUT_BACK),
        ("0", 0.001, "check"),  # 0 s: no immunity at all
    ],
)
def test_immunity_is_read_like_the_broker(immunity, age_s, action):
    rows, end, _ = _walk([_half(0, age_s, immunity=immunity)])
    assert rows[:1] == ([(0, action, 1)] if action else [])
    assert end.stop == (STOP_SPIN if action is None else STOP_FRESH)


def test_java_parsing():
    assert java_long(9223372036854775807 * 1000) == -1000
    cases = {"+5": 5, "-0": 0, "007": 7, "": -1, "+": -1, " 5": -1, "1_0": -1, "5 ": -1}
    cases |= {"9223372036854775807": (1 << 63) - 1, "9223372036854775808": -1}
    cases |= {"\u0663": 3, "\uff17": 7, "\U0001d7d3": -1}  # Arabic-Indic 3, fullwidth 7, math 5
    assert {text: java_parse(text) for text in cases} == cases
    assert java_parse("2147483648", (-(1 << 31), (1 << 31) - 1)) == -1


@pytest.mark.parametrize(
    ("counter", "action", "carried"),
    [
        (None, "check", 1),
        ("2", "check", 3),
        ("3", "discard_check_max", 3),
        ("40", "discard_check_max", 40),
        ("abc", "check", 0),  # Integer.parseInt fails: -1, then + 1
        ("2147483648", "check", 0),  # beyond an int
        ("-5", "check", -4),
    ],
)
def test_the_counter_is_read_and_carried_like_the_broker(counter, action, carried):
    rows, _, _ = _walk([_half(0, 60, counter=counter)], check_max=3)
    assert rows[0] == (0, action, carried)


def test_a_counter_in_other_unicode_digits_parses_as_in_java():
    """Integer.parseInt takes any Unicode decimal digit of the BMP; the model takes ASCII."""
    rows, _, _ = _walk([_half(0, 60, counter="\u0663")], model=False)
    assert rows[0] == (0, "discard_check_max", 3)


def test_the_counter_and_age_tests_come_before_the_fresh_and_too_young_stops():
    half = [_half(0, 1, counter="3"), _half(1, 73 * 3600), _half(2, 73 * 3600, counter="1")]
    rows, end, _ = _walk(half + [_half(3, 1)])
    assert rows == [
        (0, "discard_check_max", 3),
        (1, "discard_expired", 1),
        (2, "discard_expired", 2),
    ]
    assert (end.h1, end.stop) == (3, STOP_TOO_YOUNG)


def test_a_too_young_record_stops_the_walk():
    rows, end, _ = _walk([_half(0, 60), _half(1, 3), _half(2, 60)])
    assert rows == [(0, "check", 1)]
    assert (end.h1, end.stop, end.half_end) == (1, STOP_TOO_YOUNG, 3)


def test_the_walk_reaches_its_own_copies():
    """The check copy carries counter 3 = check_max: read in the same round, discarded."""
    rows, end, actions = _walk([_half(0, 60, counter="2")])
    assert rows == [(0, "check", 3), (1, "discard_check_max", 3)]
    assert actions.column("own_copy").to_pylist() == [False, True]
    assert (end.h1, end.stop, end.copies) == (2, STOP_END, 1)
    rows, end, _ = _walk([_half(0, 60)])
    assert rows == [(0, "check", 1)] and (end.h1, end.stop) == (1, STOP_FRESH)


def test_a_4_9_op_of_another_tag_is_never_done():
    ops = [_op(0, "0", tags="x"), _op(1, "1")]
    half = [_half(0, 60), _half(1, 60)]
    rows, end, _ = _walk(half, ops, version="4.9")
    assert rows[:2] == [(0, "check", 1), (1, "resolved", None)] and end.p1 == 0
    rows, end, _ = _walk(half, ops, version="5")
    assert rows[:2] == [(0, "check", 1), (1, "resolved", None)] and end.p1 == 2


def test_a_4_9_body_is_one_decimal():
    rows, end, _ = _walk([_half(0, 60), _half(1, 1)], [_op(0, "0,")], version="4.9")
    assert rows == [(0, "check", 1)] and end.p1 == 1  # "0," parses to -1 < h0: done


def test_op_records_are_pulled_32_at_a_time_only_when_a_check_needs_them_8311():
    """Ops 0-31 resolve halves 0-31; half 32 (at the maximum) is committed by op 33, not
    loaded yet: discarded. Half 33 needs a check, so ops 32-33 are pulled: resolved."""
    half = [_half(k, 60) for k in range(34)]
    half[32] = _half(32, 60, counter="15")
    ops = [_op(k, str(k)) for k in range(32)] + [_op(32, "33"), _op(33, "32")]
    rows, end, _ = _walk(half, ops, check_max=15)
    assert rows[32] == (32, "discard_check_max", 15) and rows[33] == (33, "resolved", None)
    assert (end.h1, end.p1, end.op_next) == (34, 33, 34)


def test_no_op_record_is_pulled_beyond_the_first_window_unless_a_check_needs_it():
    ops = [_op(k, str(100 + k)) for k in range(40)]
    quiet = [_half(0, 30, immunity="60"), _half(1, 60, counter="3"), _half(2, 1)]
    assert _walk(quiet, ops)[1].op_next == 32
    needs = [*quiet[:2], _half(2, 60)]
    assert _walk(needs, ops)[1].op_next == 40
    # A pull stops at the end of a consume-queue file (10 entries here).
    assert _walk(quiet, ops, p0=5, cq_file_entries=10)[1].op_next == 10


def test_a_missing_record_is_passed_once():
    rows, end, _ = _walk([_half(0, 60), _half(2, 60), _half(4, 60)])
    assert rows == [(0, "check", 1), (2, "check", 1)]
    assert (end.h1, end.stop) == (3, STOP_END)


def test_records_stored_at_or_after_t_do_not_exist():
    half = [_half(0, 60), _half(1, 60, stored_age_s=0)]
    rows, end, _ = _walk(half, [_op(0, "0", age_s=0)])
    assert rows == [(0, "check", 1)]  # op 0 is not there; half 1 is not: the copy is at 1
    assert (end.h1, end.p1, end.half_end, end.stop) == (1, 0, 1, STOP_FRESH)


def test_a_record_born_in_the_future_is_checked_before_more_ops_are_pulled():
    """isNeedCheck's ``valueOfCurrentMinusBorn <= -1`` holds whatever op records are loaded:
    the broker checks half 0 although op 35, not pulled yet, commits it. The model pulls the
    op records first (and resolves it)."""
    half = [_half(0, -5, stored_age_s=1)]
    ops = [_op(k, str(100 + k)) for k in range(40)]
    ops[35] = _op(35, "0")
    rows, end, _ = _walk(half, ops, model=False)
    assert rows[0] == (0, "check", 1) and end.op_next == 32
    model = replay_round(Snapshot({0: half[0]}, {o.offset: o for o in ops}, 0, 0), T, SETTINGS)
    assert model.resolved == {0: 35} and not model.checks


def test_done_op_offsets_count_in_a_gap_free_run_from_p0():
    from transforms.broker_state import calculate_op_offset

    assert calculate_op_offset([5, 3, 4], 3) == 6
    assert calculate_op_offset([3, 3, 4], 3) == 4  # a duplicate ends the run, as in Java
    assert calculate_op_offset([4, 5], 3) == 3
