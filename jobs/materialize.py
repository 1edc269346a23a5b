"""How the job materialises a round: the one place that decides where a frame's lineage is
cut, what is brought to the driver, and whether the records from h0 are broadcast.

``transforms.round`` asks a ``Materializer`` at those points and never decides itself, so
the round's stages stay lazy ``DataFrame -> DataFrame`` functions (tests pass
``transforms.round.LAZY``, the identity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from transforms.messages import QUEUE_KEY
from transforms.queue_values import joined_floor, joined_values, literal_floor, literal_values
from transforms.round import ReadSizes

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

# From this many planned half/op records on, Spark's adaptive execution is worth its cost:
# it sizes each shuffle's partitions from what the stage wrote and turns a join whose
# side came out small into a broadcast. Below it, every shuffle and broadcast stage it
# plans is a Spark job of its own, and those jobs, not the records, are the run's time.
ADAPTIVE_FROM_RECORDS = 500_000


# From this many records below the start offsets on, the round finds its floors and reads
# from them (``transforms.floors``): below it, the floors' two scans and their Spark jobs
# cost more than the stages save (docs/benchmarks.md, "The round reads from per-queue
# floors").
FLOORS_FROM_RECORDS = 4_000_000

# Without adaptive execution nothing sizes a shuffle's partitions from what it holds: a
# small read shuffles into this many (one per core of a local[2] run), not into
# ``shuffle_partitions`` tasks per stage, most of them empty.
SMALL_READ_PARTITIONS = 2


def wants_adaptive(planned_records: int | None) -> bool:
    """Whether the job's own session runs adaptive execution: when the planned read is
    large, or its size is unknown before the read (exported segments)."""
    return planned_records is None or planned_records >= ADAPTIVE_FROM_RECORDS


# How materialised frames are held: serialised, in memory while it fits, then on disk, so
# that a large store's records never fill the driver's or an executor's heap.
STORAGE = StorageLevel.MEMORY_AND_DISK


class DriverRowsError(RuntimeError):
    """A frame said to be per-queue had more rows than any set of queues has."""


def collect_together(
    frames: Mapping[str, DataFrame], max_rows: int = MAX_QUEUE_ROWS
) -> dict[str, pa.Table]:
    """Several small frames (per queue, per broker, per run) brought to the driver in one
    Spark action, each as an Arrow table of its own columns and types.

    One frame of one struct column per input, each row carrying one of them (the others
    null), is one plan: the frames' shared parts (the round's cached records, the
    anomalies) are read by one query, not one per frame."""
    names = list(frames)
    # Every field nullable: a row of another frame carries this one's struct as a null.
    types = {
        name: T.StructType([T.StructField(f.name, f.dataType) for f in frame.schema.fields])
        for name, frame in frames.items()
    }
    parts = [
        frame.select(
            *[
                (F.struct(*frame.columns) if other == name else F.lit(None))
                .cast(types[other])
                .alias(other)
                for other in names
            ]
        )
        for name, frame in frames.items()
    ]
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    table = union.toArrow()  # small frames only: each checked below
    if table.num_rows > max_rows * len(names):
        raise DriverRowsError(
            f"{table.num_rows} rows of small tables, more than any set of queues"
            f" ({max_rows} each): a record-level frame was taken for a small one"
        )
    collected = {}
    for name in names:
        column = table.column(name)
        rows = pc.filter(column, pc.is_valid(column)).combine_chunks()
        collected[name] = pa.Table.from_struct_array(rows)
    return collected


class SparkMaterializer:
    """Holds the record-level frames several stages read behind one-leaf plans (``records``,
    ``kept``), localises per-queue frames, bounds the records from h0 to choose broadcast or
    shuffle and those below the starts to choose whether the round finds its floors, and
    attaches per-queue values as literals when the queues are few."""

    def __init__(
        self,
        broadcast_rows: int = BROADCAST_ROWS,
        max_queue_rows: int = MAX_QUEUE_ROWS,
        literal_queues: int = LITERAL_QUEUES,
        floor_rows: int = 0,
    ) -> None:
        self.broadcast_rows = broadcast_rows
        self.max_queue_rows = max_queue_rows
        self.literal_queues = literal_queues
        self.floor_rows = floor_rows

    @classmethod
    def for_session(cls, spark: SparkSession) -> SparkMaterializer:
        """The job's materializer for ``spark``: without adaptive execution (a small read,
        ``wants_adaptive``) nothing is broadcast on the records' bound, since every
        broadcast is a Spark job of its own and a shuffle one more stage of a query's
        one job."""
        adaptive = spark.conf.get("spark.sql.adaptive.enabled", "true") == "true"
        broadcast_rows = BROADCAST_ROWS if adaptive else 0
        return cls(broadcast_rows=broadcast_rows, floor_rows=FLOORS_FROM_RECORDS)

    def records(self, frame: DataFrame) -> DataFrame:
        """A record-level frame several stages read, behind a plan of one leaf: Spark's
        local checkpoint, filled by the first query that reads it (``STORAGE``). Later
        stages read its rows, not its plan, which would otherwise be planned again in
        every query built on it; and unlike a cache, no later plan is compared with it.
        Its rows are freed when nothing references the frame.

        The checkpoint keeps the frame's column identities, so a later join of it with
        what it was made from (the discard rows with their transactions' half records)
        would name the same columns on both sides, which Spark cannot always tell apart:
        its columns are renamed to themselves, which gives them identities of their own.
        Their names are the held frame's own: through Spark Connect, asking ``frame`` would
        have the server analyse its whole plan again."""
        held = frame.localCheckpoint(eager=False, storageLevel=STORAGE)
        return held.toDF(*held.columns)

    def kept(self, frame: DataFrame) -> DataFrame:
        """A frame filtered down to a few records that several stages read: held like
        ``records`` (the job makes no difference between the two)."""
        return self.records(frame)

    def per_queue(self, frame: DataFrame) -> DataFrame:
        """Bring a per-queue frame to the driver and back as a local relation. Without it,
        every later join re-plans the aggregates that produced it (a small round took
        hundreds of stages). Through Arrow, the frame comes back as a ``LocalRelation``
        (not a parallelised RDD): Spark broadcasts or joins it without a job of its own,
        and the types come back exactly (no pandas float for a nullable long)."""
        return self.per_queue_table(frame)[0]

    def per_queue_table(self, frame: DataFrame) -> tuple[DataFrame, pa.Table]:
        """``per_queue``, and the rows it brought to the driver, for the driver to read."""
        table = frame.toArrow()  # one row per queue, checked below
        if table.num_rows > self.max_queue_rows:
            raise DriverRowsError(
                f"a per-queue frame has {table.num_rows} rows, more than any set of queues"
                f" ({self.max_queue_rows}): a record-level frame was taken for a per-queue one"
            )
        return frame.sparkSession.createDataFrame(table, schema=frame.schema), table

    def sizes(self, bounds: DataFrame) -> ReadSizes:
        """The records from h0 may be broadcast when their per-queue bounds (``from_h0``)
        sum to at most ``broadcast_rows``; the round reads from its floors when
        ``floor_rows`` records or more lie below the starts (``below``). The bounds are a
        projection of the round's start offsets, already local: no Spark job runs
        (counting the records themselves took one), and both come from one collect."""
        rows = bounds.select("from_h0", "below").collect()  # one row per queue
        if len(rows) > self.max_queue_rows:
            raise DriverRowsError(f"{len(rows)} per-queue bounds, more than any set of queues")
        small = sum(row["from_h0"] for row in rows) <= self.broadcast_rows
        return ReadSizes(small, sum(row["below"] for row in rows) >= self.floor_rows)

    def attach(self, records: DataFrame, queues: DataFrame, columns: Sequence[str]) -> DataFrame:
        """``records`` with ``columns`` of the per-queue frame ``queues``: up to
        ``literal_queues`` queues as a literal map in the plan (its rows are local after
        ``per_queue``: collecting them runs no job), beyond as a broadcast join (a job)."""
        rows = self._literal_rows(queues, columns)
        if rows is None:
            return joined_values(records, queues, columns)
        return literal_values(records, queues, rows, columns)

    def floored(self, records: DataFrame, queues: DataFrame, column: str) -> DataFrame:
        """``records`` of the queues of ``queues`` at offsets >= their ``column``: up to
        ``literal_queues`` queues as a condition of literals, which Spark pushes into the
        scan of the mirror's files (it skips the row groups below every floor), beyond as
        a broadcast join (a job)."""
        rows = self._literal_rows(queues, [column])
        if rows is None:
            return joined_floor(records, queues, column)
        return literal_floor(records, rows, column)

    def _literal_rows(self, queues: DataFrame, columns: Sequence[str]) -> list[Row] | None:
        """The rows of a per-queue frame (``QUEUE_KEY`` and ``columns``) to ride in a plan
        as literals; None past ``literal_queues`` queues (a join instead). Its rows are
        local after ``per_queue``: collecting them runs no job."""
        # One row per queue, and at most one past the limit, whatever the frame.
        limited = queues.select(*QUEUE_KEY, *columns).limit(self.literal_queues + 1)
        rows = limited.collect()  # <= literal_queues + 1 rows
        return None if len(rows) > self.literal_queues else rows

    def release(self) -> None:
        """Nothing to free here: a checkpointed frame's rows go with the frame (Spark's
        context cleaner drops them once no frame references them)."""
