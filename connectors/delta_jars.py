"""Delta's JVM side: the one place its Maven coordinate is derived, the session settings
that load it, and the probe that tells whether a session can write Delta (which picks the
writer, ``choose_writer``)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import uuid
import weakref
from pathlib import Path

from pyspark.sql import SparkSession

from connectors import WRITERS
from connectors.errors import InputError

IVY_DIR_ENV = "RMQ_RECONCILE_IVY_DIR"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_SOURCE = "org.apache.spark.sql.delta.sources.DeltaDataSource"


class DeltaUnavailableError(InputError):
    """delta-spark was asked for and the session cannot write Delta tables (exit code 2)."""


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


# A session's jars and extensions are fixed when it starts: one probe per session (a run
# asks up to three times: the writer check, the run's facts, the writer itself).
_PROBED: weakref.WeakKeyDictionary[SparkSession, bool] = weakref.WeakKeyDictionary()


def can_write_delta(spark: SparkSession) -> bool:
    """Capability probe: does this session have Delta's data source *and* its SQL extension?
    Asked once per session (``_PROBED``).

    Some platforms build Delta in without naming it in ``spark.sql.extensions``, so the
    probe asks Spark instead of reading settings, on a path that does not exist (no job
    runs, nothing is written): reading ``format("delta")`` finds the data source only with
    Delta's jars (else ``DATA_SOURCE_NOT_FOUND``), and ``DESCRIBE HISTORY delta.`<path>```
    parses only with its extension (which the catalog registration and ``DeltaTable``
    commands need): Delta answers it with its own "not a Delta table" error.
    """
    if spark not in _PROBED:
        _PROBED[spark] = _probe_delta(spark)
    return _PROBED[spark]


def _probe_delta(spark: SparkSession) -> bool:
    if _delta_classes_absent(spark):
        return False
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


def _delta_classes_absent(spark: SparkSession) -> bool:
    """True when a classic session's driver cannot load Delta's data source class.

    The common case (no Delta jars: the delta-rs writer) is answered by one JVM call
    instead of resolving ``format("delta")``, which loads every registered data source
    first (a noticeable share of a small run). False when unsure (a Connect session has no
    JVM here, or the call fails): the full probe decides.
    """
    try:
        jvm = spark._jvm
        if jvm is None:  # no driver JVM in this process
            return False
        return not jvm.org.apache.spark.util.Utils.classIsLoadable(DELTA_SOURCE)
    except Exception:  # Connect sessions raise on _jvm; any other failure: ask Spark
        return False


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
