"""The job on a real Spark Connect server (``make test-connect``).

A ``SparkConnectServer`` of the installed pyspark runs on loopback (``tests/connect/server.py``:
``local[2]``, a clean environment, no PYTHONPATH). Over one simulated store, with the same
``--as-of`` and ``--run-id``:

* the command line as a user runs it (``python -m jobs.reconcile --remote sc://...``) writes
  the same rows in every table, and the same offset fragments, as a ``local[2]`` run;
* the notebook functions in a Connect session: ``reconcile_stores`` gives the same rows
  (but the columns only a write fills), ``reconcile_stores_to_delta`` writes the same rows;
* the Python workers import the job from the zip the session shipped, not from the server's
  environment;
* a server that does not answer is exit 1 with one line; a malformed URL is exit 2 before
  any Spark starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from jobs.offsets import FRAGMENT_AFTER, FRAGMENT_COMMITTED, FRAGMENT_SAFE
from schemas.outputs import (
    ANOMALIES_TABLE,
    BAD_RECORDS_TABLE,
    CHECK_REQUESTS_TABLE,
    CONSUME_OFFSETS_TABLE,
    DISCARD_HISTORY_TABLE,
    DISCARDS_TABLE,
    PENDING_TABLE,
    RUN_SUMMARY_TABLE,
)
from simulator.simulation import DEFAULT_END_MS
from tests.cluster.standalone import LOOPBACK, free_port
from tests.connect.server import ConnectServer

pytestmark = pytest.mark.connect

ROOT = Path(__file__).resolve().parents[2]
BROKER = "broker-a"
TRANSACTIONS = 1_000
RUN_ID = "connect-vs-local"
AS_OF = DEFAULT_END_MS  # the simulator's end of traffic: fixed, the same for every run
TABLES = (
    CHECK_REQUESTS_TABLE,
    DISCARDS_TABLE,
    PENDING_TABLE,
    CONSUME_OFFSETS_TABLE,
    RUN_SUMMARY_TABLE,
    DISCARD_HISTORY_TABLE,
    ANOMALIES_TABLE,
    BAD_RECORDS_TABLE,
)
# When a run wrote its summary and how long it took; the notebook's frames have none of
# what only a write fills.
RUN_TIME_COLUMNS = {RUN_SUMMARY_TABLE: {"written_at_ms", "duration_ms"}}
WRITE_COLUMNS = {
    RUN_SUMMARY_TABLE: {"written_at_ms", "duration_ms", "inputs", "writer", "job_version"}
}
TIMEOUT_S = 900


@dataclass
class Runs:
    store: Path
    local: Path
    connect: Path
    connect_stderr: str
    notebook_rows: dict[str, list[str]]
    notebook_delta: Path
    worker_module_file: str


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    return subprocess.run(
        [sys.executable, "-m", "jobs.reconcile", *args],
        cwd=cwd,
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def _job_args(store: Path, output: Path) -> list[str]:
    return [
        "--store",
        f"{BROKER}={store}",
        "--output",
        str(output),
        "--as-of",
        str(AS_OF),
        "--run-id",
        RUN_ID,
    ]


def _interrupt_on_sigterm() -> None:
    """`timeout` (CI) ends this process with SIGTERM: an exception instead, so that the
    server's `with` block stops it."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def _value(value: object) -> str:
    """JSON's fallback: an instant as UTC wall time (a frame's rows hold naive datetimes in
    the session's time zone, UTC; Delta's Arrow tables hold them with the zone)."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return repr(value)


def _frame_rows(frame, skip: set[str]) -> list[str]:
    rows = [{k: v for k, v in row.asDict(True).items() if k not in skip} for row in frame.collect()]
    return sorted(json.dumps(row, sort_keys=True, default=_value) for row in rows)


def _delta_rows(output: Path, table: str, skip: set[str]) -> list[str]:
    path = str(output / table)
    data = DeltaTable(path).to_pyarrow_table(
        filesystem=pafs.SubTreeFileSystem(path, pafs.LocalFileSystem())
    )
    rows = [{k: v for k, v in row.items() if k not in skip} for row in data.to_pylist()]
    return sorted(json.dumps(row, sort_keys=True, default=_value) for row in rows)


def _notebook(url: str, store: Path, output: Path) -> tuple[dict[str, list[str]], str]:
    """Both notebook functions in one Connect session (released before the server stops)."""
    from pyspark.sql import functions as F

    from jobs.reconcile import reconcile_stores, reconcile_stores_to_delta
    from jobs.session import build_session

    spark = build_session(remote=url, shuffle_partitions=8)  # as the command line's
    try:
        outputs = reconcile_stores(spark, [f"{BROKER}={store}"], as_of=AS_OF, run_id=RUN_ID)
        rows = {
            table: _frame_rows(frame, WRITE_COLUMNS.get(table, set()))
            for table, frame in outputs.tables().items()
        }
        outputs.release()
        reconcile_stores_to_delta(
            spark, [f"{BROKER}={store}"], str(output), as_of=AS_OF, run_id=RUN_ID
        )
        where = F.udf(lambda _: __import__("jobs").__file__, "string", useArrow=False)
        module_file = spark.range(1).select(where("id")).first()[0]
    finally:
        spark.stop()
    return rows, module_file


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    _interrupt_on_sigterm()
    base = tmp_path_factory.mktemp("connect")
    store = base / "stores" / BROKER
    simulate = subprocess.run(
        [sys.executable, "-m", "simulator", "--out", str(store)]
        + ["--transactions", str(TRANSACTIONS), "--seed", "11"],
        cwd=base,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert simulate.returncode == 0, simulate.stderr
    local = _cli([*_job_args(store, base / "local"), "--master", "local[2]"], base)
    assert local.returncode == 0, local.stderr[-3000:]
    with ConnectServer(base / "server") as server:
        connect = _cli([*_job_args(store, base / "connect"), "--remote", server.url], base)
        assert connect.returncode == 0, connect.stderr[-3000:]
        rows, module_file = _notebook(server.url, store, base / "notebook")
    yield Runs(
        store,
        base / "local",
        base / "connect",
        connect.stderr,
        rows,
        base / "notebook",
        module_file,
    )


@pytest.mark.parametrize("table", TABLES)
def test_the_command_line_on_connect_writes_what_a_local_run_writes(runs: Runs, table: str) -> None:
    skip = RUN_TIME_COLUMNS.get(table, set())
    on_connect = _delta_rows(runs.connect, table, skip)

    assert on_connect == _delta_rows(runs.local, table, skip)
    if table in (CHECK_REQUESTS_TABLE, PENDING_TABLE, CONSUME_OFFSETS_TABLE, RUN_SUMMARY_TABLE):
        assert on_connect, f"{table} is empty: the comparison would prove little"


def test_offset_fragments_equal_a_local_run(runs: Runs) -> None:
    for name in (FRAGMENT_SAFE, FRAGMENT_AFTER, FRAGMENT_COMMITTED):
        relative = Path("offset_fragments") / BROKER / name
        assert (runs.connect / relative).read_text() == (runs.local / relative).read_text()


def test_the_connect_run_prints_progress_and_no_error(runs: Runs) -> None:
    lines = runs.connect_stderr.splitlines()
    assert any(line.endswith("] done") for line in lines), runs.connect_stderr[-2000:]
    assert not [line for line in lines if line.startswith("error:")]


@pytest.mark.parametrize("table", TABLES)
def test_reconcile_stores_in_a_connect_session_gives_the_local_rows(runs: Runs, table: str) -> None:
    local = _delta_rows(runs.local, table, WRITE_COLUMNS.get(table, set()))

    assert runs.notebook_rows[table] == local


@pytest.mark.parametrize("table", TABLES)
def test_reconcile_stores_to_delta_in_a_connect_session_writes_the_local_rows(
    runs: Runs, table: str
) -> None:
    skip = RUN_TIME_COLUMNS.get(table, set())

    assert _delta_rows(runs.notebook_delta, table, skip) == _delta_rows(runs.local, table, skip)


def test_the_workers_run_the_code_the_session_shipped(runs: Runs) -> None:
    # The server's own environment could import the checkout (the venv installs it
    # editable): the shipped zip comes first on the workers' path.
    assert ".zip" in runs.worker_module_file, runs.worker_module_file
    assert not runs.worker_module_file.startswith(str(ROOT))


def test_an_unreachable_server_is_one_line_and_exit_1(runs: Runs, tmp_path: Path) -> None:
    url = f"sc://{LOOPBACK}:{free_port()}"  # nothing listens there

    result = _cli([*_job_args(runs.store, tmp_path / "out"), "--remote", url], tmp_path)

    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and errors[0].startswith(
        f"error: Spark Connect server {url} unreachable: "
    ), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / PENDING_TABLE).exists()


@pytest.mark.parametrize("url", ["http://host:15002", "sc://host:port", "sc://:15002", "sc://h/x"])
def test_a_malformed_remote_is_exit_2_before_spark_starts(
    runs: Runs, tmp_path: Path, url: str
) -> None:
    result = _cli([*_job_args(runs.store, tmp_path / "out"), "--remote", url], tmp_path)

    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines()[-1].startswith(
        f"error: --remote {url}: not a Spark Connect URL"
    )
    assert not (tmp_path / "out").exists()
