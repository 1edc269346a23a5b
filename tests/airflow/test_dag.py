"""The example Airflow DAG parses without a database and renders the expected spark-submit.

Runs in the Airflow venv made by tests/airflow/run.sh (apache-airflow 3.3.2, the Spark
provider 6.3.4, deltalake, pyarrow), never in the project's venv.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

# In the project's venv (plain `pytest`, `make test`) there is no Airflow: this file runs in
# a venv of its own, made by tests/airflow/run.sh.
pytest.importorskip(
    "airflow.providers.apache.spark",
    reason="Airflow runs in its own venv: bash tests/airflow/run.sh",
)

REPO = Path(__file__).resolve().parents[2]
DAG_FOLDER = REPO / "examples" / "airflow"
DAG_ID = "rmq_txn_reconcile"

LOGICAL_DATE = datetime(2026, 1, 1, 0, 15, tzinfo=UTC)
AIRFLOW_RUN_ID = "scheduled__2026-01-01T00:15:00+00:00"
JOB_RUN_ID = "scheduled__2026-01-01T00_15_00_00_00"
AS_OF_MS = "1767226500000"  # LOGICAL_DATE in epoch ms

# The Spark connection comes from the environment: no database.
os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "yarn"}')


@pytest.fixture(scope="module")
def bag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAG_FOLDER), safe_mode=False)


@pytest.fixture(scope="module")
def dag(bag):
    return bag.dags[DAG_ID]


@pytest.fixture(scope="module")
def dag_module(dag):
    """The module DagBag loaded the DAG file as (its helpers are plain functions)."""
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == dag.fileloc:
            return module
    raise LookupError(dag.fileloc)


class _DagRun:
    """The attributes of a DAG run that the templates use."""

    def __init__(self, run_id: str, run_after: datetime) -> None:
        self.run_id = run_id
        self.run_after = run_after


def render_command(dag, params: dict | None = None, run_id: str = AIRFLOW_RUN_ID) -> list[str]:
    """Render the reconcile task for one run and return the spark-submit argv it would run."""
    task = copy.deepcopy(dag.task_dict["reconcile"])  # rendering sets the fields in place
    resolved = copy.deepcopy(dag.params)
    resolved.update(params or {})  # what a trigger with conf does
    context = {
        "params": resolved.validate(),  # raises on a value that does not match its Param
        "run_id": run_id,
        "logical_date": LOGICAL_DATE,
        "data_interval_start": LOGICAL_DATE,
        "data_interval_end": LOGICAL_DATE,
        "dag_run": _DagRun(run_id, LOGICAL_DATE),
        "dag": dag,
        "task": task,
    }
    task.render_template_fields(context)
    hook = task._get_hook()
    return hook._build_spark_submit_command(task.application)


def test_dag_parses_without_import_errors(bag) -> None:
    assert bag.import_errors == {}
    assert DAG_ID in bag.dags


def test_tasks_dependencies_and_scheduling(dag) -> None:
    assert set(dag.task_dict) == {"reconcile", "check_discards"}
    assert dag.task_dict["reconcile"].downstream_task_ids == {"check_discards"}
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    reconcile = dag.task_dict["reconcile"]
    assert type(reconcile).__name__ == "SparkSubmitOperator"
    assert reconcile.retries == 2
    assert dag.task_dict["check_discards"].retries == 2


def test_rendered_command_line(dag) -> None:
    params = {"stores": ["broker-a=/stores/a", "broker-b=/stores/b"], "output": "/out"}

    command = render_command(dag, params)

    print("\nrendered:", " ".join(command))
    assert command == [
        "spark-submit",
        "--master", "yarn",
        "--py-files", "/opt/rmq-txn-reconcile/rmq_txn_reconcile.zip",
        "--name", "rmq-txn-reconcile",
        "/opt/rmq-txn-reconcile/reconcile.py",
        "--store", "broker-a=/stores/a",
        "--store", "broker-b=/stores/b",
        "--output", "/out",
        "--as-of", AS_OF_MS,
        "--run-id", JOB_RUN_ID,
        "--fail-on", "critical",  # the default: critical anomalies fail the task (exit 3)
    ]  # fmt: skip


def test_fail_on_follows_the_param(dag) -> None:
    assert render_command(dag, {"fail_on": "warning"})[-2:] == ["--fail-on", "warning"]
    assert "--fail-on" not in render_command(dag, {"fail_on": "never"})


def test_rerun_of_the_same_dag_run_renders_the_same_round(dag) -> None:
    assert render_command(dag) == render_command(dag)


def test_variables_fill_in_what_params_leave_empty(dag, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_RMQ_TXN_RECONCILE_STORES", '["x=/var/stores/x"]')
    monkeypatch.setenv("AIRFLOW_VAR_RMQ_TXN_RECONCILE_OUTPUT", "/var/out")
    monkeypatch.setenv("AIRFLOW_VAR_RMQ_TXN_RECONCILE_PY_FILES", "/pkg/rmq.whl")

    command = render_command(dag, {"output": "/param/out", "as_of": "latest", "strict": True})

    tail = command[command.index("/opt/rmq-txn-reconcile/reconcile.py") + 1 :]
    assert tail == [
        "--store", "x=/var/stores/x",
        "--output", "/param/out",  # a param wins over the Variable
        "--as-of", "latest",
        "--run-id", JOB_RUN_ID,
        "--strict",
        "--fail-on", "critical",
    ]  # fmt: skip
    assert command[command.index("--py-files") + 1] == "/pkg/rmq.whl"


def test_manual_run_ids_become_partition_safe(dag_module) -> None:
    assert dag_module.job_run_id("manual__2026-03-04T05:06:07.123456+00:00") == (
        "manual__2026-03-04T05_06_07.123456_00_00"
    )


# --- the downstream check, on real Delta tables -------------------------------------------


def _write_run(out: Path, table: str, run_id: str, rows: int) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    data = pa.table(
        {
            "broker": pa.array(["broker-a"] * rows, pa.string()),
            "run_id": pa.array([run_id] * rows, pa.string()),
            "as_of_ms": pa.array([int(AS_OF_MS)] * rows, pa.int64()),
        }
    )
    write_deltalake(str(out / table), data, partition_by=["run_id"], mode="append")


@pytest.fixture
def check(dag):
    return dag.task_dict["check_discards"].python_callable


def test_check_passes_when_the_run_has_no_discards(check, tmp_path) -> None:
    _write_run(tmp_path, "run_summary", JOB_RUN_ID, 1)
    _write_run(tmp_path, "discards", JOB_RUN_ID, 0)
    _write_run(tmp_path, "discards", "an-earlier-run", 3)  # other runs' discards don't count

    result = check(params={"output": str(tmp_path)}, run_id=AIRFLOW_RUN_ID)

    assert result == {"run_id": JOB_RUN_ID, "queues": 1, "discards": 0}


def test_check_fails_the_run_on_discards(check, tmp_path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    _write_run(tmp_path, "run_summary", JOB_RUN_ID, 2)
    _write_run(tmp_path, "discards", JOB_RUN_ID, 2)

    with pytest.raises(AirflowFailException, match="2 transaction"):
        check(params={"output": str(tmp_path)}, run_id=AIRFLOW_RUN_ID)


def test_check_fails_when_the_job_wrote_no_summary_for_the_run(check, tmp_path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    _write_run(tmp_path, "run_summary", "another-run", 1)
    _write_run(tmp_path, "discards", "another-run", 0)

    with pytest.raises(AirflowFailException, match="no row for run"):
        check(params={"output": str(tmp_path)}, run_id=AIRFLOW_RUN_ID)


# --- end to end: the rendered command runs the real job --------------------------------------

PROJECT_VENV = Path(os.environ.get("RMQ_PROJECT_VENV", REPO / ".venv"))


def _e2e_missing() -> str | None:
    if os.environ.get("RMQ_AIRFLOW_E2E") == "0":
        return "RMQ_AIRFLOW_E2E=0"
    if not (PROJECT_VENV / "bin" / "spark-submit").exists():
        return f"no spark-submit in the project venv {PROJECT_VENV}"
    for module in ("jobs/reconcile.py", "simulator/__main__.py"):
        if not (REPO / module).exists():
            return f"{module} is not written yet"
    return None


@pytest.mark.skipif(_e2e_missing() is not None, reason=str(_e2e_missing()))
def test_rendered_command_runs_the_job_and_the_check(dag, check, tmp_path, monkeypatch) -> None:
    """Submit with the project venv's spark-submit (local master) from outside the checkout."""
    python = str(PROJECT_VENV / "bin" / "python")
    store = tmp_path / "broker-a"
    # A store whose timeline ends just before the run's as-of time, where every producer
    # answers: the round has nothing to discard and the check must pass.
    simulate = [
        "--transactions",
        "50",
        "--seed",
        "7",
        "--never-fraction",
        "0",
        "--end-ms",
        str(int(AS_OF_MS) - 1000),
    ]
    subprocess.run(
        [python, "-m", "simulator", "--out", str(store), *simulate],
        cwd=tmp_path, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    package = tmp_path / "rmq_txn_reconcile.zip"
    with zipfile.ZipFile(package, "w") as archive:
        for folder in ("jobs", "transforms", "schemas", "connectors", "conf"):
            for path in sorted((REPO / folder).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, path.relative_to(REPO))
    application = tmp_path / "reconcile.py"
    shutil.copy(REPO / "jobs" / "reconcile.py", application)
    out = tmp_path / "out"

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", python)
    monkeypatch.chdir(tmp_path)
    params = {
        "stores": [f"broker-a={store}"],
        "output": str(out),
        "application": str(application),
        "py_files": str(package),
    }
    command = render_command(dag, params)
    command[0] = str(PROJECT_VENV / "bin" / "spark-submit")

    done = subprocess.run(command, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    result = check(params={"output": str(out)}, run_id=AIRFLOW_RUN_ID)
    assert result == {"run_id": JOB_RUN_ID, "queues": 1, "discards": 0}
