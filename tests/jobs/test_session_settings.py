"""The driver settings of a local run (jobs/session.py): the G1 region size the cached
records of a large store need, set only where the job starts the driver's JVM itself."""

from __future__ import annotations

from pyspark.sql import SparkSession

from jobs import session


def test_a_local_driver_gets_the_region_size_and_a_cluster_driver_does_not() -> None:
    _, local = session._local_settings(SparkSession.builder, "local[2]", "4g")
    _, cluster = session._local_settings(SparkSession.builder, "spark://master:7077", "4g")
    assert local == [session.G1_REGION]
    assert cluster == []


def test_the_shared_session_jvm_runs_with_the_region_size(spark: SparkSession) -> None:
    # The JVM's own arguments, not the setting: proof that the option reached the driver.
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
    assert session.G1_REGION in list(runtime.getInputArguments())
