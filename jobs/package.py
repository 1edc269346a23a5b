"""Build what a cluster needs for spark-submit, and print the command line.

``python -m jobs.package DIST`` writes ``DIST/rmq_txn_reconcile.zip`` (the packages
``jobs``, ``transforms``, ``schemas``, ``connectors`` and ``conf/``) and
``DIST/reconcile.py`` (the entry script), then prints the ``spark-submit`` command.
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jobs", "transforms", "schemas", "connectors")
ZIP_NAME = "rmq_txn_reconcile.zip"
ENTRY_NAME = "reconcile.py"


def build(dist: Path) -> tuple[Path, Path]:
    dist.mkdir(parents=True, exist_ok=True)
    archive = dist / ZIP_NAME
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for package in PACKAGES:
            for path in sorted((ROOT / package).rglob("*.py")):
                out.write(path, path.relative_to(ROOT).as_posix())
        for path in sorted((ROOT / "conf").iterdir()):
            out.write(path, f"conf/{path.name}")
    entry = dist / ENTRY_NAME
    shutil.copyfile(ROOT / "jobs" / "reconcile.py", entry)
    return archive, entry


def command(archive: Path, entry: Path, master: str = "local[2]", delta: bool = False) -> list[str]:
    """The spark-submit command line; ``delta`` adds Delta's jars and extension, the
    coordinate derived from the installed pyspark and delta-spark."""
    argv = ["spark-submit", "--master", master]
    if delta:
        from connectors.delta import DELTA_CATALOG, DELTA_EXTENSION, delta_spark_coordinate

        argv += ["--packages", delta_spark_coordinate()]
        argv += ["--conf", f"spark.sql.extensions={DELTA_EXTENSION}"]
        argv += ["--conf", f"spark.sql.catalog.spark_catalog={DELTA_CATALOG}"]
    return [*argv, "--py-files", str(archive), str(entry)]


def relative(path: Path) -> Path:
    """``path`` relative to the working directory when it is below it (shorter commands)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dist = Path(args[0] if args else "dist").resolve()
    archive, entry = build(dist)
    print(f"built {archive} and {entry}")
    archive, entry = relative(archive), relative(entry)
    job = " --store [NAME=]DIR --output OUT --as-of latest"
    print("run it with (add the job's arguments; on a cluster use --master yarn or k8s://...):")
    print(" ".join(command(archive, entry)) + job)
    print("with Delta's own writer (delta-spark; Spark fetches the jars once into its Ivy cache):")
    print(" ".join(command(archive, entry, delta=True)) + job + " --writer delta-spark")
    return 0


if __name__ == "__main__":
    sys.exit(main())
