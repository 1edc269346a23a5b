"""What Spark's cache manager holds: the tests that check a run releases its frames."""

from __future__ import annotations

from pyspark.sql import SparkSession


def holds_cached_frames(spark: SparkSession) -> bool:
    """Whether any persisted frame (and so its whole plan) is still registered."""
    return not spark._jsparkSession.sharedState().cacheManager().isEmpty()
