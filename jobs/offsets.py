"""Install the job's offsets into a stopped broker: ``python -m jobs.offsets install``.

The job writes, per broker, ``offset_fragments/<broker>/consumerOffset.safe.json`` (where a
stopped broker can be set without losing anything), ``consumerOffset.after.json`` (where
the broker itself would go after the round: only right once the broker has appended the
put-back copies, so not for installing by hand) and ``consumerOffset.committed.json`` (the
offsets the run started from). ``install`` merges one fragment into a copy of the broker's
full ``config/consumerOffset.json``: only the two transaction keys change, every other byte
stays as the broker wrote it. It refuses when the copy's current offsets are not the ones
the run started from: the broker ran on since the snapshot, and the fragment is stale.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from connectors.errors import InputError
from connectors.rocketmq.offsets_file import (
    merge_offsets_text,
    parse_consumer_offsets,
    read_consumer_offsets,
)

FRAGMENT_AFTER = "consumerOffset.after.json"
FRAGMENT_SAFE = "consumerOffset.safe.json"
FRAGMENT_COMMITTED = "consumerOffset.committed.json"
EXIT_OK, EXIT_BAD_INPUT = 0, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit code 2
        raise InputError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m jobs.offsets", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser(
        "install",
        help="merge a fragment into a copy of the broker's consumerOffset.json",
        description="Merge FRAGMENT's transaction offsets into TARGET (a copy of the broker's "
        "config/consumerOffset.json, rewritten in place); every other key stays verbatim.",
    )
    install.add_argument("fragment", help=f"{FRAGMENT_SAFE} (or {FRAGMENT_AFTER}) of a run")
    install.add_argument("--into", required=True, dest="target", help="the file to rewrite")
    install.add_argument(
        "--force",
        action="store_true",
        help="install even when TARGET's offsets are not the ones the run started from",
    )
    return parser


def stale_queues(
    target: dict[str, dict[int, int]],
    committed: dict[str, dict[int, int]],
    fragment: dict[str, dict[int, int]],
) -> list[str]:
    """The fragment's queues whose offset in ``target`` differs from the run's start."""
    stale = []
    for key, queues in sorted(fragment.items()):
        for queue_id in sorted(queues):
            now = target.get(key, {}).get(queue_id)
            started = committed.get(key, {}).get(queue_id)
            if now != started:
                stale.append(
                    f"{key} queue {queue_id} is {now} there, the run started from {started}"
                )
    return stale


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        shutil.copymode(path, temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def install(fragment_path: Path, target_path: Path, force: bool) -> list[str]:
    """Merge the fragment into ``target_path``; returns one line per changed queue."""
    fragment = read_consumer_offsets(fragment_path)
    if fragment is None:
        raise InputError(f"{fragment_path}: fragment not found")
    committed_path = fragment_path.parent / FRAGMENT_COMMITTED
    committed = read_consumer_offsets(committed_path)
    if committed is None:
        raise InputError(f"{committed_path}: not found beside the fragment (written by each run)")
    if not target_path.is_file():
        raise InputError(f"{target_path}: target consumerOffset.json not found")
    text = target_path.read_text(encoding="utf-8")
    current = parse_consumer_offsets(text, str(target_path))
    stale = stale_queues(current, committed, fragment)
    if stale and not force:
        raise InputError(
            f"{target_path}: {stale[0]}{f' (+{len(stale) - 1} more)' if len(stale) > 1 else ''};"
            " the broker ran on since the snapshot: rerun on a fresh copy, or --force"
        )
    _write_atomically(target_path, merge_offsets_text(text, fragment, str(target_path)))
    return [
        f"{key} queue {queue_id}: {current.get(key, {}).get(queue_id)} -> {offset}"
        for key, queues in sorted(fragment.items())
        for queue_id, offset in sorted(queues.items())
    ]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        fragment = Path(args.fragment)
        if fragment.name == FRAGMENT_AFTER:
            print(
                f"warning: {FRAGMENT_AFTER} skips the records a live broker would put back or"
                f" discard; a stopped broker loses them. {FRAGMENT_SAFE} loses nothing.",
                file=sys.stderr,
            )
        for line in install(fragment, Path(args.target), args.force):
            print(f"installed {line}")
        print(f"wrote {args.target}: start the broker with it as config/consumerOffset.json")
        return EXIT_OK
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
