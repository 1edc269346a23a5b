"""The reference model (simulator.broker_round) and the comparison machinery, on
stores our simulator wrote: the replay is the simulator's round, the broker's op windows and
Java number parsing are modelled, and the ladder names every job/broker difference."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from collections import Counter
from pathlib import Path

import pytest

import simulator.simulation as simulation
from simulator.broker_round import (
    BROKER,
    SIMULATOR,
    BrokerSettings,
    HalfRecord,
    OpRecord,
    Snapshot,
    Variant,
    calculate_op_offset,
    java_parse,
    load_snapshot,
    op_items,
    replay_round,
)
from tests.broker import summary
from tests.broker.compare import (
    NO_COPIES,
    OP_WINDOWS,
    OVERWRITE,
    RULES_2_3,
    SAME_ROUND,
    SPEC_COUNTER,
    SPEC_IMMUNITY,
    JobRound,
    job_vs_broker,
    simulator_vs_broker,
)
from tests.broker.live import assert_torn_tail_only, reconcile_live
from tests.broker.runs import load_run, small_run_config, write_simulated_run
from tests.spark_cache import holds_cached_frames

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

T = 1_750_000_000_000
S = 1000


def _config(op_style: str, **extra) -> simulation.SimConfig:
    return small_run_config(**{"transactions": 600, "seed": 5, "op_style": op_style, **extra})


@pytest.fixture(scope="module", params=["5.x", "4.9"])
def simulated_run(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"simrun-{request.param}")
    return write_simulated_run(out, _config(request.param))


def test_replay_is_the_simulators_round_on_every_round(simulated_run):
    """Every round the simulator played, replayed on its store cut at the round's start with
    the offsets committed before it: the same copies, discards and offsets."""
    rounds = load_run(simulated_run)
    assert len(rounds) > 15
    acted = Counter()
    for recorded in rounds:
        snap = load_snapshot(recorded.snapshot, recorded.as_of_ms)
        out, problems = simulator_vs_broker(snap, recorded, SIMULATOR)
        assert not problems, f"{recorded.id}: {problems}"
        acted.update(checks=len(out.checks), immunity=len(out.immunity), discards=len(out.discards))
    assert min(acted.values()) > 0, acted


def _half(offset, key, born_s, store_s=None, counter=None, immunity=None, prepared=None):
    store = T - (store_s if store_s is not None else born_s) * S
    return HalfRecord(offset, key, counter, immunity, prepared, T - born_s * S, store)


def _snap(half, ops, h0=None, p0=None) -> Snapshot:
    return Snapshot(
        {h.offset: h for h in half},
        {o.offset: o for o in ops},
        h0,
        p0,
    )


def _op(offset, body, tags="d"):
    return OpRecord(offset, tags, body.encode(), T - 60 * S)


SETTINGS = BrokerSettings(check_max=3, transaction_timeout_ms=6000, file_reserved_hours=72)


def test_op_windows_let_the_broker_discard_a_committed_message_8311():
    """Half 0 is at the maximum and committed by op 40: the broker loads ops 0-31 only
    before its discard test (no check needed before), so it discards; all at once, it skips."""
    half = [_half(0, "K", 60, counter="3")]
    ops = [_op(k, f"{100 + k}") for k in range(40)] + [_op(40, "0")]
    ops[40] = _op(40, "0")
    snap = _snap(half, ops)
    broker = replay_round(snap, T, SETTINGS, variant=BROKER)
    sim = replay_round(snap, T, SETTINGS, variant=SIMULATOR)
    assert [(e.uniq_key, e.counter, e.reason) for e in broker.discards] == [("K", 3, "check_max")]
    assert sim.discards == [] and sim.resolved == {0: 40}


def test_check_loads_every_op_first():
    half = [_half(0, "K", 60), _half(1, "L", 60)]
    ops = [_op(k, f"{100 + k}") for k in range(40)] + [_op(40, "0")]
    out = replay_round(_snap(half, ops), T, SETTINGS, variant=BROKER)
    assert out.resolved == {0: 40}
    assert [(e.uniq_key, e.counter) for e in out.checks] == [("L", 1)]
    assert out.h1 == 2 and out.p1 == 0  # ops 0-39 name offsets never reached


def test_op_overwrite_leaves_the_earlier_op_not_done_c14():
    half = [_half(4, "K", 60), _half(5, "L", 2)]
    snap = _snap(half, [_op(0, "4"), _op(1, "4")], h0=4, p0=0)
    for version in ("5", "4.9"):
        settings = dataclasses.replace(SETTINGS, version=version)
        broker = replay_round(snap, T, settings, variant=BROKER)
        job_rule = replay_round(snap, T, settings, variant=Variant(winner_done=False))
        assert (broker.h1, broker.p1, job_rule.p1) == (5, 0, 2)


def test_version_49_reads_one_decimal_and_stalls_on_another_tag():
    assert op_items(_op(0, "7,9,8,"), "5") == [7, 9, 8]
    assert op_items(_op(0, "7,9,8,"), "4.9") == [-1]
    assert op_items(_op(0, "0", tags="x"), "5") == []
    assert op_items(_op(0, "0", tags="x"), "4.9") is None
    snap = _snap([_half(0, "K", 2)], [_op(0, "0", tags="x")])
    assert replay_round(snap, T, SETTINGS).p1 == 1
    assert replay_round(snap, T, dataclasses.replace(SETTINGS, version="4.9")).p1 == 0


def test_java_numbers_unparsable_counter_and_wrapping_immunity():
    assert java_parse("12") == 12 and java_parse("+7") == 7 and java_parse("1 ") == -1
    assert java_parse(str(2**31), -(2**31), 2**31 - 1) == -1
    half = [
        _half(0, "A", 60, counter="x"),
        _half(1, "B", 2, immunity=str(2**62)),  # x 1000 wraps to 0 in Java: checked
    ]
    broker = replay_round(_snap(half, []), T, SETTINGS)
    assert [(e.uniq_key, e.counter) for e in broker.checks] == [("A", 0), ("B", 1)]
    spec = replay_round(
        _snap(half, []), T, SETTINGS, variant=Variant(java_counter=False, java_immunity=False)
    )
    assert [(e.uniq_key, e.counter) for e in spec.checks] == [("A", 1)]
    assert [(e.uniq_key, e.counter) for e in spec.immunity] == [("B", 1)]


def test_same_round_discard_of_a_copy_at_the_maximum():
    """Counter 2 with max 3: checked (copy carries 3), and the walk reaches that copy in the
    same round and discards it; without the walk into own copies, h1 stops at the end."""
    snap = _snap([_half(0, "K", 60, counter="2")], [])
    broker = replay_round(snap, T, SETTINGS)
    assert [(e.uniq_key, e.counter, e.same_round) for e in broker.discards] == [("K", 3, True)]
    assert broker.h1 == 2
    assert replay_round(snap, T, SETTINGS, variant=Variant(walk_own_copies=False)).h1 == 1


def test_calculate_op_offset_needs_a_gap_free_run():
    assert calculate_op_offset([3, 3, 4], 3) == 4
    assert calculate_op_offset([1, 2], 0) == 0
    assert calculate_op_offset([0, 2, 1], 0) == 3


@pytest.fixture(scope="module")
def simulated_run_5x(tmp_path_factory) -> Path:
    return write_simulated_run(tmp_path_factory.mktemp("simrun-job"), _config("5.x"), [12])


def test_job_difference_names_on_a_simulated_round(spark, simulated_run_5x):
    """The job on a simulated snapshot: every difference from the simulator's recorded round
    is named, the job equals the ladder's last step, and rules 2-3 show up."""
    from jobs.reconcile import reconcile_stores

    recorded = load_run(simulated_run_5x)[0]
    snap = load_snapshot(recorded.snapshot, recorded.as_of_ms)
    s = recorded.settings
    spark.catalog.clearCache()
    out = reconcile_stores(
        spark,
        [f"broker={recorded.snapshot}"],
        as_of=recorded.as_of_ms,
        check_max=s.check_max,
        transaction_timeout_ms=s.transaction_timeout_ms,
        file_reserved_hours=s.file_reserved_hours,
        broker_version=s.version,
    )
    job = JobRound.from_outputs(out)
    out.release()
    # The notebook API's release frees what the read and the round cached.
    assert not holds_cached_frames(spark)
    result = job_vs_broker(snap, recorded, job, SIMULATOR)
    assert not result.unexplained, result.unexplained
    names = {d.name for d in result.differences}
    assert names <= {
        OP_WINDOWS,
        RULES_2_3,
        SAME_ROUND,
        OVERWRITE,
        SPEC_COUNTER,
        SPEC_IMMUNITY,
        NO_COPIES,
    }
    assert NO_COPIES in names
    assert {"check", "immune", "rule1", "too_young"} <= result.classes
    # a wrong prediction is caught: one check less in the job is not by design
    broken = dataclasses.replace(job, checks=job.checks - Counter([next(iter(job.checks))]))
    assert job_vs_broker(snap, recorded, broken, SIMULATOR).unexplained


