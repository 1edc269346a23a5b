"""Output tables as Delta Lake tables, one folder each under the output root.

Two writers behind one seam (``open_output``):

* ``DeltaRsOutput`` (default, and the only one that runs here): Spark executors write the
  rows as Parquet files into the table folder; delta-rs then commits those files in one
  transaction that replaces the run's partition (``mode="overwrite"`` with a partition
  filter on ``run_id``). Nothing proportional to the data passes through the driver,
  only the list of files. The offsets table, one row per queue and topic, is merged.
  The driver lists files the executors wrote, so it counts the rows in what it found
  against the rows the executors counted while writing and commits nothing when they
  differ (``RowsNotCommittedError``): on a cluster whose output root is not shared
  storage it would otherwise commit empty tables (docs/cluster.md).
* ``DeltaSparkOutput``: for sessions that have Delta's JVM extension (a cluster with
  delta-spark); the same semantics with ``replaceWhere`` and ``DeltaTable.merge``.

Every table is partitioned by ``run_id``: a rerun of a round atomically replaces exactly
its own rows, and other runs' rows stay. Tables are created when absent, with the
schemas of ``schemas.outputs``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import operator
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.schema import Field
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors import WRITERS
from connectors.arrow import to_arrow_schema
from connectors.errors import InputError
from schemas.outputs import CONSUME_OFFSETS_TABLE

PARTITION_COLUMN = "run_id"
IVY_DIR_ENV = "RMQ_RECONCILE_IVY_DIR"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
LOCK_NAME = ".rmq-txn-reconcile.lock"
# Set on every table at creation by both writers, so that either can write what the other
# created: no deletion vectors and classic checkpoints keep the protocol at reader 1 /
# writer 2, the features delta-rs and delta-spark both write (the schemas have no
# timestamp-without-time-zone column either: times are epoch-ms longs).
TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false", "delta.checkpointPolicy": "classic"}
OFFSETS_MERGE_KEYS = ("run_id", "broker", "topic", "queue_id")
COMMIT_ATTEMPTS = 8
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class RowsNotCommittedError(RuntimeError):
    """The driver found fewer (or more) rows in the staged files than the executors wrote."""


class OutputWriter(Protocol):
    def ensure_table(self, table: str, schema: T.StructType) -> None: ...

    def replace_run(
        self, table: str, frame: DataFrame, schema: T.StructType, run_id: str
    ) -> int: ...

    def merge_offsets(self, frame: DataFrame, schema: T.StructType) -> int: ...


class DeltaUnavailableError(InputError):
    """delta-spark was asked for and the session cannot write Delta tables (exit code 2)."""


# -- Delta's JVM side: the one place its Maven coordinate is derived --------------------------


def scala_binary_version() -> str:
    """The Scala binary version of the installed pyspark (from its bundled scala-library jar)."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    for jar in jars.glob("scala-library-*.jar"):
        match = re.fullmatch(r"scala-library-(\d+\.\d+)\.\d+\.jar", jar.name)
        if match:
            return match.group(1)
    return "2.13"  # every pyspark 4.x is built with Scala 2.13


def delta_spark_coordinate() -> str:
    """Maven coordinate of Delta's jars matching the installed pyspark and delta-spark.

    Delta 4.x publishes one artifact per Spark minor version
    (``io.delta:delta-spark_<spark major.minor>_<scala>:<delta version>``), the rule
    ``delta.pip_utils.configure_spark_with_delta_pip`` applies. Every user of the
    coordinate (session, ``make package``, README check, tests) calls this function, so a
    version bump cannot leave a stale one behind.
    """
    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta_version = importlib.metadata.version("delta-spark")
    return f"io.delta:delta-spark_{spark_minor}_{scala_binary_version()}:{delta_version}"


