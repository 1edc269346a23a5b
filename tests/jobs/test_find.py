"""``rmq-txn-reconcile find`` (jobs/find.py): the latest run of each broker, the search of
each table by business key, transaction id and unique key, the printed lines and the exit
codes, on small inline Delta tables (no Spark); and a whole run on a simulated store, where
a pending, a checked, a discarded and a resolved transaction and a key never seen each get
their answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from connectors.rocketmq.reader import parse_store_arg, read_batches
from jobs.cli import main as cli_main
from jobs.find import (
    EXIT_BAD_INPUT,
    EXIT_FOUND,
    EXIT_NOT_FOUND,
    LatestRun,
    format_row,
    iso,
    latest_runs,
    main,
    search_mask,
)
from schemas.messages import HALF_TOPIC
from simulator.simulation import SimConfig, write_store
from tests.robustness.store import read_table

T1, T2 = 1_750_000_000_000, 1_750_000_600_000  # 2025-06-15T15:06:40Z and 10 min later


def _summary(rows: list[tuple[str, str, int, list[str]]]) -> pa.Table:
    """run_summary rows (broker, run_id, as_of_ms, inputs), two queue rows each."""
    return pa.table(
        {
            "broker": [r[0] for r in rows for _ in (0, 1)],
            "queue_id": [q for _ in rows for q in (0, 1)],
            "run_id": [r[1] for r in rows for _ in (0, 1)],
            "as_of_ms": [r[2] for r in rows for _ in (0, 1)],
            "inputs": [r[3] for r in rows for _ in (0, 1)],
        }
    )


def test_the_latest_run_of_each_broker_is_the_largest_t_then_the_larger_run_id() -> None:
    summary = _summary(
        [
            ("a", "r-old", T1, ["store:a=/s/a", "store:b=/s/b"]),
            ("b", "r-old", T1, ["store:a=/s/a", "store:b=/s/b"]),
            ("a", "r-new", T2, ["store:a=/s/a2"]),
            ("a", "r-backfill", T1 - 1, ["store:a=/s/a"]),  # written last, an older T
            ("b", "r-tie-1", T2, ["parquet:b:/x/half", "parquet:b:/x/op"]),
            ("b", "r-tie-2", T2, ["parquet:b:/x/half", "parquet:b:/x/op"]),
        ]
    )
    assert latest_runs(summary) == [
        LatestRun("a", "r-new", T2, "/s/a2"),
        LatestRun("b", "r-tie-2", T2, None),  # exports: no store to check
    ]


def test_the_search_matches_uniq_key_transaction_id_or_one_of_keys() -> None:
    batch = pa.record_batch(
        {
            "uniq_key": ["U1", "U2", "U3", None, "U5"],
            "transaction_id": ["U1", "TX2", None, None, "U5"],
            "keys": [["K1", "K2"], [], None, ["K4"], ["K1"]],
        }
    )
    wanted = pa.array(["U1", "TX2", "K4", "K9"])
    assert search_mask(batch, wanted).to_pylist() == [True, True, False, True, False]
    # A batch that is a slice of a larger one (a scanner's batches can be): its own rows.
    assert search_mask(batch.slice(3), pa.array(["K1"])).to_pylist() == [False, True]
    # A table without the search columns (an older discard_history): by uniq_key alone.
    old = pa.record_batch({"uniq_key": ["U1", "K1"]})
    assert search_mask(old, pa.array(["K1"])).to_pylist() == [False, True]


def test_a_row_is_one_line_with_its_place_status_and_iso_times() -> None:
    row = {
        "broker": "broker-a",
        "queue_id": 0,
        "half_offset": 4229,
        "status": "check",
        "check_times": 8,
        "checks_left": 7,
        "store_timestamp_ms": T1,
        "uniq_key": "U1",
        "transaction_id": "U1",  # the same as uniq_key: not repeated
        "keys": ["ORD-1", "ORD-2"],
        "tags": "TagA",
        "run_id": "r",
    }
    assert format_row("pending", row) == (
        "pending          broker-a  queue 0 half_offset 4229  status=check  check_times=8"
        "  checks_left=7  stored=2025-06-15T15:06:40.000Z  uniq_key=U1  keys=ORD-1,ORD-2  tags=TagA"
    )
    history = {"broker": "b", "discard_offset": 3, "outcome": "committed", "uniq_key": "U9"}
    history["transaction_id"] = "TX9"
    assert format_row("discard_history", history) == (
        "discard_history  b  discard_offset 3  outcome=committed  uniq_key=U9  transaction_id=TX9"
    )


def test_times_are_whole_milliseconds_and_a_garbage_time_stays_a_number() -> None:
    assert iso(1_749_999_999_662) == "2025-06-15T15:06:39.662Z"  # not .661 (no float)
    assert iso(-1) == "1969-12-31T23:59:59.999Z"
    assert iso(2**62) == str(2**62)  # beyond the year 9999
    assert iso(None) == "-"


def _write(root: Path, table: str, rows: list[dict[str, Any]], by_run: bool = True) -> None:
    write_deltalake(
        str(root / table), pa.Table.from_pylist(rows), partition_by=["run_id"] if by_run else None
    )


def _half(run: str, as_of: int, offset: int, key: str, keys: list[str], **kw: Any) -> dict:
    return {
        "broker": "b",
        "queue_id": 0,
        "half_offset": offset,
        "uniq_key": key,
        "transaction_id": key,
        "keys": keys,
        "store_timestamp_ms": as_of - 60_000,
        "run_id": run,
        "as_of_ms": as_of,
        **kw,
    }


@pytest.fixture
def exported_root(tmp_path: Path) -> Path:
    """Two runs of broker b (exports): U1 pending in both, U2 checked in the first only;
    U3 in an old discard_history (written before it had keys); U1 has an anomaly."""
    root = tmp_path / "out"
    inputs = ["parquet:b:/x/half", "parquet:b:/x/op"]
    _write(
        root,
        "run_summary",
        [
            {"broker": "b", "queue_id": 0, "run_id": r, "as_of_ms": t, "inputs": inputs}
            for r, t in (("r1", T1), ("r2", T2))
        ],
    )
    checked = _half("r1", T1, 5, "U2", ["ORD-2"])
    _write(root, "check_requests", [checked])
    _write(
        root,
        "pending",
        [
            _half("r1", T1, 4, "U1", ["ORD-1"], status="too_young"),
            {**checked, "status": "check"},
            _half("r2", T2, 4, "U1", ["ORD-1"], status="check", check_times=1),
        ],
    )
    anomaly = {"broker": "b", "queue_id": 0, "kind": "slow_producer", "severity": "info"}
    anomaly |= {"uniq_key": "U1", "half_offset": 4, "detail": "slow", "run_id": "r2"}
    _write(root, "anomalies", [anomaly])
    history = {"broker": "b", "discard_offset": 0, "uniq_key": "U3", "outcome": "unresolved"}
    _write(root, "discard_history", [{**history, "run_id": "r1", "as_of_ms": T1}], by_run=False)
    return root


def test_find_prints_the_latest_runs_rows_and_says_why_a_key_is_in_none(
    exported_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--output", str(exported_root), "ORD-1", "U3", "ORD-2", "ORD-1"])
    lines = capsys.readouterr().out.splitlines()
    assert code == EXIT_NOT_FOUND  # ORD-2 is in no row of r2
    assert lines[0] == "latest run of b: r2 as of 2025-06-15T15:16:40.000Z (exports)"
    assert lines[1] == "note: " + str(exported_root) + " has no discards table"
    assert lines[2] == "ORD-1: 2 row(s)"  # once, though given twice
    assert lines[3].startswith("  pending          b  queue 0 half_offset 4  status=check")
    assert lines[4].startswith("  anomalies        b  queue 0 half_offset 4  kind=slow_producer")
    assert lines[4].endswith("uniq_key=U1  detail: slow")  # reached through ORD-1's uniq_key
    assert lines[5:] == [
        "U3: 1 row(s)",
        "  discard_history  b  discard_offset 0  outcome=unresolved  uniq_key=U3",
        "ORD-2: in no table: the store cannot be checked (the latest run of b read exports)",
    ]


def test_find_exits_0_when_every_key_has_a_row(
    exported_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--output", str(exported_root), "U1", "U3"]) == EXIT_FOUND
    # The console script's first word dispatches to the same command.
    assert cli_main(["find", "--output", str(exported_root), "U1"]) == EXIT_FOUND
    assert "U1: 2 row(s)" in capsys.readouterr().out


def test_a_broken_table_is_one_error_line_and_exit_1(
    exported_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (exported_root / "pending" / "_delta_log" / "00000000000000000000.json").write_text("x\n")
    assert main(["--output", str(exported_root), "U1"]) == EXIT_NOT_FOUND
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and err[0].startswith("error: ")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--output", "{missing}", "K"], "output root not found"),
        (["--output", "{empty}", "K"], "no run_summary table"),
        (["--output", "{out}", " "], "KEY must not be empty"),
        (["--output", "{out}"], "KEY"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(
    exported_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    needle: str,
) -> None:
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "out": exported_root}
    assert main([arg.format(**paths) for arg in argv]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1
    assert err[0].startswith("error: ") and needle in err[0]


# -- a whole run -------------------------------------------------------------------------


def _column(out: Path, table: str, *columns: str) -> list[dict[str, Any]]:
    return read_table(out, table).select(list(columns)).to_pylist()


def _resolved_key(store: Path, out: Path, as_of_ms: int) -> str:
    """A business key of a half record stored before T whose transaction is in no table."""
    known = {
        r["uniq_key"]
        for table in ("pending", "check_requests", "discards", "discard_history", "anomalies")
        for r in _column(out, table, "uniq_key")
    }
    for batch in read_batches([parse_store_arg(f"broker-a={store}")], topics=(HALF_TOPIC,)):
        for record in batch.select(["store_timestamp_ms", "properties"]).to_pylist():
            properties = dict(record["properties"])
            keys = properties.get("KEYS")
            stored = record["store_timestamp_ms"]
            if keys and properties["UNIQ_KEY"] not in known and stored < as_of_ms:
                return keys
    raise AssertionError("the simulated store has no resolved transaction with KEYS")


@pytest.mark.runs
def test_find_answers_for_each_kind_of_transaction_after_a_run(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, out = tmp_path / "broker-a", tmp_path / "out"
    # Some producers never answer: their transactions are checked, then discarded.
    write_store(
        SimConfig(transactions=300, seed=5, never_fraction=0.05, commitlog_file_size=16 << 20),
        store,
    )
    argv = ["--store", f"broker-a={store}", "--output", str(out), "--as-of", "latest"]
    assert cli_main(argv, spark=spark) == 0
    capsys.readouterr()
    (run,) = {
        (r["run_id"], r["as_of_ms"]) for r in _column(out, "run_summary", "run_id", "as_of_ms")
    }
    pending = _column(out, "pending", "keys", "uniq_key", "status", "half_offset")
    immune = next(r for r in pending if r["status"] != "check" and r["keys"])
    checked = _column(out, "check_requests", "transaction_id", "half_offset")[0]
    discarded = next(
        r for r in _column(out, "discard_history", "keys", "discard_offset") if r["keys"]
    )
    resolved = _resolved_key(store, out, run[1])
    keys = [
        immune["keys"][0],
        checked["transaction_id"],
        discarded["keys"][0],
        resolved,
        "NO-SUCH-KEY",
    ]

    assert cli_main(["find", "--output", str(out), *keys], spark=spark) == EXIT_NOT_FOUND
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"latest run of broker-a: {run[0]} as of ")
    blocks = {line.split(": ", 1)[0]: line for line in lines if not line.startswith(" ")}

    def rows_of(key: str) -> list[str]:
        return _block(lines, lines.index(blocks[key]))

    assert f"status={immune['status']}" in rows_of(keys[0])[0]
    tables = {row.split()[0] for row in rows_of(keys[1])}
    assert {"check_requests", "pending"} <= tables
    assert any(f"half_offset {checked['half_offset']} " in row for row in rows_of(keys[1]))
    (history,) = [row for row in rows_of(keys[2]) if row.startswith("discard_history")]
    assert f"discard_offset {discarded['discard_offset']} " in history
    assert blocks[resolved].startswith(f"{resolved}: in no table: resolved (uniq_key ")
    assert blocks[resolved].endswith("not pending in the latest run)")
    assert blocks["NO-SUCH-KEY"].startswith(
        "NO-SUCH-KEY: in no table: not in the store's retained half records (oldest retained:"
        " broker-a 20"
    )
    assert blocks["NO-SUCH-KEY"].endswith("): never seen, or beyond retention")


def _block(lines: list[str], start: int) -> list[str]:
    """The row lines of the key block that starts at ``start``."""
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        rows.append(line.strip())
    return rows
