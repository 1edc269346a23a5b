"""Build the SparkSession for the command line and tests. Notebooks pass their own.

A session is classic (this process runs the driver's JVM, or spark-submit's) or a Spark
Connect client (``--remote sc://HOST:PORT`` or ``SPARK_REMOTE``: the driver is a server
elsewhere, and this process has no JVM and no ``sparkContext``). What the job needs of
the driver beyond DataFrames has one function that works on both: here ``label_phase`` /
``clear_phase_label`` and ``probe_workers`` (which also ships the job's code to a Connect
server, ``ship_code``); ``connectors.connect`` has ``is_connect`` and ``default_parallelism``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.connect import is_connect
from connectors.errors import InputError

_LOG4J = Path(__file__).resolve().parent.parent / "conf" / "log4j2.properties"


def build_session(
    app_name: str = "rmq-txn-reconcile",
    master: str | None = None,
    shuffle_partitions: int | None = None,
    verbose: bool = False,
    adaptive: bool = True,
    driver_memory: str | None = None,
    delta: bool = False,
    remote: str | None = None,
) -> SparkSession:
    """Return a session configured for this job (UTC, no UI in local mode, quiet logs).

    ``remote`` (or, when not given, ``SPARK_REMOTE`` as PySpark reads it): a Spark Connect
    client of that server instead (``connect_session``); ``master``, ``driver_memory`` and
    ``delta`` are the server's own business then.

    ``master`` is only set when given, so that ``spark-submit --master ...`` wins on a
    cluster. Python workers run this interpreter unless PYSPARK_PYTHON says otherwise.
    ``delta=True`` adds Delta's extension and catalog, and (when this call starts the JVM)
    Delta's jars resolved through the project's Ivy cache (``connectors.delta.ivy_dir``):
    fetched from Maven Central once, then started from the cache. Under ``spark-submit``
    the jars come from its ``--packages``; a failure to start the JVM is raised as
    ``DeltaUnavailableError``.
    """
    remote = remote or os.environ.get("SPARK_REMOTE")
    if remote:
        return connect_session(remote, app_name, shuffle_partitions, adaptive)
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
    builder = _sql_settings(builder, shuffle_partitions, adaptive)
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


# -- Spark Connect --------------------------------------------------------------------------

CONNECT_TIMEOUT_S = 20  # how long the first contact with a Connect server may take


class ConnectUnreachableError(RuntimeError):
    """No Spark Connect server answers at the URL (exit 1, one line)."""


def check_remote_url(url: str, source: str = "--remote") -> str:
    """``url`` when it is a Spark Connect URL (``sc://HOST[:PORT][/;name=value...]``, the
    form PySpark parses), else an ``InputError`` naming what is wrong (before Spark starts)."""
    from pyspark.sql.connect.client import DefaultChannelBuilder

    try:
        DefaultChannelBuilder(url)
    except Exception as exc:  # PySparkValueError, or ValueError for a port that is no number
        params = getattr(exc, "getMessageParameters", lambda: None)() or {}
        reason = params.get("detail") or str(exc).splitlines()[0]
        raise InputError(
            f"{source} {url}: not a Spark Connect URL (sc://HOST[:PORT][/;name=value...]): {reason}"
        ) from None
    return url


def remote_url(configured: str) -> str:
    """The Spark Connect server to run on: ``configured`` (``--remote``, or ``remote`` of
    ``--conf``), else ``SPARK_REMOTE``; "" for a classic session. A malformed URL is an
    ``InputError`` (exit 2, before Spark starts); ``SPARK_REMOTE=local...`` (PySpark starts
    a Connect server of its own) passes as PySpark takes it."""
    if configured:
        return check_remote_url(configured)
    from_env = os.environ.get("SPARK_REMOTE", "")
    if from_env and not from_env.startswith("local"):
        check_remote_url(from_env, "SPARK_REMOTE")
    return from_env


@contextlib.contextmanager
def own_connect_session(
    url: str, shuffle_partitions: int | None = None, verbose: bool = False, adaptive: bool = True
) -> Iterator[SparkSession]:
    """A Connect session of the command line's own (``build_session``), released on the
    server when the run ends: a warm server shared by scheduled runs keeps none of their
    sessions, nor their caches and shipped code."""
    spark = build_session(
        remote=url, shuffle_partitions=shuffle_partitions, verbose=verbose, adaptive=adaptive
    )
    try:
        yield spark
    finally:
        with contextlib.suppress(Exception):  # the run's own outcome is what is reported
            spark.stop()


def connect_session(
    url: str,
    app_name: str = "rmq-txn-reconcile",
    shuffle_partitions: int | None = None,
    adaptive: bool = True,
) -> SparkSession:
    """A Spark Connect client session of the server at ``url``, with the job's session
    settings (the server keeps its own master, memory, logging and jars). A server that does
    not answer within ``CONNECT_TIMEOUT_S`` is one ``ConnectUnreachableError`` instead of
    the client's minutes of retries."""
    if url.startswith("sc://"):
        _wait_for_server(url)
    builder = (
        SparkSession.builder.remote(url)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    return _sql_settings(builder, shuffle_partitions, adaptive).getOrCreate()


def _wait_for_server(url: str) -> None:
    import grpc  # type: ignore[import-untyped]  # grpcio ships no type information
    from pyspark.sql.connect.client import DefaultChannelBuilder

    channel = DefaultChannelBuilder(url).toChannel()
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        raise ConnectUnreachableError(
            f"Spark Connect server {url} unreachable: no answer within {CONNECT_TIMEOUT_S} s"
        ) from None
    finally:
        channel.close()


# What travels to a Connect server's Python workers: the zip ``make package`` builds.
_SHIPPED: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def ship_code(spark: SparkSession) -> None:
    """Give a Connect session's Python workers this checkout's packages (the readers run
    there): the zip of ``make package``, added to the session as a Python file
    (``addArtifacts(..., pyfile=True)``: first on the workers' path, for this session only).
    Once per session; nothing on a classic session, whose workers get the code from
    spark-submit's ``--py-files`` or the driver's environment."""
    from jobs.package import PACKAGES, ROOT, ZIP_NAME, write_archive

    if not is_connect(spark) or spark in _SHIPPED:
        return
    if not all((ROOT / package).is_dir() for package in PACKAGES):
        return  # run from a zip itself: the server must have the code (docs/connect.md)
    with tempfile.TemporaryDirectory(prefix="rmq-txn-reconcile-ship-") as folder:
        archive = Path(folder) / ZIP_NAME
        write_archive(archive)
        spark.addArtifacts(str(archive), pyfile=True)
    _SHIPPED.add(spark)


def _sql_settings(
    builder: SparkSession.Builder, shuffle_partitions: int | None, adaptive: bool
) -> SparkSession.Builder:
    if not adaptive:
        # Small reads and tests: tiny frames, where adaptive execution only adds a Spark
        # job per stage. Nor is a join broadcast on Spark's estimate: a broadcast is a job
        # of its own, a shuffle one more stage of the query's one job.
        builder = builder.config("spark.sql.adaptive.enabled", "false")
        builder = builder.config("spark.sql.autoBroadcastJoinThreshold", "-1")
    if shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    return builder


# G1's region size in a local driver. The default for a 4 GiB heap is 2 MiB, and an object
# of half a region or more is "humongous": it takes whole regions of its own, and G1
# moves none of them. Spark's in-memory cache holds its column buffers in arrays of about
# 1 MiB, so a large store's cache fills nearly all of the heap's regions with humongous
# arrays (about half of it live data), and the read dies "Java heap space" (docs/decisions.md).
# With 32 MiB regions those arrays are ordinary objects (Spark's tuning guide gives the same
# advice for large heaps).
G1_REGION = "-XX:G1HeapRegionSize=32m"

# How much of a local driver's heap G1 keeps committed once a collection has freed it: at
# most 30 % of it free, and at least 10 %. With Java's defaults (70 % and 40 %) the heap
# stays near the high-water mark of the run's busiest phase to its end, beside the Python
# workers and the driver's Python process (its Delta merges), which need memory of their
# own. With these, G1 gives pages back when a concurrent cycle or a full collection ends
# (JEP 346), so the JVM holds about what the run is using (docs/decisions.md).
HEAP_FREE = ("-XX:MinHeapFreeRatio=10", "-XX:MaxHeapFreeRatio=30")


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
    return builder, [G1_REGION, *HEAP_FREE]


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


_REPORT = T.StructType(
    [
        T.StructField("major", T.IntegerType()),
        T.StructField("minor", T.IntegerType()),
        T.StructField("executable", T.StringType()),
        T.StructField("problem", T.StringType()),
    ]
)


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
    ship_code(spark)  # a Connect server's workers get the code with the session
    # One row, one partition: one worker's report comes back. A plain (pickled, not Arrow)
    # Python function: it runs, and reports, where pyarrow is missing; a DataFrame, not an
    # RDD, so that a Spark Connect session runs it too.
    report = F.udf(_worker_report_function(), _REPORT, useArrow=False)
    try:
        row = spark.range(0, 1, 1, 1).select(report("id").alias("report")).first()
    except Exception as exc:
        raise WorkerEnvironmentError(
            f"the Python workers cannot run the job: {_first_line_about_python(str(exc))}; {hint}"
        ) from None
    assert row is not None  # one row
    major, minor, executable, problem = row["report"]
    if f"{major}.{minor}" != driver:
        problem = f"they run Python {major}.{minor}, the driver {driver}"
    if problem is not None:
        raise WorkerEnvironmentError(
            f"the Python workers ({executable}) cannot run the job: {problem}; {hint}"
        )
    _WORKERS_OK.add(spark)


# -- labels of the Spark jobs -----------------------------------------------------------------

# The label each Connect session carries now (a tag of its own, replaced by the next).
_LABELS: weakref.WeakKeyDictionary[SparkSession, str] = weakref.WeakKeyDictionary()


def label_phase(spark: SparkSession, text: str) -> None:
    """Label the Spark jobs this thread starts from now on: a classic session's job
    description (the Spark UI and the event log show it); a Connect session's operation tag
    (its jobs carry it among their tags in the server's UI; ``spark.interruptTag`` stops them)."""
    if not is_connect(spark):
        spark.sparkContext.setJobDescription(text)
        return
    clear_phase_label(spark)
    spark.addTag(text.replace(",", ";"))  # a tag holds no comma
    _LABELS[spark] = text.replace(",", ";")


def clear_phase_label(spark: SparkSession) -> None:
    """The jobs that follow carry no label of ``label_phase``."""
    if not is_connect(spark):
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]  # clears it
        return
    label = _LABELS.pop(spark, None)
    if label is not None:
        spark.removeTag(label)


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
