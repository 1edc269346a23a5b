"""The delta-spark writer, for sessions that have Delta's JVM extension (a cluster with
delta-spark), and the registration of the tables in the session's catalog."""

from __future__ import annotations

import contextlib
import functools
import operator
import time
import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.delta_commit import (
    COMMIT_ATTEMPTS,
    OFFSETS_MERGE_KEYS,
    PARTITION_COLUMN,
    TABLE_PROPERTIES,
    absolute_root,
    commit_lock,
    commit_token,
    merge_predicate,
    merge_updates,
    partition_columns,
    update_predicate,
)
from connectors.delta_jars import DeltaUnavailableError, can_write_delta
from schemas.decided_view import VIEW_KEY
from schemas.outputs import CONSUME_OFFSETS_TABLE


class DeltaSparkOutput:
    """Writes through delta-spark's JVM extension (a session with Delta's jars).

    Same semantics as ``DeltaRsOutput``: create with ``TABLE_PROPERTIES`` when absent,
    replace the run's partition in one commit (``replaceWhere``), merge the offsets with
    ``DeltaTable.merge``. Delta's ``txnAppId``/``txnVersion`` are not used: they would make
    Delta skip a rerun of a run id, which must replace that run's rows. Row counts come
    from each commit's operation metrics, found in the history by a token this writer puts
    in the commit's ``userMetadata``.
    """

    name = "delta-spark"

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = absolute_root(root)

    def table_location(self, table: str) -> str:
        return f"{self.root}/{table}"

    def ensure_table(self, table: str, schema: T.StructType) -> None:
        from delta.tables import DeltaTable as SparkDeltaTable

        location = self.table_location(table)
        with commit_lock(self.root):
            if not SparkDeltaTable.isDeltaTable(self.spark, location):
                builder = (
                    SparkDeltaTable.createIfNotExists(self.spark)
                    .location(location)
                    .addColumns(schema)
                    .partitionedBy(*partition_columns(table))
                )
                for key, value in TABLE_PROPERTIES.items():
                    builder = builder.property(key, value)
                builder.execute()
                return
            present = set(SparkDeltaTable.forPath(self.spark, location).toDF().columns)
            missing = [field for field in schema.fields if field.name not in present]
            if missing:  # e.g. a first run with --include-body adds `body`
                columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
                self.spark.sql(f"ALTER TABLE delta.`{location}` ADD COLUMNS ({columns})")

    def replace_run(self, table: str, frame: DataFrame, schema: T.StructType, run_id: str) -> int:
        """One commit that replaces the run's partition; returns the rows it wrote."""
        quoted = run_id.replace("'", "''")
        token = commit_token(run_id)
        location = self.table_location(table)
        with commit_lock(self.root), _session_conf(self.spark, ALWAYS_COMMIT):
            _retry_spark(
                lambda: (
                    conform(frame, schema)
                    .write.format("delta")
                    .mode("overwrite")
                    .option("replaceWhere", f"{PARTITION_COLUMN} = '{quoted}'")
                    .option("userMetadata", token)
                    .save(location)
                )
            )
            return self._rows_of_commit(location, token, "numOutputRows")

    def replace_run_rows(
        self, table: str, rows: pa.Table, schema: T.StructType, run_id: str
    ) -> int:
        """``replace_run`` of a small table already on the driver."""
        return self.replace_run(table, self._frame(rows, schema), schema, run_id)

    def _frame(self, rows: pa.Table, schema: T.StructType) -> DataFrame:
        """Rows on the driver as a frame of the table's columns (a local relation)."""
        return self.spark.createDataFrame(rows.select(schema.fieldNames()), schema=schema)

    def merge_offsets(self, rows: pa.Table, schema: T.StructType) -> int:
        """Upsert the offsets rows (on the driver) keyed by (run_id, broker, topic,
        queue_id)."""
        from delta.tables import DeltaTable as SparkDeltaTable

        frame = self._frame(rows, schema)

        location = self.table_location(CONSUME_OFFSETS_TABLE)
        same_key = [F.col(f"t.{key}") == F.col(f"s.{key}") for key in OFFSETS_MERGE_KEYS]
        condition = functools.reduce(operator.and_, same_key)
        source = conform(frame, schema).alias("s")
        token = commit_token(str(uuid.uuid4()))

        def merge() -> None:
            (
                SparkDeltaTable.forPath(self.spark, location)
                .alias("t")
                .merge(source, condition)
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute()
            )

        settings = {**ALWAYS_COMMIT, USER_METADATA: token}  # merge has no writer option for it
        with commit_lock(self.root), _session_conf(self.spark, settings):
            _retry_spark(merge)
            return self._rows_of_commit(location, token, "numSourceRows")

    def merge_rows(
        self, table: str, frame: DataFrame, schema: T.StructType, metadata: str | None = None
    ) -> int:
        """Merge ``frame`` into a merged table on its key (see ``DeltaRsOutput.merge_rows``):
        a matching row is updated by a run at the same T or later, keeping
        ``KEEP_ON_UPDATE``; a new key is inserted; other rows stay. ``metadata`` is kept
        in the commit's ``userMetadata`` token, under ``VIEW_KEY``."""
        from delta.tables import DeltaTable as SparkDeltaTable

        location = self.table_location(table)
        source = conform(frame, schema).alias("s")
        token = commit_token(str(uuid.uuid4()), {VIEW_KEY: metadata} if metadata else None)
        # delta-spark takes the update as a dict of str | Column (a dict is invariant): widen it.
        updates: dict[str, str | Column] = dict(merge_updates(schema.fieldNames()))

        def merge() -> None:
            (
                SparkDeltaTable.forPath(self.spark, location)
                .alias("t")
                .merge(source, merge_predicate(table))
                .whenMatchedUpdate(update_predicate(table), updates)
                .whenNotMatchedInsertAll()
                .execute()
            )

        settings = {**ALWAYS_COMMIT, USER_METADATA: token}
        with commit_lock(self.root), _session_conf(self.spark, settings):
            _retry_spark(merge)
            return self._rows_of_commit(location, token, "numSourceRows")

    def _rows_of_commit(self, location: str, token: str, metric: str) -> int:
        """The row count Delta recorded for the commit marked with ``token``."""
        from delta.tables import DeltaTable as SparkDeltaTable

        history = SparkDeltaTable.forPath(self.spark, location).history(HISTORY_SCAN)
        commit = history.where(F.col("userMetadata") == token).select("operationMetrics").first()
        metrics = (commit["operationMetrics"] or {}) if commit is not None else None
        if metrics is not None and metric in metrics:
            return int(metrics[metric])
        if metrics is not None and metrics.get("numFiles") == "0":
            return 0  # Delta records no row count for a write that added no file
        raise RuntimeError(f"{location}: no '{metric}' in the metrics of this run's commit")


