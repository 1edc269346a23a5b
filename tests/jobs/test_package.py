"""`make package` output runs under spark-submit from a directory outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from jobs.package import build, command
from tests.jobs.segments import AS_OF, segment_argv, write_parquet_segments
from tests.jobs.test_cli import read_table


def test_packaged_job_runs_under_spark_submit_outside_the_checkout(tmp_path: Path) -> None:
    archive, entry = build(tmp_path / "dist")
    names = set(zipfile.ZipFile(archive).namelist())
    assert {
        "jobs/reconcile.py",
        "transforms/round.py",
        "schemas/outputs.py",
        "connectors/delta.py",
        "connectors/rocketmq/reader.py",
        "conf/default.toml",
    } <= names

    half, op, offsets = write_parquet_segments(tmp_path / "in")
    output = tmp_path / "out"
    spark_submit = Path(sys.executable).with_name("spark-submit")
    argv = command(archive, entry, master="local[1]")
    argv[0] = str(spark_submit)
    argv += [
        *segment_argv(half, op, output, offsets),
        "--as-of",
        str(AS_OF),
        "--run-id",
        "submitted",
    ]
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)

    assert result.returncode == 0, result.stderr[-2000:]
    assert "discard_check_max=1" in result.stdout
    pending = sorted(
        (r["half_offset"], r["status"]) for r in read_table(output, "pending").to_pylist()
    )
    assert pending == [(2, "discard_check_max"), (3, "too_young")]


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
