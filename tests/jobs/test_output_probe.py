"""The output root is probed for writing before Spark starts (jobs.cli.validate_output):
one ``error: --output ...`` line, and nothing left behind by the probe."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from connectors.errors import InputError
from jobs.cli import validate_output


@contextmanager
def immutable(folder: Path) -> Iterator[Path]:
    """``folder`` made immutable (root writes anywhere else; ``chattr +i`` stops it too).
    Without chattr the test fails: check=True raises, it is not skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chattr", "+i", str(folder)], check=True, capture_output=True)
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True, capture_output=True)


def _message(output: Path | str) -> str:
    with pytest.raises(InputError) as caught:
        validate_output(str(output), [])
    return str(caught.value)


def test_an_immutable_root_cannot_be_written(tmp_path: Path) -> None:
    with immutable(tmp_path / "out") as out:
        assert (
            _message(out) == f"--output {out}: cannot create a file in it: Operation not permitted"
        )
        assert list(out.iterdir()) == []


def test_a_root_to_create_inside_an_immutable_folder(tmp_path: Path) -> None:
    with immutable(tmp_path / "locked") as locked:
        output = locked / "a" / "out"
        assert _message(output) == (
            f"--output {output}: cannot create the directory: Operation not permitted"
        )
        assert list(locked.iterdir()) == []


def test_a_root_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    output = tmp_path / "file" / "a" / "out"
    assert (
        _message(output) == f"--output {output}: cannot be created: {tmp_path / 'file'} is a file"
    )


def test_a_root_given_as_a_file_uri_is_probed_too(tmp_path: Path) -> None:
    with immutable(tmp_path / "out") as out:
        assert "cannot create a file in it" in _message(f"file://{out}")


def test_the_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    validate_output(str(tmp_path / "new" / "deeper" / "out"), [])
    assert list(tmp_path.iterdir()) == []  # the folders it made are removed again
    (tmp_path / "existing").mkdir()
    validate_output(str(tmp_path / "existing"), [])
    assert list((tmp_path / "existing").iterdir()) == []


def test_other_file_systems_pass_through() -> None:
    validate_output("s3://bucket/out", [])
    validate_output("abfss://container@account.dfs.core.windows.net/out", [])


def test_a_root_removed_by_a_concurrent_probe_is_probed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs on one new root each create it and remove it again: the first to clean up
    takes the directory from under the other, whose probe then tries again."""
    output = tmp_path / "out"
    real_mkstemp = tempfile.mkstemp
    calls: list[str] = []

    def other_run_cleans_up_first(*args: Any, **kwargs: Any) -> tuple[int, str]:
        calls.append(str(kwargs["dir"]))
        if len(calls) == 1:
            output.rmdir()
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", other_run_cleans_up_first)
    validate_output(str(output), [])
    assert calls == [str(output), str(output)]
    assert list(tmp_path.iterdir()) == []


def test_a_root_that_keeps_vanishing_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "out"

    def always_removed(*args: Any, **kwargs: Any) -> tuple[int, str]:
        output.rmdir()
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(tempfile, "mkstemp", always_removed)
    assert (
        _message(output) == f"--output {output}: cannot create a file in it: the directory vanished"
    )
