"""The commit lock on a local output root excludes other processes (real processes, no
Spark): a second process trying to commit waits until the first one releases."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from connectors.delta import LOCK_NAME, commit_lock, local_root

ROOT = Path(__file__).resolve().parents[2]
CONTENDER = """
import sys
from pathlib import Path
from connectors.delta import commit_lock
log = Path(sys.argv[2])
with log.open("a") as out:
    out.write("B trying\\n")
with commit_lock(sys.argv[1]):
    with log.open("a") as out:
        out.write("B acquired\\n")
"""


def _wait_for(path: Path, text: str) -> None:
    for _ in range(6000):  # a bound, not a timing assertion: the other process must get there
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.01)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_a_second_process_waits_for_the_lock(tmp_path: Path) -> None:
    root, log = tmp_path / "out", tmp_path / "order.log"
    with commit_lock(str(root)):
        log.write_text("A acquired\n")
        contender = subprocess.Popen(
            [sys.executable, "-c", CONTENDER, str(root), str(log)], cwd=ROOT
        )
        _wait_for(log, "B trying")
        time.sleep(0.5)  # room for B to (wrongly) get in while A holds the lock
        with log.open("a") as out:
            out.write("A releasing\n")
    assert contender.wait(timeout=120) == 0
    assert log.read_text().splitlines() == ["A acquired", "B trying", "A releasing", "B acquired"]
    assert (root / LOCK_NAME).is_file()


@pytest.mark.parametrize(
    ("root", "local"),
    [("/data/out", "/data/out"), ("file:///data/out", "/data/out"), ("s3://bucket/out", None)],
)
def test_only_local_roots_are_locked(root: str, local: str | None) -> None:
    assert local_root(root) == (Path(local) if local else None)


def test_absolute_root_resolves_local_roots_and_keeps_uris(tmp_path, monkeypatch) -> None:
    from connectors.delta_commit import absolute_root

    monkeypatch.chdir(tmp_path)
    assert absolute_root("out/") == (tmp_path / "out").resolve().as_posix()
    assert absolute_root(f"file://{tmp_path}/out") == (tmp_path / "out").as_posix()
    assert absolute_root("s3://bucket/out/") == "s3://bucket/out"
