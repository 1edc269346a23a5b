"""What both Delta writers agree on: the partition column, the table properties, the
offsets table's merge keys, how often a commit is retried, the lock that serialises
commits to a local output root across processes, and where a commit's own metadata is
found again (``commit_token``, ``commit_value``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from schemas.outputs import DISCARD_RECORD_IDENTITY, FINAL_OUTCOMES

PARTITION_COLUMN = "run_id"
LOCK_NAME = ".rmq-txn-reconcile.lock"
# Set on every table at creation by both writers, so that either can write what the other
# created: no deletion vectors and classic checkpoints keep the protocol at reader 1 /
# writer 2, the features delta-rs and delta-spark both write (the schemas have no
# timestamp-without-time-zone column either: times are epoch-ms longs).
TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false", "delta.checkpointPolicy": "classic"}
OFFSETS_MERGE_KEYS = ("run_id", "broker", "topic", "queue_id")
# Tables merged on a key instead of partitioned by run: they must not grow with every run.
# A row is updated only by a run at the same T or later (a backfill of an older T does not
# overwrite a newer picture), and keeps the columns of KEEP_ON_UPDATE from the row it updates.
MERGED_TABLES = {"discard_history": ("broker", "discard_offset")}
KEEP_ON_UPDATE = ("first_seen_run_id",)
NEWER_OR_SAME_T = "s.as_of_ms >= t.as_of_ms"


def _final_discard_row() -> str:
    """A discard_history row with a final outcome, matched by the same discard record."""
    outcomes = ", ".join(f"'{outcome}'" for outcome in FINAL_OUTCOMES)
    same = " AND ".join(
        f"(t.`{name}` IS NOT DISTINCT FROM s.`{name}`)" for name in DISCARD_RECORD_IDENTITY
    )
    return f"coalesce(t.outcome IN ({outcomes}), false) AND {same}"


# Rows of a merged table no run updates any more (spec section 6: a final outcome is kept).
KEPT_ROWS = {"discard_history": _final_discard_row()}
COMMIT_ATTEMPTS = 8


def partition_columns(table: str) -> list[str]:
    """The partition columns a table is created with: ``run_id``, except merged tables."""
    return [] if table in MERGED_TABLES else [PARTITION_COLUMN]


def merge_updates(columns: list[str]) -> dict[str, str]:
    """Target column -> source expression of a merged table's update (``KEEP_ON_UPDATE``
    columns stay as they are)."""
    return {name: f"s.`{name}`" for name in columns if name not in KEEP_ON_UPDATE}


def update_predicate(table: str) -> str:
    """When a merged table's matching row is updated: by a run at the same T or later,
    unless the row is one the table keeps (``KEPT_ROWS``)."""
    kept = KEPT_ROWS.get(table)
    return NEWER_OR_SAME_T if kept is None else f"{NEWER_OR_SAME_T} AND NOT ({kept})"


def merge_predicate(table: str) -> str:
    """The merge condition on a merged table's key."""
    return " AND ".join(f"t.`{key}` = s.`{key}`" for key in MERGED_TABLES[table])


def local_root(root: str) -> Path | None:
    """The directory of a local output root (plain path or file: URI), else None."""
    if root.startswith("file:"):
        return Path(re.sub(r"^file:(//)?", "", root))
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", root):
        return None  # s3://, abfss://, hdfs://: the store's own commit protocol applies
    return Path(root)


def absolute_root(root: str) -> str:
    """An output root as Delta and Spark must be given it: a local one absolute (against the
    driver's working directory; Delta reads a relative "out/bad_records" as a table name),
    any other URI unchanged, without a trailing slash."""
    folder = local_root(root)
    return folder.resolve().as_posix() if folder is not None else root.rstrip("/")


@contextlib.contextmanager
def commit_lock(root: str) -> Iterator[None]:
    """Hold an exclusive lock on a local output root while committing to its tables.

    On a local file system Delta's log store guards a commit only inside one JVM and
    delta-rs has no guard across processes, so two processes could both write the same
    ``_delta_log`` version. Both writers take this ``flock`` around each commit; the kernel
    drops it when a process dies, so a crashed run never blocks the next one.
    """
    folder = local_root(root)
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def commit_token(label: str, also: Mapping[str, str] | None = None) -> str:
    """delta-spark's ``userMetadata`` of one commit: a unique marker (readable: it names the
    run) with ``also`` beside it, as JSON (delta-rs keeps such keys in the commit itself)."""
    token = {"writer": "rmq-txn-reconcile", "run": label, "commit": uuid.uuid4().hex}
    return json.dumps({**token, **(also or {})})


def commit_value(commit: Mapping[str, object], key: str) -> str | None:
    """``key`` of a commit's own metadata (a row of ``DeltaTable.history``), whichever
    writer made it: delta-rs keeps it as a key of the commit, delta-spark inside the
    ``userMetadata`` token (``commit_token``). None when the commit has none."""
    value = commit.get(key)
    if value is None:
        try:
            token = json.loads(str(commit.get("userMetadata") or ""))
        except ValueError:
            return None
        value = token.get(key) if isinstance(token, dict) else None
    return value if isinstance(value, str) else None
