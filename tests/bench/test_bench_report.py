"""Markdown rendering of bench/report.py from a small results JSON, and the pure parts of the
raw read (no Spark, no real store)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.rawread import Piece, Plan, coalesce, read_pieces, split_plan
from bench.report import MARK_BEGIN, MARK_END, headline_rows, render_markdown, update_markdown
from bench.stores import CQ_DTYPE, used_bytes, valid_entries

GIB = 1 << 30


def _repeat(wall: float, decode: float, raw: float, peer: float, peak_gib: float) -> dict:
    return {
        "job": {
            "wall_s": wall,
            "cpu_s": wall * 1.8,
            "peak_rss_bytes": int(peak_gib * GIB),
            "phases": {
                "decode": {
                    "wall_s": decode,
                    "executor_run_s": decode * 2,
                    "slowest_stages": [
                        {
                            "stage_id": 0,
                            "name": "count at x",
                            "tasks": 18,
                            "executor_run_s": decode * 2,
                            "duration_s": decode,
                            "operators": ["MapInArrow"],
                        }
                    ],
                },
                "resolve and classify": {"wall_s": wall - decode - 1, "executor_run_s": 1.0},
                "write": {"wall_s": 1.0, "executor_run_s": 1.0},
            },
        },
        "raw_read": {"wall_s": raw, "records_per_s": 1_000_000 / raw, "bytes_per_s": 4e8 / raw},
        "peer": {
            "wall_s": peer,
            "cpu_s": peer,
            "peak_rss_bytes": GIB,
            "equal": True,
            "export_wall_s": 9.0,
        },
    }


def _results() -> dict:
    return {
        "generated_at": "2025-01-01T00:00:00+00:00",
        "machine": {"cpu_model": "Test CPU", "logical_cores": 2},
        "sizes": {
            "4m": {
                "transactions": 4_000_000,
                "records": 4_000_000,
                "records_match": True,
                "raw_read_plan": {"bytes": 1_600_000_000, "ranges": 10},
                "repeats": [
                    _repeat(10, 4, 0.5, 4, 2),
                    _repeat(12, 5, 0.4, 5, 3),
                    _repeat(11, 4.5, 0.6, 6, 2.5),
                ],
            },
            "16m": {
                "transactions": 16_000_000,
                "records": 16_000_000,
                "records_match": True,
                "raw_read_plan": {"bytes": 6_400_000_000, "ranges": 40},
                "repeats": [_repeat(40, 16, 2, 10, 9)],
            },
        },
        "scaleout": {
            "size": "1m",
            "speedup": 1.7,
            "equal": True,
            "differences": [],
            "runs": {
                "local[1]": {"wall_s": 17.0, "cpu_s": 20.0, "peak_rss_bytes": GIB},
                "local[2]": {"wall_s": 10.0, "cpu_s": 21.0, "peak_rss_bytes": GIB},
            },
        },
    }


def test_headlines() -> None:
    rows = {row[0]: row for row in headline_rows(_results())}
    assert rows["job throughput at 16m"][1:] == [
        "400 k records/s",
        "≥ 500 k records/s",
        "**missed**",
    ]
    # median wall 4m = 11 s -> 40 / 11
    assert rows["time(16M) / time(4M)"][1:] == ["3.64", "≤ 4.4", "met"]
    assert rows["peak memory at 16m (max of repeats)"][3] == "**missed**"
    assert (
        rows["job / DuckDB peer at 16m (wall)"][1]
        == "4.00x (2.11x counting the peer's Parquet export)"
    )


def test_headlines_without_data_say_so() -> None:
    rows = headline_rows({"sizes": {}})
    assert all(row[-1] == "n/a" for row in rows)


def test_markdown_has_a_table_per_size_with_median_min_max() -> None:
    text = render_markdown(_results())
    assert text.index("### 4m") < text.index("### 16m")
    assert "| job: wall time | s | 11.0 | 10.0 | 12.0 |" in text
    assert "Speedup 1.70x" in text
    assert "Test CPU" in text


def test_update_keeps_hand_written_text(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(
        f"# Mine\n\nanalysis above\n\n{MARK_BEGIN}\nold\n{MARK_END}\n\nanalysis below\n"
    )
    update_markdown(page, "new figures\n")
    text = page.read_text()
    assert "old" not in text
    assert text.startswith("# Mine\n\nanalysis above") and text.endswith("analysis below\n")
    assert f"{MARK_BEGIN}\nnew figures\n{MARK_END}" in text


def test_new_page_gets_the_template(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    update_markdown(page, "figures\n")
    assert "## How to reproduce" in page.read_text() and "figures" in page.read_text()


def test_coalesce_merges_touching_and_overlapping_ranges() -> None:
    starts, lengths = coalesce(np.array([30, 0, 10, 45, 50]), np.array([5, 10, 5, 10, 2]))
    assert starts.tolist() == [0, 30, 45] and lengths.tolist() == [15, 5, 10]


def test_read_pieces_reads_exactly_the_ranges(tmp_path: Path) -> None:
    data = np.arange(1000, dtype=np.uint32).astype(np.uint8)
    path = tmp_path / "commitlog"
    data.tofile(path)
    piece = Piece(str(path), np.array([0, 100, 500]), np.array([10, 50, 333]))
    shares = split_plan([Plan(pieces=[piece])], 2)
    assert sum(p.nbytes for share in shares for p in share) == 393
    assert all(shares)  # both processes get work
    nbytes, _ = read_pieces([piece])
    assert nbytes == 393


def test_consume_queue_entries_padding_and_zero_tail() -> None:
    entries = np.zeros(5, dtype=CQ_DTYPE)
    entries[0] = (0, 0x7FFFFFFF, 0)  # padding of a late queue head
    entries[1] = (0, 300, 7)  # a record at commit-log offset 0
    entries[2] = (300, 250, 0)
    assert valid_entries(entries).tolist() == [False, True, True, False, False]
    assert used_bytes(entries) == 3 * 20
