"""The discard history's reads: ``TRANS_CHECK_MAX_TIME_TOPIC`` (a store's consume queue or
commit-log scan, or an export given with ``--discards``) and the real queues its records
name.

The discard topic is small (one record per message the broker gave up on), so it is a read
of its own beside the half/op read. Business queues can be huge: only the (topic, queue)
pairs that discard records name are read, through their consume queues (never a commit-log
scan), and of their records only committed transactional messages that may name a
discarded transaction's half record (``offset_filter``). A queue that cannot be read that
way makes an ended transaction ``ended`` rather than ``committed``/``rolled_back``
(docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.mirror import COMMITS, DISCARDS, MirrorRequest, mirror_lines, read_through_mirror
from connectors.rocketmq.layout import topic_folder, topic_path_problem
from connectors.rocketmq.mirror_plan import QueueKey
from connectors.rocketmq.offset_filter import OffsetFilter, filter_batches
from connectors.rocketmq.reader import parse_store_arg, plan_stores, read_options, read_stores
from connectors.segments import read_discard_segments
from schemas.messages import COMMIT_MESSAGE, DISCARD_TOPIC, SOURCED_MESSAGE
from schemas.outputs import BAD_RECORD

# ``commit_filters``' rows (``offset_filter.FILTER_SCHEMA``).
_FILTER_ROWS = T.StructType(
    [T.StructField("broker", T.StringType()), T.StructField("bits", T.BinaryType())]
)
EXPORT_NOTE = (
    "exports hold no real topic: a transaction ended by an op shows as ended, never as"
    " committed or rolled_back"
)
RealQueue = tuple[str, str, int]  # (broker, topic, queue id)


@dataclass(frozen=True)
class DiscardSource:
    """Where a run's discard records are: broker stores (``[NAME=]DIR`` each), or an
    export (``path`` in ``fmt``, of ``broker``; no path: none given)."""

    stores: tuple[str, ...] = ()
    path: str | None = None
    fmt: str | None = None
    broker: str | None = None
    mirror: MirrorRequest | None = None  # read the stores' discard topic through its mirror


@dataclass(frozen=True)
class DiscardRead:
    """One read of the discard history's inputs: its records (the discard records,
    ``SOURCED_MESSAGE`` with duplicates still in; or the real queues' commits,
    ``COMMIT_MESSAGE``) and their bad records."""

    records: DataFrame
    bad_records: DataFrame
    notes: list[str] = field(default_factory=list)
    release: Callable[[], None] = lambda: None
    mirror_lines: list[str] = field(default_factory=list)  # ``connectors.mirror.mirror_lines``
    # Read through the mirror: per queue, the first offset not read (``Extension.read_ends``),
    # and the brokers whose mirror this run read again from the store.
    read_ends: dict[QueueKey, int] = field(default_factory=dict)
    rebuilt: frozenset[str] = frozenset()


def read_discards(spark: SparkSession, source: DiscardSource, verify_crc: bool) -> DiscardRead:
    """The discard records of ``source``: every store's ``TRANS_CHECK_MAX_TIME_TOPIC`` (its
    consume queue, else a commit-log scan: the reader's rule for any topic), or the
    export."""
    if source.stores:
        specs = [parse_store_arg(arg) for arg in source.stores]
        lines: list[str] = []
        if source.mirror is None:
            read = read_stores(spark, specs, verify_crc=verify_crc, topics=(DISCARD_TOPIC,))
        else:
            roots = {spec.broker: spec.root for spec in specs}
            plan = plan_stores(specs, (DISCARD_TOPIC,))
            options = read_options(verify_crc=verify_crc)
            read, extension = read_through_mirror(
                spark, plan, roots, options, source.mirror, DISCARDS
            )
            lines = mirror_lines(extension, source.mirror, DISCARDS)
        notes = [f"{broker}: {text}" for broker, _, text in read.notes]
        return DiscardRead(read.messages, read.bad_records, notes, read.unpersist, lines)
    if source.path is None:
        empty = spark.createDataFrame([], SOURCED_MESSAGE)
        return DiscardRead(empty, spark.createDataFrame([], BAD_RECORD), [])
    assert source.fmt is not None and source.broker is not None  # validated by the caller
    export = read_discard_segments(spark, source.path, source.fmt, source.broker)
    return DiscardRead(export.messages, export.bad_records, [EXPORT_NOTE])


def readable_queues(stores: Sequence[str], named: Sequence[RealQueue]) -> list[RealQueue]:
    """The named queues whose consume queue exists in their store (read-only checks of file
    names): the ones a committed message can be looked for in. Any topic name is looked
    for, whatever its length or characters, except one that cannot be a folder name
    (``layout.topic_path_problem``: ``unread_queue_notes`` reports it)."""
    roots = {spec.broker: spec.root for spec in map(parse_store_arg, stores)}
    found = []
    for broker, topic, queue_id in named:
        root = roots.get(broker)
        if root is None or topic_path_problem(topic) is not None or queue_id < 0:
            continue
        folder = topic_folder(Path(root), topic) / str(queue_id)
        if folder.is_dir() and any(folder.iterdir()):
            found.append((broker, topic, queue_id))
    return found


def unread_queue_notes(named: Sequence[RealQueue], readable: Sequence[RealQueue]) -> list[str]:
    """One note per real queue that cannot be read (no consume queue), and one per real
    topic whose name cannot be a path, however many of its queues are named (the name is
    quoted: a note is one line whatever the name holds)."""
    missing = sorted(set(named) - set(readable))
    notes: list[str] = []
    unsafe: dict[tuple[str, str, str], list[int]] = {}
    for broker, topic, queue_id in missing:
        problem = topic_path_problem(topic)
        if problem is None:
            shown = topic if topic.isprintable() else repr(topic)
            notes.append(
                f"{broker}: real queue {shown}/{queue_id} cannot be read (no consume queue):"
                " its ended transactions show as ended"
            )
        else:
            unsafe.setdefault((broker, topic, problem), []).append(queue_id)
    for (broker, topic, problem), queue_ids in unsafe.items():
        notes.append(
            f"{broker}: real topic {topic!r} is not read: its name {problem}, so it is never"
            f" made a path; the ended transactions of its queue(s)"
            f" {', '.join(map(str, queue_ids))} show as ended"
        )
    return notes


def commit_filters(half_offsets: DataFrame) -> dict[str, OffsetFilter]:
    """Per broker, a filter of the commit-log offsets ``half_offsets`` (``broker``,
    ``offset``: the discarded transactions' half records): the business-queue read then
    decodes only the commits that may name one. Built in one task, which sizes each filter
    from its count; one row per broker reaches the driver."""
    filters = half_offsets.repartition(1).mapInArrow(filter_batches, _FILTER_ROWS)
    rows = filters.collect()  # one row per broker: its filter, never its offsets
    return {row["broker"]: OffsetFilter(bytes(row["bits"])) for row in rows}


def read_real_queues(
    spark: SparkSession,
    stores: Sequence[str],
    queues: Sequence[RealQueue],
    verify_crc: bool,
    filters: Mapping[str, OffsetFilter],
    mirror: MirrorRequest | None = None,
) -> DiscardRead:
    """The records of exactly ``queues``, through their consume queues: their committed
    transactional messages only, as ``COMMIT_MESSAGE``, and of those only the ones
    ``filters`` (``commit_filters``) say may name a discarded transaction's half record.
    Through the commits' mirror when ``mirror`` is given: every committed message of each
    queue, decoded once in its life (``filters`` do not apply)."""
    if not queues:
        commits = spark.createDataFrame([], COMMIT_MESSAGE)
        return DiscardRead(commits, spark.createDataFrame([], BAD_RECORD))
    brokers = {broker for broker, _, _ in queues}
    specs = [spec for spec in map(parse_store_arg, stores) if spec.broker in brokers]
    topics = tuple(sorted({topic for _, topic, _ in queues}))
    if mirror is not None:
        plan = plan_stores(specs, topics, frozenset(queues))
        options = replace(read_options(verify_crc=verify_crc), commits_only=True)
        roots = {spec.broker: spec.root for spec in specs}
        # Not held: the discard history keeps of the commits only what it needs, and its
        # filter prunes the scan of the mirror.
        read, extension = read_through_mirror(
            spark, plan, roots, options, mirror, COMMITS, hold=False
        )
        lines = mirror_lines(extension, mirror, COMMITS)
        rebuilt = frozenset(extension.plan.rebuilt)
        return DiscardRead(
            read.messages,
            read.bad_records,
            [],
            read.unpersist,
            lines,
            extension.read_ends(),
            rebuilt,
        )
    read = read_stores(
        spark,
        specs,
        verify_crc=verify_crc,
        topics=topics,
        only_queues=frozenset(queues),
        commits_only=True,
        commit_filters=filters,
    )
    return DiscardRead(read.messages, read.bad_records, [], read.unpersist)


def no_commits(spark: SparkSession) -> DataFrame:
    """No committed message (``COMMIT_MESSAGE``): the evidence before the real queues are
    read, or when none can be."""
    return spark.createDataFrame([], COMMIT_MESSAGE)


def discard_offsets(records: DataFrame) -> DataFrame:
    """``broker``, ``offset`` of ``records``' commit-log places (``commit_filters``' input)."""
    return records.select("broker", F.col("half_commitlog_offset").alias("offset"))
