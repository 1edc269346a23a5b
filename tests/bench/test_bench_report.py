"""Markdown rendering of bench/report.py from a small results JSON, and the pure parts of the
raw read (no Spark, no real store)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.rawread import Piece, Plan, coalesce, read_pieces, split_plan
from bench.report import (
    MARK_BEGIN,
    MARK_END,
    REPO,
    headline_rows,
    portable,
    render_markdown,
    update_markdown,
)
from bench.stores import CQ_DTYPE, bench_root, used_bytes, valid_entries

GIB = 1 << 30


def _repeat(wall: float, decode: float, raw: float, peer: float, peak_gib: float) -> dict:
    return {
        "bare": {"wall_s": 2.0, "cpu_s": 3.0},
        "job": {
            "wall_s": wall,
            "cpu_s": wall * 1.8,
            "peak_rss_bytes": int(peak_gib * GIB * 1.5),
            "peak_pss_bytes": int(peak_gib * GIB),
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


def _pair(round_jobs: int, connect_wall: float | None = None) -> dict:
    phases = {
        "(unlabelled)": {"jobs": 1},
        "resolve and classify": {"jobs": round_jobs},
        "write": {"jobs": 20},
    }
    job = {"wall_s": 20.0, "cpu_s": 26.0, "load_1m": 0.5, "phases": phases}
    bare = {"wall_s": 8.0, "cpu_s": 8.0, "load_1m": 0.4}
    pair = {"job": job, "bare": bare, "ratio_wall": 2.5, "ratio_cpu": 3.25}
    if connect_wall is not None:
        pair["connect"] = {"wall_s": connect_wall, "cpu_s": 1.0, "load_1m": 0.6}
    return pair


def _size(millions: int, repeats: list[dict]) -> dict:
    """A size's entry: ``millions`` M transactions and records, 400 MB per million read."""
    return {
        "transactions": millions * 1_000_000,
        "records": millions * 1_000_000,
        "records_match": True,
        "raw_read_plan": {"bytes": millions * 400_000_000, "ranges": 10 * millions},
        "repeats": repeats,
    }


