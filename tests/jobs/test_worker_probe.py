"""The worker probe (jobs/session.py): one Spark job per session, not one per run."""

from __future__ import annotations

from pyspark.sql import SparkSession

from jobs import session


def _probe_jobs(spark: SparkSession, group: str) -> int:
    """How many Spark jobs one ``probe_workers`` call ran."""
    context = spark.sparkContext
    context.setJobGroup(group, "worker probe")
    try:
        session.probe_workers(spark)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return len(context.statusTracker().getJobIdsForGroup(group))


def test_a_session_whose_workers_passed_is_not_probed_again(spark: SparkSession) -> None:
    session._WORKERS_OK.discard(spark)  # as a new session: earlier tests may have probed it
    assert _probe_jobs(spark, "probe-first") == 1
    assert _probe_jobs(spark, "probe-again") == 0
