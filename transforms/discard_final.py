"""Final discard_history rows (spec section 6): an outcome of ``committed``,
``rolled_back`` or ``ended`` is final. Once a run has seen it, later runs keep the row as
it is, also after retention has removed the evidence from the store, and decide only the
other rows again.

Stages, in order:

1. ``final_rows``: the rows an earlier run wrote with a final outcome, at or before T (a
   backfill of an older T cannot keep a row decided at a later one).
2. ``kept_rows``: those of this run's discard records, matched by the record's identity as
   well as its key, so that another broker's record at the same offset (a replaced store)
   is decided again. The writer's merge keeps the same rows (``connectors.delta_commit``).
3. ``still_open``: this run's discard records without a kept row: the ones it decides;
   ``open_evidence`` is the evidence of those alone.

Pure ``DataFrame -> DataFrame``; ``jobs.history`` reads the earlier rows.
"""

from __future__ import annotations

from dataclasses import replace
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.outputs import DISCARD_HISTORY, DISCARD_RECORD_IDENTITY, FINAL_OUTCOMES
from transforms.discard_history import DISCARD_KEY, DiscardEvidence


def final_rows(earlier: DataFrame, as_of_ms: int) -> DataFrame:
    """The ``discard_history`` rows (``earlier``) whose outcome is final and whose run's T
    is at or before ``as_of_ms``."""
    is_final = F.col("outcome").isin(*FINAL_OUTCOMES)
    seen_by_then = F.col("as_of_ms") <= F.lit(as_of_ms)
    return earlier.filter(is_final & seen_by_then)


def _same_record(rows: DataFrame, final: DataFrame) -> Column:
    """The join condition of a discard row and a final row: same key, same record (null
    equal to null, as in the writer's merge)."""
    names = [*DISCARD_KEY, *DISCARD_RECORD_IDENTITY]
    return reduce(lambda a, b: a & b, [rows[name].eqNullSafe(final[name]) for name in names])


def kept_rows(rows: DataFrame, final: DataFrame) -> DataFrame:
    """The final rows (``final_rows``) of this run's discard rows (``rows``, at least
    ``DISCARD_KEY`` and the record's identity), as they were written: ``DISCARD_HISTORY``
    columns, the run id and T of the run that decided them."""
    records = rows.select(*DISCARD_KEY, *DISCARD_RECORD_IDENTITY)
    kept = final.join(records, on=_same_record(records, final), how="left_semi")
    return kept.select(*DISCARD_HISTORY.fieldNames())


def still_open(rows: DataFrame, kept: DataFrame) -> DataFrame:
    """This run's discard rows without a kept row: the ones it decides (``rows``' columns)."""
    return rows.join(kept.select(*DISCARD_KEY), on=DISCARD_KEY, how="left_anti")


def open_evidence(evidence: DiscardEvidence, kept: DataFrame) -> DiscardEvidence:
    """``evidence`` of the rows still open (``still_open``): the rows and their transactions'
    half records without the kept ones, so that no rule, and no read of the real queues the
    half records point into, spends anything on a row already final."""
    rows = still_open(evidence.rows, kept)
    linked = evidence.linked.join(rows.select(*DISCARD_KEY), on=DISCARD_KEY, how="left_semi")
    return replace(evidence, rows=rows, linked=linked)
