"""Rounds to compare: the checked-in real-broker fixtures (always) and the run directories
named by ``RMQ_BROKER_RUN`` (when set); the closing summary line."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.broker import summary
from tests.broker.runs import fixture_dirs, load_run, run_dirs_from_env


def _sources() -> list[tuple[str, object]]:
    """(source, RecordedRound) pairs; a broken source becomes ("error", message)."""
    found: list[tuple[str, object]] = []
    try:
        runs = [("run", d) for d in run_dirs_from_env()]
    except AssertionError as exc:
        runs = []
        found.append(("error", Failure("run", str(exc))))
    fixtures = fixture_dirs()
    if not fixtures:
        found.append(
            (
                "error",
                Failure("fixture", "tests/fixtures/real-broker/: no checked-in real-broker run"),
            )
        )
    for source, directory in [("fixture", d) for d in fixtures] + runs:
        try:
            found.extend((source, r) for r in load_run(directory))
        except AssertionError as exc:
            found.append(("error", Failure(source, str(exc))))
    return found


@dataclass(frozen=True)
class Failure:
    """A source that cannot be compared: its tests fail with this one line."""

    source: str
    message: str

    def __str__(self) -> str:
        return self.message


_SOURCES: list[tuple[str, object]] | None = None


def sources() -> list[tuple[str, object]]:
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = _sources()
    return _SOURCES


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "recorded" in metafunc.fixturenames:
        items = sources()
        metafunc.parametrize(
            "source,recorded",
            items,
            ids=[
                f"{s}:{r.id}" if s != "error" else f"{r.source}:error{k}"
                for k, (s, r) in enumerate(items)
            ],
        )
    if "live_store" in metafunc.fixturenames:
        # The live (torn) copy of every run that has one; the checked-in fixtures keep none
        # (test_broker_round.py tears a simulated store for make test).
        runs = sorted(
            {
                (s, r.snapshot.parent / "live")
                for s, r in sources()
                if s != "error" and (r.snapshot.parent / "live").is_dir()
            }
        )
        errors = [(s, r) for s, r in sources() if s == "error" and r.source == "run"]
        errors += [
            ("error", Failure("run", f"{d}: the harness run has no snapshots/live"))
            for d in sorted({r.snapshot.parent.parent for s, r in sources() if s == "run"})
            if not (d / "snapshots" / "live").is_dir()
        ]
        params = [pytest.param(s, p, id=f"{s}:{p.parent.parent.name}") for s, p in runs] + [
            pytest.param(s, r, id=f"{r.source}:error{k}") for k, (s, r) in enumerate(errors)
        ]
        if not params:
            params = [
                pytest.param(
                    "none",
                    None,
                    id="no-run",
                    marks=pytest.mark.skip(
                        reason="live copies come with harness runs: set RMQ_BROKER_RUN "
                        "(test_broker_round.py tears a simulated store meanwhile)"
                    ),
                )
            ]
        metafunc.parametrize("live_source,live_store", params)
    if "version_line" in metafunc.fixturenames:
        # Class coverage is asserted on harness runs (make test-broker): the checked-in
        # fixtures keep two rounds per version line, too few to hold every class.
        lines = sorted({(s, r.line) for s, r in sources() if s == "run"})
        errors = [(s, r) for s, r in sources() if s == "error" and r.source == "run"]
        params = [pytest.param(s, x, id=f"{s}:{x}") for s, x in lines] + [
            pytest.param(s, r, id=f"run:error{k}") for k, (s, r) in enumerate(errors)
        ]
        if not params:
            params = [
                pytest.param(
                    "none",
                    "none",
                    id="no-run",
                    marks=pytest.mark.skip(
                        reason="class coverage is asserted on harness runs: set RMQ_BROKER_RUN"
                    ),
                )
            ]
        metafunc.parametrize("version_source,version_line", params)


# A fresh results file per session (this conftest is imported once, at collection).
summary.reset()


def pytest_terminal_summary(terminalreporter) -> None:
    line = summary.summary_line(summary.read(summary.results_path()))
    if line is not None:
        terminalreporter.write_line(line)
