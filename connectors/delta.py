"""Output tables as Delta Lake tables, one folder each under the output root.

Two writers behind one seam (``open_output``):

* ``DeltaRsOutput`` (default, and the only one that runs here; ``connectors.delta_rs``):
  Spark executors write Parquet files, delta-rs commits them in one transaction that
  replaces the run's partition; the offsets table is merged. The driver checks the rows it
  finds against the rows the executors wrote before it commits (docs/cluster.md).
* ``DeltaSparkOutput`` (``connectors.delta_spark``): for sessions that have Delta's JVM
  extension (a cluster with delta-spark); the same semantics with ``replaceWhere`` and
  ``DeltaTable.merge``.

Every table is partitioned by ``run_id``: a rerun of a round atomically replaces exactly
its own rows, and other runs' rows stay. Tables are created when absent, with the
schemas of ``schemas.outputs``. What both writers agree on (partitioning, table
properties, the commit lock of a local root) is in ``connectors.delta_commit``; Delta's
jars, session settings and the capability probe in ``connectors.delta_jars``. This module
re-exports their names: callers import the writers from one place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from connectors.delta_commit import (
    COMMIT_ATTEMPTS,
    LOCK_NAME,
    MERGED_TABLES,
    OFFSETS_MERGE_KEYS,
    PARTITION_COLUMN,
    TABLE_PROPERTIES,
    commit_lock,
    local_root,
)
from connectors.delta_jars import (
    DELTA_CATALOG,
    DELTA_EXTENSION,
    IVY_DIR_ENV,
    DeltaUnavailableError,
    can_write_delta,
    choose_writer,
    delta_session_conf,
    delta_spark_coordinate,
    ivy_dir,
    scala_binary_version,
)
from connectors.delta_rs import (
    DeltaRsOutput,
    RowsNotCommittedError,
    check_committed_rows,
    partition_folder,
)
from connectors.delta_spark import DeltaSparkOutput, conform, register_tables

__all__ = [
    "COMMIT_ATTEMPTS",
    "DELTA_CATALOG",
    "DELTA_EXTENSION",
    "IVY_DIR_ENV",
    "LOCK_NAME",
    "MERGED_TABLES",
    "OFFSETS_MERGE_KEYS",
    "PARTITION_COLUMN",
    "TABLE_PROPERTIES",
    "DeltaRsOutput",
    "DeltaSparkOutput",
    "DeltaUnavailableError",
    "OutputWriter",
    "RowsNotCommittedError",
    "can_write_delta",
    "check_committed_rows",
    "choose_writer",
    "commit_lock",
    "conform",
    "delta_session_conf",
    "delta_spark_coordinate",
    "ivy_dir",
    "local_root",
    "open_output",
    "partition_folder",
    "register_tables",
    "scala_binary_version",
]


class OutputWriter(Protocol):
    def ensure_table(self, table: str, schema: T.StructType) -> None: ...

    def replace_run(
        self, table: str, frame: DataFrame, schema: T.StructType, run_id: str
    ) -> int: ...

    def replace_run_rows(
        self, table: str, rows: pa.Table, schema: T.StructType, run_id: str
    ) -> int: ...

    def merge_offsets(self, rows: pa.Table, schema: T.StructType) -> int: ...

    def merge_rows(
        self, table: str, frame: DataFrame, schema: T.StructType, metadata: str | None = None
    ) -> int: ...


def open_output(
    spark: SparkSession, root: str | os.PathLike[str], writer: str = "auto"
) -> OutputWriter:
    """The writer for this session (see ``choose_writer``)."""
    if choose_writer(spark, writer) == "delta-spark":
        return DeltaSparkOutput(spark, str(root))
    return DeltaRsOutput(spark, Path(root))
