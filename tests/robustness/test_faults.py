"""Faults and reruns: a job stopped right after any table commit, then rerun with the same
run id, leaves exactly one copy of the run's rows in every table, and the offsets table
never moves ahead of the other tables; two concurrent runs against one output root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.mirror import MIRROR_TABLE
from jobs.reconcile import main
from tests.robustness.store import (
    TABLES,
    T,
    comparable,
    half,
    mirrored_places,
    op,
    read_table,
    rows_of,
    write,
)

# Real processes killed mid-write and two concurrent runs: minutes of JVM starts, so their own
# suite (`make test-processes`, run by .ci/run), outside `make test`.
pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3_600_000


def fault_store(root: Path) -> list[dict]:
    """Rows for every table: a resolved half, checks, both discards, an immune record, an
    unparsable counter (a bad record), a too-young record that stops the round, and one
    not reached."""
    return write(
        root,
        [
            op(b"0,"),
            half(0),
            half(1),
            half(2, TRANSACTION_CHECK_TIMES="15"),
            half(3, age_ms=73 * HOUR),
            half(4, age_ms=30_000, CHECK_IMMUNITY_TIME_IN_SECONDS="60"),
            half(5, TRANSACTION_CHECK_TIMES="abc"),
            half(6, age_ms=2_000),
            half(7),
        ],
    )


EXPECTED_PENDING = [
    (1, "check"),
    (2, "discard_check_max"),
    (3, "discard_expired"),
    (4, "immune"),
    (5, "check"),
    (6, "too_young"),
    (7, "not_reached"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faults") / "broker-f"
    fault_store(root)
    return root


# The tables after whose commit a fault is injected (all of them here; delta-spark's suite
# repeats the test at the points where its writer's code paths differ).
FAULT_POINTS: tuple[str, ...] = TABLES


def _args(store: Path, output: Path, run_id: str) -> list[str]:
    return ["--store", str(store), "--output", str(output), "--as-of", str(T), "--run-id", run_id]


def _tables(output: Path, run_id: str) -> dict[str, list[dict]]:
    return {table: rows_of(output, table, run_id) for table in TABLES}


def fail_after(fault: str):
    """An after-commit callback that stops the run right after ``fault`` is committed, the
    way a killed driver would leave the tables (the command line passes no callback)."""

    def after_commit(table: str) -> None:
        if table == fault:
            raise SystemExit(f"fault injected after committing {table}")

    return after_commit


def test_fault_after_each_table_then_rerun_leaves_one_copy(
    spark, store, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "out"
    # A clean run of another run id first: the reference, and rows that must stay untouched.
    assert main(_args(store, output, "clean"), spark=spark) == 0
    reference = {table: comparable(rows) for table, rows in _tables(output, "clean").items()}
    assert (
        sorted((r["half_offset"], r["status"]) for r in rows_of(output, "pending", "clean"))
        == EXPECTED_PENDING
    )
    assert all(reference[table] for table in TABLES), "every table has rows of the reference run"

    for fault in FAULT_POINTS:
        i = TABLES.index(fault)
        capsys.readouterr()
        assert main(_args(store, output, "r"), spark=spark, after_commit=fail_after(fault)) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"error: fault injected after committing {fault}"
        )
        now = _tables(output, "r")
        for j, table in enumerate(TABLES):
            if j <= i:  # committed by this attempt (and replaced, if an earlier attempt did too)
                assert comparable(now[table]) == reference[table], (fault, table)
            else:  # never committed for this run yet
                assert now[table] == [], (fault, table)
        # offsets never ahead of the other tables: no row of the run until every other table is in
        assert (now["consume_offsets"] != []) == (fault == "consume_offsets")
        assert {t: comparable(r) for t, r in _tables(output, "clean").items()} == reference

    assert main(_args(store, output, "r"), spark=spark) == 0
    assert {t: comparable(r) for t, r in _tables(output, "r").items()} == reference
    assert {t: comparable(r) for t, r in _tables(output, "clean").items()} == reference
    for table in TABLES:
        assert set(read_table(output, table).column("run_id").to_pylist()) == {"clean", "r"}


@pytest.mark.slow
def test_two_concurrent_runs_on_one_output_root(store, tmp_path):
    """Real processes, different run ids, the same output root, started together, each
    through the store's mirror: the commit lock lets one decode the store into it, the
    other then finds nothing new; the mirror holds each record once."""
    output = tmp_path / "out"
    run_concurrently(store, output, {"left": ["--mirror"], "right": ["--mirror"]})
    places = mirrored_places(output, MIRROR_TABLE)
    records = 2 + len(EXPECTED_PENDING)  # the op, the resolved half and the pending halves
    assert len(places) == len(set(places)) == records


def run_concurrently(store: Path, output: Path, extra_args: dict[str, list[str]]) -> list[str]:
    """Start one job process per run id (with its extra arguments) on ``output`` at once;
    check that each either succeeded or failed with a one-line conflict message, and that
    the tables hold one copy of each successful run. Returns the run ids that succeeded."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    procs = {
        run_id: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobs.reconcile",
                *_args(store, output, run_id),
                "--master",
                "local[1]",
                *extra,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run_id, extra in extra_args.items()
    }
    results = {run_id: proc.communicate(timeout=900) for run_id, proc in procs.items()}
    codes = {run_id: proc.returncode for run_id, proc in procs.items()}
    succeeded = [run_id for run_id, code in codes.items() if code == 0]
    assert succeeded, results
    for run_id, code in codes.items():
        if code != 0:  # a clear one-line conflict message, never a stack trace
            assert code == 1, results[run_id][1]
            last = results[run_id][1].strip().splitlines()[-1]
            assert last.startswith("error: ") and (
                "conflict" in last.lower() or "concurrent" in last.lower()
            ), last
            assert "Traceback" not in results[run_id][1]
    for table in TABLES:
        data = read_table(output, table)  # readable with deltalake
        runs = data.column("run_id").to_pylist()
        assert set(runs) <= set(codes), table
        assert len({runs.count(run_id) for run_id in succeeded}) <= 1, table
    rows = {run_id: _tables(output, run_id) for run_id in succeeded}
    for run_id in succeeded:
        assert (
            sorted((r["half_offset"], r["status"]) for r in rows[run_id]["pending"])
            == EXPECTED_PENDING
        )
        assert len(rows[run_id]["consume_offsets"]) == 2 and len(rows[run_id]["run_summary"]) == 1
        assert len(rows[run_id]["bad_records"]) == 1 and len(rows[run_id]["discards"]) == 2
        assert len(rows[run_id]["check_requests"]) == 2
    first = {t: comparable(r) for t, r in rows[succeeded[0]].items()}
    for run_id in succeeded[1:]:
        assert {t: comparable(r) for t, r in rows[run_id].items()} == first, run_id
    return succeeded


def test_a_fault_after_discard_history_leaves_offsets_behind_and_a_rerun_converges(spark, tmp_path):
    """discard_history is merged, not partitioned by run: it is committed before the
    offsets, and the rerun of a run that died right after it leaves the same rows."""
    root, output = tmp_path / "broker-f", tmp_path / "out"
    discarded = {**half(1, TRANSACTION_CHECK_TIMES="16"), "topic": "TRANS_CHECK_MAX_TIME_TOPIC"}
    write(root, [op(b"0,"), half(0), half(1, TRANSACTION_CHECK_TIMES="15"), discarded])

    fault = fail_after("discard_history")
    assert main(_args(root, output, "r"), spark=spark, after_commit=fault) == 1
    history = rows_of(output, "discard_history")
    assert [(r["discard_offset"], r["outcome"], r["run_id"]) for r in history] == [
        (0, "unresolved", "r")
    ]
    assert rows_of(output, "consume_offsets", "r") == []  # never ahead of discard_history

    assert main(_args(root, output, "r"), spark=spark) == 0
    assert rows_of(output, "discard_history") == history
    assert len(rows_of(output, "consume_offsets", "r")) == 2
