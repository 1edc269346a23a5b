"""Install the job's offsets into a stopped broker: ``python -m jobs.offsets install``.

The job writes, per broker, ``offset_fragments/<broker>/consumerOffset.safe.json`` (where a
stopped broker can be set without losing anything), ``consumerOffset.after.json`` (where
the broker itself would go after the round: only right once the broker has appended the
put-back copies, so never installed), ``consumerOffset.committed.json`` (the offsets the
run started from) and ``fragment.json`` (whose fragments these are: the broker, the run,
and marks of its store: a few records at the committed offsets, by consume-queue index,
commit-log offset and store time). A queue whose offsets the run held
(``consume_offsets.offset_hold``) is in neither installable fragment.

``install`` merges one fragment into the broker's full ``config/consumerOffset.json`` (or
a copy): only the two transaction keys change, every other byte stays as the broker wrote
it. It refuses, with one ``error:`` line and the target untouched: the ``after`` fragment;
a fragment that holds no queue; a target that is not the fragment's broker's (its store's
marks differ, or nothing shows whose it is); a target whose current offsets are not the
ones the run started from (the broker ran on; ``--force``); and any move backwards
(``--allow-rewind``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from connectors.errors import InputError
from connectors.rocketmq.offsets_file import (
    merge_offsets_text,
    parse_consumer_offsets,
    read_consumer_offsets,
)
from connectors.rocketmq.probe import entry_at, record_head

FRAGMENT_AFTER = "consumerOffset.after.json"
FRAGMENT_SAFE = "consumerOffset.safe.json"
FRAGMENT_COMMITTED = "consumerOffset.committed.json"
FRAGMENT_FACTS = "fragment.json"
EXIT_OK, EXIT_BAD_INPUT = 0, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit code 2
        raise InputError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m jobs.offsets", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser(
        "install",
        help="merge a fragment into the broker's consumerOffset.json (or a copy)",
        description="Merge FRAGMENT's transaction offsets into TARGET (the broker's "
        "config/consumerOffset.json, or a copy, rewritten in place); every other key stays "
        "verbatim.",
    )
    install.add_argument("fragment", help=f"{FRAGMENT_SAFE} of a run")
    install.add_argument("--into", required=True, dest="target", help="the file to rewrite")
    install.add_argument(
        "--store",
        help="the broker's store directory, to check that TARGET is this broker's (default:"
        " the store TARGET lies in, when it is <store>/config/consumerOffset.json)",
    )
    install.add_argument(
        "--broker",
        help="confirm TARGET is this broker's where no store can show it (a copy elsewhere,"
        " or a run over exported segments)",
    )
    install.add_argument(
        "--force",
        action="store_true",
        help="install even when TARGET's offsets are not the ones the run started from",
    )
    install.add_argument(
        "--allow-rewind",
        dest="allow_rewind",
        action="store_true",
        help="allow moving an offset backwards: the broker then checks, puts back and"
        " discards again every half record it had already passed",
    )
    return parser


# -- whose fragment: the broker and marks of its store ------------------------------------------

OffsetTable = Mapping[str, Mapping[int, int]]


def _mark(root: Path, topic: str, queue_id: int, index: int) -> dict[str, Any] | None:
    """Where the record at consume-queue ``index`` lies and when it was stored; None when
    the store has no readable record of that queue there."""
    entry = entry_at(root, topic, queue_id, index) if index >= 0 else None
    head = record_head(root, entry[0]) if entry is not None else None
    if head is None or head.topic != topic or head.queue_id != queue_id:
        return None
    return {
        "topic": topic,
        "queue_id": queue_id,
        "index": index,
        "commitlog_offset": head.commitlog_offset,
        "store_timestamp_ms": head.store_timestamp_ms,
    }


def store_marks(root: Path, committed: OffsetTable) -> list[dict[str, Any]]:
    """Per committed queue, the last record the broker passed (else the next one): no
    other store holds the same record at the same place and time."""
    marks = []
    for key, queues in sorted(committed.items()):
        topic = key.split("@", 1)[0]
        for queue_id, offset in sorted(queues.items()):
            found = _mark(root, topic, queue_id, offset - 1) or _mark(root, topic, queue_id, offset)
            if found is not None:
                marks.append(found)
    return marks


def write_fragment_facts(
    folder: Path, broker: str, run_id: str, store: Path | None, committed: OffsetTable
) -> None:
    """``fragment.json``: the broker, the run and, for a store, its marks."""
    facts = {
        "broker": broker,
        "run_id": run_id,
        "store": str(store) if store is not None else None,
        "marks": store_marks(store, committed) if store is not None else [],
    }
    _write_atomically(folder / FRAGMENT_FACTS, json.dumps(facts, indent=1) + "\n")


def _store_of(target: Path) -> Path | None:
    """The store ``target`` lies in: ``<store>/config/consumerOffset.json``."""
    store = target.resolve().parent.parent
    if target.resolve().parent.name == "config" and (store / "commitlog").is_dir():
        return store
    return None


def _contradicted(store: Path, marks: Sequence[Mapping[str, Any]]) -> tuple[int, str | None]:
    """(marks the store confirms, the first it contradicts or None). A mark whose record
    retention has removed since confirms nothing and contradicts nothing."""
    confirmed = 0
    for mark in marks:
        entry = entry_at(store, mark["topic"], mark["queue_id"], mark["index"])
        if entry is None:
            continue
        head = record_head(store, entry[0])
        same = head is not None and (head.commitlog_offset, head.store_timestamp_ms) == (
            mark["commitlog_offset"],
            mark["store_timestamp_ms"],
        )
        if not same:
            return confirmed, f"{mark['topic']} queue {mark['queue_id']} offset {mark['index']}"
        confirmed += 1
    return confirmed, None


def check_whose(
    facts: Mapping[str, Any], target: Path, store: Path | None, broker: str | None
) -> None:
    """Refuse a target that is not the fragment's broker's: its store (``store``, else the
    one ``target`` lies in) must hold the fragment's marks; where no store can show whose
    it is, the operator names the broker (``broker``)."""
    owner = facts["broker"]
    if broker is not None and broker != owner:
        raise InputError(f"the fragment is broker {owner}'s, not {broker}'s: not installed")
    store = store or _store_of(target)
    confirmed, wrong = _contradicted(store, facts.get("marks") or []) if store else (0, None)
    if wrong is not None:
        raise InputError(
            f"{store} is not the store the fragment was made from (broker {owner}): its"
            f" record at {wrong} differs; not installed"
        )
    if confirmed or broker is not None:
        return
    where = f"none of the fragment's records is left in {store}" if store else "no store"
    raise InputError(
        f"{target}: cannot tell whose file this is ({where}): give --store DIR (broker"
        f" {owner}'s store) or --broker {owner} to confirm it"
    )


# -- the install -----------------------------------------------------------------------------


def stale_queues(target: OffsetTable, committed: OffsetTable, fragment: OffsetTable) -> list[str]:
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


def rewinds(target: OffsetTable, fragment: OffsetTable) -> list[str]:
    """The fragment's queues it would move backwards from their offset in ``target``."""
    return [
        f"{key} queue {queue_id} {target[key][queue_id]} -> {offset}"
        for key, queues in sorted(fragment.items())
        for queue_id, offset in sorted(queues.items())
        if target.get(key, {}).get(queue_id, -1) > offset
    ]


