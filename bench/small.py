"""A quick benchmark (``make bench-small``): the job against bare Spark on the ``make run``
sample store, in interleaved pairs, then once on the 1m stores.

Each pair runs the job process (``python -m jobs.reconcile``, event log on), the floor
process (``python -m bench.floor``: the job's session, its read of the stores with one
count, and its writer committing the 8 tables with no rows; no round) and the bare-Spark
process (``python -m bench.bare_spark``) one after the other, alternating the order from
pair to pair, so a noisy spell on the shared machine hits all of a pair: each figure is
the median of the per-pair ratios to the bare Spark of the pair. Every figure is printed
with the machine's load average (1 min) just before it. From the job's event log: every
Spark job of the run (each SparkListenerJobStart, labelled by phase or not), with the
per-phase split.

With the Spark Connect launcher of the tests (``tests/connect/server.py``), a server is
started once on loopback before the pairs and warmed by one run of the job; each pair then
also times the job and the floor through it (``--remote``: the client process, the server
already up), and their ratios are to the bare Spark of the same pair. The server is
stopped at the end, also on failure; a server that cannot start leaves the Connect case
"not measured", with why.

``python -m bench.small [--pairs 3] [--skip-1m] [--skip-connect] [--json PATH]``
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.job import AS_OF_MS, job_env, run_job
from bench.measure import Measurement, run_measured
from bench.report import (
    RUN_JOBS_TARGET,
    TARGET_CONNECT_RATIO,
    TARGET_SMALL_RATIO,
    jobs_per_phase,
    run_jobs,
    run_jobs_met,
)
from bench.stores import REPO, bench_root, ensure_stores

SAMPLE_TRANSACTIONS = 3000  # the Makefile's SAMPLE_TRANSACTIONS
SAMPLE_SEED = 7  # the Makefile's seed
CONNECT_LAUNCHER = "tests.connect.server"
# The contenders of a pair in the order of an odd pair (an even pair runs them reversed);
# the Connect ones only with a server.
CONTENDERS = ("job", "floor", "bare")
CONNECT_CONTENDERS = ("connect_floor", "connect")


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
    figures: dict = {"load_1m": load()}
    ran = run_job(stores, work)
    phases = ran["phases"]
    figures.update(
        wall_s=ran["wall_s"],
        cpu_s=ran["cpu_s"],
        phases={name: {"jobs": p["jobs"], "wall_s": p["wall_s"]} for name, p in phases.items()},
    )
    figures["run_jobs"] = run_jobs(figures)
    return figures


def connect_command(store: Path, output: Path, url: str) -> list[str]:
    """The job as a client of the Connect server at ``url``: no ``--master`` (the server's)."""
    command = [sys.executable, "-m", "jobs.reconcile", "--remote", url]
    command += ["--store", f"broker-a={store}", "--output", str(output)]
    return command + ["--as-of", str(AS_OF_MS)]


def _measured_run(command: list[str], work: Path, what: str) -> tuple[dict, Measurement]:
    """``command`` (writing into ``work/output``, emptied first) measured without an event
    log or ``SPARK_REMOTE`` (a Connect client gets its URL as ``--remote``): the load before
    it, and what ``run_measured`` gives; a failure raises, naming ``what``."""
    shutil.rmtree(work / "output", ignore_errors=True)
    env = job_env(work)
    for name in ("PYSPARK_SUBMIT_ARGS", "SPARK_REMOTE"):
        env.pop(name, None)
    figures: dict = {"load_1m": load()}
    measured = run_measured(command, env=env, cwd=REPO)
    if measured.returncode != 0:
        raise RuntimeError(f"{what} exit {measured.returncode}: {measured.stderr[-2000:]}")
    figures.update(wall_s=measured.wall_s, cpu_s=measured.cpu_s)
    return figures, measured


def connect_job(store: Path, work: Path, url: str) -> dict:
    """One run of the job through the warm server into a fresh output root; wall and CPU
    are the client process's (the server's own work is in neither)."""
    command = connect_command(store, work / "output", url)
    return _measured_run(command, work, f"the job via {url}")[0]


def floor_command(stores: dict[str, Path], output: Path, url: str | None = None) -> list[str]:
    """The floor process (``bench.floor``): local like the job, or a client of ``url``."""
    command = [sys.executable, "-m", "bench.floor"]
    for broker, path in stores.items():
        command += ["--store", f"{broker}={path}"]
    command += ["--output", str(output)]
    return command + (["--remote", url] if url else [])


def floor(stores: dict[str, Path], work: Path, url: str | None = None) -> dict:
    """One floor process into a fresh output root, measured like bare Spark (no event log);
    through ``url``, the client process's wall and CPU, like ``connect_job``."""
    where = f" via {url}" if url else ""
    command = floor_command(stores, work / "output", url)
    figures, measured = _measured_run(command, work, f"bench.floor{where}")
    figures["parts"] = measured.stdout.strip()[-300:]
    return figures


def connect_launcher_available() -> bool:
    return importlib.util.find_spec(CONNECT_LAUNCHER) is not None


def pairs(
    stores: dict[str, Path], count: int, work: Path, label: str, connect_url: str | None = None
) -> list[dict]:
    """``count`` pairs, alternating the order of the contenders (``CONTENDERS``); with
    ``connect_url`` each pair also runs the job and the floor through that server (last or
    first, opposite to the cold job), so the bare Spark sits beside all of them."""
    results = []
    for index in range(count):
        order = list(CONTENDERS) + (list(CONNECT_CONTENDERS) if connect_url else [])
        if index % 2:
            order.reverse()
        pair = {name: contender(name, stores, work, connect_url) for name in order}
        results.append(with_ratios(pair))
        print(line(f"{label} pair {index + 1}", pair), flush=True)
    return results


def contender(name: str, stores: dict[str, Path], work: Path, connect_url: str | None) -> dict:
    """One process of a pair (a name of ``CONTENDERS`` or ``CONNECT_CONTENDERS``), measured."""
    if name == "job":
        return job(stores, work / "job")
    if name == "floor":
        return floor(stores, work / "floor")
    if name == "bare":
        return bare_spark(work / "bare")
    assert connect_url is not None
    if name == "connect_floor":
        return floor(stores, work / "connect-floor", connect_url)
    return connect_job(stores["broker-a"], work / "connect", connect_url)


def with_ratios(pair: dict) -> dict:
    """``pair`` with each contender's wall (and the job's CPU) over its bare Spark's."""
    bare = pair["bare"]
    pair["ratio_wall"] = pair["job"]["wall_s"] / bare["wall_s"]
    pair["ratio_cpu"] = pair["job"]["cpu_s"] / bare["cpu_s"]
    for name in ("floor", "connect", "connect_floor"):
        if name in pair:
            pair[f"ratio_{name}_wall"] = pair[name]["wall_s"] / bare["wall_s"]
    return pair


def line(name: str, pair: dict) -> str:
    j, b = pair["job"], pair["bare"]
    text = (
        f"{name:16s} job {j['wall_s']:6.1f} s wall {j['cpu_s']:6.1f} s CPU (load {j['load_1m']:5.2f})"
        f" | bare Spark {b['wall_s']:5.1f} s wall {b['cpu_s']:5.1f} s CPU (load {b['load_1m']:5.2f})"
        f" | ratio {pair['ratio_wall']:.2f}x wall {pair['ratio_cpu']:.2f}x CPU"
    )
    if "connect" in pair:
        c = pair["connect"]
        text += (
            f" | warm Connect {c['wall_s']:5.1f} s wall (load {c['load_1m']:5.2f})"
            f" {pair['ratio_connect_wall']:.2f}x bare"
        )
    for name, title in (("floor", "floor"), ("connect_floor", "Connect floor")):
        if name in pair:
            f = pair[name]
            text += (
                f" | {title} {f['wall_s']:5.1f} s ({pair[f'ratio_{name}_wall']:.2f}x bare)"
                f" (load {f['load_1m']:5.2f})"
            )
    return text + f" | Spark jobs: {run_jobs(j)} ({jobs_per_phase(j)})"


def _median_of(results: list[dict], key: str) -> float | None:
    values = [p[key] for p in results if key in p]
    return statistics.median(values) if values else None


def summary(results: list[dict]) -> dict:
    return {
        "median_ratio_wall": statistics.median(p["ratio_wall"] for p in results),
        "median_ratio_cpu": statistics.median(p["ratio_cpu"] for p in results),
        "run_jobs": [run_jobs(p["job"]) for p in results],
        "run_jobs_target": RUN_JOBS_TARGET,
        "run_jobs_met": run_jobs_met(results),
        "median_ratio_connect_wall": _median_of(results, "ratio_connect_wall"),
        "connect_target": TARGET_CONNECT_RATIO,
        "median_ratio_floor_wall": _median_of(results, "ratio_floor_wall"),
        "median_ratio_connect_floor_wall": _median_of(results, "ratio_connect_floor_wall"),
    }


def summary_line(s: dict, connect_error: str | None = None) -> str:
    def verdict(ok: bool | None) -> str:
        return "met" if ok else "NOT met"

    text = (
        f"sample: median ratio {s['median_ratio_wall']:.2f}x wall"
        f" (target <= {TARGET_SMALL_RATIO}x: {verdict(s['median_ratio_wall'] <= TARGET_SMALL_RATIO)}),"
        f" {s['median_ratio_cpu']:.2f}x CPU; Spark jobs of the whole run: {s['run_jobs']}"
        f" (target <= {RUN_JOBS_TARGET}: {verdict(s['run_jobs_met'])})"
    )
    connect = s["median_ratio_connect_wall"]
    if connect is None:
        text += f"; warm Connect: not measured ({connect_error or 'no Connect case'})"
    else:
        text += (
            f"; warm Connect: median {connect:.2f}x the bare Spark of its pair"
            f" (target <= {TARGET_CONNECT_RATIO}x: {verdict(connect <= TARGET_CONNECT_RATIO)})"
        )
    return text + floor_text(s)


def floor_text(s: dict) -> str:
    """The floor's medians for ``summary_line``; nothing where the floor did not run."""
    cold, connect = s.get("median_ratio_floor_wall"), s.get("median_ratio_connect_floor_wall")
    if cold is None and connect is None:
        return ""
    parts = [] if cold is None else [f"{cold:.2f}x bare cold"]
    parts += [] if connect is None else [f"{connect:.2f}x via warm Connect"]
    return "; floor: median " + ", ".join(parts)


def _work() -> Path:
    return bench_root() / "work" / "small"


@contextlib.contextmanager
def warm_connect_server(store: Path, work: Path) -> Iterator[str]:
    """A Connect server on loopback (the tests' launcher), warmed by one run of the job on
    ``store``: its URL, while the block runs; stopped on leaving, also on failure."""
    from tests.connect.server import ConnectServer  # the launcher of make test-connect

    with ConnectServer(work / "connect-server") as server:
        connect_job(store, work / "connect-warm-up", server.url)
        yield server.url


def run_sample(count: int, with_connect: bool = True) -> dict:
    """The sample pairs with their summary, printed as they run (``make bench`` runs them
    too, before the sizes); with ``with_connect``, the warm Connect case in every pair."""
    work = _work()
    store = sample_store()
    results: dict = {"load_1m_at_start": load()}
    error = None
    if with_connect and not connect_launcher_available():
        error = f"no Connect server launcher ({CONNECT_LAUNCHER})"
    with contextlib.ExitStack() as stack:
        url = None
        if with_connect and error is None:
            try:
                url = stack.enter_context(warm_connect_server(store, work))
            except (RuntimeError, OSError, ImportError) as failed:  # server, warm-up, grpc
                error = f"the Connect server or its warm-up run failed: {failed}"[:2000]
                print(f"bench: {error}", file=sys.stderr, flush=True)
        results["pairs"] = pairs({"broker-a": store}, count, work, "sample", url)
    if error is not None:
        results["connect_error"] = error
    results["summary"] = s = summary(results["pairs"])
    print(summary_line(s, error if with_connect else "--skip-connect"), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--skip-1m", action="store_true", help="only the sample pairs")
    parser.add_argument(
        "--skip-connect", action="store_true", help="no warm Spark Connect case in the pairs"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    sample = run_sample(args.pairs, with_connect=not args.skip_connect)
    results: dict = {"as_of_ms": AS_OF_MS, "load_1m_at_start": sample["load_1m_at_start"]}
    results.update(sample=sample["pairs"], sample_summary=sample["summary"])
    if "connect_error" in sample:
        results["connect_error"] = sample["connect_error"]
    if not args.skip_1m:
        results["1m"] = pairs(ensure_stores("1m"), 1, _work(), "1m")
        shutil.rmtree(_work(), ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
