"""Settings of the test suites' own sessions (not the job's)."""

from __future__ import annotations

from pyspark.sql import SparkSession

# Expressions interpreted, not compiled: the suite runs thousands of small queries over a
# few rows each, and compiling their generated Java was a fifth of each whole run's wall
# time (a warm run of the fault store: 17.6 s compiled, 14.3 s interpreted; docs/decisions.md).
# Results do not depend on it. The job keeps Spark's code generation: every suite that starts
# it as a process (make test-processes, test-notebook, test-cluster, the command-line rounds
# of the real-broker comparison, delta-spark's spark-submit runs) runs compiled code.
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


def interpret_expressions(session: SparkSession) -> None:
    """Switch a test session to interpreted expressions (``INTERPRETED``)."""
    for key, value in INTERPRETED.items():
        session.conf.set(key, value)
