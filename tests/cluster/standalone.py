"""A Spark standalone cluster on loopback for the tests: one master and two workers, each a
separate ``spark-class`` process of an installed pyspark.

The pip package has no start scripts and ``spark-class`` runs in the foreground, so each
daemon is started here in its own process group (``start_new_session``) and stopped by its
pid: SIGTERM to its group (the worker's executors and their Python workers included), then
SIGKILL if it lingers. Everything binds to 127.0.0.1 on free ports; work, log and scratch
directories live under the given folder; the daemons get a clean environment (what
``env -i`` leaves, plus only what they need) and run from that folder, never the checkout.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 20


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def java_home() -> str:
    """JAVA_HOME, or the JDK the ``java`` on PATH belongs to (a clean environment has neither
    set otherwise); a clear failure when there is no Java."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder) / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate.resolve().parent.parent)
    raise RuntimeError("no Java found: set JAVA_HOME or put java on PATH (Java 17)")


def clean_env(spark_home: Path, scratch: Path, **extra: str) -> dict[str, str]:
    """A minimal environment: nothing of the caller's (no PYTHONPATH, no SPARK_* settings,
    no virtualenv), only what Java, Spark and Python need, temporary files under ``scratch``."""
    tmp = scratch / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    conf = scratch / "spark-conf"  # empty: no spark-defaults.conf or spark-env.sh of the machine
    conf.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(scratch)),
        "LANG": "C.UTF-8",
        "JAVA_HOME": java_home(),
        "SPARK_HOME": str(spark_home),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOCAL_DIRS": str(scratch / "local"),
        "TMPDIR": str(tmp),
    }
    env.update(extra)
    return env


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the daemon's process group (its pid), SIGKILL after a grace period."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_GRACE_S)
        # Children that outlived the daemon (an executor JVM, a Python worker) share its group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


@dataclass
class Worker:
    daemon: Daemon
    port: int
    webui_port: int
    work_dir: Path


@dataclass
class StandaloneCluster:
    """``with StandaloneCluster(spark_home, folder) as cluster:`` starts master and workers,
    waits until every worker is registered, and always stops them on leaving."""

    spark_home: Path
    folder: Path
    workers: int = 2
    cores: int = 1
    worker_memory: str = "1g"
    daemon_memory: str = "256m"
    register_timeout_s: float = 240
    master_port: int = 0
    master_webui_port: int = 0
    master: Daemon | None = None
    worker_list: list[Worker] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    def _env(self) -> dict[str, str]:
        tmp = self.folder / "tmp"
        return clean_env(
            self.spark_home,
            self.folder,
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_DAEMON_JAVA_OPTS=f"-Djava.io.tmpdir={tmp}",
        )

    def _start(self, name: str, argv: list[str]) -> Daemon:
        logs = self.folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(self.spark_home / "bin" / "spark-class"), *argv],
                cwd=self.folder,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, stopped by its pid
            )
        return Daemon(name, process, log)

    def start(self) -> StandaloneCluster:
        atexit.register(self.stop)  # also when the test process is interrupted
        self.master_port, self.master_webui_port = free_port(), free_port()
        self.master = self._start(
            "master",
            [
                MASTER_CLASS,
                "--host",
                LOOPBACK,
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_webui_port),
            ],
        )
        for index in range(self.workers):
            port, webui = free_port(), free_port()
            work = self.folder / f"worker-{index}"
            work.mkdir(parents=True, exist_ok=True)
            daemon = self._start(
                f"worker-{index}",
                [
                    WORKER_CLASS,
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(port),
                    "--webui-port",
                    str(webui),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    str(work),
                    self.url,
                ],
            )
            self.worker_list.append(Worker(daemon, port, webui, work))
        self.wait_registered()
        return self

    def state(self) -> dict:
        """The master's JSON status page (workers, applications)."""
        url = f"http://{LOOPBACK}:{self.master_webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)

    def wait_registered(self) -> None:
        deadline = time.monotonic() + self.register_timeout_s
        alive = 0
        while time.monotonic() < deadline:
            for daemon in self.daemons():
                if not daemon.alive():
                    raise RuntimeError(
                        f"spark {daemon.name} exited with {daemon.process.returncode}:\n{daemon.tail()}"
                    )
            with contextlib.suppress(OSError, ValueError):
                alive = sum(w.get("state") == "ALIVE" for w in self.state().get("workers", []))
                if alive == self.workers:
                    return
            time.sleep(1)
        raise RuntimeError(
            f"only {alive} of {self.workers} workers registered with {self.url} within "
            f"{self.register_timeout_s:.0f} s:\n"
            + "\n".join(f"--- {d.name}\n{d.tail()}" for d in self.daemons())
        )

    def daemons(self) -> list[Daemon]:
        return [w.daemon for w in self.worker_list] + ([self.master] if self.master else [])

    def stop(self) -> None:
        """Workers first (they take their executors with them), then the master."""
        for daemon in self.daemons():
            daemon.stop()

    def __enter__(self) -> StandaloneCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
