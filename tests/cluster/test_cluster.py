"""The packaged job on a real Spark standalone cluster (``make test-cluster``).

A master and two workers (one core each) run on loopback as separate processes; executors
run their own JVMs and Python workers from a second venv that has the runtime dependencies
only (``tests/cluster/executor_venv.py``), so the code reaches them through ``--py-files``
or not at all. The job is built with ``make package`` and submitted exactly as the README
tells cluster users, from a working directory outside the checkout, over a simulated store
of two brokers; then the same submission with ``--master local[2]``. Asserted:

* the six tables of both runs are equal row for row (same ``--as-of`` and ``--run-id``;
  run-time columns left out), and so are the offset fragments;
* the same cluster submission with Delta's own writer (``--writer delta-spark``, Delta's jars
  through ``--packages`` as the README prints it) writes the same rows, and its commits are
  Delta-Spark's;
* the reader's tasks ran on both workers (Spark's event log);
* nothing was written into the stores, the checkout or the working directory, and the
  stores are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from connectors.delta import (
    DELTA_CATALOG,
    DELTA_EXTENSION,
    LOCK_NAME,
    delta_spark_coordinate,
    ivy_dir,
)
from jobs.offsets import FRAGMENT_AFTER, FRAGMENT_COMMITTED, FRAGMENT_SAFE
from jobs.package import ENTRY_NAME, ZIP_NAME
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
from tests.cluster.executor_venv import ensure_executor_venv
from tests.cluster.standalone import StandaloneCluster, clean_env
from tests.delta.helpers import commit_infos, engine

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
BROKERS = {"broker-a": 11, "broker-b": 12}  # name -> simulator seed
TRANSACTIONS = 2_000
RUN_ID = "cluster-vs-local"
AS_OF = DEFAULT_END_MS  # the simulator's end of traffic: fixed, the same for both runs
CORES = 2  # two workers, one core each
# Spark's default parallelism, which the reader takes as its least number of read tasks:
# twice the cores, so that both executors must read even when one is faster.
PARALLELISM = 2 * CORES
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
RUN_TIME_COLUMNS = {RUN_SUMMARY_TABLE: {"written_at_ms", "duration_ms"}}
# Runs through the two writers differ in the writer they name, and in nothing else.
WRITER_COLUMNS = {RUN_SUMMARY_TABLE: {"written_at_ms", "duration_ms", "writer"}}
# The README's delta-spark command: Delta's jars and extension (the jars resolved into the
# project's Ivy cache, as for the job's own Delta session); tiny tables: Delta's state rebuilt in
# 2 partitions, not 50.
DELTA_SPARK_SUBMIT = (
    "--packages",
    delta_spark_coordinate(),
    "--conf",
    f"spark.sql.extensions={DELTA_EXTENSION}",
    "--conf",
    f"spark.sql.catalog.spark_catalog={DELTA_CATALOG}",
    "--conf",
    f"spark.jars.ivy={ivy_dir()}",
    "--conf",
    "spark.databricks.delta.snapshotPartitions=2",
)
SUBMIT_TIMEOUT_S = 900


@dataclass(frozen=True)
class Submitted:
    output: Path
    events: Path
    result: subprocess.CompletedProcess[str]


@dataclass(frozen=True)
class Runs:
    cluster: Submitted
    local: Submitted
    cluster_delta_spark: Submitted
    workers: dict[str, str]  # web UI host:port -> worker id
    work: Path
    checkout_before: dict
    checkout_after: dict
    stores_before: dict
    stores_after: dict


# -- helpers ---------------------------------------------------------------------------------


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float):
    """A child in its own process group, killed with its children when it overruns."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def _tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` with its size and modification time."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not (Path(folder) == root and d in skip)]
        for name in [*dirs, *files]:
            path = Path(folder) / name
            stat = path.lstat()
            found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return found


def _hashes(root: Path) -> dict[str, tuple[str, int, int]]:
    """Content hash, mode and mtime of every file of a store."""
    found = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        found[str(path.relative_to(root))] = (digest, stat.st_mode, stat.st_mtime_ns)
    return found


def _rows(output: Path, table: str, skip_columns: dict = RUN_TIME_COLUMNS) -> list[str]:
    path = str(output / table)
    data = DeltaTable(path).to_pyarrow_table(
        filesystem=pafs.SubTreeFileSystem(path, pafs.LocalFileSystem())
    )
    skip = skip_columns.get(table, set())
    rows = [{k: v for k, v in row.items() if k not in skip} for row in data.to_pylist()]
    return sorted(json.dumps(row, sort_keys=True, default=repr) for row in rows)


def _events(folder: Path) -> list[dict]:
    logs = [p for p in folder.iterdir() if not p.name.startswith(".")]
    assert len(logs) == 1, f"expected one event log in {folder}: {logs}"
    assert not logs[0].name.endswith(".inprogress"), "the application did not finish"
    return [json.loads(line) for line in logs[0].read_text().splitlines() if line.strip()]


