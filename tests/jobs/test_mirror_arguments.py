"""The mirror's flags are checked before Spark starts: stores only, a local output root."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.errors import InputError
from jobs.cli import build_parser, validate_arguments
from tests.jobs.segments import write_parquet_segments


@pytest.mark.parametrize("flag", ["--mirror", "--rebuild"])
def test_exported_segments_have_no_mirror(tmp_path: Path, flag: str) -> None:
    half, op, _ = write_parquet_segments(tmp_path / "in")
    argv = ["--half", str(half), "--op", str(op), "--format", "parquet", "--broker", "a"]
    args = build_parser().parse_args([*argv, "--output", str(tmp_path / "out"), flag])
    with pytest.raises(InputError, match="exported segments have no mirror"):
        validate_arguments(args)


def test_the_mirror_needs_a_local_output_root(tmp_path: Path) -> None:
    store = tmp_path / "a"
    (store / "commitlog").mkdir(parents=True)
    args = build_parser().parse_args(
        ["--store", str(store), "--output", "s3://bucket/out", "--mirror"]
    )
    with pytest.raises(InputError, match="the mirror needs a local output root"):
        validate_arguments(args)
