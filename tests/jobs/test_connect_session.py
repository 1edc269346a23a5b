"""What the job asks of a session beyond DataFrames, on a classic session, and the Spark
Connect pieces that need no server (``make test-connect`` runs the job on a real one)."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.connect.shell.progress import StageInfo

from connectors.connect import default_parallelism, is_connect
from connectors.errors import InputError
from jobs.progress import Tasks, _ConnectProgress
from jobs.session import check_remote_url, clear_phase_label, label_phase


@pytest.mark.parametrize(
    "url", ["sc://localhost", "sc://spark.internal:15002", "sc://h:15002/;token=abc;use_ssl=true"]
)
def test_a_spark_connect_url_passes(url: str) -> None:
    assert check_remote_url(url) == url


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://h:15002", "must start with 'sc://'"),
        ("sc://h:port", "port"),
        ("sc://:15002", "Hostname is missing"),
        ("sc://h:15002/path", "path component"),
    ],
)
def test_a_malformed_url_is_one_input_error_line(url: str, needle: str) -> None:
    with pytest.raises(InputError) as caught:
        check_remote_url(url, "SPARK_REMOTE")

    message = str(caught.value)
    assert message.startswith(f"SPARK_REMOTE {url}: not a Spark Connect URL")
    assert needle in message and "\n" not in message


def test_a_classic_session_is_not_connect_and_answers_its_own_parallelism(
    spark: SparkSession,
) -> None:
    assert not is_connect(spark)
    assert default_parallelism(spark) == spark.sparkContext.defaultParallelism


def test_a_phase_label_is_the_classic_job_description_until_cleared(spark: SparkSession) -> None:
    context = spark.sparkContext
    label_phase(spark, "rmq-txn-reconcile: decode")
    assert context.getLocalProperty("spark.job.description") == "rmq-txn-reconcile: decode"

    clear_phase_label(spark)
    assert context.getLocalProperty("spark.job.description") is None


def _stage(stage_id: int, tasks: int, completed: int, done: bool) -> StageInfo:
    return StageInfo(
        stage_id=stage_id,
        num_tasks=tasks,
        num_completed_tasks=completed,
        num_bytes_read=0,
        done=done,
    )


def test_connect_progress_counts_the_running_stages_only() -> None:
    handler = _ConnectProgress()
    stages = [_stage(1, 4, 4, True), _stage(2, 8, 3, False), _stage(3, 2, 0, False)]

    handler(stages=stages, inflight_tasks=2, operation_id="op", done=False)
    assert handler.tasks == Tasks(done=3, total=10, stages=2)

    handler(stages=stages, inflight_tasks=0, operation_id="op", done=True)  # operation ended
    assert handler.tasks is None
