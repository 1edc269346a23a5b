"""Airflow DAG: reconcile RocketMQ transactional messages on a schedule, fail on discards
and on critical anomalies.

Two tasks:

``reconcile``
    One ``SparkSubmitOperator`` over all brokers (see docs/airflow.md for why not one per
    broker). ``--as-of`` is the data interval end in epoch ms and ``--run-id`` is derived
    from the Airflow run id, so a retry or a manual re-run of the same DAG run evaluates
    the same round and replaces that run's rows: retries are safe. ``--fail-on critical``
    (the ``fail_on`` setting) makes the job exit 3 after writing everything when the round
    found critical anomalies (docs/anomalies.md): the task fails and Airflow alerts; its
    retries rerun the same round and fail the same way.
``check_discards``
    Reads the ``discards`` and ``run_summary`` Delta tables of that run id with
    ``deltalake`` (no Spark) and fails the DAG run when discards appeared, or when the job
    wrote no summary for the run. The Airflow worker needs ``deltalake`` and ``pyarrow``.

Settings, first found wins:

1. the DAG run's params (the trigger form, or ``airflow dags trigger --conf '{...}'``);
2. Airflow Variables ``rmq_txn_reconcile_<name>`` (``stores`` is a JSON list);
3. ``DEFAULTS`` below.

Only the Spark connection id and the spark-submit binary are read when the file is parsed
(the provider does not template them): environment variables
``RMQ_TXN_RECONCILE_CONN_ID`` (default ``spark_default``) and
``RMQ_TXN_RECONCILE_SPARK_BINARY`` (default: the connection's, i.e. ``spark-submit`` on
the PATH).
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param, Variable, task

try:  # Airflow 3.x task SDK
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # pragma: no cover - Airflow 2.x
    from airflow.exceptions import AirflowFailException

DAG_ID = "rmq_txn_reconcile"
VARIABLE_PREFIX = "rmq_txn_reconcile_"

DEFAULTS: dict[str, Any] = {
    # Each "[NAME=]DIR": a broker's store directory (the one holding commitlog/, consumequeue/
    # and config/consumerOffset.json), readable from the Spark driver and executors.
    "stores": ["broker-a=/data/rocketmq/broker-a/store"],
    # Output root: one Delta table per folder (OUT/discards, OUT/pending, ...).
    "output": "/data/rmq-txn-reconcile/out",
    # What `make package` builds: the entry script and the package zip/wheel for --py-files.
    "application": "/opt/rmq-txn-reconcile/reconcile.py",
    "py_files": "/opt/rmq-txn-reconcile/rmq_txn_reconcile.zip",
    # Optional TOML with broker settings (check_max, timeouts, ...); "" for the defaults.
    "conf_file": "",
    # --fail-on: the reconcile task fails (job exit 3, after writing everything) when the
    # round found anomalies this severe or worse (docs/anomalies.md); "" never fails on them.
    "fail_on": "critical",
}

CONN_ID = os.environ.get("RMQ_TXN_RECONCILE_CONN_ID", "spark_default")
SPARK_BINARY = os.environ.get("RMQ_TXN_RECONCILE_SPARK_BINARY") or None

_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def setting(params: dict[str, Any], name: str) -> Any:
    """Return a setting: the run's param when set, else the Airflow Variable, else DEFAULTS."""
    value = params.get(name)
    if value not in (None, "", []):
        return value
    raw = Variable.get(VARIABLE_PREFIX + name, default=None)
    if raw is None:
        return DEFAULTS[name]
    return json.loads(raw) if name == "stores" else raw


def job_run_id(airflow_run_id: str) -> str:
    """The job's --run-id for an Airflow run id: same run, same id; safe in a partition path.

    ``scheduled__2026-01-01T00:15:00+00:00`` -> ``scheduled__2026-01-01T00_15_00_00_00``
    (colons and plus signs do not belong in Hadoop paths).
    """
    return _RUN_ID_UNSAFE.sub("_", str(airflow_run_id)).strip("_") or "run"


def epoch_ms(instant: datetime) -> int:
    """Milliseconds since the epoch of an aware datetime."""
    return int(instant.timestamp() * 1000)


def as_of(params: dict[str, Any], data_interval_end: datetime | None, dag_run: Any) -> str:
    """The round's as-of time: the ``as_of`` param when given, else the data interval end.

    The data interval end fixes the round, so a retry reproduces it. Manual runs without a
    data interval use the run's ``run_after``.
    """
    if params.get("as_of"):
        return str(params["as_of"])
    instant = data_interval_end or getattr(dag_run, "run_after", None)
    if instant is None:
        raise AirflowFailException("no data interval end and no as_of param: cannot fix the round")
    return str(epoch_ms(instant))


