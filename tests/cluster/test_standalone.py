"""The cluster harness itself (part of `make test`, no Spark): daemons are stopped with
their children, and a daemon that dies at start fails the start with its log and leaves
nothing running."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.standalone import Daemon, StandaloneCluster


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie child of ours counts as gone once reaped; anything else is still running.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" in status.read_text()


def test_stop_ends_the_daemon_and_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    log = tmp_path / "log"
    # A "daemon" with a child of its own (like a worker's executor JVM).
    process = subprocess.Popen(
        ["bash", "-c", f"sleep 300 & echo $! > {pids}; wait"],
        start_new_session=True,
        stdout=log.open("wb"),
    )
    daemon = Daemon("probe", process, log)
    deadline = time.monotonic() + 10
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pids.read_text())

    daemon.stop()

    assert not daemon.alive()
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_a_daemon_that_dies_at_start_fails_with_its_log(tmp_path: Path) -> None:
    spark_home = tmp_path / "spark"
    (spark_home / "bin").mkdir(parents=True)
    script = spark_home / "bin" / "spark-class"
    script.write_text('#!/bin/sh\necho "cannot start $1"\nexit 3\n')
    script.chmod(0o755)
    cluster = StandaloneCluster(spark_home, tmp_path / "cluster", register_timeout_s=30)

    with (
        pytest.raises(RuntimeError, match=r"exited with 3:\ncannot start org.apache.spark"),
        cluster,
    ):
        pass

    assert cluster.daemons()
    assert not any(daemon.alive() for daemon in cluster.daemons())
