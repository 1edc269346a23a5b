"""The scheduled-run benchmark (``python -m bench.schedule``): what a run through the
store's mirror costs on a schedule, against a run that reads the stores whole and bare Spark.

Per size, the bench stores (``bench.stores``) are the stores at the end of the timeline.
Each broker's store as it was ``--minutes`` earlier is a prefix of it
(``simulator.growth.copy_prefix``), written into a work directory. Then, one after the other
in one repeat:

1. **first**: the job with ``--mirror`` on the earlier stores into an empty output root
   (it decodes everything into the mirror);
2. the stores grow to their end (``copy_prefix`` again, in place) and **scheduled**: the job
   with ``--mirror`` on the same output root (it decodes what the stores appended);
3. **whole**: the job without the mirror on the grown stores into a fresh output root;
4. **bare**: a bare Spark start (``bench.bare_spark``).

Each figure is printed with the machine's load average (1 min) just before it, and the
bytes the stores appended beside the scheduled run's disk reads. ``--as-of latest`` for
every run (the earlier stores end before the bench stores' fixed end).

``python -m bench.schedule [--size 1m] [--minutes 5] [--repeat 1] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

from bench.job import job_env
from bench.measure import run_measured
from bench.small import bare_spark
from bench.stores import REPO, SIZES, bench_root, ensure_stores, read_summary
from connectors.rocketmq.probe import entry_at, record_head
from schemas.messages import HALF_TOPIC
from simulator.growth import copy_prefix, record_ends

_MIRRORED = re.compile(r"mirror: (\d+) new (half/op|discard|committed) (?:records|messages)")


def cut_before(store: Path, minutes: float) -> int:
    """The commit-log offset just after the last half record stored at least ``minutes``
    before the store's newest half record: where the store ended that much earlier."""
    ends = record_ends(store, HALF_TOPIC)

    def stored_at(index: int) -> int:
        entry = entry_at(store, HALF_TOPIC, 0, index)
        head = record_head(store, entry[0]) if entry is not None else None
        if head is None:
            raise RuntimeError(f"{store}: half record {index} is unreadable")
        return head.store_timestamp_ms

    limit = stored_at(len(ends) - 1) - int(minutes * 60_000)
    low, high = 0, len(ends) - 1  # stored_at(low) <= limit < stored_at(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if stored_at(middle) <= limit else (low, middle)
    return int(ends[low])


def _job(stores: dict[str, Path], output: Path, work: Path, *flags: str) -> dict:
    """One measured job process; its figures and the rows it says it decoded into the mirror."""
    command = [sys.executable, "-m", "jobs.reconcile"]
    for broker, path in stores.items():
        command += ["--store", f"{broker}={path}"]
    command += ["--output", str(output), "--as-of", "latest", *flags]
    load = round(os.getloadavg()[0], 2)
    env = job_env(work)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    measured = run_measured(command, env=env, cwd=REPO)
    if measured.returncode != 0:
        raise RuntimeError(
            f"exit {measured.returncode}: {' '.join(command)}\n{measured.stderr[-3000:]}"
        )
    mirrored = {kind: int(n) for n, kind in _MIRRORED.findall(measured.stderr)}
    return {
        "load_1m": load,
        "command": " ".join(command),
        "wall_s": round(measured.wall_s, 2),
        "cpu_s": round(measured.cpu_s, 2),
        "peak_pss_bytes": measured.peak_pss_bytes,
        "disk_read_bytes": measured.disk_read_bytes,
        "mirrored": mirrored,
        # Where the time goes: each phase's end is on a progress line.
        "progress": [line for line in measured.stderr.splitlines() if line.startswith("[")],
    }


def run_repeat(size: str, full: dict[str, Path], minutes: float, work: Path) -> dict:
    """One repeat of the four contenders (module docstring)."""
    stores = {broker: work / "stores" / broker for broker in full}
    shutil.rmtree(work, ignore_errors=True)
    cuts = {broker: cut_before(path, minutes) for broker, path in full.items()}
    for broker, path in full.items():
        copy_prefix(path, stores[broker], cuts[broker])
    figures: dict = {"size": size, "minutes": minutes}
    output = work / "output"
    figures["first"] = _job(stores, output, work, "--mirror")
    for broker, path in full.items():
        copy_prefix(path, stores[broker], int(record_ends(path, HALF_TOPIC)[-1]))
    figures["appended_bytes"] = sum(
        read_summary(size, broker)["commitlog_bytes"] - cuts[broker] for broker in full
    )
    figures["scheduled"] = _job(stores, output, work, "--mirror")
    figures["whole"] = _job(stores, work / "output-whole", work)
    figures["bare"] = bare_spark(work)
    return figures


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def print_repeat(figures: dict) -> None:
    bare = figures["bare"]["wall_s"]
    print(f"size {figures['size']}, stores grown by {figures['minutes']} min of traffic")
    for name in ("first", "scheduled", "whole"):
        run = figures[name]
        print(
            f"  {name:9s} {run['wall_s']:7.1f} s ({_ratio(run['wall_s'], bare)} bare)"
            f"  cpu {run['cpu_s']:7.1f} s  read {run['disk_read_bytes'] / 2**20:9.1f} MiB"
            f"  peak PSS {run['peak_pss_bytes'] / 2**30:5.2f} GiB  mirrored {run['mirrored']}"
            f"  load {run['load_1m']}"
        )
    print(f"  bare      {bare:7.1f} s  load {figures['bare']['load_1m']}")
    print(
        f"  appended {figures['appended_bytes'] / 2**20:.1f} MiB of commit log; the"
        f" scheduled run read {_ratio(figures['scheduled']['disk_read_bytes'], figures['appended_bytes'])}"
        " of that"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.schedule", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="1m")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write every repeat's figures here")
    args = parser.parse_args(argv)
    full = ensure_stores(args.size)
    repeats = []
    for number in range(args.repeat):
        work = bench_root() / "schedule" / args.size
        figures = run_repeat(args.size, full, args.minutes, work)
        figures["repeat"] = number + 1
        print_repeat(figures)
        repeats.append(figures)
        if args.json is not None:
            args.json.write_text(json.dumps(repeats, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
