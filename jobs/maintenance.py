"""Maintenance of an output root: ``python -m jobs.maintenance vacuum --output OUT`` and
``python -m jobs.maintenance mirror --output OUT [--store NAME=DIR ...]``.

A rerun replaces its rows in one Delta commit, and the files of the replaced rows stay on
disk (Delta's time travel reads them). Readers that go through the Delta log never see
them; a glob over the Parquet files does, and counts every rerun's rows again. ``vacuum``
deletes the files no table version newer than the retention needs (default 7 days, the
Delta default); reading through the log stays the only correct way to read the tables
(README, "Reading the tables").

``mirror`` keeps the store's mirror small (``connectors.mirror_upkeep``): it drops the rows
of entries the given stores no longer hold readable, which no run reads again, and
compacts the small files each run adds. ``vacuum`` then deletes the files they replaced.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from connectors.errors import InputError
from connectors.rocketmq.store_files import checked_stores

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
    mirror = commands.add_parser(
        "mirror", help="drop the mirror's rows no run reads again, and compact its files"
    )
    mirror.add_argument("--output", required=True, help="the job's output root")
    mirror.add_argument(
        "--store",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a broker's store, as the job was given it: its rows of entries the store no"
        " longer holds readable are dropped (repeatable; without it: compaction only)",
    )
    mirror.add_argument(
        "--no-compact", action="store_true", help="drop rows only, leave the files as they are"
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


def mirror_upkeep(output_root: str, stores: Sequence[str], compact: bool = True) -> list[str]:
    """Prune and compact every mirror table under ``output_root``; the lines to print.

    Raises:
        InputError: a store argument that is not a store, a broker named twice, an output
            root that is not local or holds no mirror.
    """
    from connectors.mirror import MIRROR_KINDS, RECORDS, mirror_root
    from connectors.mirror_upkeep import upkeep

    root = mirror_root(output_root)
    roots = {spec.broker: spec.root for spec in checked_stores(stores)}
    made = [kind for kind in MIRROR_KINDS if (root / kind.table / "_delta_log").is_dir()]
    if RECORDS not in made:
        raise InputError(f"{root}: no mirror here (a run with --mirror makes it)")
    lines = []
    for kind in made:  # the others: no discard record, or none naming a real queue, read yet
        done = upkeep(root, kind, roots, compact)
        lines.append(
            f"{done.table}: dropped {done.pruned_rows} row(s) the stores no longer hold;"
            f" compacted {done.files_removed} file(s) into {done.files_added}"
        )
        lines += [f"  note: {why}" for why in done.skipped]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "mirror":
            lines = mirror_upkeep(args.output, args.store, not args.no_compact)
        else:
            removed = vacuum_tables(args.output, args.retention_hours, args.dry_run)
            verb = "would delete" if args.dry_run else "deleted"
            lines = [
                f"{table}: {verb} {len(files)} file(s) older than {args.retention_hours} h"
                for table, files in removed.items()
            ]
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
