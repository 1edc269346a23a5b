"""The command line, the notebook functions and the notebook's writer run one pipeline
(``jobs.pipeline``): on the same store and T they give the same tables, every row and
every column but the ones only a write fills."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from jobs.cli import main
from jobs.notebook import reconcile_stores, reconcile_stores_to_delta
from tests.jobs.test_discard_history_store import build_store
from tests.robustness.store import T, rows_of

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

# run_summary's columns a write fills (null in the frames the notebook functions return).
WRITE_FILLED = {"inputs", "writer", "job_version", "written_at_ms", "duration_ms"}
# Only what a write can fill differs between two writes of one run.
WRITE_TIME = {"written_at_ms", "duration_ms"}


def _multiset(rows: list[dict[str, Any]], left_out: set[str]) -> Counter:
    return Counter(
        tuple(sorted((k, repr(v)) for k, v in row.items() if k not in left_out)) for row in rows
    )


def test_the_notebook_and_the_command_line_give_the_same_tables(
    spark: SparkSession, tmp_path: Path
) -> None:
    store, cli_out, notebook_out = tmp_path / "broker-a", tmp_path / "cli", tmp_path / "nb"
    build_store(store)
    argv = ["--store", f"a={store}", "--output", str(cli_out), "--as-of", str(T)]
    assert main([*argv, "--run-id", "same"], spark=spark) == 0

    outputs = reconcile_stores(spark, [f"a={store}"], as_of=T, run_id="same")
    try:
        frames = outputs.tables()
        # Every table the command line writes, each with rows (the store has discards,
        # checks, pending records and anomalies).
        assert set(frames) == {path.name for path in cli_out.iterdir() if path.is_dir()} - {
            "offset_fragments"
        }
        for table, frame in frames.items():
            written = rows_of(cli_out, table)
            got = frame.toArrow().to_pylist()
            assert _multiset(got, WRITE_FILLED) == _multiset(written, WRITE_FILLED), table
        assert rows_of(cli_out, "discard_history") and rows_of(cli_out, "anomalies")
    finally:
        outputs.release()

    # The notebook's writer through the store's mirror: the same tables.
    counts = reconcile_stores_to_delta(
        spark, [f"a={store}"], str(notebook_out), as_of=T, run_id="same", mirror=True
    )
    assert (notebook_out / "mirror_records" / "_delta_log").is_dir()
    for table, rows in counts.items():
        written = rows_of(notebook_out, table)
        assert len(written) == rows, table
        assert _multiset(written, WRITE_TIME) == _multiset(rows_of(cli_out, table), WRITE_TIME), (
            table
        )
