"""Per-queue (and per-broker) values attached to records: a broadcast join, or a literal
the records look up.

The round attaches values of one row per queue (h0, h1, the window of the end offsets) to
its records. A broadcast join does it for any number of queues, but every broadcast is a
Spark job of its own, a local relation's too; a handful of queues (the transaction topics
have one queue per broker) can ride in the plan as a literal map instead, and cost no job.
Which one a run uses is the job's decision (``jobs.materialize``); both give the same rows.

A per-queue *floor* (the first queue offset a stage reads) is applied the same two ways: a
join, or a condition of literals, which a scan of Parquet files (the mirror) takes as a
pushed filter, so that it reads only the row groups from the floor on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from transforms.messages import QUEUE_KEY

# (records, per-queue frame, value columns) -> the records of the frame's queues, with
# the value columns: ``joined_values`` or ``literal_values`` over the frame's rows.
Attach = Callable[[DataFrame, DataFrame, Sequence[str]], DataFrame]
# (records, per-queue frame, floor column) -> the records of the frame's queues at queue
# offsets >= the floor (none of a queue whose floor is null): ``joined_floor`` or
# ``literal_floor`` over the frame's rows.
Floor = Callable[[DataFrame, DataFrame, str], DataFrame]

_VALUES = "_queue_values"


def joined_values(records: DataFrame, queues: DataFrame, columns: Sequence[str]) -> DataFrame:
    """``records`` inner-joined with ``columns`` of ``queues`` (one row per queue)."""
    values = F.broadcast(queues.select(*QUEUE_KEY, *columns))
    return records.join(values, QUEUE_KEY, how="inner")


def literal_values(
    records: DataFrame, queues: DataFrame, rows: Sequence[Row], columns: Sequence[str]
) -> DataFrame:
    """What ``joined_values`` gives, from ``rows`` (the rows of ``queues``, already on the
    driver) as a literal map from ``broker, queue_id`` to the values: each record looks
    its queue up (a scan of the map's keys: for a handful of queues)."""
    types = {field.name: field.dataType for field in queues.schema.fields}

    def key(broker: Column, queue_id: Column) -> Column:
        return F.struct(broker.alias("broker"), queue_id.cast("int").alias("queue_id"))

    entries = []
    for row in rows:
        entries.append(key(F.lit(row["broker"]), F.lit(row["queue_id"])))
        entries.append(
            F.struct(*[F.lit(row[name]).cast(types[name]).alias(name) for name in columns])
        )
    if not entries:
        return records.limit(0).select("*", *[F.lit(None).cast(types[n]).alias(n) for n in columns])
    values = F.element_at(F.create_map(*entries), key(F.col("broker"), F.col("queue_id")))
    found = records.withColumn(_VALUES, values).filter(F.col(_VALUES).isNotNull())
    return found.select(
        *records.columns, *[F.col(f"{_VALUES}.{name}").alias(name) for name in columns]
    )


def joined_floor(records: DataFrame, queues: DataFrame, column: str) -> DataFrame:
    """``records`` of the queues of ``queues`` at queue offsets >= their ``column``."""
    floor = F.col(f"{_VALUES}.{column}")
    values = F.broadcast(queues.select(*QUEUE_KEY, F.struct(column).alias(_VALUES)))
    joined = records.join(values, QUEUE_KEY, how="inner")
    return joined.filter(F.col("queue_offset") >= floor).select(*records.columns)


def literal_floor(records: DataFrame, rows: Sequence[Row], column: str) -> DataFrame:
    """What ``joined_floor`` gives, from ``rows`` (the per-queue rows, already on the
    driver): one condition of literals, ``(broker, queue_id) = (b, q) and queue_offset >=
    floor`` or'ed over the queues, which Spark pushes into a Parquet scan below it."""
    condition = F.lit(False)
    for row in rows:
        if row[column] is None:  # as the join: a null floor keeps nothing
            continue
        one = (
            (F.col("broker") == F.lit(row["broker"]))
            & (F.col("queue_id") == F.lit(row["queue_id"]))
            & (F.col("queue_offset") >= F.lit(row[column]))
        )
        condition = condition | one
    return records.filter(condition)


def per_broker(values: Mapping[str, object], data_type: str) -> Column:
    """``values[broker]`` of each row's ``broker`` (null when absent), from a literal map.
    For a handful of values known on the driver (one per broker): a join with a frame of
    them is a Spark job (a broadcast), a literal is none."""
    entries = [F.lit(item) for pair in sorted(values.items()) for item in pair]
    if not entries:
        return F.lit(None).cast(data_type)
    return F.element_at(F.create_map(*entries), F.col("broker")).cast(data_type)
