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
4. **bare**: a bare Spark start (``bench.bare_spark``);
5. **peer**: the DuckDB peer (``bench.peer_process``) on the grown stores: its export into
   the work directory (made anew in every repeat) and its round over the whole export.

Before each job and the peer, the pages of the stores and output roots are dropped from the
page cache (``bench.measure.evict_from_page_cache``), so that a run's disk reads are what it
reads of them, not an accident of what an earlier run left cached. Each figure is printed
with the machine's load average (1 min) just before it, then each of the scheduled-run
targets (docs/benchmarks.md, "Targets") with its figure (``targets``). ``--as-of latest``
for every job (the earlier stores end before the bench stores' fixed end); the peer rounds
at that fixed end.

``python -m bench.schedule [--size 1m] [--minutes 5] [--repeat 1] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.job import job_env
from bench.measure import evict_from_page_cache, run_measured
from bench.run import run_peer
from bench.small import bare_spark
from bench.stores import REPO, SIZES, bench_root, ensure_stores, read_summary, topic_bytes
from connectors.mirror import COMMITS, DISCARDS, MIRROR_KINDS, RECORDS
from connectors.rocketmq.probe import entry_at, record_head
from schemas.messages import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC
from simulator.growth import copy_prefix, record_ends

# A mirror's line: the rows decoded into it, of which kind, in how many seconds.
_MIRRORED = re.compile(
    r"mirror: (\d+) new (half/op|discard|committed) (?:records|messages) decoded into .* in"
    r" ([\d.]+) s"
)
# The topics whose records the mirror holds (``mirror_records``, ``mirror_discards``).
MIRRORED_TOPICS = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC)


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
    """One measured job process, the stores and its output root not in the page cache; its
    figures and the rows it says it decoded into the mirror."""
    command = [sys.executable, "-m", "jobs.reconcile"]
    for broker, path in stores.items():
        command += ["--store", f"{broker}={path}"]
    command += ["--output", str(output), "--as-of", "latest", *flags]
    evict_from_page_cache([*stores.values(), output])
    load = round(os.getloadavg()[0], 2)
    env = job_env(work)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    measured = run_measured(command, env=env, cwd=REPO)
    if measured.returncode != 0:
        raise RuntimeError(
            f"exit {measured.returncode}: {' '.join(command)}\n{measured.stderr[-3000:]}"
        )
    mirrored = {kind: int(n) for n, kind, _ in _MIRRORED.findall(measured.stderr)}
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
    figures["mirror_bytes"] = {
        kind.table: _tree_bytes(output / kind.table) for kind in MIRROR_KINDS
    }
    figures["store_bytes"] = sum(topic_bytes(path, MIRRORED_TOPICS) for path in stores.values())
    figures["whole"] = _job(stores, work / "output-whole", work)
    figures["bare"] = bare_spark(work)
    evict_from_page_cache(stores.values())
    figures["peer"] = {"load_1m": round(os.getloadavg()[0], 2)}
    figures["peer"] |= run_peer(size, stores, None, work, cache=work / "peer")
    return figures


def _tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (its Delta log included)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


@dataclass(frozen=True)
class Target:
    """One of the scheduled-run targets (docs/benchmarks.md) against a repeat's figure: ``value`` at most (or, with
    ``at_least``, at least) ``limit``, set for the runs of ``size`` (None: any size); ``met``
    is None where the figure is missing or the target is set for another size."""

    name: str
    value: float | None
    limit: float
    size: str | None
    at_least: bool = False
    unit: str = "x"

    def met(self, size: str) -> bool | None:
        if self.value is None or (self.size is not None and self.size != size):
            return None
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def line(self, size: str) -> str:
        shown = "missing" if self.value is None else f"{self.value:,.2f}{self.unit}"
        sign = ">=" if self.at_least else "<="
        verdict = {True: "met", False: "MISSED", None: "not judged here"}[self.met(size)]
        where = f" (set at {self.size})" if self.size is not None else ""
        return f"  {self.name}: {shown}, target {sign} {self.limit:,g}{self.unit}{where}: {verdict}"


def decode_rate(run: dict) -> float | None:
    """Half/op records a run decoded into the mirror per second of its extension (the
    mirror's marks checked, the plan, the decode and its commit), as its line says. None
    without a decode."""
    for line in run["progress"]:
        found = _MIRRORED.search(line)
        if found and found[2] == "half/op" and int(found[1]) and float(found[3]):
            return int(found[1]) / float(found[3])
    return None


def targets(figures: dict) -> list[Target]:
    """The scheduled-run targets, each with this repeat's figure."""
    first, scheduled = figures["first"]["wall_s"], figures["scheduled"]["wall_s"]
    bare, peer = figures["bare"]["wall_s"], figures.get("peer", {})
    export, peer_round = peer.get("export_wall_s"), peer.get("wall_s")
    peer_total = export + peer_round if export and peer_round else None
    appended = figures["appended_bytes"]
    return [
        Target("first run / (peer export + round)", _over(first, peer_total), 1.5, "16m"),
        Target(
            "first run net of bare Spark / (peer export + round)",
            _over(first - bare, peer_total),
            4.0,
            "1m",
        ),
        Target("scheduled run / peer round", _over(scheduled, peer_round), 0.25, "16m"),
        Target("scheduled run / bare Spark", _over(scheduled, bare), 2.0, "16m"),
        Target(
            "scheduled run's disk reads / bytes appended",
            _over(figures["scheduled"]["disk_read_bytes"], appended),
            2.0,
            "16m",
        ),
        Target(
            "decode into the mirror, first run",
            decode_rate(figures["first"]),
            600_000,
            None,
            at_least=True,
            unit=" records/s",
        ),
        Target(
            "peak PSS of the scheduled run",
            figures["scheduled"]["peak_pss_bytes"] / 2**30,
            6.0,
            "16m",
            unit=" GiB",
        ),
    ]


def _over(value: float, base: float | None) -> float | None:
    return value / base if base else None


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
    peer = figures["peer"]
    if "error" in peer:
        print(f"  peer      failed: {peer['error']}")
    else:
        print(
            f"  peer      export {peer['export_wall_s']:.1f} s, round {peer['wall_s']:.1f} s"
            f"  load {peer['load_1m']}"
        )
    print(
        f"  appended {figures['appended_bytes'] / 2**20:.1f} MiB of commit log; the"
        f" scheduled run read {_ratio(figures['scheduled']['disk_read_bytes'], figures['appended_bytes'])}"
        " of that"
    )
    mirror = figures["mirror_bytes"]
    held = mirror[RECORDS.table] + mirror[DISCARDS.table]
    print(
        f"  mirror {held / 2**20:.1f} MiB of half/op/discard rows against"
        f" {figures['store_bytes'] / 2**20:.1f} MiB of those records in the commit logs"
        f" ({_ratio(held, figures['store_bytes'])}); committed messages"
        f" {mirror[COMMITS.table] / 2**20:.1f} MiB more"
    )
    print("targets (docs/benchmarks.md):")
    for target in targets(figures):
        print(target.line(figures["size"]))


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
