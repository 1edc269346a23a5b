"""Run the benchmark (the sample pairs, then per size the job, bare Spark, the raw read
floor and the DuckDB peer; then the scale-out) and write the JSON, the plot and
docs/benchmarks.md.

``python -m bench.run [--sizes 1m,4m,16m] [--repeat 3] [--pairs 3] [--skip-sample]
[--skip-connect] [--skip-peer] [--skip-scaleout] [--fresh] [--json docs/benchmarks.json]
[--plot docs/benchmarks.png] [--markdown docs/benchmarks.md]``

First the ``make run`` sample store in interleaved pairs of the job and the bare-Spark
process, each pair also timing the job through a warm Spark Connect server (``bench.small``:
the small-run ratios and the Spark jobs of the whole run). Then per size, on
the same stores, each repeat runs the contenders one after the other (so that a noisy spell
on the shared machine hits one repeat of each rather than every repeat of one): the job end
to end (with its phases from the event log), the bare-Spark process (the job net of Spark's
start is the difference), the raw read floor, and the DuckDB peer (compared with that
repeat's job output). A repeat whose job fails is recorded with its error and the bench goes
on: "every repeat completes" is one of the targets. The JSON is written after every repeat
and keeps the parts not run this time, so sizes can be run separately (``--fresh`` starts
over).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psutil

from bench.job import AS_OF_MS, MASTER, JobFailed, event_log_args, job_command, run_job
from bench.rawread import measure_raw_read
from bench.report import load_results, render_all, save_results
from bench.small import bare_spark, run_sample
from bench.stores import (
    BROKERS,
    REPO,
    SIZES,
    bench_root,
    count_records,
    ensure_stores,
    read_summary,
    simulate_command,
)

PEER_THREADS = 2


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


_OUTPUTS = (":!docs/benchmarks.md", ":!docs/benchmarks.json", ":!docs/benchmarks.png")


def git_commit() -> str:
    """HEAD, with ``-dirty`` when tracked files are modified (the figures are of the work tree)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    # The bench's own outputs change as it runs: they do not make the measured code dirty.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *_OUTPUTS)
    return head + ("-dirty" if changed else "")


def _java_version() -> str:
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME") else "java"
    try:
        done = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (done.stderr or done.stdout).splitlines()
    return lines[0] if lines else "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict:
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "java": _java_version(),
        **{
            name: _version(name)
            for name in ("pyspark", "deltalake", "pyarrow", "numpy", "duckdb", "psutil")
        },
        "git_commit": git_commit(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def commands(python: str) -> dict[str, str]:
    """How each contender is run (the exact job and simulator commands are per size)."""
    return {
        "job": f"PYSPARK_SUBMIT_ARGS='{event_log_args(Path('<events dir>'))}' {python} -m jobs.reconcile"
        f" --store broker-a=<dir> --store broker-b=<dir> --output <tmp> --as-of {AS_OF_MS} --master {MASTER}",
        "raw read": "bench.rawread.measure_raw_read(stores, passes=1, processes=2), after a warm-up pass",
        "DuckDB peer": f"{python} -m bench.peer_process --store broker-a=<dir> --store broker-b=<dir>"
        f" --cache $RMQ_BENCH_DIR/peer/<size> --as-of {AS_OF_MS} --threads {PEER_THREADS}"
        " --output <job output> --result <file>",
        "bare Spark": f"{python} -m bench.bare_spark (session as the job builds it, one trivial"
        " Spark job)",
        "scale-out": f"{python} -m bench.scaleout (the job on 1m with --master local[1], then local[2])",
    }


def size_commands(size: str, stores: dict[str, Path]) -> dict[str, str]:
    return {
        "simulate": "\n".join(" ".join(simulate_command(size, broker)) for broker in BROKERS),
        "job": " ".join(job_command(stores, bench_root() / "work" / size / "job" / "output")),
    }


def describe_stores(size: str, stores: dict[str, Path]) -> dict:
    described = {}
    for broker, path in stores.items():
        summary = read_summary(size, broker)
        described[broker] = {
            "path": str(path),
            "records_by_topic": count_records(path),
            "simulator_records_by_topic": {
                t: n
                for t, n in summary.get("records_by_topic", {}).items()
                if t.startswith("RMQ_SYS_TRANS")
            },
            "store_bytes": summary.get("store_bytes"),
        }
    return described


def run_peer(
    size: str,
    stores: dict[str, Path],
    job_output: Path | None,
    work: Path,
    cache: Path | None = None,
) -> dict:
    """One DuckDB peer measurement in its own process (see bench.peer_process), its tables
    compared with ``job_output``'s (None: not compared). ``cache``: where its exports are
    kept (default: the size's, reused while a store is unchanged)."""
    result = work / "peer.json"
    result.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "bench.peer_process",
        "--cache",
        str(cache if cache is not None else bench_root() / "peer" / size),
        "--as-of",
        str(AS_OF_MS),
        "--threads",
        str(PEER_THREADS),
        "--result",
        str(result),
    ]
    if job_output is not None:
        command += ["--output", str(job_output)]
    for broker, path in stores.items():
        command += ["--store", f"{broker}={path}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0 or not result.exists():
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-2000:]}"}
    return json.loads(result.read_text())


