"""Reading one run of the job's output tables for the report (deltalake, pyarrow, pandas;
no Spark)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import pyarrow.compute as pc

from connectors.delta_commit import PARTITION_COLUMN
from connectors.delta_read import arrow_dataset
from schemas.outputs import (
    ANOMALIES_TABLE,
    BAD_RECORDS_TABLE,
    CHECK_REQUESTS_TABLE,
    CONSUME_OFFSETS_TABLE,
    DISCARDS_TABLE,
    PENDING_TABLE,
    RUN_SUMMARY_TABLE,
)

HISTORY_RUNS = 30  # runs shown in the discard history


class ReportError(Exception):
    """The output root or the run cannot be reported on (exit code 2)."""


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunTables:
    """The rows of one run, as pandas DataFrames (empty frames for absent tables)."""

    output: str
    run_id: str
    as_of_ms: int
    run_summary: pd.DataFrame
    pending: pd.DataFrame
    check_requests: pd.DataFrame
    discards: pd.DataFrame
    consume_offsets: pd.DataFrame
    bad_records: pd.DataFrame
    runs: pd.DataFrame  # run_id, as_of_ms, written_at_ms of recent runs (discard history)
    discard_history: pd.DataFrame  # run_id, reason, count over those runs
    anomalies: pd.DataFrame = field(default_factory=pd.DataFrame)  # this run's findings


def _table_path(output: str, table: str) -> str:
    return output.rstrip("/") + "/" + table


def read_table(
    output: str,
    table: str,
    run_id: str | None = None,
    columns: Sequence[str] | None = None,
) -> pd.DataFrame | None:
    """One Delta table (optionally one run's partition) as pandas; None when the table is absent."""
    dataset = arrow_dataset(_table_path(output, table))
    if dataset is None:
        return None
    of_run = pc.field(PARTITION_COLUMN) == run_id if run_id is not None else None
    return dataset.to_table(filter=of_run, columns=list(columns) if columns else None).to_pandas()


def newest_run_id(output: str) -> str:
    """The run with the largest ``written_at_ms`` in ``run_summary``."""
    runs = read_table(output, RUN_SUMMARY_TABLE, columns=["run_id", "written_at_ms"])
    if runs is None:
        raise ReportError(
            f"{_table_path(output, RUN_SUMMARY_TABLE)} is not a Delta table: "
            "give the --output of a reconcile run"
        )
    if runs.empty:
        raise ReportError(f"{_table_path(output, RUN_SUMMARY_TABLE)} has no run yet")
    newest = runs.sort_values(["written_at_ms", "run_id"], na_position="first").iloc[-1]
    return str(newest["run_id"])


def load_run(output: str | os.PathLike[str], run_id: str | None = None) -> RunTables:
    """Read every table of one run (the newest when ``run_id`` is None)."""
    output = os.fspath(output)
    if "://" not in output and not os.path.isdir(output):
        raise ReportError(f"{output}: no such directory (give the --output of a reconcile run)")
    run_id = run_id or newest_run_id(output)

    def one(table: str) -> pd.DataFrame:
        frame = read_table(output, table, run_id)
        return frame if frame is not None else pd.DataFrame()

    summary = one(RUN_SUMMARY_TABLE)
    if summary.empty:
        raise ReportError(f"run {run_id!r} is not in {_table_path(output, RUN_SUMMARY_TABLE)}")
    runs = read_table(output, RUN_SUMMARY_TABLE, columns=["run_id", "as_of_ms", "written_at_ms"])
    assert runs is not None
    runs = (
        runs.groupby("run_id", as_index=False)
        .agg(as_of_ms=("as_of_ms", "max"), written_at_ms=("written_at_ms", "max"))
        .sort_values(["written_at_ms", "run_id"])
        .tail(HISTORY_RUNS)
    )
    history = read_table(output, DISCARDS_TABLE, columns=["run_id", "reason"])
    if history is None or history.empty:
        history = pd.DataFrame({"run_id": [], "reason": [], "count": []})
    else:
        history = history[history["run_id"].isin(runs["run_id"])]
        history = history.groupby(["run_id", "reason"], as_index=False).size()
        history = history.rename(columns={"size": "count"})
    return RunTables(
        output=output,
        run_id=run_id,
        as_of_ms=int(summary["as_of_ms"].max()),
        run_summary=summary,
        pending=one(PENDING_TABLE),
        check_requests=one(CHECK_REQUESTS_TABLE),
        discards=one(DISCARDS_TABLE),
        consume_offsets=one(CONSUME_OFFSETS_TABLE),
        bad_records=one(BAD_RECORDS_TABLE),
        runs=runs,
        discard_history=history,
        anomalies=one(ANOMALIES_TABLE),
    )
