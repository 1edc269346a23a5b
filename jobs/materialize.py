"""How the job materialises a round: the one place that decides where a frame's lineage is
cut, what is brought to the driver, and whether the records from h0 are broadcast.

``transforms.round`` asks a ``Materializer`` at those points and never decides itself, so
the round's stages stay lazy ``DataFrame -> DataFrame`` functions (tests pass
``transforms.round.LAZY``, the identity).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pyspark import StorageLevel
from pyspark.sql import DataFrame

from transforms.messages import QUEUE_KEY
from transforms.queue_values import joined_values, literal_values

# Up to this many records from h0 (bounded by the queues' offsets), the round's joins
# broadcast them (the usual case: the committed offset is near the end of the queue);
# beyond it, Spark shuffles as usual.
BROADCAST_ROWS = 2_000_000
# A per-queue frame brought to the driver has one row per (broker, queue) or
# (broker, topic, queue): a broker has at most a few thousand queues. More rows than this
# means a record-level frame reached the driver by mistake: the run fails instead of
# filling the driver's memory.
MAX_QUEUE_ROWS = 100_000


# Up to this many queues, per-queue values ride in the plan as a literal map that each
# record looks up (a scan of its keys), not a broadcast join (a Spark job per broadcast);
# the transaction topics have one queue per broker.
LITERAL_QUEUES = 64

# Operators that keep a plan "narrow": each output row is computed from one input row.
_NARROW = {"Project", "Filter", "SubqueryAlias"}
# Leaves that hold data already materialised (cached, a cached frame's rows behind a cut
# plan, or local rows in the plan).
_MATERIALISED = {"InMemoryRelation", "LogicalRDD", "LocalRelation"}
_OPERATOR = re.compile(r"^[\s:|+\-]*(\w+)")


def _first_path(plan: str) -> list[str]:
    """The operators of a plan's tree string from the root down to its first leaf (the
    first line that is not an operator ends it)."""
    path = []
    for line in plan.splitlines():
        match = _OPERATOR.match(line)
        if match is None:
            break
        path.append(match.group(1))
        if path[-1] in _MATERIALISED:
            break
    return path


def _narrow(path: list[str]) -> bool:
    return bool(path) and path[-1] in _MATERIALISED and set(path[:-1]) <= _NARROW


def is_narrow_over_cache(frame: DataFrame) -> bool:
    """Whether ``frame``'s optimised plan is only projections and filters above one
    materialised leaf. Read from plans' tree strings: the operators printed before the
    first leaf are the path from the root to it (a join or union would print first).

    The analysed plan with cached data substituted answers first: optimising a round's
    deep plans took seconds per call. Only a union on its path needs the optimiser, which
    prunes a branch filtered by a constant (the store reader's records when every queue
    offset is unique); a join, aggregate or generator it would not remove from these
    frames."""
    query = frame._jdf.queryExecution()
    path = _first_path(query.withCachedData().toString())
    if "Union" not in path:
        return _narrow(path)
    return _narrow(_first_path(query.optimizedPlan().toString()))


def cut_lineage(frame: DataFrame) -> DataFrame:
    """``frame`` as a frame whose plan is one leaf over its computed rows.

    Later stages built on the frame itself carry its whole plan: Spark analyses it again
    at every step, and the anomaly rules and the run summary would plan hundreds of
    operators. Here the frame's shuffles run once, now (adaptive execution
    runs them when the plan is turned into an RDD); each later action reads their outputs
    and runs only the frame's last stage again. Spark's own local checkpoint cuts the
    plan the same way but keeps a row-wise copy of every row, which ran a 1 GiB driver
    out of heap.
    """
    session = frame.sparkSession
    jsession = session._jsparkSession
    rows = frame._jdf.queryExecution().toRdd()
    schema = jsession.parseDataType(frame.schema.json())
    return DataFrame(jsession.internalCreateDataFrame(rows, schema, False), session)


class DriverRowsError(RuntimeError):
    """A frame said to be per-queue had more rows than any set of queues has."""


class SparkMaterializer:
    """Cuts the lineage of record-level frames, caches the few records that several rules
    read (``kept``), localises per-queue frames, bounds the records from h0 to choose
    broadcast or shuffle, and attaches per-queue values as literals when the queues are
    few."""

    def __init__(
        self,
        broadcast_rows: int = BROADCAST_ROWS,
        max_queue_rows: int = MAX_QUEUE_ROWS,
        literal_queues: int = LITERAL_QUEUES,
    ) -> None:
        self.broadcast_rows = broadcast_rows
        self.max_queue_rows = max_queue_rows
        self.literal_queues = literal_queues
        self._kept: list[DataFrame] = []

    def records(self, frame: DataFrame) -> DataFrame:
        """A frame several stages read, computed up to its shuffle outputs and cut to one
        leaf over them (``cut_lineage``), unless it is only a projection or filter of data
        cached already (the store reader's records when every queue offset is unique),
        which a reader rescans anyway.

        Not persisted: the cut plan reads the frame's own plan, planned before any cache
        of it existed, so such a cache would never be filled and the run would pay for
        the cache manager's planning of every frame for nothing. Filling a real cache
        instead is no faster on a large store, slower on a small one, and would hold
        every exploded op item of a large store in memory."""
        if is_narrow_over_cache(frame):
            return frame
        return cut_lineage(frame)

    def kept(self, frame: DataFrame) -> DataFrame:
        """A frame filtered down to a few records that several stages read, cached (memory,
        then disk) until ``release``. Unlike ``records``, whose cut plan still reruns its
        last stage, a scan of every record, for each reader, the readers of a kept frame
        read the cache: ``frame`` is persisted before anything plans it, so every later
        plan over it finds the cache."""
        self._kept.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return self._kept[-1]

    def per_queue(self, frame: DataFrame) -> DataFrame:
        """Bring a per-queue frame to the driver and back as a local relation. Without it,
        every later join re-plans the aggregates that produced it (a small round took
        hundreds of stages). Through Arrow, the frame comes back as a ``LocalRelation``
        (not a parallelised RDD): Spark broadcasts or joins it without a job of its own,
        and the types come back exactly (no pandas float for a nullable long)."""
        table = frame.toArrow()  # one row per queue, checked below
        if table.num_rows > self.max_queue_rows:
            raise DriverRowsError(
                f"a per-queue frame has {table.num_rows} rows, more than any set of queues"
                f" ({self.max_queue_rows}): a record-level frame was taken for a per-queue one"
            )
        return frame.sparkSession.createDataFrame(table, schema=frame.schema)

    def is_small(self, bound: DataFrame) -> bool:
        """Whether the per-queue upper bounds (``rows``) of the records from h0 sum to at
        most ``broadcast_rows``. The bounds are a projection of the round's start offsets,
        already local: no Spark job runs (counting the records themselves took one)."""
        rows = bound.select("rows").collect()  # one row per queue
        if len(rows) > self.max_queue_rows:
            raise DriverRowsError(f"{len(rows)} per-queue bounds, more than any set of queues")
        return sum(row["rows"] for row in rows) <= self.broadcast_rows

    def attach(self, records: DataFrame, queues: DataFrame, columns: Sequence[str]) -> DataFrame:
        """``records`` with ``columns`` of the per-queue frame ``queues``: up to
        ``literal_queues`` queues as a literal map in the plan (its rows are local after
        ``per_queue``: collecting them runs no job), beyond as a broadcast join (a job)."""
        # One row per queue, and at most one past the limit, whatever the frame.
        limited = queues.select(*QUEUE_KEY, *columns).limit(self.literal_queues + 1)
        rows = limited.collect()  # <= literal_queues + 1 rows
        if len(rows) > self.literal_queues:
            return joined_values(records, queues, columns)
        return literal_values(records, queues, rows, columns)

    def release(self) -> None:
        """Unpersist what ``kept`` cached (``records`` keeps no cache: Spark drops the
        shuffle outputs behind a cut frame once nothing references it)."""
        for frame in self._kept:
            frame.unpersist()
        self._kept.clear()
