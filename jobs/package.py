"""Build what a cluster needs for spark-submit, and print the command line.

``python -m jobs.package DIST`` writes ``DIST/rmq_txn_reconcile.zip`` (the packages
``jobs``, ``transforms``, ``schemas``, ``connectors`` and ``conf/``) and
``DIST/reconcile.py`` (the entry script) and ``DIST/log4j2.properties`` (the job's quiet
logging), then prints the ``spark-submit`` command.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jobs", "transforms", "schemas", "connectors")
ZIP_NAME = "rmq_txn_reconcile.zip"
ENTRY_NAME = "reconcile.py"
# The entry script only starts the job: every module comes from the --py-files zip. (A copy
# of jobs/reconcile.py would put the folder above dist/ on sys.path, the checkout when dist/
# sits in it, and the driver would run the checkout's code instead of what was shipped.)
ENTRY_SCRIPT = '''"""spark-submit entry point of rmq-txn-reconcile (written by `make package`).

The code is in the zip given to --py-files; this file only calls it.
"""

import sys

from jobs.reconcile import main

if __name__ == "__main__":
    sys.exit(main())
'''
LOG4J_NAME = "log4j2.properties"


def write_archive(archive: Path) -> None:
    """The job's packages and ``conf/`` in one zip: spark-submit's ``--py-files``, and what
    a Spark Connect session adds for its server's Python workers (``jobs.session.ship_code``)."""
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for package in PACKAGES:
            for path in sorted((ROOT / package).rglob("*.py")):
                out.write(path, path.relative_to(ROOT).as_posix())
        for path in sorted((ROOT / "conf").iterdir()):
            out.write(path, f"conf/{path.name}")


def build(dist: Path) -> tuple[Path, Path]:
    dist.mkdir(parents=True, exist_ok=True)
    archive = dist / ZIP_NAME
    write_archive(archive)
    entry = dist / ENTRY_NAME
    entry.write_text(ENTRY_SCRIPT, encoding="utf-8")
    shutil.copyfile(ROOT / "conf" / LOG4J_NAME, dist / LOG4J_NAME)
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


def shell_command(archive: Path, entry: Path, master: str = "local[2]", delta: bool = False) -> str:
    """The command as printed: it runs as is from a fresh shell (full paths, the venv's Python
    for driver and workers, the job's quiet logging for the driver JVM, which spark-submit
    starts before the job's own code runs)."""
    python = Path(sys.executable)
    argv = command(archive, entry, master, delta)
    argv[0] = str(python.with_name("spark-submit"))
    log4j = archive.parent / LOG4J_NAME
    argv[1:1] = ["--driver-java-options", f"-Dlog4j2.configurationFile=file:{log4j}"]
    return f"PYSPARK_PYTHON={shlex.quote(str(python))} {shlex.join(argv)}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dist = Path(args[0] if args else "dist").resolve()
    archive, entry = build(dist)
    print(f"built {archive} and {entry}")
    job = " --store [NAME=]DIR --output OUT --as-of latest"
    print(
        "run it with (add the job's arguments; on a cluster use its --master and add"
        " --conf spark.pyspark.python=PYTHON, see the README):"
    )
    print(shell_command(archive, entry) + job)
    print("with Delta's own writer (delta-spark; Spark fetches the jars once into its Ivy cache):")
    print(shell_command(archive, entry, delta=True) + job + " --writer delta-spark")
    return 0


if __name__ == "__main__":
    sys.exit(main())
