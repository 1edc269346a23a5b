"""examples/audit.ipynb in a session with Delta (the Databricks-like case): the notebook
function writes through Spark and the tables are read back with ``format("delta")``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.report import test_notebook

pytestmark = pytest.mark.delta


def test_audit_notebook_with_delta_writes_through_spark(monkeypatch, tmp_path: Path) -> None:
    executed = tmp_path / "executed.ipynb"
    monkeypatch.setenv("RMQ_AUDIT_DELTA", "1")
    monkeypatch.setenv("RMQ_NOTEBOOK_OUT", str(executed))
    test_notebook.test_audit_notebook_runs_top_to_bottom(monkeypatch, tmp_path)

    notebook = test_notebook.nbformat.read(executed, as_version=4)
    texts = "".join(
        output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    assert "written through delta-spark" in texts
    assert "Apache-Spark/" in texts  # DESCRIBE HISTORY read through format("delta")
    assert "rows at version 0 (the table as created): 0" in texts