def ivy_dir() -> Path:
    """Spark's jar cache (Ivy) for Delta's jars: fetched once, reused by every later start."""
    configured = os.environ.get(IVY_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "rmq-txn-reconcile" / "ivy"


def delta_session_conf() -> dict[str, str]:
    """Settings that give a new session Delta's extension (jars resolved through Ivy)."""
    return {
        "spark.jars.packages": delta_spark_coordinate(),
        "spark.jars.ivy": str(ivy_dir()),
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
    }


def _delta_error(exc: Exception) -> bool:
    """Delta's own answer for an absent table (as opposed to a parse or lookup error)."""
    text = str(exc)
    return "DELTA_" in text or "is not a Delta table" in text


def can_write_delta(spark: SparkSession) -> bool:
    """Capability probe: does this session have Delta's data source *and* its SQL extension?

    Some platforms build Delta in without naming it in ``spark.sql.extensions``, so the
    probe asks Spark instead of reading settings, on a path that does not exist (no job
    runs, nothing is written): reading ``format("delta")`` finds the data source only with
    Delta's jars (else ``DATA_SOURCE_NOT_FOUND``), and ``DESCRIBE HISTORY delta.`<path>```
    parses only with its extension (which the catalog registration and ``DeltaTable``
    commands need): Delta answers it with its own "not a Delta table" error.
    """
    probe = f"/rmq-txn-reconcile-probe-{uuid.uuid4().hex}/absent"
    try:  # first the data source: without Delta's jars this fails quietly (no SQL error log)
        _ = spark.read.format("delta").load(probe).schema
    except Exception as exc:  # the class differs between classic and Connect sessions
        if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find the data source" in str(exc):
            return False
    try:
        spark.sql(f"DESCRIBE HISTORY delta.`{probe}`").collect()
    except Exception as exc:
        return _delta_error(exc)
    return True


def choose_writer(spark: SparkSession, writer: str = "auto") -> str:
    """``delta-spark`` or ``delta-rs`` for ``writer`` (auto|delta-spark|delta-rs).

    Raises:
        DeltaUnavailableError: ``delta-spark`` asked for and the session has no Delta.
    """
    if writer not in WRITERS:
        raise InputError(f"writer must be one of {', '.join(WRITERS)}: {writer}")
    if writer == "delta-rs":
        return writer
    if can_write_delta(spark):
        return "delta-spark"
    if writer == "delta-spark":
        raise DeltaUnavailableError(
            f"--writer delta-spark: this Spark session cannot load Delta's extension"
            f" ({delta_spark_coordinate()} with {DELTA_EXTENSION}); give spark-submit"
            f" --packages {delta_spark_coordinate()} or use --writer delta-rs"
        )
    return "delta-rs"


def open_output(
    spark: SparkSession, root: str | os.PathLike[str], writer: str = "auto"
) -> OutputWriter:
    """The writer for this session (see ``choose_writer``)."""
    if choose_writer(spark, writer) == "delta-spark":
        return DeltaSparkOutput(spark, str(root))
    return DeltaRsOutput(spark, Path(root))


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
    folder = local_root(root)
    base = folder.resolve().as_posix() if folder is not None else root.rstrip("/")
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema_name}")
    names = []
    for table in tables:
        location = f"{base}/{table}".replace("'", "\\'")
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {schema_name}.{table} USING DELTA LOCATION '{location}'"
        )
        names.append(f"{schema_name}.{table}")
    return names


# -- commits to local roots -------------------------------------------------------------------


def local_root(root: str) -> Path | None:
    """The directory of a local output root (plain path or file: URI), else None."""
    if root.startswith("file:"):
        return Path(re.sub(r"^file:(//)?", "", root))
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", root):
        return None  # s3://, abfss://, hdfs://: the store's own commit protocol applies
    return Path(root)


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


def partition_folder(run_id: str) -> str:
    """A folder name for a run's files. Delta readers take partition values from the log,
    not from paths, so the folder only needs to be a safe, stable, readable name."""
    safe = _SAFE.sub("_", run_id)
    if safe != run_id:
        safe = f"{safe}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"
    return f"{PARTITION_COLUMN}={safe}"


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
                    partition_by=[PARTITION_COLUMN],
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
        # Counted by the executors while they write (same pass, no second job).
        written = Observation(f"rows written to {table}")
        frame.select(*data_columns).observe(written, F.count(F.lit(1)).alias("rows")).write.mode(
            "errorifexists"
        ).parquet(str(staging))
        actions, rows = self._add_actions(path, staging, run_id)
        check_committed_rows(table, written.get["rows"], rows, staging)

        def commit() -> None:
            table = DeltaTable(str(path))
            table.create_write_transaction(
                actions,
                mode="overwrite",
                schema=table.schema(),
                partition_by=[PARTITION_COLUMN],
                partition_filters=[(PARTITION_COLUMN, "=", run_id)],
                commit_properties=CommitProperties(custom_metadata={"run_id": run_id}),
            )

        with commit_lock(str(self.root)):
            _retry(commit)
        for leftover in staging.iterdir():  # Spark's _SUCCESS and .crc side files
            if not leftover.name.endswith(".parquet"):
                leftover.unlink(missing_ok=True)
        return rows

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

    def merge_offsets(self, frame: DataFrame, schema: T.StructType) -> int:
        """Upsert the offsets rows keyed by (run_id, broker, topic, queue_id).

        The frame has one row per queue and topic (not per record), so it is brought to
        the driver as Arrow; delta-rs merges it.
        """
        source = pa.table(frame.toArrow()).cast(to_arrow_schema(schema))
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
        folder = local_root(root)
        # Delta reads a relative path ("out/bad_records") as a table name and refuses it: a
        # local root is made absolute against the driver's working directory, as delta-rs does.
        self.root = folder.resolve().as_posix() if folder is not None else root.rstrip("/")

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
                    .partitionedBy(PARTITION_COLUMN)
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
        token = _commit_token(run_id)
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

    def merge_offsets(self, frame: DataFrame, schema: T.StructType) -> int:
        """Upsert the offsets rows keyed by (run_id, broker, topic, queue_id)."""
        from delta.tables import DeltaTable as SparkDeltaTable

        location = self.table_location(CONSUME_OFFSETS_TABLE)
        same_key = [F.col(f"t.{key}") == F.col(f"s.{key}") for key in OFFSETS_MERGE_KEYS]
        condition = functools.reduce(operator.and_, same_key)
        source = conform(frame, schema).alias("s")
        token = _commit_token(str(uuid.uuid4()))

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


def _commit_token(label: str) -> str:
    """A unique marker for one commit's ``userMetadata`` (readable: it names the run)."""
    return json.dumps({"writer": "rmq-txn-reconcile", "run": label, "commit": uuid.uuid4().hex})


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
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


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
