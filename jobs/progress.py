"""The command line's progress lines (spec section 9): on stderr in every launch mode, each
with the seconds since the start, and a heartbeat while a phase runs long.

Under ``spark-submit`` Python's stderr is not the job's: the JVM that runs the driver
script merges the script's stderr into its own stdout (``PythonRunner`` starts it with
``redirectErrorStream``), so the lines go through the JVM's own ``System.err`` there.

The heartbeat is a thread polling Spark's status tracker (classic Spark; a Spark Connect
session: the progress its server reports, ``connect_tasks``): when a phase has
printed nothing for ``HEARTBEAT_S`` seconds it prints the tasks done and, while the store
is decoded, about how many of the consume-queue entries the plan holds are read. A phase
shorter than that prints nothing more; ``stop`` ends it before the summary is printed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

if TYPE_CHECKING:
    from connectors.rocketmq.reader import StorePlan

HEARTBEAT_S = 10.0  # the longest silence while a phase runs
POLL_S = 1.0  # how often the heartbeat looks
DECODE_PHASE = "decode"  # the phase that reads the planned entries (jobs.run.read_phase)


@dataclass(frozen=True)
class Tasks:
    """Tasks of the Spark stages running now: done of total, over ``stages`` stages."""

    done: int
    total: int
    stages: int


@dataclass(frozen=True)
class PlannedRead:
    """What the stores' read plans hold: consume-queue entries, and the commit-log files
    with the bytes they take on disk (a broker preallocates each file whole: 1 GiB by
    default, mostly unwritten). ``plan``: the plan itself, for the read to use
    (``read_stores(plan=...)``) instead of planning the stores again."""

    entries: int
    commitlog_files: int
    commitlog_bytes: int
    stores: int
    plan: StorePlan | None = field(default=None, compare=False, repr=False)

    def line(self) -> str:
        return (
            f"reading {self.entries} consume-queue entries; {self.commitlog_files} commit-log"
            f" file(s), {_size(self.commitlog_bytes)} on disk; {self.stores} store(s)"
        )


TaskPoll = Callable[[], "Tasks | None"]  # None: no Spark stage is running


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


# -- stderr ---------------------------------------------------------------------------------

_silenced = False  # set by ``last_line``: nothing is printed after it


def _submit_jvm() -> object | None:
    """The JVM that launched this driver under spark-submit (None otherwise, or when it
    cannot be reached)."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkContext

    if SparkContext._jvm is None:
        # Before the session: connect to spark-submit's gateway, as the session will.
        with contextlib.suppress(Exception):
            SparkContext._ensure_initialized()
    return SparkContext._jvm


def _write(line: str) -> None:
    jvm = _submit_jvm()
    if jvm is not None:
        try:
            err = jvm.System.err  # type: ignore[attr-defined]
            err.println(line)
            err.flush()
            return
        except Exception:  # the JVM is going away: Python's own stderr is still somewhere
            pass
    print(line, file=sys.stderr, flush=True)


def write_stderr(line: str) -> None:
    """One line on the job's stderr (see the module doc); nothing after ``last_line``."""
    if not _silenced:
        _write(line)


def last_line(line: str) -> None:
    """The process's last line on stderr: the heartbeat and progress print nothing after
    it (the interrupt handler ends the process right after)."""
    global _silenced
    _silenced = True
    _write(line)


# -- the heartbeat --------------------------------------------------------------------------

_current_phase: str | None = None


def phase_started(name: str | None) -> None:
    """The phase running now (``jobs.run`` labels each phase's Spark jobs with it)."""
    global _current_phase
    _current_phase = name


def spark_tasks(spark: SparkSession) -> TaskPoll:
    """Tasks of the stages running now, from the session's status tracker (a Connect
    session: from the progress its server reports, ``connect_tasks``)."""
    from connectors.connect import is_connect

    if is_connect(spark):
        return connect_tasks(spark)
    tracker = spark.sparkContext.statusTracker()

    def poll() -> Tasks | None:
        infos = (tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds())
        stages = [info for info in infos if info is not None]  # None: ended meanwhile
        if not stages:
            return None
        done = sum(s.numCompletedTasks for s in stages)
        return Tasks(done, sum(s.numTasks for s in stages), len(stages))

    return poll


class _ConnectProgress:
    """A Connect session's progress handler: the stages of the operation running now, as
    its server last reported them (about every 2 s, ``spark.connect.progress.reportInterval``;
    a server that reports none leaves the heartbeat without task counts)."""

    def __init__(self) -> None:
        self.tasks: Tasks | None = None

    def __call__(self, stages: Any, inflight_tasks: int, operation_id: Any, done: bool) -> None:
        running = [stage for stage in stages or () if not stage.done]
        if done or not running:
            self.tasks = None
            return
        done_tasks = sum(stage.num_completed_tasks for stage in running)
        self.tasks = Tasks(done_tasks, sum(stage.num_tasks for stage in running), len(running))


