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


def test_fault_after_each_table_then_rerun_with_delta_spark(
    spark, store, tmp_path, monkeypatch, capsys
) -> None:
    plain_args = test_faults._args
    monkeypatch.setattr(test_faults, "_args", lambda *a: [*plain_args(*a), *DELTA_SPARK])
    test_faults.test_fault_after_each_table_then_rerun_leaves_one_copy(
        spark, store, tmp_path, monkeypatch, capsys
    )
    for table in TABLES:  # every commit, the creation included, went through Spark
        engines = [engine(info) for info in commit_infos(tmp_path / "out" / table)]
        assert all(e.startswith("Apache-Spark") for e in engines), (table, engines)


@pytest.mark.parametrize(
    "writers",
    [
        pytest.param({"left": DELTA_SPARK, "right": DELTA_SPARK}, id="delta-spark+delta-spark"),
        pytest.param({"left": DELTA_SPARK, "right": ["--writer", "delta-rs"]}, id="mixed"),
    ],
)
def test_two_concurrent_processes_on_one_root(store, tmp_path: Path, writers) -> None:
    """Real processes: the file lock on the local root serialises their commits, so both
    succeed (without it two processes can write the same log version)."""
    succeeded = test_faults.run_concurrently(store, tmp_path / "out", writers)
    assert sorted(succeeded) == ["left", "right"]
    expected = {"delta-spark" if "delta-spark" in args else "delta-rs" for args in writers.values()}
    for table in TABLES:
        engines = {engine(info) for info in commit_infos(tmp_path / "out" / table)[1:]}
        assert {
            "delta-spark" if e.startswith("Apache-Spark") else "delta-rs" for e in engines
        } == expected