def test_summary_line():
    def entry(name, line, source, comparison, agrees, **extra):
        return {
            "round": name,
            "line": line,
            "source": source,
            "comparison": comparison,
            "agrees": agrees,
            **extra,
        }

    entries = [
        entry("a", "5.3.3", "run", "simulator", True),
        entry("a", "5.3.3", "run", "job", True, differences=3),
        entry("b", "4.9.x", "run", "simulator", True),
        entry("b", "4.9.x", "run", "job", False, unexplained=1),
        entry("d", "4.9.x", "run", "simulator", True),  # its job comparison never ran
        entry("a", "5.3.3", "run", "tables", True, differences=0),
        entry("b", "4.9.x", "run", "tables", False, differences=2),
        entry("d", "4.9.x", "run", "tables", True, dispatch_cut=True),
        entry("c", "4.9.x", "fixture", "simulator", True),
        entry("c", "4.9.x", "fixture", "job", True),
        entry("c", "4.9.x", "fixture", "tables", True, differences=0),
    ]
    assert summary.summary_line(entries) == (
        "real broker: 1/3 rounds agree (5.3.3 1/1, 4.9.x 0/2); tables: 2 differences"
        " (1 rounds exact, 1 cut by dispatch); the really-pending picture: 3 differences,"
        " 1 NOT by design"
    )
    assert summary.summary_line(entries[8:]) == (
        "real broker: 1/1 rounds agree (5.3.3 0/0, 4.9.x 1/1); tables: 0 differences"
        " (1 rounds exact, 0 cut by dispatch); the really-pending picture: 0 differences,"
        " all by design"
    )
    assert summary.summary_line(entries[10:]) == (
        "real broker: tables: 0 differences (1 rounds exact, 0 cut by dispatch)"
    )
    assert summary.summary_line(entries[8:10]) == (
        "real broker: 1/1 rounds agree (5.3.3 0/0, 4.9.x 1/1); 0 differences, all by design"
    )


