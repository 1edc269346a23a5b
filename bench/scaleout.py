"""Scale-out check: the job on the 1m stores with ``--master local[1]`` and ``local[2]``;
the outputs must be equal and the second should be faster.

``python -m bench.scaleout`` runs it, stores the figures under ``"scaleout"`` in the
benchmark JSON and renders the report again; ``python -m bench.run`` runs it too, unless
``--skip-scaleout``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa

from bench.job import run_job
from bench.stores import bench_root, ensure_stores
from connectors.delta_read import arrow_dataset

TABLES = ("pending", "check_requests", "discards", "consume_offsets", "run_summary", "bad_records")
RUN_TIME_COLUMNS = ("written_at_ms", "duration_ms")  # differ between any two runs
MASTERS = ("local[1]", "local[2]")


def read_table(path: Path) -> pa.Table:
    dataset = arrow_dataset(str(path))
    if dataset is None:
        raise SystemExit(f"error: {path} is not a Delta table")
    return dataset.to_table()


def _sorted_rows(table: pa.Table) -> list[str]:
    # Rows as canonical JSON strings: sortable whatever the column types (lists, maps).
    return sorted(json.dumps(row, sort_keys=True, default=str) for row in table.to_pylist())


def compare_tables(left: Path, right: Path) -> list[str]:
    """Differences between two output tables, ignoring run-time columns and row order."""
    a, b = read_table(left), read_table(right)
    a = a.drop_columns([c for c in RUN_TIME_COLUMNS if c in a.column_names])
    b = b.drop_columns([c for c in RUN_TIME_COLUMNS if c in b.column_names])
    if a.schema != b.schema:
        return [f"{left.name}: schemas differ: {a.schema} vs {b.schema}"]
    rows_a, rows_b = _sorted_rows(a), _sorted_rows(b)
    if rows_a == rows_b:
        return []
    only_a = len(set(rows_a) - set(rows_b))
    only_b = len(set(rows_b) - set(rows_a))
    return [
        f"{left.name}: {len(rows_a)} vs {len(rows_b)} rows, {only_a} only left, {only_b} only right"
    ]


def compare_outputs(left: Path, right: Path) -> list[str]:
    """Differences between two job outputs: the six tables and the offset fragments."""
    differences = []
    for table in TABLES:
        differences += compare_tables(left / table, right / table)
    fragments_a = sorted(
        p.relative_to(left) for p in (left / "offset_fragments").rglob("*") if p.is_file()
    )
    fragments_b = sorted(
        p.relative_to(right) for p in (right / "offset_fragments").rglob("*") if p.is_file()
    )
    if fragments_a != fragments_b:
        differences.append(f"offset fragments differ: {fragments_a} vs {fragments_b}")
    else:
        differences += [
            f"offset fragment {p} differs"
            for p in fragments_a
            if (left / p).read_bytes() != (right / p).read_bytes()
        ]
    return differences


def run_scaleout(size: str = "1m", masters: tuple[str, ...] = MASTERS, keep: bool = False) -> dict:
    """Run the job once per master on the ``size`` stores; times, speedup, equality."""
    stores = ensure_stores(size)
    work = bench_root() / "work" / "scaleout"
    runs = {}
    for master in masters:
        print(f"bench: scaleout {size} --master {master}", file=sys.stderr, flush=True)
        runs[master] = run_job(stores, work / master.replace("[", "-").replace("]", ""), master)
    outputs = [Path(run["output"]) for run in runs.values()]
    differences = compare_outputs(outputs[0], outputs[-1])
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    first, last = runs[masters[0]], runs[masters[-1]]
    return {
        "size": size,
        "runs": runs,
        "speedup": first["wall_s"] / last["wall_s"],
        "equal": not differences,
        "differences": differences,
    }


def main(argv: list[str] | None = None) -> int:
    from bench.report import load_results, render_all, save_results

    parser = argparse.ArgumentParser(
        prog="python -m bench.scaleout", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size", default="1m")
    parser.add_argument("--json", type=Path, default=Path("docs/benchmarks.json"))
    parser.add_argument("--plot", type=Path, default=Path("docs/benchmarks.png"))
    parser.add_argument("--markdown", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--keep", action="store_true", help="keep the two outputs")
    args = parser.parse_args(argv)
    results = load_results(args.json)
    results["scaleout"] = run_scaleout(args.size, keep=args.keep)
    save_results(results, args.json)
    render_all(results, args.plot, args.markdown)
    print(json.dumps({k: v for k, v in results["scaleout"].items() if k != "runs"}, indent=1))
    return 0 if results["scaleout"]["equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
