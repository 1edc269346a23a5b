"""Issue 10: every recorded round of a real broker against our simulator and against the job.

Rounds come from ``tests/fixtures/real-broker/<version>/`` (always) and from the run
directories of ``RMQ_BROKER_RUN`` (``make test-broker-compare RUN=<dir>``). Comparison 1
replays the simulator's round (``simulator.broker_round``) on the snapshot;
comparison 2 runs the job on it (the notebook API in the shared session; one round per
version line through the command line) and names every difference (``compare.py``).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.broker_round import Snapshot, load_snapshot
from tests.broker import summary
from tests.broker.compare import (
    BY_DESIGN,
    CLASSES,
    JobRound,
    broker_variant,
    job_vs_broker,
    simulator_vs_broker,
)

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

ROOT = Path(__file__).resolve().parents[2]


def _check_source(source: str, recorded) -> None:
    if source == "error":
        pytest.fail(str(recorded), pytrace=False)


@functools.lru_cache(maxsize=64)
def _snapshot(path: Path, as_of_ms: int) -> Snapshot:
    return load_snapshot(path, as_of_ms)


def _broker_args(recorded) -> dict:
    s = recorded.settings
    return {
        "check_max": s.check_max,
        "transaction_timeout_ms": s.transaction_timeout_ms,
        "file_reserved_hours": s.file_reserved_hours,
        "broker_version": s.version,
    }


_JOB: dict[str, JobRound] = {}


def _first_of_line(source: str, recorded) -> bool:
    from tests.broker.conftest import sources

    first = next(r for s, r in sources() if s == source and r.line == recorded.line)
    return first.id == recorded.id


def _job_round(spark, source: str, recorded, tmp_root: Path) -> JobRound:
    """The job's round on the snapshot (cached per round): the first round of each version
    line through the command line as a user runs it, the others through the notebook API in
    the shared session (a JVM per round would cost a minute each)."""
    key = f"{source}:{recorded.id}"
    if key not in _JOB:
        if _first_of_line(source, recorded):
            _JOB[key] = _cli_round(recorded, tmp_root / key.replace(":", "-"))
        else:
            from jobs.reconcile import reconcile_stores

            out = reconcile_stores(
                spark,
                [f"broker={recorded.snapshot}"],
                as_of=recorded.as_of_ms,
                **_broker_args(recorded),
            )
            _JOB[key] = JobRound.from_outputs(out)
            out.release()  # 24 rounds in one session: each one's cache would stay
    return _JOB[key]


def _cli_round(recorded, out: Path) -> JobRound:
    from deltalake import DeltaTable

    args = _broker_args(recorded)
    argv = [
        sys.executable,
        "-m",
        "jobs.reconcile",
        "--store",
        f"broker={recorded.snapshot}",
        "--as-of",
        str(recorded.as_of_ms),
        "--check-max",
        str(args["check_max"]),
        "--transaction-timeout-ms",
        str(args["transaction_timeout_ms"]),
        "--file-reserved-hours",
        str(args["file_reserved_hours"]),
        "--broker-version",
        args["broker_version"],
        "--master",
        "local[1]",
        "--output",
        str(out),
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}: {done.stderr[-1500:]}"
    pending = DeltaTable(str(out / "pending")).to_pyarrow_table().to_pylist()
    run_summary = DeltaTable(str(out / "run_summary")).to_pyarrow_table().to_pylist()
    return JobRound.from_rows(pending, run_summary)


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
