"""Run the DuckDB peer (``bench.duckdb_peer``) in its own process and print its figures as
JSON: ``python -m bench.peer_process --store broker-a=DIR ... --cache DIR --as-of MS
--output JOB_OUTPUT --result FILE``.

A process of its own so that its memory and CPU are its own (not the harness's), and so that
a crash in DuckDB fails one measurement instead of the whole benchmark. The figures of the
query are taken around ``run_peer`` only; ``prepare`` (the Parquet export, cached after the
first call) and ``compare`` are timed apart.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from pathlib import Path

import psutil


class _RssPeak(threading.Thread):
    """Peak RSS of this process while running (DuckDB's threads are inside it)."""

    def __init__(self, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.interval, self.peak = interval, 0
        self._halt = threading.Event()
        self._me = psutil.Process()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, self._me.memory_info().rss)
            self._halt.wait(self.interval)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        self.peak = max(self.peak, self._me.memory_info().rss)
        return self.peak


def scalars(value: object, depth: int = 0) -> object:
    """The JSON-able part of a result: numbers, strings, and dicts/short lists of them
    (tables and other objects are dropped)."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 4:
        return None
    if isinstance(value, dict):
        kept = {str(k): scalars(v, depth + 1) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None}
    if isinstance(value, list | tuple) and len(value) <= 100:
        kept_items = [scalars(v, depth + 1) for v in value]
        return kept_items if all(v is not None for v in kept_items) else None
    return None


def measure_peer(
    stores: dict[str, Path], cache_dir: Path, as_of_ms: int, threads: int, output: Path | None
) -> dict:
    from bench.duckdb_peer import compare, prepare, run_peer

    started = time.perf_counter()
    info = prepare(stores, cache_dir)
    prepare_s = time.perf_counter() - started

    sampler = _RssPeak()
    rss_before = psutil.Process().memory_info().rss
    sampler.start()
    cpu, started = time.process_time(), time.perf_counter()
    result = run_peer(stores, cache_dir, as_of_ms, threads=threads)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    peak = sampler.stop()

    # The export's own wall time: this call's when it exported, else the cached manifests'
    # (the stores are exported in parallel, so the longest one).
    stores_info = info.get("stores", {}) if isinstance(info, dict) else {}
    cached = [s.get("export_seconds") or 0 for s in stores_info.values()]
    export_wall = info.get("seconds") if not info.get("reused") else max(cached, default=None)

    figures = {
        "export_wall_s": export_wall,
        "sql_s": result.get("seconds") if isinstance(result, dict) else None,
        "prepare": scalars(info),
        "prepare_call_s": prepare_s,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_bytes": peak,
        "rss_before_bytes": rss_before,
        "threads": threads,
        "result": scalars({k: v for k, v in result.items() if k != "export"}),
    }
    if output is not None:
        started = time.perf_counter()
        differences = compare(result, output)
        figures.update(
            compare_s=time.perf_counter() - started,
            equal=not differences,
            differences=[str(d) for d in differences[:50]],
            n_differences=len(differences),
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_process")
    parser.add_argument("--store", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--cache", required=True, type=Path)
    parser.add_argument("--as-of", dest="as_of", required=True, type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, help="the job's output to compare with")
    parser.add_argument("--result", required=True, type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    stores = dict(arg.split("=", 1) for arg in args.store)
    figures = measure_peer(
        {k: Path(v) for k, v in stores.items()}, args.cache, args.as_of, args.threads, args.output
    )
    args.result.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
