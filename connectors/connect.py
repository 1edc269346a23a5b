"""What the readers and writers ask of a session beyond DataFrames, answered for a classic
session (this process or spark-submit's runs the driver's JVM) and for a Spark Connect
client (the driver is a server elsewhere: no ``sparkContext`` here) alike."""

from __future__ import annotations

import re
import weakref

from pyspark.sql import SparkSession

# ``EXPLAIN`` of a range without a number of slices: the server plans it with its default
# parallelism (``Range (0, 1, step=1, splits=N)``) and runs no Spark job for it.
_SPLITS = re.compile(r"\bsplits=(?:Some\()?(\d+)")
_PARALLELISM: weakref.WeakKeyDictionary[SparkSession, int] = weakref.WeakKeyDictionary()


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect client session (``SparkSession.builder.remote``)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # the Connect client's own dependencies (grpcio) are not installed
        return False
    return isinstance(spark, ConnectSession)


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism: the cores of the session's cluster (local mode: its
    threads) unless ``spark.default.parallelism`` says otherwise. A Connect client reads it
    from the server once per session."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    if spark not in _PARALLELISM:
        configured = spark.conf.get("spark.default.parallelism", None)
        _PARALLELISM[spark] = int(configured) if configured else _planned_splits(spark)
    return _PARALLELISM[spark]


def _planned_splits(spark: SparkSession) -> int:
    plan = spark.sql("EXPLAIN SELECT id FROM range(1)").first()  # one row: the plan's text
    found = _SPLITS.search(plan[0]) if plan is not None else None
    return int(found.group(1)) if found else 1
