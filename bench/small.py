"""A quick benchmark (``make bench-small``): the job against bare Spark on the ``make run``
sample store, in interleaved pairs, then once on the 1m stores.

Each pair runs the job process (``python -m jobs.reconcile``, event log on) and the
bare-Spark process (``python -m bench.bare_spark``) one after the other, alternating which
goes first, so a noisy spell on the shared machine hits both of a pair: the figure is the
median of the per-pair ratios. Every figure is printed with the machine's load average
(1 min) just before it. From the event log: the Spark jobs of the resolve-and-classify
phase (target <= 15, issue 12) and of the write phase, counted apart.

``python -m bench.small [--pairs 3] [--skip-1m] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bench.job import AS_OF_MS, job_env, run_job
from bench.measure import run_measured
from bench.report import PHASES, ROUND_JOBS_TARGET
from bench.stores import REPO, bench_root, ensure_stores

SAMPLE_TRANSACTIONS = 3000  # the Makefile's SAMPLE_TRANSACTIONS
SAMPLE_SEED = 7  # the Makefile's seed
ROUND_PHASE = "resolve and classify"
WRITE_PHASE = "write"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def sample_store() -> Path:
    """The ``make run`` sample store, simulated once into the bench directory."""
    store = bench_root() / "sample" / f"broker-a-{SAMPLE_TRANSACTIONS}-{SAMPLE_SEED}"
    stamp = store / ".simulated"
    if not stamp.exists():
        shutil.rmtree(store, ignore_errors=True)
        command = [sys.executable, "-m", "simulator", "--out", str(store)]
        command += ["--transactions", str(SAMPLE_TRANSACTIONS), "--seed", str(SAMPLE_SEED)]
        subprocess.run(command, cwd=REPO, check=True, capture_output=True)
        stamp.touch()
    return store


def bare_spark(work: Path) -> dict:
    """One bare-Spark process, measured like the job (its event log off: nothing to read)."""
    env = job_env(work)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    figures = {"load_1m": load()}
    measured = run_measured([sys.executable, "-m", "bench.bare_spark"], env=env, cwd=REPO)
    if measured.returncode != 0:
        raise RuntimeError(
            f"bench.bare_spark exit {measured.returncode}: {measured.stderr[-2000:]}"
        )
    figures.update(
        wall_s=measured.wall_s, cpu_s=measured.cpu_s, peak_pss_bytes=measured.peak_pss_bytes
    )
    return figures


def job(stores: dict[str, Path], work: Path) -> dict:
    figures = {"load_1m": load()}
    ran = run_job(stores, work)
    phases = ran["phases"]
    figures.update(
        wall_s=ran["wall_s"],
        cpu_s=ran["cpu_s"],
        round_jobs=phases.get(ROUND_PHASE, {}).get("jobs"),
        write_jobs=phases.get(WRITE_PHASE, {}).get("jobs"),
        round_wall_s=phases.get(ROUND_PHASE, {}).get("wall_s"),
        phases={name: {"jobs": p["jobs"], "wall_s": p["wall_s"]} for name, p in phases.items()},
    )
    return figures


def pairs(stores: dict[str, Path], count: int, work: Path, label: str) -> list[dict]:
    results = []
    for index in range(count):
        job_first = index % 2 == 0
        pair: dict = {}
        for contender in ("job", "bare") if job_first else ("bare", "job"):
            if contender == "job":
                pair["job"] = job(stores, work / "job")
            else:
                pair["bare"] = bare_spark(work / "bare")
        pair["ratio_wall"] = pair["job"]["wall_s"] / pair["bare"]["wall_s"]
        pair["ratio_cpu"] = pair["job"]["cpu_s"] / pair["bare"]["cpu_s"]
        results.append(pair)
        print(line(f"{label} pair {index + 1}", pair), flush=True)
    return results


def line(name: str, pair: dict) -> str:
    j, b = pair["job"], pair["bare"]
    return (
        f"{name:16s} job {j['wall_s']:6.1f} s wall {j['cpu_s']:6.1f} s CPU (load {j['load_1m']:5.2f})"
        f" | bare Spark {b['wall_s']:5.1f} s wall {b['cpu_s']:5.1f} s CPU (load {b['load_1m']:5.2f})"
        f" | ratio {pair['ratio_wall']:.2f}x wall {pair['ratio_cpu']:.2f}x CPU"
        f" | Spark jobs: {_jobs_per_phase(j)}"
    )


def _jobs_per_phase(job_figures: dict) -> str:
    """Spark jobs per phase in the job's order (``bench.report.PHASES``): since issue 15 the
    discard history and the anomaly rules run as many jobs as the round. Figures without
    the per-phase map (older JSON) give the round and the write phase."""
    phases = job_figures.get("phases")
    if not phases:
        return (
            f"{ROUND_PHASE} {job_figures['round_jobs']}, {WRITE_PHASE} {job_figures['write_jobs']}"
        )
    named = [name for name in PHASES if name in phases]
    named += [name for name in phases if name not in PHASES]
    parts = [f"{name} {phases[name]['jobs']}" for name in named]
    return ", ".join(parts) + f" (all {sum(phases[name]['jobs'] for name in named)})"


def summary(results: list[dict]) -> dict:
    round_jobs = [p["job"]["round_jobs"] for p in results]
    return {
        "median_ratio_wall": statistics.median(p["ratio_wall"] for p in results),
        "median_ratio_cpu": statistics.median(p["ratio_cpu"] for p in results),
        "round_jobs": round_jobs,
        "round_jobs_target": ROUND_JOBS_TARGET,
        "round_jobs_met": all(n is not None and n <= ROUND_JOBS_TARGET for n in round_jobs),
    }


def _work() -> Path:
    return bench_root() / "work" / "small"


def run_sample(count: int) -> dict:
    """The sample pairs with their summary, printed as they run (``make bench`` runs them
    too, before the sizes)."""
    work = _work()
    results: dict = {"load_1m_at_start": load()}
    results["pairs"] = pairs({"broker-a": sample_store()}, count, work, "sample")
    results["summary"] = s = summary(results["pairs"])
    print(
        f"sample: median ratio {s['median_ratio_wall']:.2f}x wall (target <= 1.8x),"
        f" {s['median_ratio_cpu']:.2f}x CPU; {ROUND_PHASE}: {s['round_jobs']} Spark jobs"
        f" (target <= {ROUND_JOBS_TARGET}: {'met' if s['round_jobs_met'] else 'NOT met'})",
        flush=True,
    )
    shutil.rmtree(work, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--skip-1m", action="store_true", help="only the sample pairs")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    sample = run_sample(args.pairs)
    results: dict = {"as_of_ms": AS_OF_MS, "load_1m_at_start": sample["load_1m_at_start"]}
    results.update(sample=sample["pairs"], sample_summary=sample["summary"])
    if not args.skip_1m:
        results["1m"] = pairs(ensure_stores("1m"), 1, _work(), "1m")
        shutil.rmtree(_work(), ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
