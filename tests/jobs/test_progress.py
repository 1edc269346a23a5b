"""Progress lines and the heartbeat of a long phase (jobs/progress.py), with a clock and a
status tracker injected: no Spark, no waiting on time."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from connectors.rocketmq.reader import StoreSpec, plan_stores
from jobs import progress as progress_module
from jobs.progress import (
    HEARTBEAT_S,
    PlannedRead,
    ProgressLines,
    Tasks,
    heartbeat_text,
    phase_started,
    planned_read,
    stop_heartbeat,
    write_stderr,
)
from tests.robustness.store import base_rows, write


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def printer(clock: Clock) -> tuple[ProgressLines, list[str]]:
    lines: list[str] = []
    return ProgressLines(started=clock.now, write=lines.append, clock=clock), lines


PLANNED = PlannedRead(entries=4900, commitlog_files=1, commitlog_bytes=5_000_000, stores=1)


@pytest.fixture(autouse=True)
def no_phase():
    phase_started(None)
    yield
    phase_started(None)


def test_heartbeat_text_names_the_phase_tasks_and_the_entries_read_while_decoding():
    assert (
        heartbeat_text("decode", Tasks(done=3, total=8, stages=1), PLANNED)
        == "decode: 3/8 tasks done in 1 stage(s), about 1837 of 4900 consume-queue entries read"
    )
    # Other phases read no planned entries; without a plan (exported segments) none either.
    assert (
        heartbeat_text("write", Tasks(5, 20, 2), PLANNED) == "write: 5/20 tasks done in 2 stage(s)"
    )
    assert heartbeat_text("decode", Tasks(1, 2, 1), None) == "decode: 1/2 tasks done in 1 stage(s)"
    assert (
        heartbeat_text("resolve and classify", None, PLANNED)
        == "resolve and classify: still running (no Spark task at the moment)"
    )
    assert heartbeat_text(None, None, None) == "read: still running (no Spark task at the moment)"


def test_the_planned_read_line_gives_entries_files_and_bytes_on_disk():
    assert PLANNED.line() == (
        "reading 4900 consume-queue entries; 1 commit-log file(s), 4.8 MiB on disk; 1 store(s)"
    )
    small = PlannedRead(entries=9, commitlog_files=2, commitlog_bytes=512, stores=2)
    assert small.line().endswith("2 commit-log file(s), 512 B on disk; 2 store(s)")


def test_progress_lines_carry_the_seconds_since_the_start():
    clock = Clock()
    progress, lines = printer(clock)
    clock.now += 12.34
    progress("read 4900 half/op records from 1 input(s)")
    assert lines == ["[   12.3s] read 4900 half/op records from 1 input(s)"]


def test_a_phase_shorter_than_the_heartbeat_prints_nothing_more():
    clock = Clock()
    progress, lines = printer(clock)
    phase_started("decode")
    for _ in range(5):
        clock.now += (HEARTBEAT_S - 0.5) / 5
        assert not progress.beat(Tasks(1, 2, 1))
    progress("read 4900 half/op records from 1 input(s)")
    assert lines == [f"[{HEARTBEAT_S - 0.5:7.1f}s] read 4900 half/op records from 1 input(s)"]


def test_a_long_phase_gets_a_line_at_least_every_heartbeat_and_any_line_resets_it():
    clock = Clock()
    progress, lines = printer(clock)
    progress.planned = PLANNED
    phase_started("decode")
    clock.now += HEARTBEAT_S
    assert progress.beat(Tasks(1, 4, 1))
    clock.now += HEARTBEAT_S - 1
    assert not progress.beat(Tasks(2, 4, 1))  # 9 s since the last line
    progress("a progress line")
    clock.now += HEARTBEAT_S - 1
    assert not progress.beat(Tasks(3, 4, 1))  # 9 s since the progress line
    clock.now += 1
    # Nothing changed is still a line: the operator sees the run is alive.
    assert progress.beat(Tasks(3, 4, 1))
    assert lines == [
        "[   10.0s] decode: 1/4 tasks done in 1 stage(s), about 1225 of 4900 consume-queue"
        " entries read",
        "[   19.0s] a progress line",
        "[   29.0s] decode: 3/4 tasks done in 1 stage(s), about 3675 of 4900 consume-queue"
        " entries read",
    ]


def test_after_stop_the_heartbeat_prints_nothing_but_progress_lines_still_do():
    clock = Clock()
    progress, lines = printer(clock)
    stop_heartbeat(progress)  # before the summary
    clock.now += 10 * HEARTBEAT_S
    assert not progress.beat(Tasks(1, 2, 1))
    progress("done")
    assert lines == ["[  100.0s] done"]
    stop_heartbeat(lines.append)  # a plain Progress has no heartbeat: nothing to stop


def test_the_heartbeat_thread_polls_the_tracker_and_stops_cleanly():
    clock = Clock()
    printed = threading.Event()
    lines: list[str] = []

    def write(line: str) -> None:
        lines.append(line)
        printed.set()

    progress = ProgressLines(started=clock.now, write=write, clock=clock)
    polls: list[int] = []

    def poll() -> Tasks:
        polls.append(1)
        clock.now += HEARTBEAT_S  # each look finds the phase silent for a whole heartbeat
        return Tasks(len(polls), 100, 1)

    phase_started("write")
    progress.start(poll, interval=0.01)
    assert printed.wait(timeout=60), "the heartbeat never printed"
    progress.stop()
    count = len(lines)
    clock.now += 100 * HEARTBEAT_S
    assert not progress.beat(Tasks(1, 1, 1))
    assert len(lines) == count and lines[0].startswith("[   10.0s] write: 1/100 tasks done")


def test_a_tracker_that_fails_ends_the_heartbeat_quietly():
    clock = Clock()
    progress, lines = printer(clock)
    failed = threading.Event()

    def poll() -> Tasks:
        failed.set()
        raise ConnectionError("the session is stopping")

    progress.start(poll, interval=0.01)
    assert failed.wait(timeout=60)
    progress.stop()
    assert lines == []


def test_planned_read_counts_every_written_entry_of_the_half_and_op_queues(tmp_path: Path):
    rows = write(tmp_path / "store", base_rows())
    planned = planned_read([f"b={tmp_path / 'store'}"])
    assert planned is not None
    assert (planned.entries, planned.commitlog_files, planned.stores) == (len(rows), 1, 1)
    assert 0 < planned.commitlog_bytes <= 4096


def test_planned_read_holds_the_plan_the_read_is_given(tmp_path: Path):
    """``jobs.run`` hands the plan to the read (``read_stores(plan=...)``): it is the
    read's own plan of the stores, the offsets file's committed offsets included."""
    write(tmp_path / "store", base_rows())
    planned = planned_read([f"b={tmp_path / 'store'}"])
    assert planned is not None
    assert planned.plan == plan_stores([StoreSpec("b", tmp_path / "store")])


def test_under_spark_submit_lines_go_through_the_jvms_stderr(monkeypatch, capsys):
    # spark-submit merges the Python driver's stderr into its stdout (PythonRunner).
    class Stream:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def println(self, line: str) -> None:
            self.lines.append(line)

        def flush(self) -> None:
            pass

    class System:
        err = Stream()

    class Jvm:
        pass

    jvm = Jvm()
    jvm.System = System  # type: ignore[attr-defined]
    monkeypatch.setattr(progress_module, "_submit_jvm", lambda: jvm)
    write_stderr("[    1.0s] read 3 half/op records from 1 input(s)")
    assert System.err.lines == ["[    1.0s] read 3 half/op records from 1 input(s)"]
    assert capsys.readouterr() == ("", "")


def test_without_spark_submit_lines_go_to_pythons_stderr(monkeypatch, capsys):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    write_stderr("error: something")
    assert capsys.readouterr() == ("", "error: something\n")
