"""The delta-rs writer refuses to commit when the driver cannot see every row the executors
wrote (a cluster whose output root is not shared storage): a loud failure, nothing committed."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from connectors.delta import DeltaRsOutput, RowsNotCommittedError
from tests.robustness.store import read_table

SCHEMA = T.StructType([T.StructField("run_id", T.StringType()), T.StructField("n", T.LongType())])


def _frame(spark: SparkSession, rows: int):
    # Two partitions, so two Parquet files: one of them goes missing below.
    return spark.createDataFrame([("r1", i) for i in range(rows)], SCHEMA).repartition(2)


def test_rows_written_and_committed_agree(spark: SparkSession, tmp_path: Path) -> None:
    output = DeltaRsOutput(spark, tmp_path)
    output.ensure_table("t", SCHEMA)

    assert output.replace_run("t", _frame(spark, 10), SCHEMA, "r1") == 10
    assert read_table(tmp_path, "t").num_rows == 10


def test_a_file_the_driver_cannot_see_fails_the_write_and_commits_nothing(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = DeltaRsOutput(spark, tmp_path)
    output.ensure_table("t", SCHEMA)
    version = DeltaTable(str(tmp_path / "t")).version()
    listed = DeltaRsOutput._add_actions

    def without_one_file(table_path: Path, staging: Path, run_id: str):
        # What a driver without shared storage sees: an executor's file is not there.
        sorted(staging.glob("*.parquet"))[0].unlink()
        return listed(table_path, staging, run_id)

    monkeypatch.setattr(DeltaRsOutput, "_add_actions", staticmethod(without_one_file))

    with pytest.raises(RowsNotCommittedError, match=r"t: executors wrote 10 rows but the driver"):
        output.replace_run("t", _frame(spark, 10), SCHEMA, "r1")
    assert DeltaTable(str(tmp_path / "t")).version() == version
