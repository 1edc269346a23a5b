"""Every command block in README.md and docs/ runs as written, on the state `make run` leaves.

A command block is a fenced block whose info string names a shell (``bash``, ``sh``,
``shell``, ``console``) or ``python``. A bare fence holds output, a synopsis (the command
line of ``docs/spec/reconcile.md``), a layout or a diagram, and is never run. The line right
before a command block's fence (an HTML comment: GitHub shows nothing) says what it is:

    <!-- runnable -->                run by this test; it must exit 0
    <!-- runnable: exit N -->        ... it must exit N (a refusal shown on purpose)
    <!-- runnable: NAME=VALUE -->    ... with the variable the text names set (e.g. the
                                     store directory a procedure calls $STORE)
    <!-- not runnable: REASON -->    not run here, and why: a cluster, a real broker, an hour
                                     of work, a second whole job run (and which test runs it)

``test_every_command_block_is_marked`` (part of ``make test``) fails on a command block
with neither, so each new block is decided on.

``test_the_block_runs_as_written`` (marker ``processes``: ``make test-processes``) first
runs ``make run`` once, in a checkout-like temporary directory (what a fresh clone holds,
and the venv, symlinked; ``sample/`` and whatever the blocks create are its own): the one
whole job run of this test; blocks that would start another are ``not runnable`` and name
the test that runs them (the README's usage block: its launchers run with ``--help``). Then each document's runnable blocks run in document order, in that document's own
copy of the directory, so a block sees what the blocks above it did, as a reader running
them top to bottom would. A shell block runs with ``bash -e -o pipefail -c BLOCK``, a python
block with ``.venv/bin/python -c BLOCK`` (the README's notebook kernel). The environment is
a new user's shell: the venv is not active (its ``bin`` is not on ``PATH``; ``VIRTUAL_ENV``
and ``PYSPARK_*`` are unset), so a bare ``spark-submit`` or ``python`` fails here as it does
for them; a block that needs the venv says ``.venv/bin/`` or activates it itself. The blocks
write in the temporary directory; the checkout's own ``sample/`` is never read or touched.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMAND_LANGUAGES = {"bash", "sh", "shell", "console", "python"}
# A fresh clone's entries, linked into the checkout-like directory; `make run` and the
# blocks create everything else there (sample/, out/, dist/, what Spark leaves).
LINKED_UNTRACKED = {".git", ".venv"}
BLOCK_TIMEOUT_S = 600

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not runnable|runnable)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    document: str  # relative to the checkout
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    kind: str | None  # "runnable", "not runnable" or None (no marker)
    arg: str

    @property
    def expected_exit(self) -> int:
        found = re.search(r"(?:^|\s)exit (\d+)(?:\s|$)", self.arg)
        return int(found.group(1)) if found else 0

    @property
    def variables(self) -> dict[str, str]:
        return dict(re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=(\S+)", self.arg))

    def bad_argument(self) -> bool:
        rest = re.sub(r"(?:^|\s)(exit \d+|[A-Z_][A-Z0-9_]*=\S+)(?=\s|$)", "", self.arg)
        return bool(rest.strip())

    def __str__(self) -> str:
        return f"{self.document}:{self.line}"


def _dedent(lines: list[str], indent: str) -> str:
    return "".join(line.removeprefix(indent) + "\n" for line in lines)


def command_blocks(path: Path) -> list[Block]:
    """The command blocks of one Markdown file, in order, with their markers."""
    lines = path.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(
            (j for j in range(index + 1, len(lines)) if lines[j].strip() == "```"), len(lines)
        )
        info = fence.group("info").split()
        if info and info[0] in COMMAND_LANGUAGES:
            marker = MARKER.match(lines[index - 1]) if index else None
            blocks.append(
                Block(
                    document=str(path.relative_to(ROOT)),
                    line=index + 1,
                    language=info[0],
                    code=_dedent(lines[index + 1 : end], fence.group("indent")),
                    kind=marker.group("kind") if marker else None,
                    arg=(marker.group("arg") or "") if marker else "",
                )
            )
        index = end + 1
    return blocks


ALL_BLOCKS = [block for path in DOCUMENTS for block in command_blocks(path)]
RUNNABLE = [block for block in ALL_BLOCKS if block.kind == "runnable"]


def test_every_command_block_is_marked() -> None:
    unmarked = [f"{block}: {block.code.splitlines()[0]}" for block in ALL_BLOCKS if not block.kind]
    assert not unmarked, (
        "command blocks without <!-- runnable --> or <!-- not runnable: REASON --> on the"
        " line before the fence:\n" + "\n".join(unmarked)
    )
    no_reason = [
        str(block) for block in ALL_BLOCKS if block.kind == "not runnable" and not block.arg
    ]
    assert not no_reason, f"not runnable without a reason: {no_reason}"
    bad_args = [str(block) for block in RUNNABLE if block.bad_argument()]
    assert not bad_args, f"runnable takes `exit N` and NAME=VALUE only: {bad_args}"
    assert RUNNABLE, "no runnable block found: the marker or the parser changed"


# -- running them -------------------------------------------------------------------------


def fresh_shell_env() -> dict[str, str]:
    """A new user's shell: this suite's environment without the venv and the variables the
    suite, make or an activated venv set."""
    venv_bins = {
        os.path.realpath(ROOT / ".venv" / "bin"),
        os.path.realpath(Path(sys.executable).parent),
    }
    dropped = {"VIRTUAL_ENV", "PYTHONPATH", "MAKELEVEL", "MAKEFLAGS", "MFLAGS"}
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in dropped and not key.startswith(("PYSPARK_", "PYTEST_"))
    }
    path = os.environ.get("PATH", os.defpath).split(os.pathsep)
    env["PATH"] = os.pathsep.join(p for p in path if p and os.path.realpath(p) not in venv_bins)
    return env


def _run(
    argv: list[str], cwd: Path, variables: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env={**fresh_shell_env(), **(variables or {})},
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def tracked_top_level() -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout
    return {name.split("/", 1)[0] for name in listed.split("\0") if name}


@pytest.fixture(scope="module")
def after_make_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout-like directory after ``make run`` (the stamp of the shared venv is taken
    as up to date: ``-o``, so that make never reinstalls it)."""
    made = tmp_path_factory.mktemp("docs") / "checkout"
    made.mkdir()
    for name in sorted(tracked_top_level() | LINKED_UNTRACKED):
        (made / name).symlink_to(ROOT / name)
    result = _run(["make", "-o", ".venv/.installed-stamp", "run"], made)
    assert result.returncode == 0, f"make run: exit {result.returncode}\n{_tail(result.stderr)}"
    assert (made / "sample" / "output" / "run_summary").is_dir()
    return made


