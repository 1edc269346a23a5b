"""Run the reconciliation job as the benchmark runs it: a subprocess, measured as a process
tree (``bench.measure``), with Spark's event log on for the per-phase figures."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from bench.measure import run_measured
from bench.metrics import phases_from_log
from bench.stores import REPO

AS_OF_MS = 1_750_000_000_000  # the simulator's default end of timeline: every store ends here
MASTER = "local[2]"
_RECORDS_LINE = re.compile(r"read (\d+) half/op records")


class JobFailed(RuntimeError):
    """The job exited with a non-zero code."""


def job_command(
    stores: dict[str, Path], output: Path, master: str = MASTER, python: str = sys.executable
) -> list[str]:
    command = [python, "-m", "jobs.reconcile"]
    for broker, path in stores.items():
        command += ["--store", f"{broker}={path}"]
    return command + ["--output", str(output), "--as-of", str(AS_OF_MS), "--master", master]


def event_log_args(event_dir: Path) -> str:
    """PYSPARK_SUBMIT_ARGS that turn the event log on for a ``python -m`` launched session
    (the builder in jobs/session.py does not touch these settings). Uncompressed, so the
    log is plain JSON lines (Spark 4 compresses it by default)."""
    return (
        "--conf spark.eventLog.enabled=true"
        f" --conf spark.eventLog.dir=file://{event_dir}"
        " --conf spark.eventLog.compress=false"
        " pyspark-shell"
    )


def job_env(event_dir: Path, python: str = sys.executable) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=python,
        PYSPARK_DRIVER_PYTHON=python,
        PYSPARK_SUBMIT_ARGS=event_log_args(event_dir),
    )
    return env


def records_reported(stderr: str) -> int | None:
    """N of the job's ``read N half/op records`` progress line."""
    found = _RECORDS_LINE.search(stderr)
    return int(found.group(1)) if found else None


def _fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def run_job(stores: dict[str, Path], work_dir: Path, master: str = MASTER) -> dict:
    """Run the job once into ``work_dir/output``; figures, phases and the output path.

    Raises JobFailed (with the end of its stderr) when the job fails.
    """
    output = work_dir / "output"
    shutil.rmtree(output, ignore_errors=True)
    events = _fresh_dir(work_dir / "events")
    command = job_command(stores, output, master)
    load = [round(x, 2) for x in os.getloadavg()]  # other work on the machine skews the times
    measured = run_measured(command, env=job_env(events), cwd=REPO)
    # Kept whole: a failure's cause can be thousands of lines above the end of the stream.
    (work_dir / "stderr.log").write_text(measured.stderr)
    if measured.returncode != 0:
        raise JobFailed(
            f"exit {measured.returncode}: {' '.join(command)}\n{measured.stderr[-3000:]}\n"
            f"(whole stderr: {work_dir / 'stderr.log'})"
        )
    figures = measured.figures()
    figures.update(
        master=master,
        load_average_before=load,
        records_reported=records_reported(measured.stderr),
        phases=phases_from_log(events),
        output=str(output),
        progress=[line for line in measured.stderr.splitlines() if line.startswith("[")],
    )
    return figures