def conform(frame: DataFrame, schema: T.StructType) -> DataFrame:
    """``frame`` with exactly the table's columns and types: Delta enforces the table schema
    (a literal such as ``F.lit(duration)`` is an int, the column a long)."""
    return frame.select(*[F.col(field.name).cast(field.dataType) for field in schema.fields])


HISTORY_SCAN = 50  # commits searched for this writer's own (concurrent runs may add some)


USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
# Delta skips the commit of a write that adds and removes nothing (an empty table on a first
# run): every run commits once per table instead, as delta-rs does, so the history has one
# commit per table and run to read the row count from.
ALWAYS_COMMIT = {"spark.databricks.delta.skipRecordingEmptyCommits": "false"}


@contextlib.contextmanager
def _session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """Set session settings for one commit and put the caller's values back afterwards."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def _retry_spark(commit: Callable[[], object]) -> None:
    """Remote roots have no file lock: retry Delta's optimistic-concurrency conflicts."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            commit()
            return
        except Exception as exc:
            conflict = "DELTA_CONCURRENT" in str(exc) or "Concurrent" in type(exc).__name__
            if not conflict or attempt == COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * 2**attempt)


def register_tables(
    spark: SparkSession, root: str, schema_name: str, tables: list[str]
) -> list[str]:
    """``CREATE TABLE IF NOT EXISTS NAME.<table> USING DELTA LOCATION ...`` for each table.

    Needs Delta's extension and catalog in the session. The registration lasts as long as
    the session's catalog does: Spark's built-in catalog forgets it with the session, a
    cluster's metastore (Hive, Unity Catalog, Glue) keeps it.
    """
    if not can_write_delta(spark):
        raise DeltaUnavailableError(
            f"--catalog-schema {schema_name}: the session has no Delta extension to register"
            " tables with (use --writer delta-spark or a session with Delta)"
        )
    base = absolute_root(root)
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema_name}")
    names = []
    for table in tables:
        location = f"{base}/{table}".replace("'", "\\'")
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {schema_name}.{table} USING DELTA LOCATION '{location}'"
        )
        names.append(f"{schema_name}.{table}")
    return names