def _scopes(stage_info: dict) -> set[str]:
    """Names of the operators whose RDDs a stage ran (``RDD Info`` scopes of the event log)."""
    return {json.loads(rdd["Scope"])["name"] for rdd in stage_info["RDD Info"] if rdd.get("Scope")}


def _submit(
    python: Path,
    master: str,
    name: str,
    base: Path,
    work: Path,
    dist: Path,
    extra: tuple[str, ...] = (),
    job_extra: tuple[str, ...] = (),
) -> Submitted:
    """The README's cluster command (plus this test's scratch and event-log settings);
    ``extra``: more spark-submit options (the delta-spark variant's ``--packages`` ...),
    ``job_extra``: more arguments of the job."""
    venv_bin = python.parent
    spark_home = _spark_home(python)
    output = base / f"out-{name}"
    events = base / f"events-{name}"
    events.mkdir()
    scratch = base / f"scratch-{name}"
    env = clean_env(
        spark_home,
        scratch,
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
    )
    stores = [
        f"--store={broker}={os.path.relpath(base / 'stores' / broker, work)}" for broker in BROKERS
    ]
    argv = [
        str(venv_bin / "spark-submit"),
        "--master",
        master,
        "--conf",
        f"spark.pyspark.python={python}",
        "--driver-memory",
        "1g",
        "--executor-memory",
        "512m",
        "--conf",
        "spark.scheduler.minRegisteredResourcesRatio=1.0",
        "--conf",
        "spark.scheduler.maxRegisteredResourcesWaitingTime=300s",
        "--conf",
        f"spark.default.parallelism={PARALLELISM}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.eventLog.enabled=true",
        "--conf",
        f"spark.eventLog.dir={events.as_uri()}",
        # One plain JSON-lines file (Spark 4 otherwise writes zstd, and may roll files).
        "--conf",
        "spark.eventLog.compress=false",
        "--conf",
        "spark.eventLog.rolling.enabled=false",
        "--conf",
        f"spark.local.dir={scratch / 'local'}",
        # A session with Delta's catalog creates Spark's default warehouse folder (empty:
        # the job registers no table unless asked) in the working directory: scratch too.
        "--conf",
        f"spark.sql.warehouse.dir={scratch / 'warehouse'}",
        "--conf",
        f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={scratch / 'tmp'}",
        "--conf",
        f"spark.executor.extraJavaOptions=-Djava.io.tmpdir={scratch / 'tmp'}",
        *extra,
        "--py-files",
        str(dist / ZIP_NAME),
        str(dist / ENTRY_NAME),
        *stores,
        "--output",
        os.path.relpath(output, work),
        "--as-of",
        str(AS_OF),
        "--run-id",
        RUN_ID,
        *job_extra,
    ]
    print(f"\n$ (cd {work} && {' '.join(argv)})", flush=True)
    started = time.monotonic()
    result = _run(argv, work, env, SUBMIT_TIMEOUT_S)
    print(f"{name}: exit {result.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    assert result.returncode == 0, f"{name} run failed:\n{result.stderr[-4000:]}"
    return Submitted(output, events, result)


def _interrupt_on_sigterm() -> None:
    """`timeout` (CI) ends this process with SIGTERM: turn it into an exception, so the
    cluster's `with` block stops the daemons."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


# -- the runs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    _interrupt_on_sigterm()
    python = ensure_executor_venv()
    probe = _run([str(python), "-c", "import jobs"], Path("/"), {"PATH": "/usr/bin:/bin"}, 60)
    assert probe.returncode != 0, f"{python} can import the project: the test would prove nothing"

    base = tmp_path_factory.mktemp("cluster")
    work = base / "work"  # the submitting user's working directory, outside the checkout
    work.mkdir()
    checkout_before = _tree(ROOT, skip=(".venv", ".git"))

    dist = base / "dist"
    package = _run(
        ["make", "-C", str(ROOT), "package", f"DIST={dist}"],
        work,
        {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        300,
    )
    assert package.returncode == 0, package.stderr
    for broker, seed in BROKERS.items():
        simulate = _run(
            [
                sys.executable,
                "-m",
                "simulator",
                "--out",
                str(base / "stores" / broker),
                "--transactions",
                str(TRANSACTIONS),
                "--seed",
                str(seed),
            ],
            base,
            {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            300,
        )
        assert simulate.returncode == 0, simulate.stderr
    stores_before = _hashes(base / "stores")

    with StandaloneCluster(_spark_home(python), base / "cluster", workers=2, cores=1) as cluster:
        workers = {urlparse(w["webuiaddress"]).netloc: w["id"] for w in cluster.state()["workers"]}
        print(f"\ncluster {cluster.url}: workers {sorted(workers.values())}", flush=True)
        on_cluster = _submit(python, cluster.url, "cluster", base, work, dist)
        delta_spark = _submit(
            python,
            cluster.url,
            "cluster-delta-spark",
            base,
            work,
            dist,
            extra=DELTA_SPARK_SUBMIT,
            job_extra=("--writer", "delta-spark"),
        )
    local = _submit(python, "local[2]", "local", base, work, dist)

    yield Runs(
        cluster=on_cluster,
        local=local,
        cluster_delta_spark=delta_spark,
        workers=workers,
        work=work,
        checkout_before=checkout_before,
        checkout_after=_tree(ROOT, skip=(".venv", ".git")),
        stores_before=stores_before,
        stores_after=_hashes(base / "stores"),
    )


def _spark_home(python: Path) -> Path:
    found = _run(
        [str(python), "-c", "import pyspark, os; print(os.path.dirname(pyspark.__file__))"],
        Path("/"),
        {"PATH": "/usr/bin:/bin"},
        120,
    )
    assert found.returncode == 0, found.stderr
    return Path(found.stdout.strip())


# -- the assertions ---------------------------------------------------------------------------


@pytest.mark.parametrize("table", TABLES)
def test_tables_equal_a_local_run(runs: Runs, table: str) -> None:
    on_cluster = _rows(runs.cluster.output, table)
    local = _rows(runs.local.output, table)

    assert on_cluster == local
    # a store of this size has rows in the others
    if table not in (DISCARDS_TABLE, BAD_RECORDS_TABLE, DISCARD_HISTORY_TABLE, ANOMALIES_TABLE):
        assert on_cluster, f"{table} is empty: the comparison would prove little"


def test_offset_fragments_equal_a_local_run(runs: Runs) -> None:
    for broker in BROKERS:
        for name in (FRAGMENT_SAFE, FRAGMENT_AFTER, FRAGMENT_COMMITTED):
            relative = Path("offset_fragments") / broker / name
            cluster_text = (runs.cluster.output / relative).read_text()
            assert cluster_text == (runs.local.output / relative).read_text()


def test_the_reader_ran_on_both_workers(runs: Runs) -> None:
    events = _events(runs.cluster.events)
    executors = {
        e["Executor ID"]: urlparse(e["Executor Info"]["Log Urls"]["stdout"]).netloc
        for e in events
        if e["Event"] == "SparkListenerExecutorAdded"
    }
    # The stage that ran the store reader's Python (mapInArrow over its task list): the
    # first one that did, since the run's first query decodes the half and op records into
    # the read's cache (later stages read the cache, and the discard topic is read later).
    read_stages = {
        e["Stage Info"]["Stage ID"]: e["Stage Info"]["Number of Tasks"]
        for e in events
        if e["Event"] == "SparkListenerStageCompleted"
        and _scopes(e["Stage Info"]) >= {"MapInArrow"}
    }
    assert read_stages, "no stage ran the store reader"
    read_stage = min(read_stages)
    read_tasks = read_stages[read_stage]
    by_worker = Counter(
        runs.workers.get(executors.get(e["Task Info"]["Executor ID"]), "?")
        for e in events
        if e["Event"] == "SparkListenerTaskEnd"
        and e["Stage ID"] == read_stage
        and e["Task End Reason"]["Reason"] == "Success"
    )
    all_tasks = Counter(
        runs.workers.get(executors.get(e["Task Info"]["Executor ID"]), "?")
        for e in events
        if e["Event"] == "SparkListenerTaskEnd"
    )
    print("\nworkers that ran tasks (reader's tasks / all tasks):")
    for worker in sorted(all_tasks):
        print(f"  {worker}: {by_worker.get(worker, 0)} / {all_tasks[worker]}")

    assert read_tasks >= 2 * CORES
    assert sum(by_worker.values()) == read_tasks
    assert set(by_worker) == set(runs.workers.values()), f"reader's tasks by worker: {by_worker}"


def test_nothing_written_outside_the_output(runs: Runs) -> None:
    assert sorted(runs.work.iterdir()) == []
    assert runs.checkout_after == runs.checkout_before
    assert runs.stores_after == runs.stores_before
    for submitted in (runs.cluster, runs.local, runs.cluster_delta_spark):
        # The commit lock (docs/decisions.md, concurrent processes) is a flock file: it stays.
        assert sorted(p.name for p in submitted.output.iterdir()) == sorted(
            [*TABLES, "offset_fragments", LOCK_NAME]
        )


@pytest.mark.parametrize("table", TABLES)
def test_delta_spark_on_the_cluster_writes_the_same_rows(runs: Runs, table: str) -> None:
    through_delta_spark = _rows(runs.cluster_delta_spark.output, table, WRITER_COLUMNS)

    assert through_delta_spark == _rows(runs.local.output, table, WRITER_COLUMNS)
    infos = commit_infos(runs.cluster_delta_spark.output / table)
    assert infos, f"{table}: no commits"
    version = delta_spark_coordinate().rsplit(":", 1)[1]
    assert {engine(info) for info in infos} == {f"Apache-Spark/4.2.0 Delta-Lake/{version}"}
