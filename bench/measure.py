"""Run a command and measure its whole process tree: wall time, CPU time, peak memory.

CPU time (user+sys) is counted two ways; both are kept in the results:

* ``cpu_s`` (the figure reported): psutil samples every live descendant every ``interval``
  s and remembers the last figures of those that exit. It misses what a process used after
  its last sample (at most ``interval`` s each; PySpark reuses its Python workers, so few
  processes end during a run).
* ``cpu_rusage_s``: ``getrusage(RUSAGE_CHILDREN)`` after every descendant is reaped. It looks
  exact but is not: the PySpark worker daemon sets ``SIGCHLD`` to ``SIG_IGN``
  (``pyspark/daemon.py``), so the kernel reaps the forked Python workers itself and
  *discards* their rusage; it never reaches the JVM, the driver or us. Measured on a 1M run:
  350 s by rusage against 359 s sampled. Kept as the cross-check (it can only be lower).

The harness makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) so that a
descendant whose parent dies first (the daemon's workers when the JVM goes) stays in our
tree for the sampler and is reaped by us, not by init.

``disk_read_bytes`` (psutil ``io_counters().read_bytes``, last sample of each process) is
what the tree made the kernel fetch from storage: near 0 when the stores were in the page
cache.

Peak memory is measured two ways. ``peak_rss_bytes``: the highest sum of RSS over the tree
seen by the sampler; pages shared between processes (forked Python workers) are counted once
per process, so it is an upper bound of the physical memory used. ``peak_pss_bytes``: the
highest sum of proportional set sizes (``/proc/<pid>/smaps_rollup``: a page shared by n
processes counts 1/n in each), the tree's real share of memory. Reading ``smaps_rollup``
walks the page tables of a multi-GB JVM, so PSS is sampled every ``pss_interval`` s (1 s)
rather than at every sample: a peak shorter than that can be missed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); False elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def evict_from_page_cache(roots: Iterable[Path]) -> None:
    """Drop the pages of every file under ``roots`` from the page cache (``os.sync`` first:
    a dirty page stays), so that the next command's ``disk_read_bytes`` counts what it reads
    of them; everything else (Python, Spark's jars) stays cached. A missing root is
    skipped."""
    os.sync()
    for root in roots:
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Measurement:
    """What one command used. ``cpu_rusage_s`` is None when the tree could not be reaped."""

    command: list[str]
    returncode: int
    wall_s: float
    cpu_s: float
    cpu_rusage_s: float | None
    peak_rss_bytes: int
    peak_pss_bytes: int
    max_processes: int
    processes_seen: int
    disk_read_bytes: int
    stdout: str = field(repr=False)
    stderr: str = field(repr=False)

    def figures(self) -> dict:
        """The JSON-able figures (no captured output)."""
        return {k: v for k, v in asdict(self).items() if k not in ("stdout", "stderr")}


class TreeSampler(threading.Thread):
    """Samples every descendant of this process: CPU (remembering the exited) and RSS sum."""

    def __init__(
        self, interval: float = 0.2, exclude: set[int] | None = None, pss_interval: float = 1.0
    ) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.pss_interval = pss_interval
        self._pss_due = 0.0  # monotonic time of the next PSS sample
        self.exclude = exclude or set()  # children (and their trees) that are not measured
        # Last figures seen per process, keyed by (pid, create time): user+sys seconds, and
        # bytes read from storage.
        self.cpu: dict[tuple[int, float], float] = {}
        self.disk: dict[tuple[int, float], int] = {}
        self.peak_rss = 0
        self.peak_pss = 0
        self.max_processes = 0
        self._halt = threading.Event()
        self._me = psutil.Process()

    def sample(self) -> None:
        rss, alive = 0, 0
        tree = self._tree()
        for proc in tree:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    key = (proc.pid, proc.create_time())
                    rss += proc.memory_info().rss
                    read_bytes = proc.io_counters().read_bytes
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            self.disk[key] = read_bytes
            # user+system only: children_* would count again the time of reaped children
            # that are (or were) sampled themselves.
            self.cpu[key] = times.user + times.system
            alive += 1
        self.peak_rss = max(self.peak_rss, rss)
        self.max_processes = max(self.max_processes, alive)
        if time.monotonic() >= self._pss_due:
            self._pss_due = time.monotonic() + self.pss_interval
            self.peak_pss = max(self.peak_pss, self._pss(tree))

    @staticmethod
    def _pss(tree: list[psutil.Process]) -> int:
        total = 0
        for proc in tree:
            with contextlib.suppress(
                psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess
            ):
                total += getattr(proc.memory_full_info(), "pss", 0)  # no PSS off Linux
        return total

    def _tree(self) -> list[psutil.Process]:
        found = []
        for child in self._me.children():
            if child.pid in self.exclude:
                continue
            found.append(child)
            with contextlib.suppress(psutil.Error):
                found.extend(child.children(recursive=True))
        return found

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    @property
    def disk_total(self) -> int:
        return sum(self.disk.values())

    @property
    def cpu_total(self) -> float:
        return sum(self.cpu.values())


def _child_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children()}


def _reap_orphans(keep: set[int], timeout: float) -> bool:
    """Wait for the children of this process that are not in ``keep`` (descendants of the
    command re-parented to us); True when all are reaped. ``keep`` holds the children from
    before the command, e.g. multiprocessing's resource tracker, which lives on."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = _child_pids() - keep
        for pid in waiting:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if not (_child_pids() - keep):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def run_measured(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    interval: float = 0.2,
    orphan_timeout: float = 30.0,
) -> Measurement:
    """Run ``command`` to completion and measure its process tree.

    Children this process already has (multiprocessing's resource tracker) are left out of
    the figures; a child started by another thread meanwhile would be counted.
    """
    subreaper = become_subreaper()
    before = _child_pids()
    cpu_before = _children_cpu()
    sampler = TreeSampler(interval, exclude=before)
    started = time.perf_counter()
    proc = subprocess.Popen(
        list(command),
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - started
    sampler.stop()
    reaped = _reap_orphans(before, orphan_timeout) if subreaper else False
    rusage = _children_cpu() - cpu_before if reaped else None
    return Measurement(
        command=list(command),
        returncode=proc.returncode,
        wall_s=wall,
        cpu_s=sampler.cpu_total,
        cpu_rusage_s=rusage,
        peak_rss_bytes=sampler.peak_rss,
        peak_pss_bytes=sampler.peak_pss,
        max_processes=sampler.max_processes,
        processes_seen=len(sampler.cpu),
        disk_read_bytes=sampler.disk_total,
        stdout=stdout,
        stderr=stderr,
    )
