"""The delta-rs writer (the default): Spark executors write the rows as Parquet files into
the table folder; delta-rs then commits those files in one transaction that replaces the
run's partition (``mode="overwrite"`` with a partition filter on ``run_id``). Nothing
proportional to the data passes through the driver, only the list of files. The offsets
table, one row per queue and topic, is merged.

The driver lists files the executors wrote, so it counts the rows in what it found against
the rows the executors counted while writing and commits nothing when they differ
(``RowsNotCommittedError``): on a cluster whose output root is not shared storage it would
otherwise commit empty tables (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.schema import Field
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.arrow import to_arrow_schema
from connectors.delta_commit import (
    COMMIT_ATTEMPTS,
    OFFSETS_MERGE_KEYS,
    PARTITION_COLUMN,
    TABLE_PROPERTIES,
    commit_lock,
    merge_predicate,
    merge_updates,
    partition_columns,
    update_predicate,
)
from schemas.decided_view import VIEW_KEY
from schemas.outputs import CONSUME_OFFSETS_TABLE

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class RowsNotCommittedError(RuntimeError):
    """The driver found fewer (or more) rows in the staged files than the executors wrote."""


def partition_folder(value: str, column: str = PARTITION_COLUMN) -> str:
    """A folder name for a partition's files (``column=value``). Delta readers take
    partition values from the log, not from paths, so the folder only needs to be a safe,
    stable, readable name."""
    safe = _SAFE.sub("_", value)
    if safe != value:
        safe = f"{safe}-{hashlib.sha1(value.encode()).hexdigest()[:8]}"
    return f"{column}={safe}"


def check_committed_rows(table: str, written: int, found: int, staging: Path) -> None:
    """Refuse to commit when the files the driver lists do not hold the rows the executors
    wrote: executors write on their own file system and the driver lists its own, so an
    output root that is not shared storage would otherwise commit an empty (or partial)
    table without a word. See docs/cluster.md."""
    if written != found:
        raise RowsNotCommittedError(
            f"{table}: executors wrote {written} rows but the driver found {found} in"
            f" {staging}; nothing committed. The output root must be storage that the driver"
            " and every executor share (or run with delta-spark)"
        )


def _retry(commit: Callable[[], object]) -> None:
    """Concurrent runs commit to the same tables: retry on optimistic-concurrency conflicts."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            commit()
            return
        except CommitFailedError:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * 2**attempt)


