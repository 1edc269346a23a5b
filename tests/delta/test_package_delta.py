"""The packaged job under spark-submit with Delta's jars (the README's command), and the
one-line exit 2 when delta-spark is asked for and cannot be loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.delta import IVY_DIR_ENV, delta_spark_coordinate, ivy_dir
from jobs.package import build, command
from tests.delta.helpers import commit_infos, engine
from tests.jobs.segments import AS_OF, segment_argv, write_parquet_segments
from tests.robustness.store import read_table

pytestmark = pytest.mark.delta
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def _submit(tmp_path: Path, delta: bool, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    archive, entry = build(tmp_path / "dist")
    half, op, offsets = write_parquet_segments(tmp_path / "in")
    output = tmp_path / "out"
    argv = command(archive, entry, master="local[2]", delta=delta)
    argv[0] = str(Path(sys.executable).with_name("spark-submit"))
    # The jars come from the project's Ivy cache, as for the job's own Delta session; tiny
    # tables: Delta's state rebuilt in 2 partitions, not 50 (as jobs/session.py does locally).
    argv[1:1] = ["--conf", f"spark.jars.ivy={ivy_dir()}"]
    argv[1:1] = ["--conf", "spark.databricks.delta.snapshotPartitions=2"]
    workdir = tmp_path / "elsewhere"  # outside the checkout: only the package is used
    workdir.mkdir()
    # The output as users type it, relative to the working directory ("../out"): Delta takes
    # a relative table path for a table name unless the writer resolves it.
    relative = Path(os.path.relpath(output, workdir))
    argv += [*segment_argv(half, op, relative, offsets), "--as-of", str(AS_OF), *extra]
    result = subprocess.run(
        argv, cwd=workdir, env=ENV, capture_output=True, text=True, timeout=2400
    )
    return result, output


def _job_lines(result: subprocess.CompletedProcess) -> str:
    """The job's own lines on stderr (spark-submit merges the driver script's stderr into
    its stdout: the job writes them to the JVM's stderr, jobs/progress.py)."""
    return "\n".join(line for line in result.stderr.splitlines() if not line.startswith("\t"))


def test_packaged_job_writes_through_delta_spark_under_spark_submit(tmp_path: Path) -> None:
    result, output = _submit(tmp_path, True, "--run-id", "submitted", "--writer", "delta-spark")

    assert result.returncode == 0, _job_lines(result)[-3000:]
    assert "writing through DeltaSparkOutput" in result.stderr
    pending = sorted(
        (r["half_offset"], r["status"]) for r in read_table(output, "pending").to_pylist()
    )
    assert pending == [(2, "discard_check_max"), (3, "too_young")]
    version = delta_spark_coordinate().rsplit(":", 1)[1]
    for info in commit_infos(output / "pending"):
        assert engine(info) == f"Apache-Spark/4.2.0 Delta-Lake/{version}", info


def test_delta_spark_without_delta_jars_under_spark_submit_is_one_line_exit_2(
    tmp_path: Path,
) -> None:
    result, output = _submit(tmp_path, False, "--writer", "delta-spark")

    assert result.returncode == 2, _job_lines(result)[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --writer delta-spark: this Spark session cannot load Delta"), (
        last
    )
    assert "Traceback" not in result.stdout + result.stderr
    assert not (output / "pending").exists()


def test_own_session_without_cached_jars_or_maven_central_is_one_line_exit_2(
    tmp_path: Path,
) -> None:
    """An empty jar cache and a dead proxy for Ivy (SPARK_SUBMIT_OPTS reaches the JVM that
    resolves --packages): the job's own Delta session cannot start."""
    store = tmp_path / "store"
    from tests.robustness.test_faults import fault_store

    fault_store(store)
    dead_proxy = " ".join(
        f"-D{scheme}.proxyHost=127.0.0.1 -D{scheme}.proxyPort=9" for scheme in ("http", "https")
    )
    env = {**ENV, IVY_DIR_ENV: str(tmp_path / "empty-ivy"), "SPARK_SUBMIT_OPTS": dead_proxy}
    argv = [sys.executable, "-m", "jobs.reconcile", "--store", str(store)]
    argv += ["--output", str(tmp_path / "out"), "--writer", "delta-spark", "--master", "local[1]"]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: Delta's jars ({delta_spark_coordinate()}) could not be loaded")
    assert "Traceback" not in result.stderr


def test_readme_shows_the_command_these_tests_run() -> None:
    printed = command(Path("dist/rmq_txn_reconcile.zip"), Path("dist/reconcile.py"), delta=True)
    assert " ".join(printed) in (ROOT / "README.md").read_text()
