"""Reading a Delta table on the driver with delta-rs, as an Arrow dataset: the one way the
job, its commands, the bench and the tests read its tables without Spark.

A local table is read through Arrow's own local file system. delta-rs' default is a Python
file system (``PyFileSystem`` over its storage handler) that Arrow's I/O threads call
into, and a short process that scanned a table with it can abort at exit with
"terminate called without an active exception" (SIGABRT, exit 134) while one of those
threads is still alive: the work done, the exit code lost. A table on an object store
(``s3://``, ``abfss://``, ...) keeps delta-rs' default, which is the only one that reaches it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from pyarrow.fs import LocalFileSystem, SubTreeFileSystem

from connectors.delta_commit import local_root

if TYPE_CHECKING:
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

# Commits that change no row: a vacuum writes a start and an end commit
# (``jobs.maintenance vacuum``), a compaction rewrites files (``OPTIMIZE``).
NO_ROW_CHANGE = ("VACUUM START", "VACUUM END", "OPTIMIZE")


def table_filesystem(path: str) -> SubTreeFileSystem | None:
    """Arrow's local file system rooted at a local table's folder (a plain path or a
    ``file:`` URI); None for a table on an object store (delta-rs' default then)."""
    folder = local_root(path)
    if folder is None:
        return None
    return SubTreeFileSystem(folder.resolve().as_posix(), LocalFileSystem())


def arrow_dataset(path: str, version: int | None = None) -> ds.Dataset | None:
    """The Delta table at ``path`` (its current version, or ``version``) as an Arrow
    dataset, None when there is no table there. Its fragments carry each file's partition
    values, so a filter on ``run_id`` reads only that run's files."""
    # deltalake is imported here: Spark's Python workers import the modules that call this
    # and do not need it.
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path, version=version)
    except TableNotFoundError:
        return None
    return table.to_pyarrow_dataset(filesystem=table_filesystem(path))


def newest_data_commit(
    table: DeltaTable, skipped: Collection[str] = NO_ROW_CHANGE
) -> dict[str, Any] | None:
    """The commit information of the newest commit of ``table`` whose operation is not
    one of ``skipped``, read from the newest back in a few growing windows (maintenance
    between runs adds a few each); None when every commit is."""
    for limit in (8, 128, None):
        commits = table.history(limit)  # newest first
        for commit in commits:
            if commit.get("operation") not in skipped:
                return commit
        if limit is None or len(commits) < limit:
            return None
    return None
