"""README "Reading the tables": each offline recipe, run as written, counts every row once
after a rerun (a plain Parquet read counts the replaced rows again); and the vacuum
maintenance command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs import maintenance
from jobs.reconcile import main
from tests.jobs.segments import AS_OF, segment_argv, write_parquet_segments
from tests.jobs.test_cli import ROOT

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

# Per run two pending rows (offsets 2 and 3); run-1 is written twice, then run-2.
ROWS_PER_RUN = 2


def recipe(name: str) -> str:
    """The first ```python block after ``<!-- recipe: NAME -->`` in the README."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- recipe: {name} -->.*?```python\n(.*?)```", readme, re.S)
    assert found, f"README has no recipe {name}"
    return found.group(1)


@pytest.fixture(scope="module")
def rerun_output(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("recipes")
    half, op, offsets = write_parquet_segments(base / "in")
    args = [*segment_argv(half, op, base / "out", offsets), "--as-of", str(AS_OF), "--run-id"]
    for run_id in ("run-1", "run-1", "run-2"):
        assert main([*args, run_id], spark=spark) == 0
    return base


def _run_recipe(name: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(folder)
    namespace: dict = {}
    exec(compile(recipe(name), f"README recipe {name}", "exec"), namespace)
    return namespace


def test_a_plain_parquet_read_double_counts_a_rerun(
    spark: SparkSession, rerun_output: Path
) -> None:
    # Why the recipes exist: the replaced run's files are still on disk.
    files = list((rerun_output / "out" / "pending").glob("**/*.parquet"))
    import pyarrow.parquet as pq

    assert sum(pq.read_metadata(f).num_rows for f in files) == 3 * ROWS_PER_RUN


def test_spark_without_delta_reads_the_files_the_log_lists(
    spark: SparkSession, rerun_output: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        found = _run_recipe("spark-files", rerun_output, monkeypatch)
        pending = found["pending"]
        rows = sorted((r["run_id"], r["half_offset"], r["status"]) for r in pending.collect())
    finally:
        spark.conf.unset("spark.sql.sources.partitionColumnTypeInference.enabled")
    assert rows == [
        ("run-1", 2, "discard_check_max"),
        ("run-1", 3, "too_young"),
        ("run-2", 2, "discard_check_max"),
        ("run-2", 3, "too_young"),
    ]


def test_deltalake_to_pandas(rerun_output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pending = _run_recipe("deltalake", rerun_output, monkeypatch)["pending"]
    assert len(pending) == 2 * ROWS_PER_RUN
    assert sorted(pending["run_id"].unique()) == ["run-1", "run-2"]


def test_duckdb_over_the_arrow_dataset(rerun_output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_status = _run_recipe("duckdb", rerun_output, monkeypatch)["by_status"]
    assert sorted(by_status) == [("discard_check_max", 2), ("too_young", 2)]


def test_vacuum_keeps_recent_files_by_default_and_deletes_replaced_ones_with_zero_retention(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    half, op, offsets = write_parquet_segments(tmp_path / "in")
    output = tmp_path / "out"
    args = [*segment_argv(half, op, output, offsets), "--as-of", str(AS_OF), "--run-id", "r"]
    assert main(args, spark=spark) == 0
    assert main(args, spark=spark) == 0  # the rerun replaces run r's files

    def on_disk() -> int:
        return sum(pq.read_metadata(f).num_rows for f in (output / "pending").glob("**/*.parquet"))

    assert on_disk() == 2 * ROWS_PER_RUN
    assert maintenance.main(["vacuum", "--output", str(output)]) == 0  # 7 days: keeps all
    assert "pending: deleted 0 file(s) older than 168 h" in capsys.readouterr().out
    assert on_disk() == 2 * ROWS_PER_RUN

    dry = maintenance.vacuum_tables(output, retention_hours=0, dry_run=True)
    assert dry["pending"] and on_disk() == 2 * ROWS_PER_RUN
    assert set(dry) == {
        "anomalies",
        "bad_records",
        "check_requests",
        "consume_offsets",
        "discard_history",
        "discards",
        "pending",
        "run_summary",
    }
    assert maintenance.main(["vacuum", "--output", str(output), "--retention-hours", "0"]) == 0
    assert on_disk() == ROWS_PER_RUN  # now even a glob reads each row once
    assert DeltaTable(str(output / "pending")).to_pyarrow_table().num_rows == ROWS_PER_RUN


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["vacuum", "--output", "{missing}"], "output root not found"),
        (["vacuum", "--output", "{empty}"], "no Delta table"),
        (["vacuum", "--output", "{empty}", "--retention-hours", "-1"], "must not be negative"),
        (["vacuum"], "--output"),
    ],
)
def test_vacuum_bad_arguments_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty"}
    argv = [arg.format(**paths) for arg in argv]
    assert maintenance.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0]