# One handler per Connect session, registered once (a notebook session runs many jobs).
_CONNECT_PROGRESS: weakref.WeakKeyDictionary[SparkSession, _ConnectProgress] = (
    weakref.WeakKeyDictionary()
)


def connect_tasks(spark: SparkSession) -> TaskPoll:
    """Tasks of the stages running now in a Spark Connect session (no status tracker on
    this side): what its server reported last for the running operation."""
    handler = _CONNECT_PROGRESS.get(spark)
    if handler is None:
        handler = _CONNECT_PROGRESS[spark] = _ConnectProgress()
        spark.registerProgressHandler(handler)  # type: ignore[arg-type]  # a ProgressHandler
    return lambda: handler.tasks


def heartbeat_text(phase: str | None, tasks: Tasks | None, planned: PlannedRead | None) -> str:
    """The heartbeat's message: the phase, its running tasks and, while the store is
    decoded, about how many of the planned entries are read (tasks hold about equal
    shares of them: ``connectors.rocketmq.task_packing.pack_tasks``)."""
    name = phase or "read"  # before the first labelled phase: the read is being set up
    if tasks is None:
        return f"{name}: still running (no Spark task at the moment)"
    text = f"{name}: {tasks.done}/{tasks.total} tasks done in {tasks.stages} stage(s)"
    if phase == DECODE_PHASE and planned is not None and tasks.total:
        read = planned.entries * tasks.done // tasks.total
        text += f", about {read} of {planned.entries} consume-queue entries read"
    return text


class ProgressLines:
    """The run's progress printer (a ``jobs.output.Progress``), with its heartbeat."""

    def __init__(
        self,
        started: float,
        write: Callable[[str], None] = write_stderr,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._started, self._write, self._clock = started, write, clock
        self._last = clock()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.planned: PlannedRead | None = None

    def __call__(self, message: str) -> None:
        with self._lock:
            now = self._clock()
            self._write(f"[{now - self._started:7.1f}s] {message}")
            self._last = now

    def beat(self, tasks: Tasks | None) -> bool:
        """One look of the heartbeat: a line when nothing was printed for ``HEARTBEAT_S``
        (the lock keeps it from printing once ``stop`` returned). True when it printed."""
        with self._lock:
            now = self._clock()
            if self._stopped.is_set() or now - self._last < HEARTBEAT_S:
                return False
            text = heartbeat_text(_current_phase, tasks, self.planned)
            self._write(f"[{now - self._started:7.1f}s] {text}")
            self._last = now
            return True

    def start(self, poll: TaskPoll, interval: float = POLL_S) -> None:
        """Start the heartbeat thread (a daemon: it never keeps the process alive)."""

        def run() -> None:
            while not self._stopped.wait(interval):
                try:
                    tasks = poll()
                except Exception:  # the session is stopping: the run reports its own error
                    return
                self.beat(tasks)

        self._thread = threading.Thread(target=run, name="progress-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the heartbeat: after this returns it prints nothing (progress lines still do)."""
        with self._lock:
            self._stopped.set()
        phase_started(None)  # the next run in this process starts unlabelled
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def stop_heartbeat(progress: Callable[[str], None]) -> None:
    """Stop ``progress``'s heartbeat, if it has one (before the summary is printed)."""
    if isinstance(progress, ProgressLines):
        progress.stop()


def planned_read(stores: Sequence[str]) -> PlannedRead | None:
    """The read's plan of the stores (``plan_stores``: the read uses it, the stores are
    planned once) with the consume-queue entries it holds (all written entries of the half
    and op queues) and the commit logs' sizes; None when a store cannot be planned (the
    read plans it again and reports why)."""
    from connectors.errors import InputError
    from connectors.rocketmq.reader import QueueUnit, list_commitlog, parse_store_arg, plan_stores

    files = size = 0
    try:
        specs = [parse_store_arg(arg) for arg in stores]
        plan = plan_stores(specs)
        for spec in specs:
            commitlog = list_commitlog(spec.root)[0]
            files += len(commitlog)
            size += sum(_on_disk(spec.root / file.name, file.size) for file in commitlog)
    except (OSError, ValueError, InputError):  # the read reports what it cannot plan
        return None
    entries = sum(unit.weight for unit in plan.units if isinstance(unit, QueueUnit))
    return PlannedRead(entries, files, size, len(stores), plan)


def _on_disk(path: Path, size: int) -> int:
    """The bytes a file takes on disk, at most its size (a preallocated file is sparse)."""
    return min(size, path.stat().st_blocks * 512)
