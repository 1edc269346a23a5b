"""Does the store look copied (or the broker stalled) at T? (spec section 1, 2026-11-23)

A live broker appends put-back copies of every pending transaction each check interval,
so while a round has ``check`` or ``immune`` rows the newest half/op record cannot be much
older than T. When it is, ``--as-of now`` was most likely left at its default on a copied
store: every transaction then looks expired and the picture is wrong. These functions
find that case; they never change a class or an offset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.outputs import CHECK, DISCARD_EXPIRED, IMMUNE
from transforms.queue_values import per_broker


def stale_after_ms(check_interval_ms: int, transaction_timeout_ms: int) -> int:
    """How old the newest record may be while something is pending: three check rounds,
    or the default immunity when that is longer (the first check waits for it)."""
    return max(3 * check_interval_ms, transaction_timeout_ms)


def _stale_warning(age: Column) -> Column:
    return F.format_string(
        "the newest half/op record of broker %s was stored %d ms before T, too long ago for"
        " a live broker with transactions still pending (it appends put-back copies every"
        " check interval and discards expired ones): the store looks copied (or the broker"
        " stalled) and T may be wrong; for a copied store run with --as-of latest",
        F.col("broker"),
        age,
    )


def with_stale_store_warning(
    queues: DataFrame,
    as_of_ms: int,
    limit_ms: int,
    reserved_ms: int,
    newest_by_broker: Mapping[str, int],
) -> DataFrame:
    """Append the stale-store warning to ``warnings`` of every queue row (``run_summary``
    shape: ``broker``, class counts, ``warnings``) whose broker's newest record at T
    (``newest_by_broker``, ``broker_newest`` of the queue rows) is

    * older than ``limit_ms`` while the queue has ``check`` or ``immune`` rows (a live
      broker would have appended their copies since), or
    * older than the retention ``reserved_ms`` while the queue has ``discard_expired``
      rows (a live broker would have discarded them and moved on long ago; this is the
      ``--as-of now`` on an old copy case, where nothing is checked any more).
    """
    # A literal per broker: a window over the queue rows was a shuffle, a Spark job.
    age = F.lit(as_of_ms) - per_broker(newest_by_broker, "long")
    puts_back = (F.coalesce(F.col(CHECK), F.lit(0)) + F.coalesce(F.col(IMMUNE), F.lit(0))) > 0
    expires = F.coalesce(F.col(DISCARD_EXPIRED), F.lit(0)) > 0
    stale = (puts_back & (age > F.lit(limit_ms))) | (expires & (age > F.lit(reserved_ms)))
    warned = F.when(
        F.coalesce(stale, F.lit(False)),
        F.concat(F.col("warnings"), F.array(_stale_warning(age))),
    ).otherwise(F.col("warnings"))
    return queues.withColumn("warnings", warned).select(*queues.columns)


def broker_newest(rows: Iterable[tuple[str, int | None]]) -> dict[str, int]:
    """Per broker, the newest of its queues' ``newest_ms`` (``rows``: broker, newest_ms of
    each queue; a queue without a record before T has none)."""
    newest: dict[str, int] = {}
    for broker, newest_ms in rows:
        if newest_ms is not None:
            newest[broker] = max(newest_ms, newest.get(broker, newest_ms))
    return newest
