"""The write phase of bench/writers.py is read from the job's progress lines."""

from __future__ import annotations

import pytest

from bench.writers import write_phase_seconds

STDERR = """\
[    3.0s] read 12 half/op records from 1 input(s)
[   10.5s] resolved and classified: 3 unresolved half records from h0, 0 bad records
[   11.0s] writing through DeltaSparkOutput
[   14.0s] wrote bad_records: 0 rows
[   19.25s] wrote consume_offsets: 4 rows
[   19.5s] done
"""


def test_write_phase_runs_from_the_round_to_the_last_commit() -> None:
    assert write_phase_seconds(STDERR) == pytest.approx(8.75)


def test_a_run_without_the_offsets_commit_has_no_write_phase() -> None:
    with pytest.raises(KeyError):
        write_phase_seconds(STDERR.replace("wrote consume_offsets", "wrote pending"))