def peer_available() -> bool:
    return importlib.util.find_spec("bench.duckdb_peer") is not None


def run_size(size: str, repeat: int, with_peer: bool, save: Callable[[dict], None]) -> dict:
    """All repeats of one size; ``save(entry)`` is called after each repeat."""
    stores = ensure_stores(size)
    described = describe_stores(size, stores)
    records = sum(sum(b["records_by_topic"].values()) for b in described.values())
    entry = {
        "transactions": SIZES[size],
        "stores": described,
        "records": records,
        "records_reported": [],
        "records_match": None,
        "commands": size_commands(size, stores),
        "git_commit": git_commit(),
        "started_at": _now(),
        "repeats": [],
    }
    work = bench_root() / "work" / size
    for index in range(repeat):
        figures = run_repeat(size, stores, work, f"{index + 1}/{repeat}", with_peer)
        entry["repeats"].append(figures)
        if figures.get("job"):
            entry["records_reported"].append(figures["job"]["records_reported"])
        entry["raw_read_plan"] = figures.pop("raw_read_plan")
        entry["records_match"] = all(n == records for n in entry["records_reported"])
        save(entry)
    shutil.rmtree(work, ignore_errors=True)
    return entry


def run_repeat(size: str, stores: dict[str, Path], work: Path, name: str, with_peer: bool) -> dict:
    """One repeat of one size: job, bare Spark, raw read, peer (the peer only after a job
    that succeeded: it is compared with the job's output)."""

    def step(what: str) -> None:
        print(f"bench: {size} repeat {name}: {what}", file=sys.stderr, flush=True)

    figures: dict = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    step("job")
    try:
        figures["job"] = run_job(stores, work / "job")
    except JobFailed as failed:
        figures["job_failed"] = str(failed)[-3000:]
        print(f"bench: {size} repeat {name}: the job FAILED: {failed}", file=sys.stderr)
    step("bare Spark")
    figures["bare"] = bare_spark(work / "bare")
    step("raw read")
    raw = measure_raw_read(stores, passes=1)
    figures["raw_read_plan"] = {k: v for k, v in raw.items() if k != "runs"}
    figures["raw_read"] = raw["runs"][0]
    if with_peer and figures.get("job"):
        step("DuckDB peer")
        figures["peer"] = run_peer(size, stores, Path(figures["job"]["output"]), work)
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--sizes", default="1m,4m,16m", help="comma-separated, of " + ",".join(SIZES)
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3, help="job/bare-Spark pairs on the sample")
    parser.add_argument("--skip-sample", action="store_true", help="do not run the sample pairs")
    parser.add_argument(
        "--skip-connect", action="store_true", help="no warm Spark Connect case in the pairs"
    )
    parser.add_argument("--skip-peer", action="store_true", help="do not run the DuckDB peer")
    parser.add_argument("--skip-scaleout", action="store_true", help="do not run bench.scaleout")
    parser.add_argument("--fresh", action="store_true", help="drop the sizes already in the JSON")
    parser.add_argument("--json", type=Path, default=Path("docs/benchmarks.json"))
    parser.add_argument("--plot", type=Path, default=Path("docs/benchmarks.png"))
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; known: {', '.join(SIZES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = {} if args.fresh else load_results(args.json)
    results.update(
        schema=1,
        machine=machine_info(),
        commands=commands(sys.executable),
        settings={
            "as_of_ms": AS_OF_MS,
            "master": MASTER,
            "peer_threads": PEER_THREADS,
            "bench_dir": str(bench_root()),
        },
    )
    results.setdefault("sizes", {})
    with_peer = not args.skip_peer
    if with_peer and not peer_available():
        print(
            "bench: warning: bench/duckdb_peer.py is missing: the DuckDB peer is skipped",
            file=sys.stderr,
        )
        with_peer = False

    def save(size: str, entry: dict) -> None:
        results["sizes"][size] = entry
        results["generated_at"] = _now()
        save_results(results, args.json)
        render_all(results, args.plot, args.markdown)

    started = time.perf_counter()
    if not args.skip_sample:
        results["sample"] = run_sample(args.pairs, with_connect=not args.skip_connect)
        results["generated_at"] = _now()
        save_results(results, args.json)
        render_all(results, args.plot, args.markdown)
    for size in args.sizes:
        run_size(size, args.repeat, with_peer, lambda entry, size=size: save(size, entry))
    if not args.skip_scaleout:
        from bench.scaleout import run_scaleout

        results["scaleout"] = run_scaleout("1m")
        results["generated_at"] = _now()
        save_results(results, args.json)
        render_all(results, args.plot, args.markdown)
    print(
        f"bench: done in {time.perf_counter() - started:.0f} s: {args.json}, {args.markdown}, {args.plot}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
