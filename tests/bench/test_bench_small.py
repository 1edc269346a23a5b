"""bench.small's figures: medians of per-pair ratios and the Spark-job target."""

from __future__ import annotations

from bench.small import ROUND_JOBS_TARGET, line, summary


def _pair(job_wall: float, bare_wall: float, round_jobs: int) -> dict:
    return {
        "job": {
            "wall_s": job_wall,
            "cpu_s": 2 * job_wall,
            "load_1m": 1.5,
            "round_jobs": round_jobs,
            "write_jobs": 19,
        },
        "bare": {"wall_s": bare_wall, "cpu_s": bare_wall, "load_1m": 1.25},
        "ratio_wall": job_wall / bare_wall,
        "ratio_cpu": 2 * job_wall / bare_wall,
    }


def test_summary_takes_the_median_of_per_pair_ratios() -> None:
    pairs = [_pair(30, 10, 12), _pair(40, 10, 12), _pair(20, 10, 12)]
    result = summary(pairs)
    assert result["median_ratio_wall"] == 3.0
    assert result["median_ratio_cpu"] == 6.0
    assert result["round_jobs_met"]


def test_one_run_over_the_job_target_misses_it() -> None:
    pairs = [_pair(30, 10, ROUND_JOBS_TARGET), _pair(30, 10, ROUND_JOBS_TARGET + 1)]
    assert not summary(pairs)["round_jobs_met"]


def test_each_line_names_the_load_beside_its_figures() -> None:
    text = line("sample pair 1", _pair(30, 10, 55))
    assert "(load  1.50)" in text and "(load  1.25)" in text
    assert "resolve and classify 55, write 19" in text


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
        "Spark jobs: decode 3, resolve and classify 45, discard history 40, write 29,"
        " (unlabelled) 1 (all 118)"
    )
    assert expected in text
