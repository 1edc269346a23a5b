"""bench.compare_tables on two tiny output roots written by delta-rs (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from bench import compare_tables
from bench.compare_tables import compare_roots, main


def _summary(written_at_ms: int, run_id: str = "r1") -> pa.Table:
    return pa.table(
        {
            "run_id": [run_id],
            "written_at_ms": [written_at_ms],
            "duration_ms": [written_at_ms - 1000],
            "settings": [[{"key": "as_of", "value": "7"}]],
        }
    )


def _pending(ids: list[str]) -> pa.Table:
    return pa.table({"txn_id": ids, "queue_id": list(range(len(ids)))})


def _root(base: Path, name: str, summary: pa.Table, pending: pa.Table) -> Path:
    root = base / name
    write_deltalake(str(root / "run_summary"), summary)
    write_deltalake(str(root / "pending"), pending)
    return root


def test_roots_differing_only_in_the_run_timing_and_row_order_are_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _root(tmp_path, "a", _summary(1_000_000), _pending(["t1", "t2", "t3"]))
    reordered = _pending(["t1", "t2", "t3"]).take([2, 0, 1])
    b = _root(tmp_path, "b", _summary(2_000_000), reordered)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "pending: same (3 rows)" in out and "run_summary: same (1 rows)" in out


def test_a_changed_row_a_duplicate_and_a_missing_table_are_differences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _root(tmp_path, "a", _summary(1_000_000), _pending(["t1", "t2", "t3"]))
    b = _root(tmp_path, "b", _summary(1_000_000, run_id="r2"), _pending(["t1", "t2", "t3"]))
    write_deltalake(str(b / "pending"), _pending(["t1"]), mode="append")  # t1 twice
    write_deltalake(str(a / "discards"), _pending(["t9"]))
    assert main([str(a), str(b)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "discards: only in A" in out
    assert "pending: 1 rows differ (0 of A's 3, 1 of B's 4)" in out
    assert '    only in B: {"queue_id": 0, "txn_id": "t1"}' in out
    assert "run_summary: 2 rows differ (1 of A's 1, 1 of B's 1)" in out
    assert out[-1] == "0 of 3 tables the same; differ: discards, pending, run_summary"


def test_an_ignored_column_is_left_out_and_a_column_only_one_side_has_is_a_difference(
    tmp_path: Path,
) -> None:
    a = _root(tmp_path, "a", _summary(1_000_000), _pending(["t1"]))
    b = _root(tmp_path, "b", _summary(1_000_000, run_id="r2"), _pending(["t1"]))
    write_deltalake(
        str(b / "pending"),
        _pending(["t1"]).append_column("extra", pa.array([1])),
        mode="overwrite",
        schema_mode="overwrite",
    )
    results = {r.table: r for r in compare_roots(a, b, ignore=("run_summary.run_id", "x.y"))}
    assert results["run_summary"].same  # run_id left out; the timing compared and equal
    assert not results["pending"].same
    assert results["pending"].line == "pending: columns differ: only in A [], only in B ['extra']"


def test_a_missing_root_is_exit_2(tmp_path: Path) -> None:
    assert main([str(tmp_path), str(tmp_path / "nowhere")]) == 2


def test_a_table_too_large_to_list_is_compared_by_its_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compare_tables, "LISTED_ROWS", 2)
    rows = _pending(["t1", "t2", "t3"])
    a = _root(tmp_path, "a", _summary(1_000_000), rows)
    # The same rows in other files and order (two appends) are the same multiset.
    b = _root(tmp_path, "b", _summary(1_000_000), rows.take([2]))
    write_deltalake(str(b / "pending"), rows.take([1, 0]), mode="append")
    assert compare_roots(a, b)[0].line == "pending: same (3 rows)"
    # One value changed: the fingerprints differ, and the rows are too many to list.
    changed = pa.table({"txn_id": ["t1", "t2", "t3"], "queue_id": [0, 1, 7]})
    write_deltalake(str(b / "pending"), changed, mode="overwrite")
    line = compare_roots(a, b)[0].line
    assert line == "pending: rows differ (A has 3, B 3; too many to list the rows)"


def test_the_same_values_of_other_types_are_the_same(tmp_path: Path) -> None:
    a = _root(tmp_path, "a", _summary(1_000_000), _pending(["t1", "t2"]))
    narrow = pa.table({"txn_id": ["t2", "t1"], "queue_id": pa.array([1, 0], pa.int32())})
    b = _root(tmp_path, "b", _summary(1_000_000), narrow)
    assert compare_roots(a, b)[0].line == "pending: same (2 rows)"
