"""The repository stands alone: nothing tracked refers outside the checkout."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A sibling folder of the checkout, this machine's work tree, the home directory of whoever
# runs the suite: none of them exists on a fresh clone elsewhere.
FORBIDDEN = [
    re.compile(r"\.\./shared\b"),
    re.compile(r"(?<![\w.~])/work/"),
    re.compile(re.escape(str(Path.home())) + r"/"),
]


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = []
    for name in filter(None, listed):
        path = ROOT / name.decode()
        data = path.read_bytes() if path.is_file() else b""
        if b"\0" not in data[:8192]:  # text only: binary fixtures hold arbitrary bytes
            files.append(path)
    return files


def offending_lines(files: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(pattern.search(line) for pattern in FORBIDDEN):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:120]}")
    return found


def test_no_tracked_file_refers_outside_the_checkout() -> None:
    # This file names the patterns it forbids: it is the one file not checked.
    files = [path for path in _tracked_text_files() if path != Path(__file__).resolve()]
    assert len(files) > 50, "git ls-files found too few files: is this a checkout?"
    assert offending_lines(files) == []


def test_the_guard_catches_each_kind_of_reference(tmp_path: Path) -> None:
    sample = tmp_path / "doc.md"
    sample.write_text(
        "see ../shared/spec/reconcile.md\n"
        "fixture at /work/shared/x\n"
        f"cache {Path.home()}/.cache/bench\n"
        "fine: ~/.cache/bench and docs/spec/reconcile.md\n"
    )
    found = offending_lines([sample], tmp_path)
    assert [entry.split(":")[1] for entry in found] == ["1", "2", "3"]