def _first(problems: Sequence[str]) -> str:
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        if path.exists():
            shutil.copymode(path, temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _beside(fragment_path: Path, name: str) -> Path:
    path = fragment_path.parent / name
    if not path.is_file():
        raise InputError(f"{path}: not found beside the fragment (written by each run)")
    return path


def _fragment(fragment_path: Path) -> dict[str, dict[int, int]]:
    if fragment_path.name == FRAGMENT_AFTER:
        raise InputError(
            f"{FRAGMENT_AFTER} is where the broker goes once it has appended the put-back"
            " copies the job does not write: installed by hand it loses every pending"
            f" transaction; install {FRAGMENT_SAFE}"
        )
    fragment = read_consumer_offsets(fragment_path)
    if fragment is None:
        raise InputError(f"{fragment_path}: fragment not found")
    if not any(fragment.values()):
        raise InputError(
            f"{fragment_path}: holds no queue: the run held every queue's offsets (its"
            " summary and consume_offsets.offset_hold say why); nothing to install"
        )
    return fragment


def install(
    fragment_path: Path, target_path: Path, args: argparse.Namespace
) -> tuple[list[str], list[str]]:
    """Merge the fragment into ``target_path`` after every check; returns (one line per
    changed queue, the backward moves ``--allow-rewind`` let through)."""
    fragment = _fragment(fragment_path)
    committed = read_consumer_offsets(_beside(fragment_path, FRAGMENT_COMMITTED)) or {}
    facts = json.loads(_beside(fragment_path, FRAGMENT_FACTS).read_text(encoding="utf-8"))
    if not target_path.is_file():
        raise InputError(f"{target_path}: target consumerOffset.json not found")
    check_whose(facts, target_path, Path(args.store) if args.store else None, args.broker)
    text = target_path.read_text(encoding="utf-8")
    current = parse_consumer_offsets(text, str(target_path))
    stale = stale_queues(current, committed, fragment)
    if stale and not args.force:
        raise InputError(
            f"{target_path}: {_first(stale)}; the broker ran on since the snapshot: rerun on a"
            " fresh copy, or --force"
        )
    backwards = rewinds(current, fragment)
    if backwards and not args.allow_rewind:
        raise InputError(
            f"{target_path}: would move {_first(backwards)} backwards: the broker would check,"
            " put back and discard again what it had settled; rerun on a fresh copy (or"
            " --allow-rewind if that is meant)"
        )
    _write_atomically(target_path, merge_offsets_text(text, fragment, str(target_path)))
    changed = [
        f"{key} queue {queue_id}: {current.get(key, {}).get(queue_id)} -> {offset}"
        for key, queues in sorted(fragment.items())
        for queue_id, offset in sorted(queues.items())
    ]
    return changed, backwards


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        changed, backwards = install(Path(args.fragment), Path(args.target), args)
        for move in backwards:
            print(
                f"warning: --allow-rewind: moved {move} backwards: the broker checks, puts back"
                " and discards again the half records it had passed",
                file=sys.stderr,
            )
        for line in changed:
            print(f"installed {line}")
        print(f"wrote {args.target}: start the broker with it as config/consumerOffset.json")
        return EXIT_OK
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
