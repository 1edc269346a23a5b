"""Stores this reader does not understand, recognised from the store's own files.

The reader understands one layout: a master broker's file commit log under
``commitlog/`` (one path), file consume queues under ``consumequeue/<topic>/<queue>/``
and the committed offsets in ``config/consumerOffset.json``. A broker can be set up
otherwise, and reading such a store as if it were the usual one gives a partial or stale
picture without a word (the consume queues look absent and are "rebuilt", the offsets
file is an old leftover, half of the commit log is elsewhere). Each kind below is
recognised from what that set-up leaves on disk (RocketMQ 4.9-5.3 sources), and refused
with one line (exit 2). ``docs/store-reader.md`` lists what is supported.
"""

from __future__ import annotations

import os
from itertools import pairwise
from pathlib import Path

from connectors.errors import InputError

# Where a broker started without ``-c`` persists its settings (BrokerPathConfigHelper:
# ``<store>/config/broker.properties``); ``broker.conf`` is the name of the shipped
# examples, which operators often keep beside the store.
BROKER_CONFIG_FILES = (Path("config") / "broker.properties", Path("config") / "broker.conf")

# RocksDB's own files: what a RocksDB consume-queue store (``storeType=defaultRocksDB``)
# leaves directly in ``consumequeue/`` instead of one folder per topic.
_ROCKSDB_MARKERS = ("CURRENT", "IDENTITY", "LOCK")
_ROCKSDB_PREFIXES = ("MANIFEST-", "OPTIONS-")

# RocksDB config stores: v1 (storeType=defaultRocksDB) keeps one database per table
# under config/, v2 (configManagerVersion=v2) one database in config/rdb.
_ROCKSDB_CONFIG_DIRS = ("consumerOffsets", "topics", "subscriptionGroups", "rdb")


def read_broker_properties(text: str) -> dict[str, str]:
    """Java ``.properties`` lines (``key=value``, ``key: value`` or ``key value``;
    ``#``/``!`` comments), enough for the broker's flat settings."""
    settings: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min(
            (i for i in (line.find("="), line.find(":"), line.find(" ")) if i > 0), default=-1
        )
        if cut < 0:
            continue
        settings[line[:cut].strip()] = line[cut + 1 :].strip().lstrip("=:").strip()
    return settings


def _is_rocksdb_dir(directory: Path) -> bool:
    if not directory.is_dir():
        return False
    names = [entry.name for entry in os.scandir(directory) if entry.is_file()]
    return any(
        name in _ROCKSDB_MARKERS or name.startswith(_ROCKSDB_PREFIXES) or name.endswith(".sst")
        for name in names
    )


def _from_settings(settings: dict[str, str], source: str) -> str | None:
    """What the broker's own settings say is unsupported, or None."""

    def value(key: str) -> str:
        return settings.get(key, "").strip()

    if value("storeType").lower() == "defaultrocksdb":
        return f"{source} sets storeType={value('storeType')}: consume queues and config in RocksDB"
    if value("configManagerVersion").lower() == "v2":
        return f"{source} sets configManagerVersion=v2: consumer offsets in RocksDB (config/rdb)"
    if value("enableDLegerCommitLog").lower() == "true":
        return f"{source} sets enableDLegerCommitLog=true: a DLedger commit log"
    if "," in value("storePathCommitLog") or value("readOnlyCommitLogStorePaths"):
        return f"{source} spreads the commit log over several paths (storePathCommitLog)"
    if value("brokerRole").upper() == "SLAVE" or value("brokerId") not in ("", "0"):
        return (
            f"{source} describes a slave (brokerRole={value('brokerRole') or '?'},"
            f" brokerId={value('brokerId') or '?'}): read the master's store"
        )
    return None


def _commitlog_gap(root: Path) -> str | None:
    """A whole commit-log file missing inside the sequence: the broker spread the log over
    several paths (``storePathCommitLog`` with ``,``: files go round-robin to the paths) or
    files were lost. Names are the files' start offsets and the broker creates every file
    at the mapped size, so two names further apart than the largest file is a gap (a
    damaged, shorter file is not taken for one)."""
    folder = root / "commitlog"
    if not folder.is_dir():
        return None
    files = sorted(
        (int(entry.name), entry.stat().st_size)
        for entry in os.scandir(folder)
        if entry.is_file() and entry.name.isdigit() and len(entry.name) == 20
    )
    if len(files) < 2:
        return None
    mapped = max(size for _, size in files[:-1])
    if mapped <= 0:  # only empty files before the last: no mapped size to judge by
        return None
    for (before, _), (after, _) in pairwise(files):
        if after - before > mapped:
            return (
                f"commitlog/ has no file between {before:020d} and {after:020d}: a commit log"
                " spread over several paths (storePathCommitLog) or missing files"
            )
    return None


def unsupported_reason(root: str | os.PathLike[str]) -> str | None:
    """Why the store at ``root`` cannot be read faithfully, or None when it can."""
    root = Path(root)
    for relative in BROKER_CONFIG_FILES:
        path = root / relative
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            reason = _from_settings(read_broker_properties(text), str(relative))
            if reason is not None:
                return reason
    if _is_rocksdb_dir(root / "consumequeue"):
        return "consumequeue/ is a RocksDB database (storeType=defaultRocksDB)"
    for name in _ROCKSDB_CONFIG_DIRS:
        if _is_rocksdb_dir(root / "config" / name):
            return f"config/{name}/ is a RocksDB database: the broker keeps its offsets there"
    dledger = sorted(p.name for p in root.glob("dledger-*") if p.is_dir())
    if dledger:
        return f"{dledger[0]}/ found: a DLedger commit log (enableDLegerCommitLog)"
    return _commitlog_gap(root)


def check_supported(root: str | os.PathLike[str]) -> None:
    """InputError (one line) when the store is of a kind this reader does not understand."""
    reason = unsupported_reason(root)
    if reason is not None:
        raise InputError(
            f"{root}: unsupported store: {reason}; this reader reads a master's file"
            " commit log and consume queues only (see docs/store-reader.md)"
        )
