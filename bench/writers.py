"""The write phase through each writer (``make bench-writers``): the job on the benchmark's
stores of one size, once per ``--writer``, measured as ``make bench`` measures the job.

The write phase is read from the job's own progress lines: from "resolved and classified"
(the round is cached) to "wrote consume_offsets" (the last commit). It holds the Spark jobs
that compute and write each table and the commits, so it compares the writers as a user
meets them. delta-spark's session start (Ivy resolution of Delta's jars) is outside it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys

from bench.job import job_command, job_env
from bench.measure import run_measured
from bench.stores import REPO, bench_root, ensure_stores

_PROGRESS = re.compile(r"^\[\s*([\d.]+)s\] (.*)$")
WRITERS = ("delta-rs", "delta-spark")


def write_phase_seconds(stderr: str) -> float:
    """Seconds from the end of the round to the last commit, from the progress lines."""
    times = {}
    for line in stderr.splitlines():
        found = _PROGRESS.match(line)
        if found:
            times.setdefault(found.group(2).split(":")[0], float(found.group(1)))
    start = next(t for message, t in times.items() if message.startswith("resolved and classified"))
    return times["wrote consume_offsets"] - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.writers", description=__doc__)
    parser.add_argument("--size", default="1m", help="benchmark store size (default 1m)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    stores = ensure_stores(args.size)
    print("| writer | write phase (s) | whole job wall (s) | load average before |")
    print("|---|---|---|---|")
    for writer in WRITERS:
        for _ in range(args.repeat):
            work = bench_root() / "writers" / writer
            shutil.rmtree(work, ignore_errors=True)
            (work / "events").mkdir(parents=True)
            load = [round(x, 1) for x in os.getloadavg()]
            command = job_command(stores, work / "output") + ["--writer", writer]
            measured = run_measured(command, env=job_env(work / "events"), cwd=REPO)
            (work / "stderr.log").write_text(measured.stderr)
            if measured.returncode != 0:
                print(measured.stderr[-3000:], file=sys.stderr)
                return 1
            seconds = write_phase_seconds(measured.stderr)
            print(f"| {writer} | {seconds:.1f} | {measured.wall_s:.1f} | {load} |", flush=True)
            shutil.rmtree(work / "output", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