def test_torn_store_copy_reads_as_tail_bad_records(spark, tmp_path):
    """A store copy caught mid-write (commit log cut inside its last record, a half-written
    consume-queue entry): the job runs and only the tail is unreadable."""
    store = tmp_path / "store"
    simulation.write_store(_config("5.x", transactions=200), store)
    live = tmp_path / "live"
    shutil.copytree(store, live)
    last = sorted((live / "commitlog").iterdir())[-1]
    full = load_snapshot(store)
    last_half = max(full.half)
    data = last.read_bytes()
    used = len(data.rstrip(b"\0"))
    last.write_bytes(data[: used - 40])  # the newest record loses its tail
    cq = sorted((live / "consumequeue" / simulation.HALF_TOPIC / "0").iterdir())[-1]
    raw = cq.read_bytes().rstrip(b"\0")
    cq.write_bytes(raw + b"\x00\x00\x00\x00\x00\x01")  # 6 bytes of a next entry
    rows = reconcile_live(spark, live)
    assert any(r["queue_id"] == 0 for r in rows)
    assert_torn_tail_only(live)
    assert last_half >= 0


def test_a_dispatch_cut_is_named_as_a_same_round_discard():
    """Two copies reach the maximum this round; the recorded broker discarded one and
    stopped (the second copy was not in the consume queue yet). The cut is accepted only as
    that, and the ladder names the difference "same-round discard", nothing else."""
    from types import SimpleNamespace

    from tests.broker.compare import broker_variant, ladder

    snap = _snap([_half(0, "K", 60, counter="2"), _half(1, "L", 60, counter="2")], [])
    recorded = SimpleNamespace(as_of_ms=T, settings=SETTINGS, half_committed_after=3)
    variant = broker_variant(snap, recorded)
    assert variant.own_copies_limit == 1
    steps = ladder(snap, T, SETTINGS, variant)
    assert [(e.uniq_key, e.counter) for e in steps[0][1].discards] == [("K", 3)]
    changed = {
        name
        for (_, a), (name, b) in itertools.pairwise(steps)
        if (a.h1, a.p1, a.discards) != (b.h1, b.p1, b.discards)
    }
    assert changed == {SAME_ROUND}
    full = SimpleNamespace(as_of_ms=T, settings=SETTINGS, half_committed_after=4)
    assert broker_variant(snap, full).own_copies_limit is None
