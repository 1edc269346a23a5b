"""The Delta suite's own session (``make test-delta``): local[2] with Delta's extension and
jars, resolved through the project's Ivy cache (``connectors.delta.ivy_dir``).

A machine that can neither reach Maven Central nor find the jars in that cache fails here
with the job's own one-line message: it is a missing prerequisite, not a skip. Every module here sets ``pytestmark = pytest.mark.delta``: plain ``make test``
deselects them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.session_settings import interpret_expressions


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from jobs.session import build_session

    session = build_session(
        app_name="rmq-txn-reconcile-delta-tests",
        master="local[2]",
        shuffle_partitions=2,
        adaptive=False,
        delta=True,
    )
    interpret_expressions(session)  # as the main suite's session (tests/conftest.py)
    yield session
    session.stop()