def reconcile_args(
    params: dict[str, Any], run_id: str, data_interval_end: datetime | None, dag_run: Any
) -> list[str]:
    """The job's command-line arguments (spec section 9) for one DAG run."""
    stores = setting(params, "stores")
    if isinstance(stores, str):
        stores = [stores]
    if not stores:
        raise AirflowFailException("no stores configured: set the stores param or Variable")
    args: list[str] = []
    for store in stores:
        args += ["--store", str(store)]
    args += ["--output", str(setting(params, "output"))]
    args += ["--as-of", as_of(params, data_interval_end, dag_run)]
    args += ["--run-id", job_run_id(run_id)]
    conf_file = setting(params, "conf_file")
    if conf_file:
        args += ["--conf", str(conf_file)]
    if params.get("strict"):
        args.append("--strict")
    fail_on = setting(params, "fail_on")
    if fail_on and fail_on != "never":
        args += ["--fail-on", str(fail_on)]
    return args


def count_run_rows(output: str, table: str, run_id: str) -> int:
    """Rows of one run in the Delta table OUT/<table>, read with deltalake (no Spark)."""
    from deltalake import DeltaTable
    from pyarrow.fs import LocalFileSystem, SubTreeFileSystem

    path = os.path.join(output, table)
    delta = DeltaTable(path)
    # A local SubTreeFileSystem avoids delta-rs' default filesystem, which can abort the
    # process at exit (exit 134), and a crashed worker process is a failed task.
    filesystem = SubTreeFileSystem(os.path.abspath(path), LocalFileSystem())
    rows = delta.to_pyarrow_table(
        filters=[("run_id", "=", str(run_id))], columns=["run_id"], filesystem=filesystem
    )
    return rows.num_rows


with DAG(
    dag_id=DAG_ID,
    description="Offline round of the RocketMQ transaction checker over broker stores, to Delta",
    schedule="*/15 * * * *",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    # A past round would use today's committed offsets and whatever retention left: no backfill.
    catchup=False,
    # Runs write the same tables; one at a time keeps Delta commits from conflicting.
    max_active_runs=1,
    # application_args is rendered from one macro into a list (the number of --store
    # flags is a run-time setting), which needs native rendering. Every other templated
    # value here is a path or a name, which stays a string.
    render_template_as_native_obj=True,
    user_defined_macros={"reconcile_args": reconcile_args, "setting": setting},
    params={
        "stores": Param(
            [], type="array", description='["NAME=DIR", ...]; empty: Variable, then default'
        ),
        "output": Param(
            "", type="string", description="output root; empty: Variable, then default"
        ),
        "application": Param("", type="string", description="packaged jobs/reconcile.py"),
        "py_files": Param("", type="string", description="package zip or wheel for --py-files"),
        "conf_file": Param("", type="string", description="TOML settings file; empty for none"),
        "as_of": Param(
            "", type="string", description="now|latest|ISO|ms; empty: data interval end"
        ),
        "strict": Param(False, type="boolean", description="fail the run on any bad record"),
        "fail_on": Param(
            "",
            type="string",
            enum=["", "warning", "critical", "never"],
            description="fail the reconcile task on anomalies this severe; empty: Variable,"
            " then default (critical); never: do not",
        ),
    },
    default_args={
        "owner": "messaging",
        "retries": 2,
        "retry_delay": timedelta(minutes=2),
    },
    tags=["rocketmq", "spark", "delta"],
) as dag:
    reconcile = SparkSubmitOperator(
        task_id="reconcile",
        conn_id=CONN_ID,
        spark_binary=SPARK_BINARY,
        application="{{ setting(params, 'application') }}",
        py_files="{{ setting(params, 'py_files') }}",
        name="rmq-txn-reconcile",
        application_args="{{ reconcile_args(params, run_id, data_interval_end, dag_run) }}",
        # Same --as-of and --run-id on every try: the rerun replaces its own rows.
        retries=2,
        execution_timeout=timedelta(minutes=30),
    )

    # AirflowFailException fails without retrying: a discard does not go away on a retry,
    # while a transient read error does.
    @task(task_id="check_discards")
    def check_discards(params: dict[str, Any] | None = None, run_id: str | None = None) -> dict:
        """Fail the DAG run when the round discarded transactions (operators look at these)."""
        output = str(setting(params or {}, "output"))
        job_run = job_run_id(str(run_id))
        summaries = count_run_rows(output, "run_summary", job_run)
        if summaries == 0:
            raise AirflowFailException(
                f"{output}/run_summary has no row for run {job_run}: the job did not write this run"
            )
        discards = count_run_rows(output, "discards", job_run)
        if discards:
            raise AirflowFailException(
                f"{discards} transaction(s) discarded in run {job_run}: see {output}/discards "
                f"(python -m jobs.report --output {output} --run-id {job_run})"
            )
        return {"run_id": job_run, "queues": summaries, "discards": 0}

    reconcile >> check_discards()
