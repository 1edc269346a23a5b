"""The second venv that the cluster's executors (and the submitting driver) run: the
project's pinned runtime dependencies only, never the project itself.

The project's own .venv has the checkout installed in editable mode, so a Python worker
started from it would import the code without ``--py-files``, and the cluster test could
not fail for the reason it exists. This venv is built once from ``[project]
dependencies`` of pyproject.toml into ``~/.cache/rmq-txn-reconcile/venv-executor`` (or
``$RMQ_EXECUTOR_VENV``) and rebuilt when those pins change.

    python -m tests.cluster.executor_venv     # build or reuse it, print its python
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = ".pins"


def runtime_pins(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The ``[project] dependencies`` of pyproject.toml, as pip requirements."""
    return list(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"])


def default_location() -> Path:
    if os.environ.get("RMQ_EXECUTOR_VENV"):
        return Path(os.environ["RMQ_EXECUTOR_VENV"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rmq-txn-reconcile" / "venv-executor"


def _base_python() -> str:
    # The interpreter the project's venv was made from (a venv of a venv would be fragile).
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_executor_venv(location: Path | None = None) -> Path:
    """Build (or reuse) the venv and return its ``bin/python``. Fails loudly when pip does."""
    venv = location or default_location()
    python = venv / "bin" / "python"
    pins = runtime_pins()
    wanted = "\n".join(pins)
    marker = venv / MARKER
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"executor venv: creating {venv} ({' '.join(pins)})", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *pins], check=True)
    marker.write_text(wanted)
    return python


if __name__ == "__main__":
    print(ensure_executor_venv())