class DeltaRsOutput:
    """delta-rs commits of files written by Spark (see module docstring)."""

    name = "delta-rs"

    def __init__(self, spark: SparkSession, root: Path) -> None:
        self.spark = spark
        self.root = root

    def table_path(self, table: str) -> Path:
        return self.root / table

    def ensure_table(self, table: str, schema: T.StructType) -> None:
        path = self.table_path(table)
        arrow = to_arrow_schema(schema)
        try:
            existing = DeltaTable(str(path))
        except TableNotFoundError:
            path.mkdir(parents=True, exist_ok=True)
            with (
                commit_lock(str(self.root)),
                contextlib.suppress(CommitFailedError),  # a concurrent run created it first
            ):
                DeltaTable.create(
                    str(path),
                    arrow,
                    mode="ignore",
                    partition_by=partition_columns(table),
                    configuration=TABLE_PROPERTIES,
                )
            return
        present = {field.name for field in pa.schema(existing.schema().to_arrow())}
        missing = [field for field in arrow if field.name not in present]
        if missing:  # e.g. a first run with --include-body adds `body`
            with commit_lock(str(self.root)):
                _retry(
                    lambda: DeltaTable(str(path)).alter.add_columns(
                        [Field.from_arrow(field) for field in missing]
                    )
                )

    def replace_run(self, table: str, frame: DataFrame, schema: T.StructType, run_id: str) -> int:
        """Write ``frame`` (which has ``schema``, ``run_id`` included) as the run's partition."""
        path = self.table_path(table)
        staging = path / partition_folder(run_id) / f"write-{uuid.uuid4().hex}"
        data_columns = [name for name in schema.fieldNames() if name != PARTITION_COLUMN]
        # Timestamps as INT64 microseconds (Delta's own encoding), not Spark's legacy INT96.
        self.spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        # Counted by the executors while they write (same pass, no second job). Mode "error"
        # (not its synonym "errorifexists"): the one spelling Spark Connect accepts too.
        written = Observation(f"rows written to {table}")
        frame.select(*data_columns).observe(written, F.count(F.lit(1)).alias("rows")).write.mode(
            "error"
        ).parquet(str(staging))
        actions, rows = self._add_actions(path, staging, run_id)
        check_committed_rows(table, written.get["rows"], rows, staging)
        self._commit_run(path, actions, run_id)
        for leftover in staging.iterdir():  # Spark's _SUCCESS and .crc side files
            if not leftover.name.endswith(".parquet"):
                leftover.unlink(missing_ok=True)
        return rows

    def _commit_run(self, path: Path, actions: Sequence[AddAction], run_id: str) -> None:
        """One commit that replaces the run's partition of the table at ``path`` with the
        files of ``actions``."""

        def commit() -> None:
            table = DeltaTable(str(path))
            # The transaction takes a list of adds and removes (a list is invariant): widen it.
            replacing: list[AddAction | RemoveAction] = list(actions)
            table.create_write_transaction(
                replacing,
                mode="overwrite",
                schema=table.schema(),
                partition_by=[PARTITION_COLUMN],
                partition_filters=[(PARTITION_COLUMN, "=", run_id)],
                commit_properties=CommitProperties(custom_metadata={"run_id": run_id}),
            )

        with commit_lock(str(self.root)):
            _retry(commit)

    @staticmethod
    def _add_actions(table_path: Path, staging: Path, run_id: str) -> tuple[list[AddAction], int]:
        actions: list[AddAction] = []
        total = 0
        for file in sorted(staging.glob("*.parquet")):
            rows = pq.read_metadata(file).num_rows  # the footer only
            if rows == 0:
                file.unlink()
                continue
            stat = file.stat()
            actions.append(
                AddAction(
                    path=file.relative_to(table_path).as_posix(),
                    size=stat.st_size,
                    partition_values={PARTITION_COLUMN: run_id},
                    modification_time=int(stat.st_mtime * 1000),
                    data_change=True,
                    stats=json.dumps({"numRecords": rows}),
                )
            )
            total += rows
        return actions, total

    def replace_run_rows(
        self, table: str, rows: pa.Table, schema: T.StructType, run_id: str
    ) -> int:
        """Write ``rows`` (a small table already on the driver, ``schema`` with ``run_id``)
        as the run's partition: one Parquet file written here, committed like
        ``replace_run``'s."""
        path = self.table_path(table)
        staging = path / partition_folder(run_id) / f"write-{uuid.uuid4().hex}"
        data_columns = [name for name in schema.fieldNames() if name != PARTITION_COLUMN]
        arrow = to_arrow_schema(T.StructType([schema[name] for name in data_columns]))
        staging.mkdir(parents=True)
        pq.write_table(rows.select(data_columns).cast(arrow), staging / "part-00000.parquet")
        actions, written = self._add_actions(path, staging, run_id)
        self._commit_run(path, actions, run_id)
        return written

    def merge_offsets(self, rows: pa.Table, schema: T.StructType) -> int:
        """Upsert the offsets rows (one per queue and topic, already on the driver) keyed by
        (run_id, broker, topic, queue_id); delta-rs merges them."""
        source = rows.cast(to_arrow_schema(schema))
        path = str(self.table_path(CONSUME_OFFSETS_TABLE))
        on = " AND ".join(f"t.`{key}` = s.`{key}`" for key in OFFSETS_MERGE_KEYS)

        def commit() -> None:
            (
                DeltaTable(path)
                .merge(source, predicate=on, source_alias="s", target_alias="t")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )

        with commit_lock(str(self.root)):
            _retry(commit)
        return source.num_rows

    def merge_rows(
        self, table: str, frame: DataFrame, schema: T.StructType, metadata: str | None = None
    ) -> int:
        """Merge ``frame`` into a merged table (``delta_commit.MERGED_TABLES``) on its key:
        a matching row is updated by a run at the same T or later, keeping
        ``KEEP_ON_UPDATE``; a new key is inserted; other rows stay. ``metadata``: the
        run's ``DecidedView`` text, kept in the commit (``VIEW_KEY``).

        Executors write the rows as Parquet into a scratch folder of the table (Delta
        readers ignore folders starting with ``_``); delta-rs streams them from there into
        its merge, so the rows are never collected on the driver. The scratch folder is
        removed afterwards."""
        path = self.table_path(table)
        staging = path / f"_merge-{uuid.uuid4().hex}"
        self.spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        written = Observation(f"rows merged into {table}")
        frame.select(*schema.fieldNames()).observe(
            written, F.count(F.lit(1)).alias("rows")
        ).write.mode("error").parquet(str(staging))
        try:
            files = sorted(str(f) for f in staging.glob("*.parquet"))
            found = sum(pq.read_metadata(f).num_rows for f in files)
            check_committed_rows(table, written.get["rows"], found, staging)
            arrow = to_arrow_schema(schema)
            kept = {VIEW_KEY: metadata} if metadata is not None else None
            properties = CommitProperties(custom_metadata=kept) if kept else None

            def commit() -> None:
                reader = ds.dataset(files, schema=arrow, format="parquet").scanner().to_reader()
                (
                    DeltaTable(str(path))
                    .merge(
                        reader,
                        predicate=merge_predicate(table),
                        source_alias="s",
                        target_alias="t",
                        commit_properties=properties,
                    )
                    .when_matched_update(
                        merge_updates(schema.fieldNames()), predicate=update_predicate(table)
                    )
                    .when_not_matched_insert_all()
                    .execute()
                )

            with commit_lock(str(self.root)):
                _retry(commit)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return found
