"""The anomalies table through the command line on a hand-made store: written by the run,
counted in run_summary, printed per kind, ``stalled_offset`` across the runs of one output
root, and ``--fail-on`` (exit 3 after writing everything)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets
from jobs.anomalies import KindCount, anomaly_lines, earlier_offsets, failing
from jobs.reconcile import main
from tests.robustness.store import T, half, op, rows_of, write

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

HOUR = 3_600_000


def _store(root: Path) -> Path:
    """Transaction KEY0000: the original (offset 0) is committed by op 0, its check copy at
    offset 1 has reached check_max (the broker discards it: recheck_of_resolved, critical).
    Offset 2 is pending (check); offset 3's real topic is a system topic (warning). The
    committed offsets are the queues' heads (h0 = 0, p0 = 0) in every run: a missing file
    would hold the offsets and warn, findings of their own."""
    rows = [
        half(0, age_ms=HOUR),
        half(0, age_ms=HOUR, TRANSACTION_CHECK_TIMES="15"),
        half(2, age_ms=HOUR),
        half(3, age_ms=HOUR, REAL_TOPIC="rmq_sys_wheel_timer"),
        op(b"0,"),
    ]
    write(root, rows)
    write_consumer_offsets(
        root / "config" / "consumerOffset.json", {HALF_KEY: {0: 0}, OP_KEY: {0: 0}}
    )
    return root


def _args(store: Path, output: Path, as_of: int, run_id: str, *extra: str) -> list[str]:
    return [
        "--store",
        f"broker-a={store}",
        "--output",
        str(output),
        "--as-of",
        str(as_of),
        "--run-id",
        run_id,
        *extra,
    ]


def test_anomalies_are_written_counted_printed_and_fail_on_exits_3(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, output = _store(tmp_path / "store"), tmp_path / "out"
    # Two earlier runs, 100 s and 50 s before T, with the same offsets (h0 = 0, p0 = 0).
    assert main(_args(store, output, T - 100_000, "early"), spark=spark) == 0
    assert main(_args(store, output, T - 50_000, "middle"), spark=spark) == 0
    assert "stalled_offset" not in capsys.readouterr().out  # two runs are not three yet

    assert main(_args(store, output, T, "now", "--fail-on", "critical"), spark=spark) == 3

    captured = capsys.readouterr()
    found = [
        (r["kind"], r["severity"], r["uniq_key"], r["half_offset"], r["op_offset"])
        for r in rows_of(output, "anomalies", "now")
    ]
    assert sorted(found, key=repr) == [
        ("recheck_of_resolved", "critical", "KEY0000", 1, None),
        ("settled_discards", "info", None, None, None),  # the same discard, per queue
        ("stalled_offset", "critical", None, 0, None),
        ("stalled_offset", "critical", None, None, 0),
        ("system_topic_or_delay", "warning", "KEY0003", 3, None),
    ]
    (summary,) = rows_of(output, "run_summary", "now")
    assert (summary["anomalies_info"], summary["anomalies_warning"]) == (1, 1)
    assert summary["anomalies_critical"] == 3
    assert summary["settled_discards"] == 1
    # Everything is written before the exit code: the offsets table is committed too.
    assert len(rows_of(output, "consume_offsets", "now")) == 2
    assert "  recheck_of_resolved (critical): 1 (broker-a queue 0: 1)" in captured.out
    assert "  stalled_offset (critical): 2 (broker-a queue 0: 2)" in captured.out
    assert "  system_topic_or_delay (warning): 1 (broker-a queue 0: 1)" in captured.out
    assert "  settled_discards (info): 1 (broker-a queue 0: 1)" in captured.out
    assert captured.err.strip().splitlines()[-1].startswith("fail-on: 3 anomalies of severity")
    # The earlier runs had no stalled offset (nor the op, stored 50 s before T). A rerun of
    # a run id does not take itself for history: test_earlier_offsets_count_reruns_of_one_t_once.
    # At T - 50 s the newest record is the halves' (an hour old): the store looks stalled,
    # a picture_warning.
    middle = {r["kind"] for r in rows_of(output, "anomalies", "middle")}
    assert middle == {"system_topic_or_delay", "picture_warning"}


def test_earlier_offsets_count_reruns_of_one_t_once(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    rows = [
        ("a", "r1", 100, 5),
        ("a", "r1b", 100, 6),  # a rerun of T=100 under another id: the larger id counts
        ("a", "r2", 200, 7),
        ("a", "r3", 300, 8),
        ("a", "now", 250, 9),  # this run's own earlier rows: not history
        ("a", "later", 400, 1),  # at or after T: not history
    ]
    broker, run_id, as_of, h0 = zip(*rows, strict=True)
    write_deltalake(
        str(tmp_path / "run_summary"),
        pa.table(
            {
                "broker": list(broker),
                "queue_id": pa.array([0] * len(rows), pa.int32()),
                "run_id": list(run_id),
                "as_of_ms": pa.array(as_of, pa.int64()),
                "h0": pa.array(h0, pa.int64()),
                "p0": pa.array([0] * len(rows), pa.int64()),
            }
        ),
        partition_by=["run_id"],
    )

    latest = earlier_offsets(str(tmp_path), "now", 400, runs=4)

    assert [(r["as_of_ms"], r["h0"]) for r in latest] == [(300, 8), (200, 7), (100, 6)]
    assert earlier_offsets(str(tmp_path / "none"), "now", 400, runs=3) == []


def test_fail_on_counts_that_severity_or_worse() -> None:
    counts = [
        KindCount("system_topic_or_delay", "warning", (("a", 0, 2),)),
        KindCount("op_queue_gap", "critical", (("a", 0, 1), ("b", 0, 1))),
    ]
    assert (failing(counts, ""), failing(counts, "warning"), failing(counts, "critical")) == (
        0,
        4,
        2,
    )
    assert failing(counts[:1], "critical") == 0
    assert anomaly_lines(counts) == [
        "anomalies (rows in the anomalies table):",
        "  system_topic_or_delay (warning): 2 (a queue 0: 2)",
        "  op_queue_gap (critical): 2 (a queue 0: 1, b queue 0: 1)",
    ]
    assert anomaly_lines([]) == ["anomalies: none"]
