"""One SparkSession for the whole suite (chispa style): local[2], UI off, few shuffle partitions, UTC."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.session_settings import interpret_expressions

# Python workers must run this interpreter (the venv's), not the system python3.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    active = SparkSession.getActiveSession()
    if active is not None:  # a notebook or another harness already owns a session
        yield active
        return
    from jobs.session import build_session

    # Adaptive execution off: results do not depend on it, and on tiny frames it costs a
    # Spark job per stage (96 instead of 37 jobs for a small round). The heap of a local
    # run of the job (4 GiB, conf/default.toml): the in-process command-line tests run
    # whole rounds (with the anomaly rules, the discard history and earlier runs' history)
    # in this one JVM, where the JVM's default of 1 GiB ran out of execution memory in an
    # aggregate.
    session = build_session(
        app_name="rmq-txn-reconcile-tests",
        master="local[2]",
        shuffle_partitions=2,
        adaptive=False,
        driver_memory="4g",
    )
    interpret_expressions(session)
    yield session
    session.stop()


@pytest.fixture(autouse=True, scope="module")
def _forget_cached_frames() -> Iterator[None]:
    """Drop what a module's tests left cached (tests call the round with the job's
    materializer and do not release it). The cache manager keeps every persisted frame's
    whole plan and matches each new plan against all of them: 60 rounds' worth filled the
    4 GiB heap, and the suite spent its time in full garbage collections. The job releases
    its own frames, which ``tests/jobs/test_cli.py`` asserts."""
    yield
    active = SparkSession.getActiveSession()
    if active is not None:
        active.catalog.clearCache()
