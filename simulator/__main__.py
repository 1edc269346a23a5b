"""Write a simulated RocketMQ broker store (sample data, tests, benchmarks).

    python -m simulator --out DIR --transactions N --seed S [--op-style 4.9|5.x] ...

The store (``commitlog/``, ``consumequeue/``, ``config/consumerOffset.json``) is written to a
temporary sibling directory and renamed to ``DIR`` when complete, so an interrupted run never
leaves a half-written store behind. The same arguments give the same bytes. Prints one
summary line. What is simulated, and how it differs from a live broker: ``docs/simulator.md``.
Exit codes: 0 done, 2 bad arguments (one ``error:`` line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from simulator.simulation import DEFAULT_END_MS, OP_STYLES, SimConfig, write_store


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit code 2
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m simulator", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="store directory to create")
    p.add_argument(
        "--transactions", required=True, type=int, help="number of transactions (half messages)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--op-style",
        choices=OP_STYLES,
        default="5.x",
        help="4.9: one op record per resolution, 60 s checks; 5.x: batched op bodies "
        "'7,9,8,', 30 s checks, 5.1.1+ rules (default 5.x)",
    )
    p.add_argument("--producer-groups", type=int, default=3, help="producer groups (default 3)")
    p.add_argument(
        "--topics", type=int, default=4, help="real topics of the transactions (default 4)"
    )
    p.add_argument(
        "--other-traffic",
        type=float,
        default=0.5,
        help="plain messages of other topics per transaction (default 0.5)",
    )
    p.add_argument(
        "--clock-skew-ms",
        type=int,
        default=0,
        help="some producer instances' clocks are off by up to +-MS (default 0)",
    )
    p.add_argument(
        "--commitlog-file-size",
        type=int,
        default=1 << 30,
        help="bytes per commit-log file (default 1 GiB)",
    )
    p.add_argument(
        "--cq-file-entries",
        type=int,
        default=300_000,
        help="entries per consume-queue file (default 300000)",
    )
    p.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="length of the simulated timeline (default max(1800, transactions / 1000))",
    )
    p.add_argument(
        "--check-interval-ms",
        type=int,
        default=None,
        help="transactionCheckInterval (default 60000 for 4.9, 30000 for 5.x)",
    )
    p.add_argument(
        "--end-ms",
        type=int,
        default=DEFAULT_END_MS,
        help=f"end of the timeline, epoch ms (default {DEFAULT_END_MS})",
    )
    p.add_argument("--check-max", type=int, default=15, help="transactionCheckMax (default 15)")
    p.add_argument(
        "--transaction-timeout-ms", type=int, default=6000, help="transactionTimeOut (default 6000)"
    )
    p.add_argument(
        "--file-reserved-hours", type=int, default=72, help="fileReservedTime (default 72)"
    )
    p.add_argument(
        "--late-fraction",
        type=float,
        default=0.03,
        help="transactions decided 10 s to 30 min late (default 0.03)",
    )
    p.add_argument(
        "--never-fraction",
        type=float,
        default=0.01,
        help="transactions whose producer never answers (default 0.01)",
    )
    p.add_argument(
        "--rollback-fraction",
        type=float,
        default=0.1,
        help="decided transactions rolled back (default 0.1)",
    )
    p.add_argument(
        "--immunity-fraction",
        type=float,
        default=0.05,
        help="half messages with CHECK_IMMUNITY_TIME_IN_SECONDS (default 0.05)",
    )
    p.add_argument("--body-bytes", type=int, default=200, help="typical body size (default 200)")
    p.add_argument(
        "--ipv6-fraction",
        type=float,
        default=0.0,
        help="producer instances with IPv6 addresses (default 0)",
    )
    p.add_argument(
        "--summary-json",
        type=Path,
        default=None,
        help="also write the summary as JSON to this file",
    )
    p.add_argument("--force", action="store_true", help="replace DIR when it already holds a store")
    return p


def _config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        transactions=args.transactions,
        seed=args.seed,
        op_style=args.op_style,
        producer_groups=args.producer_groups,
        topics=args.topics,
        other_traffic=args.other_traffic,
        clock_skew_ms=args.clock_skew_ms,
        commitlog_file_size=args.commitlog_file_size,
        cq_file_entries=args.cq_file_entries,
        duration_s=args.duration_s,
        check_interval_ms=args.check_interval_ms,
        end_ms=args.end_ms,
        check_max=args.check_max,
        transaction_timeout_ms=args.transaction_timeout_ms,
        file_reserved_hours=args.file_reserved_hours,
        late_fraction=args.late_fraction,
        never_fraction=args.never_fraction,
        rollback_fraction=args.rollback_fraction,
        immunity_fraction=args.immunity_fraction,
        body_bytes=args.body_bytes,
        ipv6_fraction=args.ipv6_fraction,
    )


def _is_store_or_empty(path: Path) -> bool:
    names = {p.name for p in path.iterdir()}
    return not names or bool(names & {"commitlog", "consumequeue"})


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = _config(args)
    except ValueError as exc:
        parser.error(str(exc))
    out: Path = args.out
    if out.exists():
        if not out.is_dir():
            parser.error(f"{out}: exists and is not a directory")
        if any(out.iterdir()):
            if not args.force:
                parser.error(
                    f"{out}: already exists and is not empty (use --force to replace a store)"
                )
            if not _is_store_or_empty(out):
                parser.error(f"{out}: not a store directory; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it 0700
    try:
        summary = write_store(config, staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if args.summary_json is not None:
        document = {
            "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
            **summary.as_dict(),
        }
        args.summary_json.write_text(
            json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
    print(summary.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
