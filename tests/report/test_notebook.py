"""examples/audit.ipynb runs top to bottom without an error (nbclient, the venv's kernel).

It simulates a sample store (unless RMQ_SAMPLE_STORE names one), calls the notebook
function, writes the Delta outputs and reads them back with Spark and with deltalake: the
whole audit path a person takes. It starts its own Spark session in the kernel, so it
takes a minute or so.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# Its own kernel and JVM: about 3 minutes here, so it runs as `make test-notebook`
# (called by .ci/run), not inside `make test`.
pytestmark = pytest.mark.notebook

nbformat = pytest.importorskip("nbformat", reason="dev extra missing: pip install -e '.[dev]'")
nbclient = pytest.importorskip("nbclient", reason="dev extra missing: pip install -e '.[dev]'")
pytest.importorskip("ipykernel", reason="dev extra missing: pip install -e '.[dev]'")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "audit.ipynb"


@pytest.mark.slow
def test_audit_notebook_runs_top_to_bottom(monkeypatch, tmp_path) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # A kernel of this interpreter (the project venv), whatever kernels the user has.
    kernel = tmp_path / "jupyter" / "kernels" / "rmq-audit"
    kernel.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (kernel / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    client = nbclient.NotebookClient(
        notebook,
        timeout=600,
        kernel_name="rmq-audit",
        # Run where a person opens it: the examples folder.
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )

    client.execute()  # raises CellExecutionError with the cell and its traceback

    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors, errors
    texts = "".join(
        output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    assert "reports" in texts and ".html" in texts, "the report cell printed no page path"
    if os.environ.get("RMQ_NOTEBOOK_OUT"):  # keep the executed notebook to look at
        nbformat.write(notebook, os.environ["RMQ_NOTEBOOK_OUT"])
