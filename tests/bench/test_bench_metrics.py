"""Event-log parsing of bench/metrics.py on a small inline log (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.metrics import (
    UNLABELLED,
    collect,
    collect_queries,
    event_log_files,
    main,
    phases_from_log,
    query_figures,
)


def _job_start(job_id: int, at: int, stages: list[int], description: str | None) -> dict:
    properties = {"spark.job.description": description} if description else {}
    return {
        "Event": "SparkListenerJobStart",
        "Job ID": job_id,
        "Submission Time": at,
        "Stage IDs": stages,
        "Properties": properties,
    }


def _job_end(job_id: int, at: int) -> dict:
    return {"Event": "SparkListenerJobEnd", "Job ID": job_id, "Completion Time": at}


def _stage(stage_id: int, start: int, end: int, name: str, tasks: int = 2) -> dict:
    scope = json.dumps({"id": "1", "name": "WholeStageCodegen (3)"})
    return {
        "Event": "SparkListenerStageCompleted",
        "Stage Info": {
            "Stage ID": stage_id,
            "Stage Name": name,
            "Number of Tasks": tasks,
            "Submission Time": start,
            "Completion Time": end,
            "RDD Info": [
                {"Name": "x", "Scope": scope},
                {"Name": "y", "Scope": json.dumps({"name": "Exchange"})},
            ],
        },
    }


def _task(stage_id: int, run_ms: int, cpu_ns: int) -> dict:
    return {
        "Event": "SparkListenerTaskEnd",
        "Stage ID": stage_id,
        "Task Metrics": {
            "Executor Run Time": run_ms,
            "Executor CPU Time": cpu_ns,
            "JVM GC Time": 5,
            "Disk Bytes Spilled": 0,
            "Shuffle Write Metrics": {"Shuffle Bytes Written": 100},
        },
    }


EVENTS = [
    {"Event": "SparkListenerLogStart", "Spark Version": "4.2.0"},
    _job_start(0, 1_000, [0], None),  # before the first label
    _stage(0, 1_000, 1_500, "count at x"),
    _task(0, 400, 1_000_000),
    _job_end(0, 1_500),
    _job_start(1, 2_000, [1], "rmq-txn-reconcile: decode"),
    _stage(1, 2_000, 6_000, "count at NativeMethodAccessorImpl.java:0"),
    _task(1, 3_000, 2_000_000_000),
    _task(1, 3_500, 1_000_000_000),
    _job_end(1, 6_000),
    # Two overlapping jobs and a skipped stage (7: no StageCompleted, no tasks).
    _job_start(2, 7_000, [2, 3, 7], "rmq-txn-reconcile: resolve and classify"),
    _job_start(3, 8_000, [4], "rmq-txn-reconcile: resolve and classify"),
    _stage(2, 7_000, 9_000, "collect at round.py:1"),
    _task(2, 1_000, 0),
    _stage(3, 7_000, 10_000, "collect at round.py:1"),
    _task(3, 500, 0),
    _stage(4, 8_000, 11_000, "collect at round.py:2"),
    _task(4, 2_500, 0),
    _job_end(2, 10_000),
    _job_end(3, 11_000),
    _job_start(4, 12_000, [5], "rmq-txn-reconcile: write"),
    _stage(5, 12_000, 12_500, "save"),
    _task(5, 300, 0),
    _job_end(4, 12_500),
]


def _write_rolling(tmp_path: Path) -> Path:
    folder = tmp_path / "eventlog_v2_local-1"
    folder.mkdir()
    lines = [json.dumps(e) for e in EVENTS]
    # Rolled into two parts, numbered: events_2 must come after events_1.
    (folder / "events_2_local-1").write_text("\n".join(lines[10:]) + "\n")
    (folder / "events_1_local-1").write_text("\n".join(lines[:10]) + "\n")
    (folder / "appstatus_local-1").write_text("")
    return tmp_path


def test_phases_from_a_rolling_log(tmp_path: Path) -> None:
    phases = phases_from_log(_write_rolling(tmp_path))

    assert list(phases) == [UNLABELLED, "decode", "resolve and classify", "write"]
    decode = phases["decode"]
    assert (decode["jobs"], decode["stages"], decode["wall_s"]) == (1, 1, 4.0)
    assert decode["executor_run_s"] == 6.5
    assert decode["executor_cpu_s"] == 3.0
    resolve = phases["resolve and classify"]
    # Union of [7, 10] and [8, 11] seconds: 4 s, not 3 + 3.
    assert (resolve["wall_s"], resolve["span_s"], resolve["stages"]) == (4.0, 4.0, 3)
    # Heaviest by executor run time, not by duration (stage 3 lasted longest).
    assert [s["stage_id"] for s in resolve["slowest_stages"]] == [4, 2, 3]
    assert resolve["slowest_stages"][0]["operators"] == ["WholeStageCodegen", "Exchange"]
    assert resolve["shuffle_write_bytes"] == 300


def test_single_file_log(tmp_path: Path) -> None:
    (tmp_path / "local-1").write_text("\n".join(json.dumps(e) for e in EVENTS) + "\n")
    assert event_log_files(tmp_path) == [tmp_path / "local-1"]
    assert phases_from_log(tmp_path)["write"]["wall_s"] == 0.5


def test_unfinished_job_counts_no_wall_time() -> None:
    jobs, stages = collect([_job_start(0, 0, [0], "rmq-txn-reconcile: decode")])
    assert jobs[0].completed_ms is None and stages == {}


_SQL = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecution"


def _query(query: int, start: int, end: int, description: str) -> list[dict]:
    return [
        {"Event": _SQL + "Start", "executionId": query, "time": start, "description": description},
        {"Event": _SQL + "End", "executionId": query, "time": end},
    ]


def _read(stage_id: int, run_ms: int, records: int, shuffled: int) -> dict:
    task = _task(stage_id, run_ms, 0)
    task["Task Metrics"]["Input Metrics"] = {"Records Read": records}
    task["Task Metrics"]["Shuffle Read Metrics"] = {"Total Records Read": shuffled}
    return task


def _in_query(job: dict, query: int) -> dict:
    job["Properties"]["spark.sql.execution.id"] = str(query)
    return job


QUERY_EVENTS = [
    *_query(0, 1_000, 5_000, "rmq-txn-reconcile: decode"),
    # Query 0: two jobs that share stage 1 (counted once); stage 9 was skipped.
    _in_query(_job_start(0, 1_000, [0, 1], "rmq-txn-reconcile: decode"), 0),
    _stage(0, 1_000, 2_000, "scan"),
    _read(0, 700, 1_000, 0),
    _stage(1, 2_000, 3_000, "exchange"),
    _read(1, 300, 0, 40),
    _job_end(0, 3_000),
    _in_query(_job_start(1, 3_000, [1, 9], "rmq-txn-reconcile: decode"), 0),
    _job_end(1, 4_000),
    # Query 1 ran no job (a local relation); query 2 is longer but reads less.
    *_query(1, 5_000, 5_500, "rmq-txn-reconcile: write"),
    *_query(2, 6_000, 12_000, "rmq-txn-reconcile: write"),
    _in_query(_job_start(2, 6_000, [2], "rmq-txn-reconcile: write"), 2),
    _stage(2, 6_000, 12_000, "save"),
    _read(2, 5_000, 10, 0),
    _job_start(3, 13_000, [3], "rmq-txn-reconcile: write"),  # no query
]


def test_each_query_is_its_jobs_stages_and_wall_time() -> None:
    jobs, stages, queries = collect_queries(QUERY_EVENTS)
    figures = query_figures(jobs, stages, queries)
    assert [(f["query"], f["phase"], f["wall_s"], f["jobs"]) for f in figures] == [
        (2, "write", 6.0, 1),
        (0, "decode", 4.0, 2),
        (1, "write", 0.5, 0),
    ]
    decode = figures[1]
    assert (decode["executor_run_s"], decode["input_records"]) == (1.0, 1_000)
    assert decode["shuffle_read_records"] == 40
    assert figures[2]["executor_run_s"] == 0


def test_the_command_prints_the_phases_then_the_longest_queries(tmp_path: Path, capsys) -> None:
    (tmp_path / "local-1").write_text("\n".join(json.dumps(e) for e in QUERY_EVENTS) + "\n")
    assert main([str(tmp_path), "--queries", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "decode: 2 job(s), 3.0 s wall, 1.0 s of tasks"
    assert lines[2] == "3 queries, 10.5 s wall in all; the longest:"
    assert lines[3].split() == [
        "6.0",
        "s",
        "5.0",
        "s",
        "of",
        "tasks",
        "10",
        "input",
        "0",
        "shuffled",
        "query",
        "2",
        "(write)",
    ]
    assert len(lines) == 4
