"""Build the SparkSession for the command line and tests. Notebooks pass their own."""

from __future__ import annotations

import os
import sys
import weakref
from pathlib import Path

from pyspark.sql import SparkSession

_LOG4J = Path(__file__).resolve().parent.parent / "conf" / "log4j2.properties"


def build_session(
    app_name: str = "rmq-txn-reconcile",
    master: str | None = None,
    shuffle_partitions: int | None = None,
    verbose: bool = False,
    adaptive: bool = True,
    driver_memory: str | None = None,
    delta: bool = False,
) -> SparkSession:
    """Return a session configured for this job (UTC, no UI in local mode, quiet logs).

    ``master`` is only set when given, so that ``spark-submit --master ...`` wins on a
    cluster. Python workers run this interpreter unless PYSPARK_PYTHON says otherwise.
    ``delta=True`` adds Delta's extension and catalog, and (when this call starts the JVM)
    Delta's jars resolved through the project's Ivy cache (``connectors.delta.ivy_dir``):
    fetched from Maven Central once, then started from the cache. Under ``spark-submit``
    the jars come from its ``--packages``; a failure to start the JVM is raised as
    ``DeltaUnavailableError``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Notebooks run many rounds in one session: keep the UI's query history small.
        .config("spark.sql.ui.retainedExecutions", "20")
    )
    builder, java_options = _local_settings(builder, master, driver_memory)
    if not adaptive:
        # Tests: tiny frames, where adaptive execution only adds a Spark job per stage.
        builder = builder.config("spark.sql.adaptive.enabled", "false")
    if shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if not verbose and _LOG4J.exists():
        # The driver's JVM only (effective when this call starts it): the file is on the
        # driver's disk, and executors elsewhere keep the cluster's own logging options.
        java_options.append(f"-Dlog4j2.configurationFile=file:{_LOG4J}")
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
    if delta:
        from connectors.delta import delta_session_conf

        for key, value in delta_session_conf().items():
            builder = builder.config(key, value)
        if master and master.startswith("local"):
            # Delta rebuilds a table's state from its log in 50 partitions by default: on a
            # few local cores that is most of each commit's time for tables of this size.
            builder = builder.config(
                "spark.databricks.delta.snapshotPartitions", str(shuffle_partitions or 4)
            )
        return _start(builder, verbose)
    session = builder.getOrCreate()
    if not verbose:
        session.sparkContext.setLogLevel("ERROR")
    return session


# G1's region size in a local driver. The default for a 4 GiB heap is 2 MiB, and an object
# of half a region or more is "humongous": it takes whole regions of its own, and G1
# moves none of them. Spark's in-memory cache holds its column buffers in arrays of about
# 1 MiB, so a large store's cache fills nearly all of the heap's regions with humongous
# arrays (about half of it live data), and the read dies "Java heap space" (docs/decisions.md).
# With 32 MiB regions those arrays are ordinary objects (Spark's tuning guide gives the same
# advice for large heaps).
G1_REGION = "-XX:G1HeapRegionSize=32m"


def _local_settings(
    builder: SparkSession.Builder, master: str | None, driver_memory: str | None
) -> tuple[SparkSession.Builder, list[str]]:
    """Settings that only make sense when the driver's JVM runs the whole job, and the
    driver's Java options they need."""
    if not (master and master.startswith("local")):
        return builder, []
    builder = builder.config("spark.ui.enabled", "false")
    if driver_memory:
        # Local mode runs everything in the driver's JVM: its heap holds the cached records.
        # Only effective when this call starts the JVM (not in a running notebook session).
        builder = builder.config("spark.driver.memory", driver_memory)
    return builder, [G1_REGION]


# What the Python workers must be able to import: the readers and transforms run there.
WORKER_MODULES = ("pyarrow", "jobs.reconcile", "transforms.round", "connectors.rocketmq.reader")


class WorkerEnvironmentError(RuntimeError):
    """The Python workers cannot run the job (wrong Python, missing pyarrow or modules)."""


def _worker_report_function():
    """The probe task, defined locally so that it travels to the worker by value: it must
    run even where this project's modules cannot be imported (that is what it checks)."""

    def report(_: object, modules: tuple[str, ...] = WORKER_MODULES) -> tuple:
        import importlib
        import sys as worker_sys

        problem = None
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # any failure to import is the answer
                problem = f"cannot import {module} ({type(exc).__name__}: {exc})"
                break
        version = worker_sys.version_info
        return version[0], version[1], worker_sys.executable, problem

    return report


def _first_line_about_python(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "PYTHON_VERSION_MISMATCH" in line or "different version" in line:
            return line
    return lines[0] if lines else "the probe task failed"


# Sessions whose workers passed the probe: their Python does not change while they run, so
# a notebook or test session that runs the job many times probes once.
_WORKERS_OK: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def probe_workers(spark: SparkSession) -> None:
    """One tiny task before the heavy work: the Python workers import pyarrow and the job's
    modules with the driver's Python major.minor (workers on a cluster may run another
    Python). Raises ``WorkerEnvironmentError`` with one clear line instead of a long worker
    traceback in the middle of the read. Once per session when it passes (``_WORKERS_OK``)."""
    if spark in _WORKERS_OK:
        return
    driver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    hint = (
        f"set PYSPARK_PYTHON to a Python {driver} with pyarrow and this project installed"
        f" (the driver runs {sys.executable}) before the session starts"
    )
    try:
        # One element, one partition: one worker's report comes back.
        rows = spark.sparkContext.parallelize([0], 1).map(_worker_report_function()).collect()
    except Exception as exc:
        raise WorkerEnvironmentError(
            f"the Python workers cannot run the job: {_first_line_about_python(str(exc))}; {hint}"
        ) from None
    major, minor, executable, problem = rows[0]
    if f"{major}.{minor}" != driver:
        problem = f"they run Python {major}.{minor}, the driver {driver}"
    if problem is not None:
        raise WorkerEnvironmentError(
            f"the Python workers ({executable}) cannot run the job: {problem}; {hint}"
        )
    _WORKERS_OK.add(spark)


def _start(builder: SparkSession.Builder, verbose: bool) -> SparkSession:
    """Start a session with Delta's jars; a JVM that cannot resolve them is one clear error."""
    from pyspark.errors import PySparkRuntimeError

    from connectors.delta import DeltaUnavailableError, delta_spark_coordinate, ivy_dir

    try:
        session = builder.getOrCreate()
    except PySparkRuntimeError as exc:  # JAVA_GATEWAY_EXITED: Ivy could not resolve the jars
        raise DeltaUnavailableError(
            f"Delta's jars ({delta_spark_coordinate()}) could not be loaded: not in the"
            f" jar cache {ivy_dir()} and not downloadable from Maven Central"
            f" ({getattr(exc, 'getErrorClass', lambda: None)() or type(exc).__name__})"
        ) from None
    if not verbose:
        session.sparkContext.setLogLevel("ERROR")
    return session
