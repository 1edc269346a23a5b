"""The robustness suite's fault points and concurrent processes, repeated with delta-spark
(and with both writers on one root at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.delta.helpers import commit_infos, engine
from tests.robustness import test_faults
from tests.robustness.store import TABLES

pytestmark = pytest.mark.delta
store = test_faults.store  # the robustness suite's store fixture (module scope)
DELTA_SPARK = ["--writer", "delta-spark"]
# delta-spark writes every per-run table with one function (a partition overwrite) and the
# offsets with a merge: a fault after the first table, after the last per-run table and
# after the offsets covers each of its commits' positions. The robustness suite (delta-rs)
# injects a fault after every table.
DELTA_SPARK_FAULT_POINTS = (TABLES[0], TABLES[-2], TABLES[-1])


def test_faults_between_commits_then_rerun_with_delta_spark(
    spark, store, tmp_path, monkeypatch, capsys
) -> None:
    plain_args = test_faults._args
    monkeypatch.setattr(test_faults, "_args", lambda *a: [*plain_args(*a), *DELTA_SPARK])
    monkeypatch.setattr(test_faults, "FAULT_POINTS", DELTA_SPARK_FAULT_POINTS)
    test_faults.test_fault_after_each_table_then_rerun_leaves_one_copy(
        spark, store, tmp_path, monkeypatch, capsys
    )
    for table in TABLES:  # every commit, the creation included, went through Spark
        engines = [engine(info) for info in commit_infos(tmp_path / "out" / table)]
        assert all(e.startswith("Apache-Spark") for e in engines), (table, engines)


def test_delta_spark_and_delta_rs_processes_at_once_on_one_root(store, tmp_path: Path) -> None:
    """Real processes, one per writer: the file lock on the local root serialises their
    commits, so both succeed (without it two processes can write the same log version). Two
    delta-spark processes take the same lock as these two (``connectors.delta_commit``)."""
    writers = {"left": DELTA_SPARK, "right": ["--writer", "delta-rs"]}
    succeeded = test_faults.run_concurrently(store, tmp_path / "out", writers)
    assert sorted(succeeded) == ["left", "right"]
    expected = {"delta-spark", "delta-rs"}
    for table in TABLES:
        engines = {engine(info) for info in commit_infos(tmp_path / "out" / table)[1:]}
        assert {
            "delta-spark" if e.startswith("Apache-Spark") else "delta-rs" for e in engines
        } == expected
