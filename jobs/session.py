"""Build the SparkSession for the command line and tests. Notebooks pass their own."""

from __future__ import annotations

import os
import sys
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
) -> SparkSession:
    """Return a session configured for this job (UTC, no UI in local mode, quiet logs).

    ``master`` is only set when given, so that ``spark-submit --master ...`` wins on a
    cluster. Python workers run this interpreter unless PYSPARK_PYTHON says otherwise.
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
    if master and master.startswith("local"):
        builder = builder.config("spark.ui.enabled", "false")
    if not adaptive:
        # Tests: tiny frames, where adaptive execution only adds a Spark job per stage.
        builder = builder.config("spark.sql.adaptive.enabled", "false")
    if driver_memory and master and master.startswith("local"):
        # Local mode runs everything in the driver's JVM: its heap holds the cached records.
        # Only effective when this call starts the JVM (not in a running notebook session).
        builder = builder.config("spark.driver.memory", driver_memory)
    if shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if not verbose and _LOG4J.exists():
        # The driver's JVM only (effective when this call starts it): the file is on the
        # driver's disk, and executors elsewhere keep the cluster's own logging options.
        opt = f"-Dlog4j2.configurationFile=file:{_LOG4J}"
        builder = builder.config("spark.driver.extraJavaOptions", opt)
    session = builder.getOrCreate()
    if not verbose:
        session.sparkContext.setLogLevel("ERROR")
    return session
