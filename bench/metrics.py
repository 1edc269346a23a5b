"""Per-phase figures of a job run from Spark's own event log.

The job labels its Spark jobs with ``setJobDescription("rmq-txn-reconcile: <phase>")``
(``_phase`` in ``jobs/run.py``); Spark copies the label into the ``Properties`` of each
``SparkListenerJobStart`` as ``spark.job.description``. The event log is JSON lines:

* ``SparkListenerJobStart``: ``Job ID``, ``Submission Time``, ``Stage IDs``, ``Properties``
* ``SparkListenerJobEnd``: ``Job ID``, ``Completion Time``
* ``SparkListenerStageCompleted``: ``Stage Info`` with ``Stage ID``, ``Stage Name``,
  ``Number of Tasks``, ``Submission Time``, ``Completion Time``, ``RDD Info`` (operator scopes)
* ``SparkListenerTaskEnd``: ``Stage ID``, ``Task Metrics`` (``Executor Run Time`` ms,
  ``Executor CPU Time`` ns, ``JVM GC Time`` ms, spill and shuffle bytes, records read from
  the input and from shuffles)
* ``...SparkListenerSQLExecutionStart`` and ``...End``: ``executionId``, ``time``,
  ``description``; a job names its query in ``Properties`` as ``spark.sql.execution.id``

A query (one SQL execution, an action of the job) runs its jobs one after the other or
side by side; ``query_figures`` gives each its wall time, what its stages read and their
executor time: where a phase's time goes, query by query.

Skipped stages (shuffle output reused) have no StageCompleted event and no tasks, so they
count for nothing, as they cost nothing. Stages of one job can run at the same time, so a
phase's wall time is the union of its jobs' intervals, not a sum of stage durations.

Spark 4 writes a rolling log by default: a directory ``eventlog_v2_<app id>/`` holding
``events_<n>_<app id>`` files; older settings give one file. Both are read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PHASE_PREFIX = "rmq-txn-reconcile: "
UNLABELLED = "(unlabelled)"
SLOWEST = 3


def _seconds(start_ms: int | None, end_ms: int | None) -> float:
    """Seconds from ``start_ms`` to ``end_ms``; 0 when either is unknown (never logged)."""
    if start_ms is None or end_ms is None:
        return 0.0
    return (end_ms - start_ms) / 1000


@dataclass
class Stage:
    stage_id: int
    name: str = ""
    tasks: int = 0
    submitted_ms: int | None = None
    completed_ms: int | None = None
    operators: list[str] = field(default_factory=list)
    run_ms: int = 0
    cpu_ns: int = 0
    gc_ms: int = 0
    spill_disk_bytes: int = 0
    shuffle_write_bytes: int = 0
    input_records: int = 0
    shuffle_read_records: int = 0
    failed: bool = False

    @property
    def duration_s(self) -> float:
        return _seconds(self.submitted_ms, self.completed_ms)


@dataclass
class Job:
    job_id: int
    phase: str
    submitted_ms: int
    stage_ids: list[int]
    completed_ms: int | None = None
    query: int | None = None  # the SQL execution the job ran for


@dataclass
class Query:
    """One SQL execution: its label, start and end (ms)."""

    query_id: int
    description: str = ""
    started_ms: int | None = None
    ended_ms: int | None = None

    @property
    def wall_s(self) -> float:
        return _seconds(self.started_ms, self.ended_ms)


def event_log_files(path: Path) -> list[Path]:
    """The files of the one application logged under ``path`` (a dir or a file), in order."""
    if path.is_file():
        return [path]
    rolling = sorted(path.glob("eventlog_v2_*"))
    if rolling:
        if len(rolling) > 1:
            raise ValueError(f"more than one application logged in {path}")
        parts = [p for p in rolling[0].iterdir() if p.name.startswith("events_")]
        return sorted(parts, key=lambda p: int(p.name.split("_")[1]))
    plain = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
    if len(plain) != 1:
        raise ValueError(f"expected one event log in {path}, found {[p.name for p in plain]}")
    return plain


def read_events(files: Iterable[Path]) -> Iterator[dict]:
    for path in files:
        with path.open() as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def _phase_of(properties: dict | None) -> str:
    description = (properties or {}).get("spark.job.description") or ""
    if description.startswith(PHASE_PREFIX):
        return description[len(PHASE_PREFIX) :]
    return UNLABELLED


def _operators(stage_info: dict) -> list[str]:
    """Distinct operator scopes of a stage ("Exchange", "MapInArrow", ...), in log order."""
    names: list[str] = []
    for rdd in stage_info.get("RDD Info", []):
        scope = rdd.get("Scope")
        if not scope:
            continue
        name = re.sub(r" \(\d+\)$", "", json.loads(scope).get("name", ""))
        if name and name not in names:
            names.append(name)
    return names


def collect(events: Iterable[dict]) -> tuple[dict[int, Job], dict[int, Stage]]:
    """Jobs and completed stages (last attempt) with their summed task metrics."""
    jobs, stages, _ = collect_queries(events)
    return jobs, stages


def _query_of(properties: dict | None) -> int | None:
    query = (properties or {}).get("spark.sql.execution.id")
    return int(query) if query is not None else None


def _add_task(stage: Stage, metrics: dict) -> None:
    stage.run_ms += metrics.get("Executor Run Time", 0)
    stage.cpu_ns += metrics.get("Executor CPU Time", 0)
    stage.gc_ms += metrics.get("JVM GC Time", 0)
    stage.spill_disk_bytes += metrics.get("Disk Bytes Spilled", 0)
    stage.shuffle_write_bytes += (metrics.get("Shuffle Write Metrics") or {}).get(
        "Shuffle Bytes Written", 0
    )
    stage.input_records += (metrics.get("Input Metrics") or {}).get("Records Read", 0)
    stage.shuffle_read_records += (metrics.get("Shuffle Read Metrics") or {}).get(
        "Total Records Read", 0
    )


def _add_query(queries: dict[int, Query], kind: str, event: dict) -> None:
    query = queries.setdefault(event["executionId"], Query(event["executionId"]))
    if kind.endswith("SQLExecutionStart"):
        query.description = event.get("description") or ""
        query.started_ms = event.get("time")
    else:
        query.ended_ms = event.get("time")


def collect_queries(
    events: Iterable[dict],
) -> tuple[dict[int, Job], dict[int, Stage], dict[int, Query]]:
    """``collect``'s jobs and stages, and the SQL executions they ran for."""
    jobs: dict[int, Job] = {}
    stages: dict[int, Stage] = {}
    queries: dict[int, Query] = {}
    for event in events:
        kind = event.get("Event") or ""
        if kind == "SparkListenerJobStart":
            properties = event.get("Properties")
            job = Job(
                event["Job ID"],
                _phase_of(properties),
                event["Submission Time"],
                list(event.get("Stage IDs", [])),
                query=_query_of(properties),
            )
            jobs[job.job_id] = job
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
            jobs[event["Job ID"]].completed_ms = event["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stage = stages.setdefault(info["Stage ID"], Stage(info["Stage ID"]))
            stage.name = info.get("Stage Name", "")
            stage.tasks = info.get("Number of Tasks", 0)
            stage.submitted_ms = info.get("Submission Time")
            stage.completed_ms = info.get("Completion Time")
            stage.operators = _operators(info)
            stage.failed = "Failure Reason" in info
        elif kind == "SparkListenerTaskEnd":
            stage = stages.setdefault(event["Stage ID"], Stage(event["Stage ID"]))
            _add_task(stage, event.get("Task Metrics") or {})
        elif kind.endswith(("SQLExecutionStart", "SQLExecutionEnd")):
            _add_query(queries, kind, event)
    return jobs, stages, queries


def _union_seconds(intervals: list[tuple[int, int]]) -> float:
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total / 1000


def _ran(jobs: Iterable[Job], stages: dict[int, Stage]) -> list[Stage]:
    """The completed stages of ``jobs``, each once: a stage two jobs list (a shuffle the
    second reuses) ran once."""
    stage_ids = sorted({s for job in jobs for s in job.stage_ids})
    return [stages[s] for s in stage_ids if s in stages and stages[s].completed_ms]


def phase_figures(jobs: dict[int, Job], stages: dict[int, Stage]) -> dict[str, dict]:
    """Per phase: jobs, wall time of its jobs (union of intervals), span, executor time,
    and its slowest stages.

    ``executor_cpu_s`` is the JVM's CPU only (``Executor CPU Time`` does not see the Python
    workers); ``executor_run_s`` is the wall time of the tasks and does include them."""
    phases: dict[str, dict] = {}
    for phase in dict.fromkeys(job.phase for job in sorted(jobs.values(), key=lambda j: j.job_id)):
        mine = [job for job in jobs.values() if job.phase == phase]
        intervals = [(j.submitted_ms, j.completed_ms) for j in mine if j.completed_ms is not None]
        ran = _ran(mine, stages)
        # By executor run time, not duration: stages of one job run side by side and a
        # stage's duration counts the time its tasks waited for a core.
        slowest = sorted(ran, key=lambda s: s.run_ms, reverse=True)[:SLOWEST]
        phases[phase] = {
            "jobs": len(mine),
            "stages": len(ran),
            "tasks": sum(s.tasks for s in ran),
            "wall_s": _union_seconds(intervals),
            "span_s": (max(i[1] for i in intervals) - min(i[0] for i in intervals)) / 1000
            if intervals
            else 0.0,
            "executor_run_s": sum(s.run_ms for s in ran) / 1000,
            "executor_cpu_s": sum(s.cpu_ns for s in ran) / 1e9,
            "jvm_gc_s": sum(s.gc_ms for s in ran) / 1000,
            "spill_disk_bytes": sum(s.spill_disk_bytes for s in ran),
            "shuffle_write_bytes": sum(s.shuffle_write_bytes for s in ran),
            "slowest_stages": [
                {
                    "stage_id": s.stage_id,
                    "name": s.name,
                    "duration_s": s.duration_s,
                    "tasks": s.tasks,
                    "executor_run_s": s.run_ms / 1000,
                    "operators": s.operators[:6],
                }
                for s in slowest
            ],
        }
    return phases


def phases_from_log(path: Path) -> dict[str, dict]:
    """Per-phase figures of the application logged in ``path`` (directory or file)."""
    jobs, stages = collect(read_events(event_log_files(path)))
    return phase_figures(jobs, stages)


def query_figures(
    jobs: dict[int, Job], stages: dict[int, Stage], queries: dict[int, Query]
) -> list[dict]:
    """Per query, the longest first: its phase (its first job's; a query that ran no job,
    answered on the driver, by its own label), wall time, jobs, executor run time and the
    records its stages read, from their input and from shuffles (``_ran``)."""
    by_query: dict[int, list[Job]] = {}
    for job in sorted(jobs.values(), key=lambda j: j.job_id):
        if job.query is not None:
            by_query.setdefault(job.query, []).append(job)
    figures = []
    for query in queries.values():
        mine = by_query.get(query.query_id, [])
        ran = _ran(mine, stages)
        label = {"spark.job.description": query.description}
        figures.append(
            {
                "query": query.query_id,
                "phase": mine[0].phase if mine else _phase_of(label),
                "wall_s": query.wall_s,
                "jobs": len(mine),
                "executor_run_s": sum(s.run_ms for s in ran) / 1000,
                "input_records": sum(s.input_records for s in ran),
                "shuffle_read_records": sum(s.shuffle_read_records for s in ran),
            }
        )
    return sorted(figures, key=lambda f: (-f["wall_s"], f["query"]))


def report_lines(path: Path, longest: int) -> list[str]:
    """What ``main`` prints for the application logged in ``path``: each phase, then the
    ``longest`` queries."""
    jobs, stages, queries = collect_queries(read_events(event_log_files(path)))
    lines = [
        f"{phase}: {f['jobs']} job(s), {f['wall_s']:.1f} s wall, "
        f"{f['executor_run_s']:.1f} s of tasks"
        for phase, f in phase_figures(jobs, stages).items()
    ]
    figures = query_figures(jobs, stages, queries)
    total = sum(f["wall_s"] for f in figures)
    lines.append(f"{len(figures)} queries, {total:.1f} s wall in all; the longest:")
    lines += [
        f"{f['wall_s']:7.1f} s {f['executor_run_s']:7.1f} s of tasks"
        f" {f['input_records']:>12,} input {f['shuffle_read_records']:>12,} shuffled"
        f"  query {f['query']} ({f['phase']})"
        for f in figures[:longest]
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.metrics",
        description="Where a job run's time went, phase by phase and query by query, from"
        " Spark's event log (spark.eventLog.enabled=true, spark.eventLog.compress=false).",
    )
    parser.add_argument(
        "log", type=Path, help="the directory spark.eventLog.dir named (one run), or its file"
    )
    parser.add_argument("--queries", type=int, default=10, help="how many queries to list")
    args = parser.parse_args(argv)
    print("\n".join(report_lines(args.log, args.queries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
