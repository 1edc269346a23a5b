"""`make package` output runs under spark-submit from a directory outside the checkout."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jobs.package import build
from tests.jobs.segments import AS_OF, segment_argv, write_parquet_segments
from tests.robustness.store import read_table

ROOT = Path(__file__).resolve().parents[2]


# A fresh shell starts its own spark-submit JVM: make test-processes, outside make test.
@pytest.mark.processes
def test_the_printed_command_runs_as_is_from_a_fresh_shell_and_stays_quiet(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "dist"
    printed = subprocess.run(
        [sys.executable, "-m", "jobs.package", str(dist)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    archive = dist / "rmq_txn_reconcile.zip"
    names = set(zipfile.ZipFile(archive).namelist())
    assert {
        "jobs/reconcile.py",
        "jobs/cli.py",
        "jobs/extract.py",
        "jobs/run.py",
        "jobs/notebook.py",
        "jobs/output.py",
        "jobs/history.py",
        "transforms/round.py",
        "schemas/outputs.py",
        "connectors/delta.py",
        "connectors/delta_jars.py",
        "connectors/delta_commit.py",
        "connectors/delta_rs.py",
        "connectors/delta_spark.py",
        "connectors/rocketmq/reader.py",
        "connectors/rocketmq/read_plan.py",
        "connectors/rocketmq/read_tasks.py",
        "connectors/rocketmq/combined.py",
        "conf/default.toml",
    } <= names
    # The simulator and the store writer are tooling, not the job: the run below works without.
    assert not [name for name in names if name.startswith("simulator/")]
    line = next(line for line in printed.splitlines() if "spark-submit" in line)
    job_args = " --store [NAME=]DIR --output OUT --as-of latest"
    assert line.endswith(job_args)

    half, op, offsets = write_parquet_segments(tmp_path / "in")
    output = tmp_path / "out"
    args = [*segment_argv(half, op, output, offsets), "--as-of", str(AS_OF), "--run-id", "sub"]
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    # A fresh shell: no venv activated, no PYSPARK_* variables, a minimal PATH.
    fresh = {"HOME": os.environ.get("HOME", "/"), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    shell_line = line.removesuffix(job_args) + " " + shlex.join(args)
    result = subprocess.run(
        ["bash", "-c", shell_line],
        cwd=workdir,
        env=fresh,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert result.returncode == 0, result.stderr[-2000:]
    assert "discard_check_max=1" in result.stdout
    # The job's quiet logging applies under spark-submit: no Spark INFO/WARN log lines.
    noisy = [line for line in result.stderr.splitlines() if re.search(r" (INFO|WARN) ", line)]
    assert noisy == []
    pending = sorted(
        (r["half_offset"], r["status"]) for r in read_table(output, "pending").to_pylist()
    )
    assert pending == [(2, "discard_check_max"), (3, "too_young")]


def test_no_shipped_module_imports_the_simulator(tmp_path: Path) -> None:
    """The zip holds no simulator, so nothing in it may import one (checked on the zip's own
    sources: every import statement of every module)."""
    archive, _ = build(tmp_path / "dist")
    importers = []
    with zipfile.ZipFile(archive) as src:
        modules = [name for name in src.namelist() if name.endswith(".py")]
        assert modules
        for name in modules:
            for node in ast.walk(ast.parse(src.read(name), filename=name)):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    targets = [node.module or ""]
                else:
                    continue
                if any(t == "simulator" or t.startswith("simulator.") for t in targets):
                    importers.append(name)
    assert importers == []


def test_shipped_code_reads_its_defaults_from_the_zip(tmp_path: Path) -> None:
    archive, entry = build(tmp_path / "dist")
    with zipfile.ZipFile(archive) as src:  # a packaged default that differs from the code's
        text = src.read("conf/default.toml").decode().replace("check_max = 15", "check_max = 4")
    rebuilt = tmp_path / "edited.zip"
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(rebuilt, "w") as out:
        for name in src.namelist():
            data = text.encode() if name == "conf/default.toml" else src.read(name)
            out.writestr(name, data)
    # -S: no site-packages, so not the editable install of the checkout; only the zip.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import jobs.config as c;"
        "print(c.__file__); print(c.load_config(None, {}).check_max)"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe, str(rebuilt)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    where, check_max = result.stdout.split()
    assert where.startswith(str(rebuilt))
    assert check_max == "4"
    assert "from jobs.reconcile import main" in entry.read_text()
