"""The merged discard_history table through the delta-spark writer: the same merge as
delta-rs (tests/connectors/test_discard_history_merge.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from connectors.delta import DeltaSparkOutput
from tests.connectors.test_discard_history_merge import (
    check_decided_view,
    check_merge,
    check_old_root_gains_search_columns,
)

pytestmark = pytest.mark.delta


def test_delta_spark_merges_discard_history(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "out"
    check_merge(spark, DeltaSparkOutput(spark, str(root)), root)


def test_delta_spark_merges_into_a_discard_history_without_the_search_columns(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "out"
    check_old_root_gains_search_columns(spark, DeltaSparkOutput(spark, str(root)), root)


def test_delta_spark_keeps_the_decided_view_in_the_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "out"
    check_decided_view(spark, DeltaSparkOutput(spark, str(root)), root)
