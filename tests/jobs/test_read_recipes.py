"""README "Reading the tables": each offline recipe, run as written, reads the latest run of
each broker once, after a rerun and a backfill written later (a plain Parquet read counts
the replaced rows again, a read of the whole table every run), finds one transaction by
its key, and works through a symlinked output root; and the vacuum maintenance command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs import maintenance
from jobs.reconcile import main
from tests.jobs.segments import AS_OF, segment_argv, write_parquet_segments
from tests.jobs.test_cli import ROOT
from tests.robustness.store import read_table

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

# Per run two pending rows (offsets 2 and 3). run-2 is written twice at T, then run-9 (a
# backfill of an earlier T with a larger run id): the latest run is run-2.
ROWS_PER_RUN = 2
# The recipes' key (a business key of the sample output) and the test data's key.
SAMPLE_KEY, KEY = "ORD100018142", "K2"
OUT = Path("sample/output")


def recipe(name: str) -> str:
    """The first ```python block after ``<!-- recipe: NAME -->`` in the README."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- recipe: {name} -->.*?```python\n(.*?)```", readme, re.S)
    assert found, f"README has no recipe {name}"
    return found.group(1)


@pytest.fixture(scope="module")
def rerun_output(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder that holds ``sample/output``, after the runs of ``ROWS_PER_RUN``."""
    base = tmp_path_factory.mktemp("recipes")
    half, op, offsets = write_parquet_segments(base / "in")
    args = segment_argv(half, op, base / OUT, offsets)
    for run_id, as_of in (("run-2", AS_OF), ("run-2", AS_OF), ("run-9", AS_OF - 1)):
        assert main([*args, "--as-of", str(as_of), "--run-id", run_id], spark=spark) == 0
    return base


def _run_recipe(name: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The recipe run as written from ``folder``, its key being the test data's."""
    code = recipe(name)
    assert code.count(f'"{SAMPLE_KEY}"') == 1
    monkeypatch.chdir(folder)
    namespace: dict = {}
    exec(compile(code.replace(SAMPLE_KEY, KEY), f"README recipe {name}", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def symlinked_output(rerun_output: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose ``sample/output`` is a symlink to ``rerun_output``'s."""
    folder = tmp_path_factory.mktemp("symlinked")
    (folder / OUT.parent).mkdir(parents=True)
    (folder / OUT).symlink_to(rerun_output / OUT)
    return folder


def test_a_plain_parquet_read_double_counts_a_rerun(
    spark: SparkSession, rerun_output: Path
) -> None:
    # Why the recipes exist: the replaced run's files are still on disk.
    files = list((rerun_output / OUT / "pending").glob("**/*.parquet"))
    import pyarrow.parquet as pq

    assert sum(pq.read_metadata(f).num_rows for f in files) == 3 * ROWS_PER_RUN


@pytest.mark.parametrize("where", ["rerun_output", "symlinked_output"])
def test_spark_without_delta_reads_the_latest_runs_files_the_log_lists(
    spark: SparkSession, where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        found = _run_recipe("spark-files", request.getfixturevalue(where), monkeypatch)
        rows = sorted(
            (r["run_id"], r["half_offset"], r["status"]) for r in found["pending"].collect()
        )
        key_rows = [(r["run_id"], r["half_offset"]) for r in found["found"].collect()]
    finally:
        spark.conf.unset("spark.sql.sources.partitionColumnTypeInference.enabled")
    assert rows == [("run-2", 2, "discard_check_max"), ("run-2", 3, "too_young")]
    assert key_rows == [("run-2", 2)]


def test_deltalake_to_pandas(rerun_output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = _run_recipe("deltalake", rerun_output, monkeypatch)
    assert len(found["pending"]) == ROWS_PER_RUN
    assert sorted(found["pending"]["run_id"].unique()) == ["run-2"]
    assert found["found"][["uniq_key", "half_offset"]].values.tolist() == [[KEY, 2]]


def test_duckdb_over_the_arrow_dataset(rerun_output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = _run_recipe("duckdb", rerun_output, monkeypatch)
    assert found["by_status"] == [("discard_check_max", 1), ("too_young", 1)]
    assert found["found"] == [("b", 0, 2, "discard_check_max", KEY)]


def test_vacuum_keeps_recent_files_by_default_and_deletes_replaced_ones_with_zero_retention(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

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
    assert read_table(output, "pending").num_rows == ROWS_PER_RUN


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
