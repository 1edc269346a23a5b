"""Read RocketMQ broker stores (``--store [NAME=]DIR``) into the canonical schema, on Spark.

The driver plans the read (``read_plan`` over ``store_files``: file names and sizes, and
where each consume-queue file's written entries end) and cuts the work into
*units*: a range of entries of one consume-queue file, or one commit-log file to scan when a
queue's consume queue is missing. Units are packed into tasks (``task_packing``) and run by
``mapInArrow`` over ``spark.range(n_tasks)`` (one task per partition); each task decodes its units
(``read_tasks``: memory-mapped read-only, vectorised numpy/pyarrow through ``codec``),
yielding Arrow record batches of one combined schema (``combined``): message columns plus
``reason``/``raw_hex`` (null for readable records). That DataFrame is persisted and split
into ``messages`` and ``bad_records``, so a run reads the store once. See
``docs/store-reader.md``.

The planning and decoding names are re-exported here: callers import the reader from one
place.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.connect import default_parallelism
from connectors.errors import InputError
from connectors.rocketmq.combined import (
    COMBINED_ARROW,
    COMMITS_COMBINED_ARROW,
    LEAN_COMBINED_ARROW,
    SAME_AS_UNIQ_KEY,
    TRANSACTION_ID,
    UNIQ_KEY,
    ReadOptions,
)
from connectors.rocketmq.offset_filter import OffsetFilter
from connectors.rocketmq.offsets_file import committed_rows, load_store_offsets
from connectors.rocketmq.read_plan import (
    SCAN_BYTES_PER_ENTRY,
    TASK_ENTRIES,
    TRANSACTION_TOPICS,
    Note,
    QueueUnit,
    ScanUnit,
    Unit,
    plan_store,
    unique_offset_queues,
)
from connectors.rocketmq.read_tasks import (
    CHUNK_BYTES,
    CHUNK_RECORDS,
    read_tasks,
    run_queue_unit,
    run_scan_unit,
    run_unit,
)
from connectors.rocketmq.store_files import (
    CommitLogFile,
    StoreSpec,
    list_commitlog,
    parse_store_arg,
    validate_store,
)
from connectors.rocketmq.task_packing import (
    MIN_TASK_ENTRIES,
    in_log_order,
    pack_tasks,
    split_units,
    task_size,
)
from schemas.messages import (
    COMMIT_MESSAGE,
    COMMITTED_OFFSET,
    LEAN_MESSAGE,
    OFFSET_UNIQUE,
    OP_TOPIC,
    SOURCED_MESSAGE,
)
from schemas.outputs import BAD_RECORD

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_RECORDS",
    "COMBINED",
    "COMBINED_ARROW",
    "COMMITS_COMBINED",
    "COMMITS_COMBINED_ARROW",
    "LEAN_COMBINED",
    "LEAN_COMBINED_ARROW",
    "MIN_TASK_ENTRIES",
    "SCAN_BYTES_PER_ENTRY",
    "TASK_ENTRIES",
    "TRANSACTION_TOPICS",
    "CommitLogFile",
    "QueueUnit",
    "ReadOptions",
    "ScanUnit",
    "StorePlan",
    "StoreRead",
    "StoreSpec",
    "Unit",
    "decode_units",
    "in_log_order",
    "list_commitlog",
    "offset_unique_flag",
    "pack_tasks",
    "parse_store_arg",
    "plan_store",
    "plan_stores",
    "read_batches",
    "read_options",
    "read_stores",
    "run_queue_unit",
    "run_scan_unit",
    "run_unit",
    "split_read",
    "split_units",
    "task_size",
    "unique_offset_queues",
    "validate_store",
]

# One pass produces both readable records and bad records.
_PROBLEM_FIELDS = [
    T.StructField("reason", T.StringType()),
    T.StructField("raw_hex", T.StringType()),
]
COMBINED = T.StructType([*SOURCED_MESSAGE.fields, *_PROBLEM_FIELDS])
# The job's lean path: the properties the round reads as columns, no map (LEAN_MESSAGE).
LEAN_COMBINED = T.StructType([*LEAN_MESSAGE.fields, *_PROBLEM_FIELDS])
# A business queue's committed messages (``commits_only``): COMMIT_MESSAGE.
COMMITS_COMBINED = T.StructType([*COMMIT_MESSAGE.fields, *_PROBLEM_FIELDS])
assert LEAN_COMBINED_ARROW.names == LEAN_COMBINED.fieldNames()
assert COMBINED_ARROW.names == COMBINED.fieldNames()
assert COMMITS_COMBINED_ARROW.names == COMMITS_COMBINED.fieldNames()


@dataclass(frozen=True)
class StoreRead:
    messages: DataFrame
    bad_records: DataFrame
    committed_offsets: DataFrame
    notes: list[Note]
    # The persisted one-pass DataFrame both of the above are cut from (``unpersist`` frees it).
    combined: DataFrame | None = field(default=None, repr=False, compare=False)
    # Per broker, the offsets file used and why the usual one was not
    # (``offsets_file.StoreOffsets``): the round names them in its warnings per queue.
    offsets_files: tuple[tuple[str, str, str | None], ...] = ()
    # No record's queue offset can repeat: the round needs no duplicate check.
    offsets_unique: bool = False

    def unpersist(self) -> None:
        if self.combined is not None:
            self.combined.unpersist()


def all_offsets_unique(units: Sequence[Unit]) -> bool:
    """Whether no record of ``units`` can share its queue offset with another: every unit
    reads a consume queue whose offsets cannot repeat (``unique_offset_queues``)."""
    queues = unique_offset_queues(units)
    return (
        bool(queues)
        and not any(isinstance(u, ScanUnit) for u in units)
        and len(queues)
        == len({(u.broker, u.topic, u.queue_id) for u in units if isinstance(u, QueueUnit)})
    )


def offset_unique_flag(units: Sequence[Unit]) -> Column:
    """The round's ``offset_unique`` column: true for records whose queue offset cannot
    repeat (``unique_offset_queues``). A literal when it is the same for every record, so
    that Spark's optimizer drops the duplicate check's branch it never needs."""
    queues = unique_offset_queues(units)
    if not queues:
        return F.lit(False)
    if all_offsets_unique(units):
        return F.lit(True)
    key = F.concat_ws("\u0000", F.col("broker"), F.col("topic"), F.col("queue_id").cast("string"))
    flag = key.isin(
        [f"{broker}\u0000{topic}\u0000{queue_id}" for broker, topic, queue_id in queues]
    )
    return F.coalesce(flag, F.lit(False))


def restored_transaction_id() -> Column:
    """The lean records' transaction id as decoded: UNIQ_KEY where the batches carry
    ``SAME_AS_UNIQ_KEY`` (``combined.shared_transaction_ids``)."""
    same = F.col(TRANSACTION_ID) == F.lit(SAME_AS_UNIQ_KEY)
    return F.when(same, F.col(UNIQ_KEY)).otherwise(F.col(TRANSACTION_ID)).alias(TRANSACTION_ID)


def read_batches(
    stores: Sequence[StoreSpec],
    *,
    verify_crc: bool = False,
    include_half_body: bool = False,
    topics: Sequence[str] = TRANSACTION_TOPICS,
) -> Iterator[pa.RecordBatch]:
    """The reader without Spark (tests, small tools): every combined batch of the stores."""
    options = ReadOptions(
        verify_crc=verify_crc, body_topics=None if include_half_body else (OP_TOPIC,)
    )
    for spec in stores:
        validate_store(spec)
        offsets = load_store_offsets(spec.root).table
        units, _ = plan_store(spec, tuple(topics), offsets)
        for unit in units:
            yield from run_unit(unit, options)


@dataclass(frozen=True)
class StorePlan:
    """The units of every store, with what the driver learnt while planning them
    (``plan_stores``; ``read_stores`` reads them)."""

    units: list[Unit]
    notes: list[Note]
    committed: list[tuple[str, str, int, int]]
    offsets_files: list[tuple[str, str, str | None]]


def only_these_queues(units: Sequence[Unit], queues: frozenset[tuple[str, str, int]]) -> list[Unit]:
    """The consume-queue units of the (broker, topic, queue id) in ``queues``; no commit-log
    scan: a queue read this way (a business queue a discard record names) is read through
    its consume queue or not at all (docs/store-reader.md)."""
    return [
        unit
        for unit in units
        if isinstance(unit, QueueUnit) and (unit.broker, unit.topic, unit.queue_id) in queues
    ]


def plan_stores(
    stores: Sequence[StoreSpec],
    topics: tuple[str, ...] = TRANSACTION_TOPICS,
    only_queues: frozenset[tuple[str, str, int]] | None = None,
) -> StorePlan:
    """Check and plan every store (``read_stores``'s ``topics`` and ``only_queues``);
    InputError before any Spark job. Reads file names and sizes, each consume-queue file's
    tail and the offsets file: one pass of the driver over the stores."""
    names = [s.broker for s in stores]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise InputError(f"--store: broker name {duplicated[0]!r} given twice")
    plan = StorePlan([], [], [], [])
    for spec in stores:
        validate_store(spec)
        loaded = load_store_offsets(spec.root)
        plan.offsets_files.append((spec.broker, loaded.used, loaded.note))
        offsets = loaded.table
        plan.committed.extend(committed_rows(spec.broker, offsets))
        store_units, store_notes = plan_store(spec, topics, offsets)
        if only_queues is not None:
            store_units, store_notes = only_these_queues(store_units, only_queues), []
        plan.units.extend(store_units)
        plan.notes.extend(store_notes)
    return plan


def _schemas(options: ReadOptions) -> tuple[T.StructType, T.StructType]:
    """(the tasks' combined schema, the readable records' schema) of a read."""
    if options.commits_only:
        return COMMITS_COMBINED, COMMIT_MESSAGE
    if options.lean:
        return LEAN_COMBINED, LEAN_MESSAGE
    return COMBINED, SOURCED_MESSAGE


def read_stores(
    spark: SparkSession,
    stores: Sequence[StoreSpec],
    *,
    verify_crc: bool = False,
    include_half_body: bool = False,
    topics: Sequence[str] = TRANSACTION_TOPICS,
    lean: bool = False,
    only_queues: frozenset[tuple[str, str, int]] | None = None,
    commits_only: bool = False,
    commit_filters: Mapping[str, OffsetFilter] | None = None,
    plan: StorePlan | None = None,
) -> StoreRead:
    """Read the half and op queues (or ``topics``) of every store; see the module doc.

    ``lean``: records carry ``PROPERTY_COLUMNS`` instead of the properties map
    (``LEAN_MESSAGE``), what the job reads; the default gives ``SOURCED_MESSAGE``.
    ``only_queues``: read only these (broker, topic, queue id) of ``topics``, through their
    consume queues (``only_these_queues``). ``commits_only``: of the records the consume
    queues point at, only committed transactional messages (and broken records, reported)
    are decoded, into ``COMMIT_MESSAGE`` (``lean`` does not apply); the others are read no
    further than their fixed fields. ``commit_filters`` (with ``commits_only``): per
    broker, the prepared-transaction offsets wanted (``offset_filter``); a commit the
    filter rules out is not decoded, nor is any commit of a broker without one. ``plan``: the
    stores' plan already made by ``plan_stores`` (with these ``topics`` and ``only_queues``),
    so that the driver does not plan them again.

    Raises InputError (before any Spark job) for a path that is not a store, two stores with
    the same broker name, or a malformed ``config/consumerOffset.json``."""
    if plan is None:
        plan = plan_stores(stores, tuple(topics), only_queues)
    options = replace(
        read_options(verify_crc=verify_crc, include_half_body=include_half_body, lean=lean),
        commits_only=commits_only,
        commit_filters=None if commit_filters is None else tuple(sorted(commit_filters.items())),
    )
    combined = decode_units(spark, plan.units, options)
    return split_read(spark, plan, options, combined.persist(StorageLevel.MEMORY_AND_DISK))


def read_options(
    *, verify_crc: bool = False, include_half_body: bool = False, lean: bool = False
) -> ReadOptions:
    """The decode options of a read of the half and op queues (``read_stores``)."""
    return ReadOptions(
        verify_crc=verify_crc, body_topics=None if include_half_body else (OP_TOPIC,), lean=lean
    )


def unit_tasks(spark: SparkSession, units: Sequence[Unit]) -> tuple[DataFrame, list[list[Unit]]]:
    """The tasks of one Spark job that decodes ``units``: a frame of task ids, one per
    partition, and each task's units (``task_packing``), for a ``mapInArrow`` function."""
    size = task_size(units, default_parallelism(spark))
    # In commit-log order: the queues' records lie among each other's over the whole log.
    tasks = pack_tasks(in_log_order(split_units(units, size)), size)
    return spark.range(0, len(tasks), 1, max(1, len(tasks))), tasks


def decode_units(spark: SparkSession, units: Sequence[Unit], options: ReadOptions) -> DataFrame:
    """The combined rows (records and bad records, ``_schemas``) of ``units``, decoded by
    one Spark job's tasks (module docstring); nothing is decoded until a query reads it."""
    ranges, tasks = unit_tasks(spark, units)
    combined_schema, _ = _schemas(options)
    return ranges.mapInArrow(functools.partial(read_tasks, tasks, options), combined_schema)


def split_read(
    spark: SparkSession, plan: StorePlan, options: ReadOptions, combined: DataFrame
) -> StoreRead:
    """The read of ``plan``'s stores from their ``combined`` rows (held by the caller):
    readable records in the message schema of ``options``, bad records, committed offsets."""
    combined_schema, message_schema = _schemas(options)
    # The lean records are the round's input contract: what it reads, and whether each
    # record's queue offset can repeat (``transforms.round_stages.OFFSET_UNIQUE``).
    flag = [offset_unique_flag(plan.units).alias(OFFSET_UNIQUE)] if options.lean else []
    columns = [
        restored_transaction_id() if name == TRANSACTION_ID else F.col(name)
        for name in message_schema.fieldNames()
    ]
    # Columns kept beside the decoded ones (the mirror's derived columns) ride along.
    derived = [name for name in combined.columns if name not in combined_schema.fieldNames()]
    messages = combined.where(F.col("reason").isNull()).select(*columns, *flag, *derived)
    bad_records = combined.where(F.col("reason").isNotNull()).select(*BAD_RECORD.fieldNames())
    committed_offsets = spark.createDataFrame(plan.committed, COMMITTED_OFFSET)
    return StoreRead(
        messages=messages,
        bad_records=bad_records,
        committed_offsets=committed_offsets,
        notes=plan.notes,
        combined=combined,
        offsets_files=tuple(plan.offsets_files),
        offsets_unique=options.lean and all_offsets_unique(plan.units),
    )