def _results() -> dict:
    return {
        "generated_at": "2025-01-01T00:00:00+00:00",
        "machine": {"cpu_model": "Test CPU", "logical_cores": 2},
        "sample": {
            # Connect / bare: 2 / 8, 6 / 8, 3.6 / 8 -> median 0.45
            "pairs": [_pair(14, 2.0), _pair(16, 6.0), _pair(14, 3.6)],
            "summary": {"median_ratio_wall": 2.5, "median_ratio_cpu": 3.25},
        },
        "sizes": {
            # 1m, net of Spark's start: (10 - 2) / 4 = 2.0 wall, (18 - 3) / 4 = 3.75 CPU;
            # (12 - 2) / 2 = 5.0 and (21.6 - 3) / 2 = 9.3; (6 - 2) / 1 = 4.0 and 7.8
            "1m": _size(
                1,
                [_repeat(10, 4, 0.5, 4, 2), _repeat(12, 5, 0.4, 2, 2), _repeat(6, 4, 1, 1, 2)],
            ),
            "4m": _size(
                4,
                [
                    _repeat(10, 4, 0.5, 4, 2),
                    _repeat(12, 5, 0.4, 5, 3),
                    _repeat(11, 4.5, 0.6, 6, 2.5),
                ],
            ),
            "16m": _size(16, [_repeat(40, 16, 2, 10, 5), {"job_failed": "exit 1: boom"}]),
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
    rows = {row[0]: row[1:] for row in headline_rows(_results())}
    sample = "sample store, cold: job / bare-Spark process (median of 3 pairs)"
    assert rows[sample] == ["2.50x wall (3.25x CPU)", "≤ 1.8x wall", "**missed**"]
    # every phase's jobs, the unlabelled one included; the split of the pair with the most
    jobs = "sample store: Spark jobs of the whole run, every phase and write (each pair)"
    split = "(resolve and classify 16, write 20, (unlabelled) 1)"
    assert rows[jobs] == [f"35, 37, 35 {split}", "≤ 15", "**missed**"]
    connect = (
        "sample store via a warm Spark Connect server: job / bare-Spark process of the"
        " same pair (median of 3 pairs)"
    )
    assert rows[connect] == ["0.45x wall", "≤ 0.5x wall", "met"]
    assert rows["`make test-runs`: wall"] == ["timed outside make bench", "≤ 10 min", "n/a"]
    assert rows["`.ci/run`: wall"] == ["timed outside make bench", "≤ 45 min", "n/a"]
    # per-repeat ratios (2.0, 5.0, 4.0) and (3.75, 9.3, 7.8), then their medians
    net_wall = "1m: job net of Spark's start / DuckDB peer: wall"
    assert rows[net_wall] == ["4.00x", "≤ 4x", "met"]
    net_cpu = "1m: job net of Spark's start / DuckDB peer: CPU"
    assert rows[net_cpu] == ["7.80x", "≤ 5x", "**missed**"]
    assert rows["16m: job / DuckDB peer (wall)"] == ["4.00x", "≤ 1.5x", "**missed**"]
    assert rows["16m: job throughput (stretch)"][0] == "400 k records/s"
    # median wall 4m = 11 s -> 40 / 11
    assert rows["time(16m) / time(4m)"] == ["3.64", "≤ 4.4", "met"]
    pss = "16m: peak memory, PSS of the process tree (max of repeats)"
    assert rows[pss] == ["5.00 GiB", "≤ 6 GiB", "met"]
    assert rows["every repeat completes"] == ["1m 3/3, 4m 3/3, 16m 1/2", "all", "**missed**"]
    # 1m decode: 1 M records / (4, 5, 4) s against 1 M records / (0.5, 0.4, 1) s raw
    decode = "1m: decode vs raw read, page cache warm"
    assert rows[decode] == ["12.5 % (250 k vs 2.00 M records/s)", "≥ 25%", "**missed**"]


def test_a_failed_repeat_is_shown_with_its_error() -> None:
    text = render_markdown(_results())
    assert "The job **failed** in 1 repeat(s)" in text and "exit 1: boom" in text


def test_the_sample_pairs_get_a_row_each_with_the_jobs_per_phase() -> None:
    text = render_markdown(_results())
    assert (
        "| 3 | 20.0 | 26.0 | 0.50 | 8.00 | 8.00 | 0.40 | 2.50x / 3.25x | 3.60 | 0.60 | 0.45x"
        " | 35 (resolve and classify 14, write 20, (unlabelled) 1) |"
    ) in text


def test_a_sample_without_the_connect_case_says_it_was_not_measured() -> None:
    results = _results()
    results["sample"]["pairs"] = [_pair(14), _pair(14), _pair(14)]
    results["sample"]["connect_error"] = "no Connect server launcher (tests.connect.server)"
    rows = {row[0]: row[1:] for row in headline_rows(results)}
    connect = next(label for label in rows if "warm Spark Connect" in label)
    assert rows[connect] == ["not measured", "≤ 0.5x wall", "n/a"]
    jobs = "sample store: Spark jobs of the whole run, every phase and write (each pair)"
    assert rows[jobs][-1] == "**missed**"  # 35 > 15
    text = render_markdown(results)
    assert "Connect / bare" not in text  # no Connect columns without a Connect figure
    assert "The Connect case was **not measured**: no Connect server launcher" in text


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


def test_committed_figures_hold_no_absolute_path_of_the_machine() -> None:
    text = f"collect at {REPO}/jobs/x.py:1; {REPO}/.venv/bin/python; {Path.home()}/.cache/b"
    assert portable(text) == "collect at jobs/x.py:1; .venv/bin/python; ~/.cache/b"
    stores = f"{bench_root()}/stores/1m/broker-a"
    assert portable(stores) == "$RMQ_BENCH_DIR/stores/1m/broker-a"


def test_the_sample_pairs_show_the_floor_cold_and_via_connect() -> None:
    results = _results()
    for pair in results["sample"]["pairs"]:
        pair["floor"] = {"wall_s": 12.0, "cpu_s": 4.0, "load_1m": 0.7}
        pair["connect_floor"] = {"wall_s": 2.4, "cpu_s": 1.0, "load_1m": 0.8}
    text = render_markdown(results)
    assert (
        "| 3 | 20.0 | 26.0 | 0.50 | 8.00 | 8.00 | 0.40 | 2.50x / 3.25x | 12.0 | 0.70 | 1.50x"
        " | 3.60 | 0.60 | 0.45x | 2.40 | 0.80 | 0.30x"
        " | 35 (resolve and classify 14, write 20, (unlabelled) 1) |"
    ) in text
    assert "floor / bare wall" in text and "Connect floor / bare wall" in text
    assert "Floor: `python -m bench.floor`, what a run costs with no round" in text
    assert "Connect: the job's and the floor's client process (`--remote`)" in text


def test_the_sample_pairs_without_a_floor_have_no_floor_columns() -> None:
    text = render_markdown(_results())
    assert "floor" not in text.lower()
