"""bench.small's figures: medians of per-pair ratios, the Spark jobs of the whole run and
the warm Connect case."""

from __future__ import annotations

from pathlib import Path

from bench.job import AS_OF_MS
from bench.report import RUN_JOBS_TARGET
from bench.small import (
    connect_command,
    floor_command,
    line,
    summary,
    summary_line,
    with_ratios,
)


def _pair(job_wall: float, bare_wall: float, round_jobs: int) -> dict:
    """A pair whose run has ``round_jobs`` + 19 + 1 Spark jobs (the round, the write and
    one unlabelled)."""
    phases = {
        "resolve and classify": {"jobs": round_jobs, "wall_s": 4.0},
        "write": {"jobs": 19, "wall_s": 3.0},
        "(unlabelled)": {"jobs": 1, "wall_s": 0.5},
    }
    return {
        "job": {"wall_s": job_wall, "cpu_s": 2 * job_wall, "load_1m": 1.5, "phases": phases},
        "bare": {"wall_s": bare_wall, "cpu_s": bare_wall, "load_1m": 1.25},
        "ratio_wall": job_wall / bare_wall,
        "ratio_cpu": 2 * job_wall / bare_wall,
    }


def _with_connect(pair: dict, connect_wall: float) -> dict:
    pair["connect"] = {"wall_s": connect_wall, "cpu_s": 1.0, "load_1m": 0.75}
    pair["ratio_connect_wall"] = connect_wall / pair["bare"]["wall_s"]
    return pair


def test_summary_takes_the_median_of_per_pair_ratios() -> None:
    pairs = [_pair(30, 10, 12), _pair(40, 10, 12), _pair(20, 10, 12)]
    result = summary(pairs)
    assert result["median_ratio_wall"] == 3.0
    assert result["median_ratio_cpu"] == 6.0
    assert result["run_jobs"] == [32, 32, 32]
    assert result["median_ratio_connect_wall"] is None


def test_every_phase_and_the_unlabelled_jobs_count_toward_the_job_target() -> None:
    at_target = RUN_JOBS_TARGET - 20  # + 19 write + 1 unlabelled
    assert summary([_pair(30, 10, at_target)])["run_jobs_met"]
    pairs = [_pair(30, 10, at_target), _pair(30, 10, at_target + 1)]
    assert not summary(pairs)["run_jobs_met"]  # one run over the target misses it


def test_the_connect_ratio_is_to_the_bare_spark_of_the_same_pair() -> None:
    pairs = [
        _with_connect(_pair(30, 10, 12), 4.0),
        _with_connect(_pair(30, 20, 12), 4.0),
        _with_connect(_pair(30, 5, 12), 4.0),
    ]
    result = summary(pairs)
    assert result["median_ratio_connect_wall"] == 0.4  # of 0.4, 0.2, 0.8
    text = summary_line(result)
    assert "warm Connect: median 0.40x the bare Spark of its pair (target <= 0.5x: met)" in text
    assert "Spark jobs of the whole run: [32, 32, 32] (target <= 15: NOT met)" in text


def test_without_the_connect_case_the_summary_says_why() -> None:
    text = summary_line(summary([_pair(30, 10, 12)]), "no Connect server launcher")
    assert text.endswith("warm Connect: not measured (no Connect server launcher)")


def test_the_connect_run_names_the_server_and_no_master() -> None:
    command = connect_command(Path("/s"), Path("/o"), "sc://127.0.0.1:1")
    assert command[1:5] == ["-m", "jobs.reconcile", "--remote", "sc://127.0.0.1:1"]
    assert command[5:] == ["--store", "broker-a=/s", "--output", "/o", "--as-of", str(AS_OF_MS)]


def test_each_line_names_the_load_beside_its_figures() -> None:
    text = line("sample pair 1", _with_connect(_pair(30, 10, 55), 4.0))
    assert "(load  1.50)" in text and "(load  1.25)" in text and "(load  0.75)" in text
    assert "warm Connect   4.0 s wall (load  0.75) 0.40x bare" in text
    assert "Spark jobs: 75 (resolve and classify 55, write 19, (unlabelled) 1)" in text


