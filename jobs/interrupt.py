"""Ctrl-C (SIGINT) and SIGTERM in the command line's own process: one line on stderr and
exit 130 / 143, without the Py4J and Spark tracebacks of an interrupted Py4J call.

PySpark's own SIGINT handler cancels the jobs over Py4J from inside the Py4J call it
interrupted; the reentrant call fails, and Py4J logs each failure with its traceback. Here
the handler ends the process instead: the line; then this process's stderr closed to the
threads that would report the JVM's end, the JVM's logging off, the JVM the job started
shut down, and ``os._exit``. Nothing is half-written: a Delta table commits as a whole or
not at all, an offset fragment is renamed into place whole, and the summary is printed
only after every table is committed.

Only for the command line (``jobs.cli.main`` without a caller's session): a notebook or a
test keeps its own handlers and its session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from pyspark import SparkContext

from jobs.progress import last_line

SIGNALS = (signal.SIGINT, signal.SIGTERM)
JVM_QUIET_S = 2  # how long turning the JVM's logging off may take
JVM_EXIT_S = 10  # how long the JVM's shutdown may take before it is killed

_handling = False  # inside ``handled``: SIGINT is taken back from PySpark (``reclaim``)


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal's number (130 SIGINT, 143 SIGTERM)."""
    return 128 + signum


def interrupted_line(signum: int) -> str:
    """The one line an interrupted run prints."""
    return (
        f"error: interrupted ({signal.Signals(signum).name}); stopped at once: each table is"
        ' committed whole or not at all, those on "wrote" lines above are written'
    )


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM end the run at once (``_stop``) while the block runs; the
    previous handlers come back after it. Only in the main thread (Python's rule)."""
    global _handling
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _stop) for signum in SIGNALS}
    _handling = True
    try:
        yield
    finally:
        _handling = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def reclaim() -> None:
    """Take SIGINT back after a SparkContext started (it installs PySpark's handler)."""
    if _handling and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop)


def _stop(signum: int, _frame: FrameType | None) -> None:
    for other in SIGNALS:  # a second Ctrl-C while stopping changes nothing
        signal.signal(other, signal.SIG_IGN)
    line = interrupted_line(signum)
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # spark-submit: the line goes through the JVM (jobs.progress), over a Py4J
        # connection of its own (this thread's is inside the interrupted call).
        writer = threading.Thread(target=last_line, args=(line,), daemon=True)
        writer.start()
        writer.join(timeout=5)
    else:
        last_line(line)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    _quiet_stderr()
    _jvm_logging_off()
    _end_own_jvm()
    os._exit(exit_code(signum))


def _quiet_stderr() -> None:
    """After the line, the process's stderr goes nowhere: the threads still running (Py4J
    callbacks, PySpark's accumulator server) report the JVM's end with tracebacks."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())


def _end_own_jvm() -> None:
    """End the JVM this process started (``python -m jobs.reconcile``): its shutdown
    removes Spark's local directories; killed if it takes longer than ``JVM_EXIT_S``.
    Under spark-submit the JVM is the parent and ends when this process does."""
    process = getattr(SparkContext._gateway, "proc", None)
    if process is None:
        return
    with contextlib.suppress(Exception):
        process.terminate()
        try:
            process.wait(timeout=JVM_EXIT_S)
        except subprocess.TimeoutExpired:
            process.kill()


def _jvm_logging_off() -> None:
    """The JVM's shutdown (ours, or spark-submit's once this process is gone) logs the jobs
    it cuts short as errors: every logger off first, over a Py4J connection of its own
    (this thread's is inside the interrupted call)."""
    if SparkContext._active_spark_context is None:
        return
    quiet = threading.Thread(target=_logging_off, daemon=True)
    quiet.start()
    quiet.join(timeout=JVM_QUIET_S)


def _logging_off() -> None:
    # setLogLevel sets the root logger only, and conf/log4j2.properties gives Spark's
    # loggers levels of their own.
    with contextlib.suppress(Exception):
        log4j = SparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
        log4j.core.config.Configurator.setAllLevels("", log4j.Level.OFF)
