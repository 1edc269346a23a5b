"""Compare every Delta table of two output roots, row for row.

``python -m bench.compare_tables ROOT_A ROOT_B [--ignore TABLE.COLUMN ...] [--examples N]``

A table is a folder with a ``_delta_log`` under either root (tables present in only one
root are a difference). Each table is compared as a multiset of rows over every column but
the run's timing (``run_summary.written_at_ms`` and ``duration_ms``: when a run wrote and
how long it took differ between any two runs), so row order and file layout do not matter
but a duplicated row does. A table is first scanned batch by batch into a fingerprint (its
row count and the sum of a 64-bit hash of each row, by DuckDB), so that the mirror's tables
of a large store compare in little memory; only a table whose fingerprints differ is read
whole to show the rows that differ (and to compare values of other types), when it has at
most ``LISTED_ROWS`` rows. One line per table, then exit 0 when every table is the same, 1
when any differs, 2 when a root is missing.

Two runs compare only with the same stores, ``--as-of`` and ``--run-id``: the run id is in
every table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow.dataset as ds

from connectors.delta_read import arrow_dataset

DELTA_LOG = "_delta_log"
# When a run wrote its summary and how long it took: different in any two runs.
RUN_TIMING = ("run_summary.written_at_ms", "run_summary.duration_ms")
EXAMPLES = 3
EXAMPLE_CHARS = 300
# Up to this many rows a table whose fingerprints differ is read whole to list its rows.
LISTED_ROWS = 2_000_000


@dataclass
class Comparison:
    table: str
    same: bool
    line: str


def delta_tables(root: Path) -> dict[str, Path]:
    """Table name (its folder relative to ``root``) -> folder, for every Delta table under
    ``root`` (a table's own folders are not searched further)."""
    found: dict[str, Path] = {}

    def walk(folder: Path) -> None:
        if (folder / DELTA_LOG).is_dir():
            found[folder.relative_to(root).as_posix()] = folder
            return
        for child in sorted(p for p in folder.iterdir() if p.is_dir()):
            walk(child)

    walk(root)
    return found


def _key(row: dict) -> str:
    """A row as one comparable string: nested values (structs, lists, maps) included, column
    order ignored; values JSON cannot hold (instants, decimals, bytes) by their repr."""
    return json.dumps(row, sort_keys=True, default=repr)


def _dataset(path: Path) -> ds.Dataset:
    dataset = arrow_dataset(str(path))
    if dataset is None:
        raise SystemExit(f"error: {path} is not a Delta table")
    return dataset


def fingerprint(dataset: ds.Dataset, columns: list[str]) -> tuple[int, int]:
    """(rows, sum of each row's 64-bit hash) of ``columns`` of a Delta table's ``dataset``:
    DuckDB scans it batch by batch, so the table is never held whole. Equal multisets of
    rows (of equal types) give equal fingerprints."""
    connection = duckdb.connect()
    connection.register("rows", dataset)
    quoted = ", ".join('"' + name.replace('"', '""') + '"' for name in sorted(columns))
    hashed = f"coalesce(sum(hash({quoted})::HUGEINT), 0)" if columns else "0"
    count, total = connection.execute(f"SELECT count(*), {hashed} FROM rows").fetchall()[0]
    connection.close()
    return int(count), int(total)


def read_rows(dataset: ds.Dataset, columns: list[str]) -> Counter[str]:
    """The multiset of rows (``columns``) of a Delta table's ``dataset``, read whole."""
    data = dataset.to_table(columns=columns)
    return Counter(_key(row) for row in data.to_pylist())


def _examples(side: str, rows: Counter[str], count: int) -> list[str]:
    shown = []
    for row in list(rows.elements())[:count]:
        text = row if len(row) <= EXAMPLE_CHARS else row[:EXAMPLE_CHARS] + "..."
        shown.append(f"    only in {side}: {text}")
    return shown


def compare_table(
    name: str, a: Path | None, b: Path | None, ignored: set[str], examples: int = EXAMPLES
) -> Comparison:
    if a is None or b is None:
        return Comparison(name, False, f"{name}: only in {'B' if a is None else 'A'}")
    dataset_a, dataset_b = _dataset(a), _dataset(b)  # each table's log read once
    columns_a = [column for column in dataset_a.schema.names if column not in ignored]
    columns_b = [column for column in dataset_b.schema.names if column not in ignored]
    if set(columns_a) != set(columns_b):
        only_a = sorted(set(columns_a) - set(columns_b))
        only_b = sorted(set(columns_b) - set(columns_a))
        return Comparison(
            name, False, f"{name}: columns differ: only in A {only_a}, only in B {only_b}"
        )
    (total_a, sum_a), (total_b, sum_b) = (
        fingerprint(dataset_a, columns_a),
        fingerprint(dataset_b, columns_a),
    )
    if (total_a, sum_a) == (total_b, sum_b):
        return Comparison(name, True, f"{name}: same ({total_a} rows)")
    if max(total_a, total_b) > LISTED_ROWS:
        return Comparison(
            name,
            False,
            f"{name}: rows differ (A has {total_a}, B {total_b}; too many to list the rows)",
        )
    rows_a, rows_b = read_rows(dataset_a, columns_a), read_rows(dataset_b, columns_a)
    extra_a, extra_b = rows_a - rows_b, rows_b - rows_a
    if not extra_a and not extra_b:  # the same values, of other types
        return Comparison(name, True, f"{name}: same ({total_a} rows)")
    differ = sum(extra_a.values()) + sum(extra_b.values())
    lines = [
        f"{name}: {differ} rows differ ({sum(extra_a.values())} of A's {total_a},"
        f" {sum(extra_b.values())} of B's {total_b})"
    ]
    lines += _examples("A", extra_a, examples) + _examples("B", extra_b, examples)
    return Comparison(name, False, "\n".join(lines))


def compare_roots(
    root_a: Path, root_b: Path, ignore: tuple[str, ...] = RUN_TIMING, examples: int = EXAMPLES
) -> list[Comparison]:
    tables_a, tables_b = delta_tables(root_a), delta_tables(root_b)
    results = []
    for name in sorted(set(tables_a) | set(tables_b)):
        ignored = {c.split(".", 1)[1] for c in ignore if c.split(".", 1)[0] == name}
        results.append(
            compare_table(name, tables_a.get(name), tables_b.get(name), ignored, examples)
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare_tables", description=__doc__.splitlines()[0]
    )
    parser.add_argument("root_a", type=Path, metavar="ROOT_A")
    parser.add_argument("root_b", type=Path, metavar="ROOT_B")
    parser.add_argument(
        "--ignore",
        action="append",
        metavar="TABLE.COLUMN",
        help=f"a column left out of the comparison (default: {', '.join(RUN_TIMING)});"
        " repeatable, replaces the default",
    )
    parser.add_argument("--examples", type=int, default=EXAMPLES, help="rows shown per side")
    args = parser.parse_args(argv)
    for root in (args.root_a, args.root_b):
        if not root.is_dir():
            print(f"error: {root} is not a folder", file=sys.stderr)
            return 2
    ignore = tuple(args.ignore) if args.ignore else RUN_TIMING
    malformed = [c for c in ignore if "." not in c]
    if malformed:
        print(f"error: --ignore takes TABLE.COLUMN, got {malformed[0]!r}", file=sys.stderr)
        return 2
    results = compare_roots(args.root_a, args.root_b, ignore, args.examples)
    for result in results:
        print(result.line)
    differing = [r.table for r in results if not r.same]
    if not results:
        print("no Delta table under either root")
        return 1
    print(
        f"{len(results) - len(differing)} of {len(results)} tables the same"
        + (f"; differ: {', '.join(differing)}" if differing else "")
    )
    return 1 if differing else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Every answer is printed: end the process here. deltalake's scan leaves threads behind
    # that can abort the interpreter's own shutdown (exit 134 after a correct comparison).
    os._exit(code)
