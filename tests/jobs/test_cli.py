"""The command line of spec section 9: exit codes, messages, the six tables, reruns, --as-of."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from jobs.cli import error_line
from jobs.extract import age_text
from jobs.reconcile import main
from schemas.outputs import TABLE_SCHEMAS
from tests.jobs.segments import (
    AS_OF,
    NEWEST_STORE_MS,
    segment_argv,
    write_json_segments,
    write_parquet_segments,
)
from tests.robustness.store import T as STORE_T
from tests.robustness.store import base_rows, read_table
from tests.robustness.store import write as write_store
from tests.spark_cache import holds_cached_frames

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command line in a child process (error paths stop before Spark starts)."""
    return subprocess.run(
        [sys.executable, "-m", "jobs.reconcile", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0]


def test_missing_input_is_exit_2_with_one_line_and_no_output(tmp_path: Path) -> None:
    output = tmp_path / "out"
    result = run_cli(*segment_argv(tmp_path / "nope", tmp_path / "nope", output))
    assert_one_line_error(result, str(tmp_path / "nope"), "not found")
    assert not output.exists()


def test_malformed_offsets_file_is_exit_2(tmp_path: Path) -> None:
    half, op, offsets = write_parquet_segments(tmp_path / "in")
    offsets.write_text('{"offsetTable": {"RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS": {0: "x"}}}')
    output = tmp_path / "out"
    result = run_cli(*segment_argv(half, op, output, offsets))
    assert_one_line_error(result, str(offsets))
    assert not output.exists()


def test_unknown_flag_is_exit_2(tmp_path: Path) -> None:
    output = tmp_path / "out"
    result = run_cli("--store", str(tmp_path), "--output", str(output), "--frobnicate")
    assert_one_line_error(result, "--frobnicate")
    assert not output.exists()


def test_not_a_store_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = run_cli("--store", str(tmp_path / "empty"), "--output", str(tmp_path / "out"))
    assert_one_line_error(result, str(tmp_path / "empty"))
    assert not (tmp_path / "out").exists()


def _segment_args(tmp_path: Path, output: Path) -> list[str]:
    half, op, offsets = write_parquet_segments(tmp_path / "in")
    return segment_argv(half, op, output, offsets)


def test_run_writes_six_tables_with_spec_columns_and_a_rerun_leaves_one_copy(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out"
    args = [*_segment_args(tmp_path, output), "--as-of", str(AS_OF), "--run-id", "run-1"]
    spark.catalog.clearCache()

    assert main(args, spark=spark) == 0
    assert main(args, spark=spark) == 0
    # One millisecond later: the same round, and run-1 is an earlier run of this root.
    assert main([*args[:-3], str(AS_OF + 1), "--run-id", "run-2"], spark=spark) == 0
    # Each run released what it cached: a notebook runs the job many times in one session,
    # and every cached plan left behind slows and fills the driver.
    assert not holds_cached_frames(spark)

    for table, schema in TABLE_SCHEMAS.items():
        data = read_table(output, table)
        assert data.column_names == schema.fieldNames(), table
        runs = data.column("run_id").to_pylist()
        assert runs.count("run-1") == runs.count("run-2"), table
    pending = read_table(output, "pending").to_pylist()
    run_1 = sorted(
        (row["half_offset"], row["status"], row["check_times"])
        for row in pending
        if row["run_id"] == "run-1"
    )
    # 0 and 1 are resolved by the ops; 2 reached the max; 3 is too young and stops the round.
    assert run_1 == [(2, "discard_check_max", 15), (3, "too_young", None)]
    # Pending across runs: run-2 inherits run-1's first sighting; run-1's rerun did not see
    # its own earlier rows as history.
    assert {(r["run_id"], r["first_seen_run_id"], r["pending_since_ms"]) for r in pending} == {
        ("run-1", "run-1", AS_OF),
        ("run-2", "run-1", AS_OF),
    }
    offsets = {
        (r["topic"], r["run_id"]): (r["offset_before"], r["offset_after"], r["offset_safe"])
        for r in read_table(output, "consume_offsets").to_pylist()
    }
    # h_safe stops at the discard at 2: discards bound it (spec 5, 2026-11-23).
    assert offsets[("RMQ_SYS_TRANS_HALF_TOPIC", "run-1")] == (0, 3, 2)
    assert offsets[("RMQ_SYS_TRANS_OP_HALF_TOPIC", "run-1")] == (0, 2, 2)
    assert len(offsets) == 4
    fragments = output / "offset_fragments" / "b"
    assert sorted(p.name for p in fragments.iterdir()) == [
        "consumerOffset.after.json",
        "consumerOffset.committed.json",
        "consumerOffset.safe.json",
        "fragment.json",
    ]
    fragment = (fragments / "consumerOffset.safe.json").read_text()
    assert "RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS" in fragment and "0:2" in fragment
    committed = (fragments / "consumerOffset.committed.json").read_text()
    assert "RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS" in committed and "0:0" in committed
    assert "discard_check_max=1" in capsys.readouterr().out


def test_as_of_latest_is_one_ms_after_the_newest_record(
    spark: SparkSession, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    assert main([*_segment_args(tmp_path, output), "--as-of", "latest"], spark=spark) == 0
    summary = read_table(output, "run_summary").to_pylist()
    assert {row["as_of_ms"] for row in summary} == {NEWEST_STORE_MS + 1}
    assert all(row["run_id"].startswith(f"r{NEWEST_STORE_MS + 1}-") for row in summary)


@pytest.mark.parametrize(
    ("as_of", "needle"),
    [
        ("1749999999", "as seconds it is 2025-06-15T15:06:39Z: give --as-of 1749999999000"),
        ("-5", "is negative (1969-12-31T23:59:59.995Z, before 1970)"),
        (str(STORE_T - 60_000), "not after the oldest half/op record of broker b"),
    ],
)
def test_a_bad_as_of_is_exit_2_before_spark_starts(tmp_path: Path, as_of: str, needle: str) -> None:
    store, output = tmp_path / "b", tmp_path / "out"
    write_store(store, base_rows())  # stored from T - 60 s + 1 ms
    result = run_cli("--store", str(store), "--output", str(output), "--as-of", as_of)
    assert_one_line_error(result, needle)
    assert not output.exists()


def test_the_default_as_of_on_a_copied_store_is_latest_and_says_so(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, output = tmp_path / "b", tmp_path / "out"
    rows = write_store(store, base_rows())
    newest = max(row["store_timestamp_ms"] for row in rows)
    assert main(["--store", str(store), "--output", str(output)], spark=spark) == 0
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "as-of auto" in line]
    assert line.endswith(
        "as-of auto: latest (broker b's newest half/op record is"
        f" {age_text(int(time.time() * 1000) - newest)} old, a live broker's is at most 90 s"
        " old: the store looks copied)"
    )
    summary = read_table(output, "run_summary").to_pylist()
    assert {row["as_of_ms"] for row in summary} == {newest + 1}
    # The choice is a warning on the queue (once: T = latest raises no stale-store warning).
    copied = [w for row in summary for w in row["warnings"] if "looks copied" in w]
    assert len(copied) == 1 and line.endswith(copied[0])


def test_json_segments_give_the_same_round_as_parquet(spark: SparkSession, tmp_path: Path) -> None:
    half, op = write_json_segments(tmp_path / "json")
    output = tmp_path / "out"
    args = [
        *segment_argv(half, op, output, fmt="json"),
        "--as-of",
        str(AS_OF),
        "--run-id",
        "json",
    ]
    assert main(args, spark=spark) == 0
    pending = sorted(
        (r["half_offset"], r["status"]) for r in read_table(output, "pending").to_pylist()
    )
    assert pending == [(2, "discard_check_max"), (3, "too_young")]


def test_strict_fails_with_exit_1_and_writes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    output = tmp_path / "out"
    args = _segment_args(tmp_path, output)
    op_path = Path(args[args.index("--op") + 1])
    table = pq.read_table(op_path)
    bodies = table.column("body").to_pylist()
    bodies[0] = b"x"
    pq.write_table(
        table.set_column(table.schema.get_field_index("body"), "body", [bodies]), op_path
    )
    assert main([*args, "--as-of", str(AS_OF), "--strict"], spark=spark) == 1
    assert not output.exists()


def test_conf_file_and_flags_and_include_body(spark: SparkSession, tmp_path: Path) -> None:
    output = tmp_path / "out"
    conf = tmp_path / "job.toml"
    # check_max 2 in the file would discard nothing new; the flag (3) must win over it,
    # and the file's timeout must apply: 1 s makes record 3 (age 2 s) checkable.
    conf.write_text("[broker]\ncheck_max = 2\ntransaction_timeout_ms = 1000\n")
    args = [
        *_segment_args(tmp_path, output),
        "--as-of",
        str(AS_OF),
        "--run-id",
        "conf",
        "--conf",
        str(conf),
        "--check-max",
        "20",
        "--include-body",
    ]
    assert main(args, spark=spark) == 0
    pending = read_table(output, "pending")
    assert "body" in pending.column_names
    statuses = sorted(
        (r["half_offset"], r["status"], r["check_times"]) for r in pending.to_pylist()
    )
    # check_max 20 (flag over file): counter 15 is checked, not discarded; timeout 1000 ms
    # (file over default): the 2 s old record is checked too.
    assert statuses == [(2, "check", 16), (3, "check", 1)]


def test_bad_conf_file_is_exit_2(tmp_path: Path) -> None:
    conf = tmp_path / "job.toml"
    conf.write_text("[broker]\ncheck_max = 'many'\n")
    result = run_cli(
        "--store", str(tmp_path), "--output", str(tmp_path / "out"), "--conf", str(conf)
    )
    assert_one_line_error(result, str(conf), "check_max")


def test_an_error_in_the_jvm_names_its_java_cause(spark: SparkSession) -> None:
    # Py4J's own message only names the call ("An error occurred while calling o1.get."); the
    # one error line must carry the innermost Java exception, the one that explains it.
    jvm = spark.sparkContext._jvm
    future = jvm.java.util.concurrent.CompletableFuture()
    future.completeExceptionally(jvm.java.io.IOException("No space left on device"))
    with pytest.raises(Py4JJavaError) as raised:
        future.get()  # an ExecutionException caused by the IOException
    line = error_line(raised.value)
    assert line.startswith("Py4JJavaError: An error occurred while calling")
    assert line.endswith("Cause: java.io.IOException: No space left on device")
    assert "\n" not in line
