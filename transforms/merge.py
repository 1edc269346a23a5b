"""Several facts per key (a queue, a discard record) in one aggregate: joins of
aggregates, as one union.

Joining a frame with an aggregate of records shuffles both sides, and with adaptive
execution every shuffle or broadcast is a Spark job of its own, so a summary built by joins
costs a job per join however few its records. Here each part brings rows
keyed like the result (``broker, queue_id`` unless said) and the aggregates that read
them; the parts' rows are unioned (each part's columns null in the others' rows) and
grouped once, so that the whole merge is one shuffle. Aggregates ignore nulls, so a part's
aggregates see only its own rows, as long as no two parts share a column name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from transforms.messages import QUEUE_KEY

# Set on the rows of ``carried`` parts: a queue with such a row is in the frame carried.
_CARRIED = "_carried"


@dataclass(frozen=True)
class Facts:
    """Rows keyed like the merge's result and the named aggregates that read them."""

    rows: DataFrame
    aggregates: tuple[Column, ...]


def carried(frame: DataFrame, keys: Sequence[str] = QUEUE_KEY) -> Facts:
    """Every column of a frame of one row per key, carried through the merge unchanged.
    With a ``carried`` part, ``merged`` keeps only the keys it has (a left join)."""
    values = [name for name in frame.columns if name not in keys]
    return Facts(
        frame.withColumn(_CARRIED, F.lit(True)),
        (
            *[F.first(name, ignorenulls=True).alias(name) for name in values],
            F.max(_CARRIED).alias(_CARRIED),
        ),
    )


def merged(*parts: Facts, keys: Sequence[str] = QUEUE_KEY, outer: bool = False) -> DataFrame:
    """One row per key with every part's aggregates: of the keys of the ``carried`` part
    when there is one and not ``outer`` (a left join), else of any part's keys."""
    rows = reduce(
        lambda left, right: left.unionByName(right, allowMissingColumns=True),
        [part.rows for part in parts],
    )
    facts = rows.groupBy(*keys).agg(*[column for part in parts for column in part.aggregates])
    if _CARRIED not in facts.columns:
        return facts
    if outer:
        return facts.drop(_CARRIED)
    return facts.filter(F.col(_CARRIED).isNotNull()).drop(_CARRIED)
