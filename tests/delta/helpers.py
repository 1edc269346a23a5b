"""Reading what the writers left: commit infos from ``_delta_log``, and job runs."""

from __future__ import annotations

import json
from pathlib import Path

from jobs.reconcile import main
from tests.robustness.store import TABLES, T, comparable, rows_of


def commit_infos(table_path: Path) -> list[dict]:
    """The ``commitInfo`` of every version, oldest first (straight from the JSON log)."""
    infos = []
    for entry in sorted((table_path / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                infos.append(action["commitInfo"])
    return infos


def engine(info: dict) -> str:
    """Which writer made a commit: Spark's names itself in engineInfo, delta-rs in clientVersion."""
    return info.get("engineInfo") or info.get("clientVersion") or ""


def run_job(spark, store: Path, output: Path, run_id: str, writer: str, *extra: str) -> int:
    argv = ["--store", str(store), "--output", str(output), "--as-of", str(T)]
    return main([*argv, "--run-id", run_id, "--writer", writer, *extra], spark=spark)


def tables_of(output: Path, run_id: str) -> dict[str, object]:
    return {table: comparable(rows_of(output, table, run_id)) for table in TABLES}
