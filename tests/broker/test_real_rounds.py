"""Issue 10: every recorded round of a real broker against our simulator and against the job.

Rounds come from ``tests/fixtures/real-broker/<version>/`` (always) and from the run
directories of ``RMQ_BROKER_RUN`` (``make test-broker-compare RUN=<dir>``). Comparison 1
replays the simulator's round (``simulator.broker_round``) on the snapshot;
comparison 2 runs the job on it (the notebook API in the shared session; one round per
version line through the command line) and names every difference (``compare.py``).
"""

from __future__ import annotations

import pytest

from tests.broker import summary
from tests.broker.compare import (
    BY_DESIGN,
    CLASSES,
    broker_variant,
    job_vs_broker,
    simulator_vs_broker,
)
from tests.broker.job_rounds import check_source as _check_source
from tests.broker.job_rounds import job_round as _job_round
from tests.broker.job_rounds import snapshot as _snapshot

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs


def test_simulator_round_reproduces_the_broker_round(source, recorded):
    _check_source(source, recorded)
    snap = _snapshot(recorded.snapshot, recorded.as_of_ms)
    broker = broker_variant(snap, recorded)
    _, problems = simulator_vs_broker(snap, recorded, broker)
    summary.record(
        recorded.id,
        recorded.line,
        source,
        "simulator",
        not problems,
        dispatch_cut=broker.own_copies_limit,
    )
    assert not problems, f"{recorded.id}: simulator != broker: " + "; ".join(problems)


def test_job_predicts_the_broker_round(spark, tmp_path_factory, source, recorded):
    _check_source(source, recorded)
    snap = _snapshot(recorded.snapshot, recorded.as_of_ms)
    job = _job_round(spark, source, recorded, tmp_path_factory.getbasetemp())
    result = job_vs_broker(snap, recorded, job, broker_variant(snap, recorded))
    summary.record(
        recorded.id,
        recorded.line,
        source,
        "job",
        result.agrees,
        differences=len(result.differences),
        unexplained=len(result.unexplained),
        names=sorted({d.name for d in result.differences}),
        classes=sorted(result.classes),
    )
    assert {d.name for d in result.differences} <= set(BY_DESIGN)
    assert not result.unexplained, f"{recorded.id}: " + "; ".join(result.unexplained)


def test_every_class_occurs_in_a_compared_round(
    spark, tmp_path_factory, version_source, version_line
):
    """rules 1/2/3, check, immune, both discards, too_young, not_reached: "all rounds agree"
    is not vacuous for this version line."""
    from tests.broker.conftest import sources

    _check_source(version_source, version_line)
    seen: set[str] = set()
    for source, recorded in sources():
        if source == version_source and recorded.line == version_line:
            snap = _snapshot(recorded.snapshot, recorded.as_of_ms)
            job = _job_round(spark, source, recorded, tmp_path_factory.getbasetemp())
            seen |= job_vs_broker(snap, recorded, job, broker_variant(snap, recorded)).classes
    missing = [c for c in CLASSES if c not in seen]
    assert not missing, f"{version_source} {version_line}: no compared round has {missing}"


def test_live_snapshot_reads_without_failing(spark, live_source, live_store):
    """A store copied while the broker was writing: the job runs, and what it cannot read is
    bad records at the tail of their files, never a failure."""
    from tests.broker.live import assert_torn_tail_only, reconcile_live

    _check_source(live_source, live_store)
    assert live_store.is_dir(), f"{live_store}: the run has no live snapshot"
    reconcile_live(spark, live_store)
    assert_torn_tail_only(live_store)
