"""The front door, tried as a new user would: the README's notebook snippet, the worker
probe, --output checks, --help, the console script, make help, make run's sample store."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.reconcile import build_parser
from tests.jobs.segments import segment_argv, write_parquet_segments
from tests.jobs.test_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def readme_snippet() -> str:
    """The README's notebook snippet, verbatim: the python block that calls reconcile_stores."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    snippets = [block for block in blocks if "reconcile_stores(" in block]
    assert len(snippets) == 1, "the README has one notebook snippet"
    return snippets[0]


def clean_env() -> dict[str, str]:
    """A new user's environment: no PYSPARK_* variables set by this suite."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}


# A fresh Python process starts its own Spark JVM: make test-processes, outside make test.
@pytest.mark.processes
def test_the_readme_notebook_snippet_runs_verbatim_with_a_plain_session(tmp_path: Path) -> None:
    snippet = readme_snippet()
    assert "SparkSession.builder.getOrCreate()" in snippet  # it says how to get `spark`
    # The store it names is the one `make run` simulates (sample/broker-a), small here.
    subprocess.run(
        [sys.executable, "-m", "simulator", "--out", "sample/broker-a"]
        + ["--transactions", "40", "--seed", "7"],
        cwd=tmp_path,
        env=clean_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    header = next(line for line in result.stdout.splitlines() if "producer_group" in line)
    assert re.search(r"\|\s*producer_group\s*\|\s*status\s*\|\s*count\s*\|", header)


def test_workers_that_cannot_import_pyarrow_fail_at_once_with_one_line(tmp_path: Path) -> None:
    # A worker Python like the driver's, but where pyarrow cannot be imported.
    shadow = tmp_path / "shadow" / "pyarrow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no pyarrow on this worker')\n")
    worker = tmp_path / "worker-python"
    worker.write_text(f'#!/bin/sh\nPYTHONPATH={shadow.parent} exec {sys.executable} "$@"\n')
    worker.chmod(0o755)
    half, op, offsets = write_parquet_segments(tmp_path / "in")
    output = tmp_path / "out"

    result = subprocess.run(
        [sys.executable, "-m", "jobs.reconcile", *segment_argv(half, op, output, offsets)],
        cwd=ROOT,
        env={**clean_env(), "PYSPARK_PYTHON": str(worker)},
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert "cannot import pyarrow" in errors[0] and "PYSPARK_PYTHON" in errors[0]
    # The wrapper execs the venv's Python: that is the worker Python the line names.
    assert f"the Python workers ({sys.executable})" in errors[0]
    assert "Traceback" not in result.stderr
    assert not (output / "pending").exists()  # stopped before the heavy work


def _store(path: Path) -> Path:
    (path / "commitlog").mkdir(parents=True)
    (path / "consumequeue").mkdir()
    return path


@pytest.mark.parametrize(
    "where", ["a file", "the store", "inside the store", "under a file", "immutable"]
)
def test_a_bad_output_is_exit_2_before_spark_starts(tmp_path: Path, where: str) -> None:
    store = _store(tmp_path / "store")
    output = {
        "a file": tmp_path / "out.txt",
        "the store": store,
        "inside the store": store / "config" / "out",
        "under a file": tmp_path / "out.txt" / "out",
        "immutable": tmp_path / "locked",
    }[where]
    if where in ("a file", "under a file"):
        (tmp_path / "out.txt").write_text("not a directory")
    if where == "immutable":  # chattr missing fails the test (check=True), never skips it
        output.mkdir()
        subprocess.run(["chattr", "+i", str(output)], check=True, capture_output=True)

    try:
        result = run_cli("--store", str(store), "--output", str(output))
    finally:
        if where == "immutable":
            subprocess.run(["chattr", "-i", str(output)], check=True, capture_output=True)

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --output ")  # no Spark line either
    assert not (store / "config").exists()


def test_help_shows_the_broker_defaults() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "--check-max CHECK_MAX discard when the counter reaches it (default 15)" in text
    assert "--transaction-timeout-ms TRANSACTION_TIMEOUT_MS default immunity (default 6000)" in text
    assert "(default 72)" in text.split("--file-reserved-hours FILE_RESERVED_HOURS", 2)[2]


def test_the_console_script_is_installed_and_in_the_readme() -> None:
    assert "rmq-txn-reconcile --store" in (ROOT / "README.md").read_text()
    result = subprocess.run(
        [str(VENV_BIN / "rmq-txn-reconcile"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "--check-max" in result.stdout
    # It names itself as it was started, and ends with an example and the exit codes.
    assert result.stdout.startswith("usage: rmq-txn-reconcile [-h]")
    assert "example:\n  rmq-txn-reconcile --store " in result.stdout
    codes = result.stdout.split("exit codes:\n", 1)[1]
    assert [line.split()[0] for line in codes.splitlines()] == ["0", "1", "2", "3", "130/143"]


def test_help_through_the_module_names_the_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobs.reconcile", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert result.stdout.startswith("usage: python -m jobs.reconcile [-h]")
    assert "example:\n  python -m jobs.reconcile --store " in result.stdout


def test_make_help_aligns_every_target() -> None:
    # Under `make test` the environment carries MAKELEVEL/MAKEFLAGS, and a nested make prints
    # "Entering directory" lines: run it as a user would, from a plain shell.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    result = subprocess.run(
        ["make", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    targets = re.findall(r"^([a-z-]+):.*## ", (ROOT / "Makefile").read_text(), re.M)
    assert [line.split()[1] for line in lines] == targets
    # Every description starts in the same column.
    starts = {len(re.match(r"(\s*make\s+\S+\s+)", line).group(1)) for line in lines}
    assert len(starts) == 1
    # A text that names a variable shows its value (HELP_VARS), never the raw $(NAME).
    assert "$(" not in result.stdout
    assert "newest run in sample/output " in result.stdout


def test_make_run_simulates_again_when_sample_transactions_changes(tmp_path: Path) -> None:
    store = tmp_path / "broker-a"

    def planned(transactions: int) -> str:
        return subprocess.run(
            ["make", "-n", "run", f"SAMPLE_STORE={store}", f"SAMPLE_TRANSACTIONS={transactions}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    assert "-m simulator" in planned(30)
    store.mkdir()
    (store / ".simulated-30-transactions").touch()  # as the recipe leaves it
    assert "-m simulator" not in planned(30)
    assert "--transactions 50" in planned(50)
