"""The driver settings of a local run (jobs/session.py): the G1 region size the cached
records of a large store need and the free heap G1 may keep, set only where the job starts
the driver's JVM itself."""

from __future__ import annotations

from pyspark.sql import SparkSession

from jobs import session


def test_a_local_driver_gets_the_heap_options_and_a_cluster_driver_does_not() -> None:
    _, local = session._local_settings(SparkSession.builder, "local[2]", "4g")
    _, cluster = session._local_settings(SparkSession.builder, "spark://master:7077", "4g")
    assert local == [
        "-XX:G1HeapRegionSize=32m",
        "-XX:MinHeapFreeRatio=10",
        "-XX:MaxHeapFreeRatio=30",
    ]
    assert cluster == []


def test_the_shared_session_jvm_runs_with_the_heap_options(spark: SparkSession) -> None:
    # The JVM's own arguments and flags, not the setting: proof that the options reached
    # the driver and that the JVM took them.
    jvm = spark.sparkContext._jvm  # type: ignore[union-attr]
    management = jvm.java.lang.management.ManagementFactory
    assert session.G1_REGION in list(management.getRuntimeMXBean().getInputArguments())
    diagnostics = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    hotspot = management.getPlatformMXBean(diagnostics)
    ratios = ("MinHeapFreeRatio", "MaxHeapFreeRatio")
    free = {name: hotspot.getVMOption(name).getValue() for name in ratios}
    assert free == {"MinHeapFreeRatio": "10", "MaxHeapFreeRatio": "30"}
