"""Several per-queue facts in one aggregate: the round's joins of per-queue frames, as
unions.

Joining a per-queue frame with an aggregate of records shuffles both sides, and with
adaptive execution every shuffle or broadcast is a Spark job of its own: the round's
summary alone took 20 jobs for a few thousand records (docs/benchmarks.md). Here each
part brings rows keyed by ``broker, queue_id`` and the aggregates that read them; the
parts' rows are unioned (each part's columns null in the others' rows) and grouped once,
so that the whole merge is one shuffle. Aggregates ignore nulls, so a part's aggregates
see only its own rows, as long as no two parts share a column name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from transforms.messages import QUEUE_KEY

# Set on the rows of ``carried`` parts: a queue with such a row is in the frame carried.
_CARRIED = "_carried"


@dataclass(frozen=True)
class QueueFacts:
    """Rows keyed by ``broker, queue_id`` and the named aggregates that read them."""

    rows: DataFrame
    aggregates: tuple[Column, ...]


def carried(queues: DataFrame) -> QueueFacts:
    """Every column of a frame of one row per queue, carried through the merge unchanged.
    With a ``carried`` part, ``merged`` keeps only the queues it has (a left join)."""
    values = [name for name in queues.columns if name not in QUEUE_KEY]
    return QueueFacts(
        queues.withColumn(_CARRIED, F.lit(True)),
        (
            *[F.first(name, ignorenulls=True).alias(name) for name in values],
            F.max(_CARRIED).alias(_CARRIED),
        ),
    )


def merged(*parts: QueueFacts, outer: bool = False) -> DataFrame:
    """One row per queue with every part's aggregates: of the queues of the ``carried``
    part when there is one and not ``outer`` (a left join), else of any part's queues."""
    rows = reduce(
        lambda left, right: left.unionByName(right, allowMissingColumns=True),
        [part.rows for part in parts],
    )
    facts = rows.groupBy(*QUEUE_KEY).agg(*[column for part in parts for column in part.aggregates])
    if _CARRIED not in facts.columns:
        return facts
    if outer:
        return facts.drop(_CARRIED)
    return facts.filter(F.col(_CARRIED).isNotNull()).drop(_CARRIED)


def per_broker(values: Mapping[str, object], data_type: str) -> Column:
    """``values[broker]`` of each row's ``broker`` (null when absent), from a literal map.
    For a handful of values known on the driver (one per broker): a join with a frame of
    them is a Spark job (a broadcast), a literal is none."""
    entries = [F.lit(item) for pair in sorted(values.items()) for item in pair]
    if not entries:
        return F.lit(None).cast(data_type)
    return F.element_at(F.create_map(*entries), F.col("broker")).cast(data_type)
