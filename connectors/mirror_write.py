"""The mirror's writes, done by its decode tasks (Python workers; no Spark in the tasks).

Each task decodes its units (``read_tasks.run_unit``; consume-queue ranges, whose every row
is of the unit's broker and topic, bad records included), derives the mirror's derived
columns on each batch and writes the batches as Parquet files into the run's staging
folder: one file per (broker, topic) of its units, one row group per batch. It sends back one row per file
(``STAGED_FILE``): where the file is, its partition, and how many rows it holds and how many
of them have no queue offset. The driver checks the files, moves them into the table and
commits them (``connectors.mirror``). The rows never pass through the JVM: its Parquet
writer costs about as much as the decode (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from connectors.arrow import to_arrow_schema
from connectors.rocketmq.combined import ReadOptions
from connectors.rocketmq.read_plan import QueueUnit, Unit
from connectors.rocketmq.read_tasks import run_unit
from connectors.rocketmq.reader import unit_tasks
from schemas.messages import PROP_KEYS, PROP_TRANSACTION_ID, PROP_UNIQ_KEY, PROPERTY_COLUMNS

STAGED_FILE = T.StructType(
    [
        T.StructField("path", T.StringType(), False),
        T.StructField("broker", T.StringType(), False),
        T.StructField("topic", T.StringType(), False),
        T.StructField("rows", T.LongType(), False),
        T.StructField("unplaced", T.LongType(), False),
    ]
)
_STAGED_FILE_ARROW = to_arrow_schema(STAGED_FILE)
Partition = tuple[str, str]
# Text columns that hold a value per message: a dictionary of them only adds to the file.
_UNIQUE_TEXT = tuple(
    PROPERTY_COLUMNS[name] for name in (PROP_UNIQ_KEY, PROP_KEYS, PROP_TRANSACTION_ID)
)


@dataclass(frozen=True)
class StagedFile:
    """One file a task wrote (a row of ``STAGED_FILE``)."""

    path: str
    broker: str
    topic: str
    rows: int
    # Bad records without a queue offset: the mirror's ranges cannot hold them.
    unplaced: int


@dataclass(frozen=True)
class StagedWrite:
    """What the tasks write: into ``folder`` (the driver's staging folder, which every
    executor must see: docs/cluster.md), files of the columns of ``schema`` (the table's,
    without its partition columns), the last of them derived from each decoded batch by
    ``derive``."""

    folder: str
    schema: pa.Schema
    derive: Callable[[pa.RecordBatch], Sequence[pa.Array]]


def column_encodings(schema: pa.Schema) -> dict[str, object]:
    """The Parquet writer's encodings for ``schema``: its longs (offsets, positions, times,
    which rise along a queue) delta-encoded, its binary and unique text columns plain, a
    dictionary for the rest (names, hosts, tags, flags, properties that repeat)."""
    longs = [field.name for field in schema if pa.types.is_int64(field.type)]
    binary = [field.name for field in schema if pa.types.is_binary(field.type)]
    plain = {*longs, *binary, *_UNIQUE_TEXT}
    return {
        "use_dictionary": [name for name in schema.names if name not in plain],
        "column_encoding": dict.fromkeys(longs, "DELTA_BINARY_PACKED"),
    }


def _unplaced(batch: pa.RecordBatch) -> int:
    bad = pc.is_valid(batch.column("reason"))
    return int(pc.sum(pc.and_(bad, pc.is_null(batch.column("queue_offset")))).as_py() or 0)


@dataclass
class _OpenFile:
    """One file a task is writing, and what it holds so far."""

    path: str
    writer: pq.ParquetWriter
    rows: int = 0
    unplaced: int = 0


class _TaskFiles:
    """The open files of one task, one per partition."""

    def __init__(self, write: StagedWrite) -> None:
        self.write = write
        self.files: dict[Partition, _OpenFile] = {}

    def add(self, key: Partition, rows: pa.RecordBatch) -> None:
        if key not in self.files:
            # Made here too: an executor that does not share the driver's file system
            # writes on its own, and the driver finds fewer rows than were written.
            folder = Path(self.write.folder)
            folder.mkdir(parents=True, exist_ok=True)
            path = str(folder / f"part-{uuid.uuid4().hex}.parquet")
            writer = pq.ParquetWriter(
                path, self.write.schema, compression="snappy", **column_encodings(self.write.schema)
            )
            self.files[key] = _OpenFile(path, writer)
        file = self.files[key]
        columns = [rows.column(name) for name in self.write.schema.names]
        file.writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=self.write.schema))
        file.rows += rows.num_rows
        file.unplaced += _unplaced(rows)

    def close(self) -> None:
        for file in self.files.values():
            file.writer.close()

    def staged(self) -> pa.RecordBatch:
        staged = [
            asdict(StagedFile(file.path, *key, file.rows, file.unplaced))
            for key, file in self.files.items()
        ]
        return pa.RecordBatch.from_pylist(staged, schema=_STAGED_FILE_ARROW)


def _write_task(units: Sequence[Unit], options: ReadOptions, write: StagedWrite) -> pa.RecordBatch:
    files = _TaskFiles(write)
    # The file's columns the decode does not give are the derived ones.
    decoded = set(options.arrow_schema.names)
    derived = [name for name in write.schema.names if name not in decoded]
    try:
        for unit in units:
            if not isinstance(unit, QueueUnit):  # plan_mirror extends consume-queue ranges
                raise TypeError(f"the mirror holds consume-queue ranges, not {unit!r}")
            for batch in run_unit(unit, options):
                if batch.num_rows:
                    columns = [*batch.columns, *write.derive(batch)]
                    full = pa.RecordBatch.from_arrays(columns, [*batch.schema.names, *derived])
                    files.add((unit.broker, unit.topic), full)
    finally:
        files.close()
    return files.staged()


def write_tasks(
    tasks: list[list[Unit]],
    options: ReadOptions,
    write: StagedWrite,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: each input row is a task id; its units, decoded and
    written (module docstring)."""
    for batch in batches:
        for task_id in batch.column(0).to_pylist():
            yield _write_task(tasks[int(task_id)], options, write)


def write_units(
    spark: SparkSession, units: Sequence[QueueUnit], options: ReadOptions, write: StagedWrite
) -> list[StagedFile]:
    """Decode ``units`` and write them as ``write`` says, in one Spark job: the files."""
    ranges, tasks = unit_tasks(spark, units)
    written = ranges.mapInArrow(functools.partial(write_tasks, tasks, options, write), STAGED_FILE)
    # One row per file (per task and partition it met): a few, however many records.
    return [StagedFile(**row.asDict()) for row in written.collect()]