def test_each_line_counts_the_jobs_of_every_phase_in_the_job_order() -> None:
    pair = _pair(30, 10, 45)
    pair["job"]["phases"] = {
        "write": {"jobs": 29, "wall_s": 8.5},
        "(unlabelled)": {"jobs": 1, "wall_s": 1.6},
        "decode": {"jobs": 3, "wall_s": 3.1},
        "discard history": {"jobs": 40, "wall_s": 10.0},
        "resolve and classify": {"jobs": 45, "wall_s": 7.7},
    }
    text = line("sample pair 1", pair)
    expected = (
        "Spark jobs: 118 (decode 3, resolve and classify 45, discard history 40, write 29,"
        " (unlabelled) 1)"
    )
    assert expected in text


def _with_floors(pair: dict, floor_wall: float, connect_floor_wall: float | None = None) -> dict:
    pair["floor"] = {"wall_s": floor_wall, "cpu_s": 2.0, "load_1m": 1.0}
    if connect_floor_wall is not None:
        pair["connect_floor"] = {"wall_s": connect_floor_wall, "cpu_s": 1.0, "load_1m": 0.5}
    return with_ratios(pair)


def test_the_floor_ratios_are_to_the_bare_spark_of_the_same_pair() -> None:
    pair = _with_floors(_with_connect(_pair(30, 10, 12), 4.0), 18.0, 3.5)
    assert pair["ratio_floor_wall"] == 1.8
    assert pair["ratio_connect_floor_wall"] == 0.35
    assert pair["ratio_connect_wall"] == 0.4 and pair["ratio_wall"] == 3.0
    text = line("sample pair 1", pair)
    assert " | floor  18.0 s (1.80x bare) (load  1.00)" in text
    assert " | Connect floor   3.5 s (0.35x bare) (load  0.50)" in text


def test_the_summary_gives_the_floor_medians_cold_and_via_connect() -> None:
    pairs = [
        _with_floors(_with_connect(_pair(30, 10, 12), 4.0), 18.0, 3.5),
        _with_floors(_with_connect(_pair(30, 20, 12), 4.0), 20.0, 8.0),
        _with_floors(_with_connect(_pair(30, 5, 12), 4.0), 10.0, 2.0),
    ]
    result = summary(pairs)
    assert result["median_ratio_floor_wall"] == 1.8  # of 1.8, 1.0, 2.0
    assert result["median_ratio_connect_floor_wall"] == 0.4  # of 0.35, 0.4, 0.4
    assert summary_line(result).endswith("; floor: median 1.80x bare cold, 0.40x via warm Connect")


def test_without_the_connect_case_the_floor_is_cold_only() -> None:
    result = summary([_with_floors(_pair(30, 10, 12), 17.0)])
    assert result["median_ratio_connect_floor_wall"] is None
    text = summary_line(result, "--skip-connect")
    assert text.endswith(
        "warm Connect: not measured (--skip-connect); floor: median 1.70x bare cold"
    )
    assert "Connect floor" not in line("sample pair 1", _with_floors(_pair(30, 10, 12), 17.0))


def test_a_pair_without_a_floor_shows_none() -> None:
    result = summary([_pair(30, 10, 12)])
    assert result["median_ratio_floor_wall"] is None
    assert "floor" not in summary_line(result) and "floor" not in line("p", _pair(30, 10, 12))


def test_the_floor_runs_local_or_as_a_client_of_the_server() -> None:
    stores = {"broker-a": Path("/a"), "broker-b": Path("/b")}
    command = floor_command(stores, Path("/o"))
    assert command[1:] == [
        "-m",
        "bench.floor",
        "--store",
        "broker-a=/a",
        "--store",
        "broker-b=/b",
        "--output",
        "/o",
    ]
    remote = floor_command(stores, Path("/o"), "sc://127.0.0.1:1")
    assert remote[-2:] == ["--remote", "sc://127.0.0.1:1"]
