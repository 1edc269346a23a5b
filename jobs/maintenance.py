"""Maintenance of an output root: ``python -m jobs.maintenance vacuum --output OUT``.

A rerun replaces its rows in one Delta commit, and the files of the replaced rows stay on
disk (Delta's time travel reads them). Readers that go through the Delta log never see
them; a glob over the Parquet files does, and counts every rerun's rows again. ``vacuum``
deletes the files no table version newer than the retention needs (default 7 days, the
Delta default); reading through the log stays the only correct way to read the tables
(README, "Reading the tables").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from connectors.errors import InputError

DEFAULT_RETENTION_HOURS = 7 * 24


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit code 2 like the job
        raise InputError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m jobs.maintenance", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    vacuum = commands.add_parser(
        "vacuum", help="delete the files of replaced runs older than the retention"
    )
    vacuum.add_argument("--output", required=True, help="the job's output root")
    vacuum.add_argument(
        "--retention-hours",
        type=int,
        default=DEFAULT_RETENTION_HOURS,
        help=f"keep files a table version of the last N hours needs (default {DEFAULT_RETENTION_HOURS}:"
        " 7 days); time travel to older versions is lost",
    )
    vacuum.add_argument(
        "--dry-run", action="store_true", help="list what would be deleted, delete nothing"
    )
    return parser


def output_tables(output_root: str | Path) -> list[Path]:
    """The Delta tables under an output root (folders with a ``_delta_log``)."""
    root = Path(output_root)
    if not root.is_dir():
        raise InputError(f"{root}: output root not found")
    tables = sorted(p for p in root.iterdir() if (p / "_delta_log").is_dir())
    if not tables:
        raise InputError(f"{root}: no Delta table in this folder (is it the job's --output?)")
    return tables


def vacuum_tables(
    output_root: str | Path, retention_hours: int = DEFAULT_RETENTION_HOURS, dry_run: bool = False
) -> dict[str, list[str]]:
    """Vacuum every output table; returns, per table, the files deleted (or that would be).

    Raises:
        InputError: a negative retention, or no output tables under ``output_root``.
    """
    from deltalake import DeltaTable

    if retention_hours < 0:
        raise InputError(f"--retention-hours must not be negative: {retention_hours}")
    removed: dict[str, list[str]] = {}
    for path in output_tables(output_root):
        # The retention is the operator's choice: delta-rs would refuse one below the
        # table's own (7 days) unless told the check is deliberate.
        removed[path.name] = sorted(
            DeltaTable(str(path)).vacuum(
                retention_hours=retention_hours, dry_run=dry_run, enforce_retention_duration=False
            )
        )
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        removed = vacuum_tables(args.output, args.retention_hours, args.dry_run)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    verb = "would delete" if args.dry_run else "deleted"
    for table, files in removed.items():
        print(f"{table}: {verb} {len(files)} file(s) older than {args.retention_hours} h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
