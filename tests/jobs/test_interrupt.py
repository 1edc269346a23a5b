"""Ctrl-C and SIGTERM in the middle of a run (jobs/interrupt.py): one line on stderr, exit
130 / 143, no Py4J or Spark traceback, the JVM gone, nothing written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.interrupt import interrupted_line
from tests.jobs.test_front_door import clean_env
from tests.robustness.store import T, base_rows, write

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the JVM the job starts)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            # pid (comm) state ppid ...: comm may hold spaces, the last ')' ends it
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# A fresh Python process starts its own Spark JVM: make test-processes, outside make test.
@pytest.mark.processes
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_run_is_one_line_and_its_exit_code(
    tmp_path: Path, signum: signal.Signals, code: int
) -> None:
    store, output = tmp_path / "store", tmp_path / "out"
    write(store, base_rows())
    process = subprocess.Popen(
        [sys.executable, "-m", "jobs.reconcile", "--store", str(store)]
        + ["--output", str(output), "--as-of", str(T)],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None and process.stdout is not None
    before = []
    for line in process.stderr:  # until the store is read: the round runs in Spark now
        before.append(line)
        if "half/op records from" in line:
            break
    jvms = children(process.pid)
    process.send_signal(signum)
    after = process.stderr.read().splitlines()
    stdout = process.stdout.read()
    assert process.wait(timeout=120) == code, "".join(before) + "\n".join(after)

    assert "half/op records from" in before[-1], "".join(before)
    assert jvms, "the job started no JVM"
    # The line is the last one; before it at most a progress line (the heartbeat may have
    # printed between the read above and the signal).
    assert after[-1] == interrupted_line(signum), after
    assert all(line.startswith("[") for line in after[:-1]), after
    assert stdout == ""  # no summary: the run stopped before it
    assert not list(output.glob("*/_delta_log"))  # stopped in the round: no table written
    # The JVM went with the job; its shutdown is given a bound, not a time to meet.
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in jvms) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(alive(pid) for pid in jvms)
