"""The Delta capability probe (connectors/delta_jars.py) on the shared session, which has no
Delta jars: the quick class check and Spark's own answer agree (the session of the Delta
suite, with the jars, is checked in tests/delta/test_writers.py)."""

from __future__ import annotations

from unittest import mock

from pyspark.sql import SparkSession

from connectors import delta_jars


def test_a_session_without_delta_jars_cannot_write_delta(spark: SparkSession) -> None:
    assert delta_jars._delta_classes_absent(spark)
    assert delta_jars._probe_delta(spark) is False


def test_spark_itself_gives_the_same_answer_as_the_class_check(spark: SparkSession) -> None:
    # What a Connect session (no JVM in Python) goes through: the data source lookup.
    with mock.patch.object(delta_jars, "_delta_classes_absent", return_value=False):
        assert delta_jars._probe_delta(spark) is False
