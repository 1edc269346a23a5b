"""Issue 11, "silent wrong pictures": each path that used to give a wrong picture without a
word now warns on stdout and in ``run_summary.warnings``, or refuses with one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.reconcile import main
from tests.jobs.segments import AS_OF, NEWEST_STORE_MS, segment_argv, write_parquet_segments
from tests.robustness.store import read_table

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
STALE = "the store looks copied"


def _run(spark: SparkSession, tmp_path: Path, *extra: str) -> tuple[int, Path]:
    half, op, offsets = write_parquet_segments(tmp_path / "in")
    output = tmp_path / "out"
    return main([*segment_argv(half, op, output, offsets), *extra], spark=spark), output


def _summary(output: Path) -> dict:
    (row,) = read_table(output, "run_summary").to_pylist()
    return row


def _attention(printed: str) -> str:
    """The summary's block of what needs attention first (before the anomalies and counts)."""
    begin = printed.index("needs attention first:")
    return printed[begin : printed.index("\nanomalies", begin)]


def test_as_of_now_on_a_copied_store_warns_and_names_as_of_latest(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An hour after the newest record, record 3 (too young at AS_OF) is checked: a live
    # broker would have put a copy back within three check intervals (90 s).
    code, output = _run(spark, tmp_path, "--as-of", str(AS_OF + HOUR_MS))
    assert code == 0
    summary = _summary(output)
    assert summary["check"] == 1
    (warning,) = [w for w in summary["warnings"] if STALE in w]
    assert "--as-of latest" in warning
    assert f"{AS_OF + HOUR_MS - NEWEST_STORE_MS} ms before T" in warning
    out = capsys.readouterr().out
    assert f" queue 0: {warning}" in _attention(out)  # said first, before any count


def test_a_recent_newest_record_gives_no_stale_warning(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 61 s after the newest record (below 3 x 30 s): a check is normal on a live broker.
    code, output = _run(spark, tmp_path, "--as-of", str(NEWEST_STORE_MS + 61_000))
    assert code == 0
    summary = _summary(output)
    assert summary["check"] == 1
    assert not [w for w in summary["warnings"] if STALE in w]
    assert STALE not in capsys.readouterr().out


def test_a_longer_check_interval_setting_moves_the_limit(
    spark: SparkSession, tmp_path: Path
) -> None:
    # 20 min after the newest record warns with the default interval (3 x 30 s), not with
    # a 10-minute interval (3 x 10 min = 30 min).
    conf = tmp_path / "job.toml"
    conf.write_text("[broker]\ncheck_interval_ms = 600000\n")
    code, output = _run(
        spark, tmp_path, "--as-of", str(NEWEST_STORE_MS + 20 * 60_000), "--conf", str(conf)
    )
    assert code == 0
    summary = _summary(output)
    assert summary["check"] == 1
    assert not [w for w in summary["warnings"] if STALE in w]


def test_as_of_far_past_the_store_warns_and_h_safe_skips_no_pending_transaction(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 526 days later every unresolved record is discarded; h_safe stays at the first of
    # them (spec 5, 2026-11-23), and the summary says the picture looks wrong.
    code, output = _run(spark, tmp_path, "--as-of", str(NEWEST_STORE_MS + 526 * DAY_MS))
    assert code == 0
    summary = _summary(output)
    assert (summary["discard_check_max"], summary["discard_expired"]) == (1, 1)
    assert (summary["h0"], summary["h1"], summary["h_safe"]) == (0, 4, 2)
    assert [w for w in summary["warnings"] if STALE in w]
    assert STALE in capsys.readouterr().out


def test_strict_refuses_t_beyond_the_newest_record_by_more_than_the_retention(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    as_of = NEWEST_STORE_MS + 72 * HOUR_MS + 1
    code, output = _run(spark, tmp_path, "--as-of", str(as_of), "--strict")
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "broker b" in errors[0] and "--as-of latest" in errors[0]
    assert not output.exists()


def test_strict_accepts_t_within_the_retention(spark: SparkSession, tmp_path: Path) -> None:
    code, _ = _run(spark, tmp_path, "--as-of", str(NEWEST_STORE_MS + 72 * HOUR_MS), "--strict")
    assert code == 0


# -- committed offsets: the .bak, or the queue's head, always with a warning -----------------

OFFSETS_GOOD = (
    '{"offsetTable":{"RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:2},'
    '"RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:1}}}'
)
OFFSETS_HALF_ONLY = '{"offsetTable":{"RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:2}}}'
OFFSETS_STORES = {
    # name: (consumerOffset.json, consumerOffset.json.bak)
    "usual": (OFFSETS_GOOD, None),
    "bak-for-missing": (None, OFFSETS_GOOD),
    "bak-for-empty": ("", OFFSETS_GOOD),
    "bak-for-unparsable": ("{not json", OFFSETS_GOOD),
    "none": (None, None),
    "op-key-missing": (OFFSETS_HALF_ONLY, None),
}


@pytest.fixture(scope="module")
def offsets_outcome(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory):
    from tests.robustness.store import T, base_rows, rows_of, write

    base = tmp_path_factory.mktemp("offsets")
    argv = []
    for name, (main_text, bak_text) in OFFSETS_STORES.items():
        write(base / name, base_rows())  # op 0 names half 0; halves 0..3 are checked
        (base / name / "config").mkdir()
        for file, text in (
            ("consumerOffset.json", main_text),
            ("consumerOffset.json.bak", bak_text),
        ):
            if text is not None:
                (base / name / "config" / file).write_text(text)
        argv += ["--store", f"{name}={base / name}"]
    output = base / "out"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([*argv, "--output", str(output), "--as-of", str(T)], spark=spark)
    summaries = {row["broker"]: row for row in rows_of(output, "run_summary")}
    return code, summaries, printed.getvalue()


def test_the_usual_offsets_file_gives_no_warning(offsets_outcome) -> None:
    code, summaries, _ = offsets_outcome
    assert code == 0
    usual = summaries["usual"]
    assert (usual["h0"], usual["p0"], usual["warnings"]) == (2, 1, [])


@pytest.mark.parametrize(
    ("broker", "problem"),
    [
        ("bak-for-missing", "missing"),
        ("bak-for-empty", "empty"),
        ("bak-for-unparsable", "unparsable"),
    ],
)
def test_the_bak_gives_the_offsets_with_a_warning_naming_it(
    offsets_outcome, broker: str, problem: str
) -> None:
    _, summaries, printed = offsets_outcome
    summary = summaries[broker]
    assert (summary["h0"], summary["p0"], summary["check"]) == (2, 1, 2)
    warning = (
        f"queue 0: config/consumerOffset.json is {problem}: offsets read from"
        " config/consumerOffset.json.bak"
    )
    assert summary["warnings"] == [warning]
    assert f"{broker} queue 0: {warning}" in printed


def test_no_offsets_file_starts_at_the_head_with_a_warning_per_topic(offsets_outcome) -> None:
    _, summaries, printed = offsets_outcome
    summary = summaries["none"]
    # Before: the same offsets, without a word. Now each topic says where it started.
    assert (summary["h0"], summary["p0"], summary["resolved"], summary["check"]) == (0, 0, 1, 3)
    note, half_warning, op_warning = summary["warnings"]
    assert note.startswith("queue 0: config/consumerOffset.json is missing and")
    assert half_warning.startswith(
        "RMQ_SYS_TRANS_HALF_TOPIC queue 0: no committed offset (key"
        " RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS) in no offsets file"
    )
    assert half_warning.endswith("starting at the queue's smallest available offset 0")
    assert op_warning.startswith("RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0: no committed offset")
    assert f"none queue 0: {half_warning}" in printed


def test_a_missing_key_starts_that_topic_at_the_head_naming_the_file(offsets_outcome) -> None:
    _, summaries, _ = offsets_outcome
    summary = summaries["op-key-missing"]
    assert (summary["h0"], summary["p0"]) == (2, 0)
    assert summary["warnings"] == [
        "RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0: no committed offset (key"
        " RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS) in config/consumerOffset.json;"
        " starting at the queue's smallest available offset 0"
    ]


def test_a_malformed_offsets_file_with_a_malformed_bak_is_exit_2(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.robustness.store import T, base_rows, write

    store = tmp_path / "store"
    write(store, base_rows())
    (store / "config").mkdir()
    (store / "config" / "consumerOffset.json").write_text("{not json")
    (store / "config" / "consumerOffset.json.bak").write_text("{nor this")
    output = tmp_path / "out"
    assert (
        main(["--store", str(store), "--output", str(output), "--as-of", str(T)], spark=spark) == 2
    )
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {store}/config/consumerOffset.json:")
    assert "consumerOffset.json.bak" in errors[0]
    assert not output.exists()


# -- bad records without --strict: one line with the count and where they are ---------------


def test_bad_records_without_strict_print_a_line_with_the_count_and_the_table(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

    half, op, offsets = write_parquet_segments(tmp_path / "in")
    table = pq.read_table(op)
    bodies = table.column("body").to_pylist()
    bodies[0], bodies[1] = b"x", b"y,"  # two unparsable op items
    pq.write_table(table.set_column(table.schema.get_field_index("body"), "body", [bodies]), op)
    output = tmp_path / "out"
    args = [*segment_argv(half, op, output, offsets), "--as-of", str(AS_OF), "--run-id", "bad"]
    assert main(args, spark=spark) == 0
    out = capsys.readouterr().out
    line = (
        f"warning: 2 bad record(s) took no part in the round: rows in"
        f" {output.resolve() / 'bad_records'} (run_id bad)"
    )
    assert line in out
    assert len(read_table(output, "bad_records").to_pylist()) == 2


def test_no_bad_records_no_line(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = _run(spark, tmp_path, "--as-of", str(AS_OF))
    assert code == 0
    assert "bad record(s)" not in capsys.readouterr().out


# -- exported JSON segments: text bodies, body_base64, missing columns ------------------------


@pytest.mark.parametrize("base64_bodies", [False, True])
def test_json_bodies_as_text_or_body_base64_give_the_parquet_round(
    spark: SparkSession, tmp_path: Path, base64_bodies: bool
) -> None:
    from tests.jobs.segments import write_json_segments

    half, op = write_json_segments(tmp_path / "json", base64_bodies=base64_bodies)
    output = tmp_path / "out"
    args = [*segment_argv(half, op, output, fmt="json"), "--as-of", str(AS_OF)]
    assert main(args, spark=spark) == 0
    summary = _summary(output)
    # ops "1" and "0," resolve halves 0 and 1 (a text body read as base64 resolved none).
    assert (summary["resolved"], summary["discard_check_max"], summary["too_young"]) == (2, 1, 1)
    assert summary["bad_records"] == 0


def _json_lines(path: Path, rows: list[dict]) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_json_body_and_body_base64_problems_are_bad_records(
    spark: SparkSession, tmp_path: Path
) -> None:
    from tests.jobs.segments import write_json_segments

    half, _ = write_json_segments(tmp_path / "json")
    base = {"queue_id": 0, "born_timestamp_ms": AS_OF - 9, "store_timestamp_ms": AS_OF - 9}
    op = _json_lines(
        tmp_path / "json" / "op-bad.json",
        [
            {**base, "queue_offset": 0, "tags": "d", "body": "1", "body_base64": "MQ=="},
            {**base, "queue_offset": 1, "tags": "d", "body_base64": "not base64!"},
            {**base, "queue_offset": 2, "tags": "d", "body_base64": "MCw="},  # "0,"
        ],
    )
    output = tmp_path / "out"
    args = [*segment_argv(half, op, output, fmt="json"), "--as-of", str(AS_OF)]
    assert main(args, spark=spark) == 0
    bad = sorted(
        (r["position"], r["reason"]) for r in read_table(output, "bad_records").to_pylist()
    )
    assert bad == [(0, "both body and body_base64 given"), (1, "body_base64 is not base64")]
    assert _summary(output)["resolved"] == 1  # half 0, named by the third op


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_a_missing_required_column_is_exit_2_in_json_and_parquet(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    import pyarrow.parquet as pq

    from tests.jobs.segments import half_table, write_json_segments

    if fmt == "json":
        half, op = write_json_segments(tmp_path / "in")
        rows = [json_row for json_row in _read_json_lines(half)]
        for row in rows:
            del row["store_timestamp_ms"]
        _json_lines(half, rows)
    else:
        half, op, _ = write_parquet_segments(tmp_path / "in")
        pq.write_table(half_table().drop(["store_timestamp_ms"]), half)
    output = tmp_path / "out"
    code = main([*segment_argv(half, op, output, fmt=fmt), "--as-of", str(AS_OF)], spark=spark)
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {half}: missing column(s) store_timestamp_ms"]
    assert not output.exists()


def _read_json_lines(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_example_segments_run_as_documented(spark: SparkSession, tmp_path: Path) -> None:
    # examples/segments/ and docs/segments.md: half 0 committed by op 0, half 1 (a binary
    # body in body_base64) checked, half 2 too young.
    from tests.jobs.test_cli import ROOT

    folder = ROOT / "examples" / "segments"
    output = tmp_path / "out"
    args = segment_argv(
        folder / "half.json", folder / "op.json", output, folder / "consumerOffset.json", "json"
    )
    assert main([*args, "--as-of", "latest", "--include-body"], spark=spark) == 0
    pending = sorted(
        (r["half_offset"], r["status"], r["body"])
        for r in read_table(output, "pending").to_pylist()
    )
    assert pending == [(1, "check", bytes([0, 1, 2, 3, 255])), (2, "too_young", b'{"orderId": 3}')]
    summary = _summary(output)
    assert (summary["resolved"], summary["h1"], summary["h_safe"], summary["p1"]) == (1, 2, 1, 1)