class _Reader:
    """One document's copy of the state, and how far down the document it has run."""

    def __init__(self, source: Path, folder: Path) -> None:
        shutil.copytree(source, folder, symlinks=True)
        self.folder = folder
        self.done = 0


_readers: dict[str, _Reader] = {}
_copies = itertools.count()


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    if block.language == "python":
        return _run([str(cwd / ".venv" / "bin" / "python"), "-c", block.code], cwd, block.variables)
    return _run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd, block.variables)


@pytest.mark.processes
@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_the_block_runs_as_written(block: Block, after_make_run: Path) -> None:
    mine = [other for other in RUNNABLE if other.document == block.document]
    position = mine.index(block)
    reader = _readers.get(block.document)
    if reader is None or reader.done > position:  # first, or selected out of order
        folder = after_make_run.parent / f"{Path(block.document).stem}-{position}-{next(_copies)}"
        reader = _readers[block.document] = _Reader(after_make_run, folder)
    for earlier in mine[reader.done : position]:  # what a reader ran above it (-k selection)
        run_block(earlier, reader.folder)
    reader.done = position + 1

    result = run_block(block, reader.folder)

    assert result.returncode == block.expected_exit, (
        f"{block}: exit {result.returncode}, expected {block.expected_exit}\n"
        f"--- block ({block.language})\n{block.code}--- stderr\n{_tail(result.stderr)}\n"
        f"--- stdout\n{_tail(result.stdout, 15)}"
    )


# -- the launchers of a block that is not run ----------------------------------------------


def launchers(block: Block) -> list[str]:
    """Each distinct command of a block up to its first ``--`` option: how it starts the job."""
    joined = block.code.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        command = line.split(" #", 1)[0].strip()
        if command and not command.startswith("#"):
            launcher = re.split(r"\s--", command, maxsplit=1)[0].strip()
            if launcher not in found:
                found.append(launcher)
    return found


USAGE = next(block for block in ALL_BLOCKS if "jobs/reconcile.py" in block.code)


@pytest.mark.processes
@pytest.mark.parametrize("launcher", launchers(USAGE))
def test_each_launcher_of_the_usage_block_starts_the_job(launcher: str) -> None:
    # The usage block runs the job on stores of one's own (placeholders): its launchers run
    # as written, with --help for the job's arguments, from a new user's shell.
    result = _run(["bash", "-e", "-c", f"{launcher} --help"], ROOT)
    assert result.returncode == 0, (
        f"{launcher} --help: exit {result.returncode}\n{_tail(result.stderr)}"
    )
    assert result.stdout.startswith("usage: python -m jobs.reconcile"), result.stdout[:500]
    assert "exit codes:" in result.stdout
