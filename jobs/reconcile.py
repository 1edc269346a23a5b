"""The reconciliation job's front door: ``python -m jobs.reconcile``, ``spark-submit
jobs/reconcile.py``, the ``rmq-txn-reconcile`` script and the notebook functions
(``from jobs.reconcile import reconcile_stores``).

The job lives in one module per concern (README, "Architecture"): ``jobs.cli`` (arguments,
checks before Spark starts, exit codes, ``main``), ``jobs.extract`` (reading, T, run id),
``jobs.run`` (one run, phase by phase), ``jobs.notebook`` (the notebook functions) and
``jobs.output`` (tables, offset fragments, printed summary). This module re-exports the
names other code imports from it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # spark-submit jobs/reconcile.py: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# A notebook that imports this module before it creates its session with a plain
# SparkSession.builder.getOrCreate() gets Python workers running this interpreter (the one
# with pyarrow and the project), not whatever `python3` is first on PATH. An explicit
# PYSPARK_PYTHON wins; a session started earlier keeps its workers (probe_workers says so).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from jobs.cli import (  # after the sys.path and environment set-up above
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    build_parser,
    main,
    validate_arguments,
    validate_output,
)
from jobs.extract import (
    Inputs,
    derive_run_id,
    parse_as_of,
    read_segment_inputs,
    read_store_inputs,
    resolve_as_of,
)
from jobs.notebook import (
    reconcile_segments,
    reconcile_stores,
    reconcile_stores_to_delta,
)
from jobs.output import (
    bad_records_line,
    format_summary,
    job_version,
    write_offset_fragments,
    write_tables,
)
from jobs.pipeline import with_picture_warnings
from jobs.run import (
    PHASE_PREFIX,
    StrictModeError,
    refuse_far_past_store,
    round_totals,
)

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "PHASE_PREFIX",
    "Inputs",
    "StrictModeError",
    "bad_records_line",
    "build_parser",
    "derive_run_id",
    "format_summary",
    "job_version",
    "main",
    "parse_as_of",
    "read_segment_inputs",
    "read_store_inputs",
    "reconcile_segments",
    "reconcile_stores",
    "reconcile_stores_to_delta",
    "refuse_far_past_store",
    "resolve_as_of",
    "round_totals",
    "validate_arguments",
    "validate_output",
    "with_picture_warnings",
    "write_offset_fragments",
    "write_tables",
]

if __name__ == "__main__":
    sys.exit(main())
