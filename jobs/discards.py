"""The discard history of one run (spec section 6, ``discard_history``): the glue that reads
``TRANS_CHECK_MAX_TIME_TOPIC`` (a store's consume queue or commit-log scan, or an export
given with ``--discards``) and the real queues its records name, then hands them to the
pure ``transforms.discard_history``.

The discard topic is small (one record per message the broker gave up on), so it is a
separate read beside the half/op read, which stays as it is. Business queues can be huge:
only the (topic, queue) pairs that discard records name are read, through their consume
queues (never a commit-log scan); a queue that cannot be read that way makes an ended
transaction ``ended`` rather than ``committed``/``rolled_back`` (docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.rocketmq.layout import topic_folder, topic_path_problem
from connectors.rocketmq.offset_filter import OffsetFilter, filter_batches
from connectors.rocketmq.read_tasks import NO_RECORD_PLACE
from connectors.rocketmq.reader import parse_store_arg, read_stores
from connectors.segments import read_discard_segments
from jobs.config import JobConfig
from jobs.materialize import SparkMaterializer
from schemas.messages import COMMIT_MESSAGE, DISCARD_TOPIC, SOURCED_MESSAGE
from schemas.outputs import ANOMALY, BAD_RECORD, DISCARD_HISTORY
from transforms.anomalies import discarded_without_check, with_anomaly_counts, with_run_columns
from transforms.bad_records import duplicate_records, unparsable_properties
from transforms.discard_history import (
    OUTCOMES,
    UNRESOLVED,
    DiscardEvidence,
    discard_history,
    discard_history_counts,
    discarded_unchecked,
    evidence_from,
)
from transforms.messages import mark_duplicates, stored_before, with_half_fields
from transforms.params import RoundParams
from transforms.queue_values import per_broker
from transforms.round import RoundOutputs, RoundState

if TYPE_CHECKING:
    from jobs.run import JobRequest

# Where a bad record is: the same broken record found by two reads is one bad record.
_BAD_PLACE = ["broker", "source", "position"]
# ``commit_filters``' rows (``offset_filter.FILTER_SCHEMA``).
_FILTER_ROWS = T.StructType(
    [T.StructField("broker", T.StringType()), T.StructField("bits", T.BinaryType())]
)
EXPORT_NOTE = (
    "exports hold no real topic: a transaction ended by an op shows as ended, never as"
    " committed or rolled_back"
)


@dataclass(frozen=True)
class DiscardRead:
    """Discard records (``SOURCED_MESSAGE``, duplicates still in) and their bad records."""

    records: DataFrame
    bad_records: DataFrame
    notes: list[str] = field(default_factory=list)
    release: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class DiscardHistory:
    """One run's ``discard_history`` rows (cached), its ``immunity_exhausts_checks``
    findings (``ANOMALY`` rows, cached), the bad discard records, and what the summary says
    about them."""

    history: DataFrame
    unchecked: DataFrame
    bad_records: DataFrame
    counts: dict[str, int]
    bad_count: int
    notes: list[str]
    release: Callable[[], None]

    def apply(self, outputs: RoundOutputs, params: RoundParams) -> RoundOutputs:
        """``outputs`` with the table, the bad discard records, the findings of discards
        without a check among the anomalies, and ``run_summary``'s ``discard_history_rows``
        (per broker, on each of its queue rows) and anomaly counts."""
        run = [F.lit(params.run_id).alias("run_id"), F.lit(params.as_of_ms).alias("as_of_ms")]
        bad = self.bad_records.select(*BAD_RECORD.fieldNames(), *run)
        # A handful of counts known on the driver: a literal map, not a join (a frame made
        # from Python rows has no size estimate, so the join shuffled both sides).
        rows = F.coalesce(per_broker(self.counts, "long"), F.lit(0))
        summary = outputs.run_summary.withColumn("discard_history_rows", rows)
        anomalies = outputs.anomalies.unionByName(with_run_columns(self.unchecked, params))
        return replace(
            outputs,
            discard_history=self.history,
            bad_records=outputs.bad_records.unionByName(bad),
            run_summary=with_anomaly_counts(summary, anomalies),
            anomalies=anomalies,
        )


def _empty_records(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], SOURCED_MESSAGE)


def read_store_discards(
    spark: SparkSession, stores: Sequence[str], config: JobConfig
) -> DiscardRead:
    """``TRANS_CHECK_MAX_TIME_TOPIC`` of every store: its consume queue, else a commit-log
    scan (the reader's rule for any topic)."""
    specs = [parse_store_arg(arg) for arg in stores]
    read = read_stores(spark, specs, verify_crc=config.verify_crc, topics=(DISCARD_TOPIC,))
    notes = [f"{broker}: {text}" for broker, _, text in read.notes]
    return DiscardRead(read.messages, read.bad_records, notes, read.unpersist)


def read_export_discards(
    spark: SparkSession, path: str | None, fmt: str, broker: str
) -> DiscardRead:
    """The ``--discards`` export, or no record when none was given."""
    if path is None:
        empty = _empty_records(spark)
        return DiscardRead(empty, spark.createDataFrame([], BAD_RECORD), [])
    read = read_discard_segments(spark, path, fmt, broker)
    return DiscardRead(read.messages, read.bad_records, [EXPORT_NOTE])


def _other_queue(records: DataFrame) -> DataFrame:
    """Bad records: a record of another queue than 0 (the broker creates one queue), whose
    offset would collide with queue 0's in the table's key."""
    reason = F.format_string(
        "%s has one queue (0): a record of queue %d is not used",
        F.lit(DISCARD_TOPIC),
        F.col("queue_id"),
    )
    return records.filter(F.col("queue_id") != 0).select(
        "broker",
        "source",
        "position",
        "topic",
        "queue_id",
        "queue_offset",
        reason.alias("reason"),
        F.lit(None).cast("string").alias("raw_hex"),
    )


def _usable(read: DiscardRead, as_of_ms: int) -> tuple[DataFrame, DataFrame]:
    """(discard records used, every bad discard record): duplicates and unparsable
    properties of records stored before T are bad records like the half records', and so
    is a record of another queue than 0."""
    marked = mark_duplicates(read.records.filter(F.col("queue_id") == 0))
    usable = marked.filter(F.col("duplicate_of").isNull()).drop("duplicate_of")
    fields = with_half_fields(usable.filter(stored_before(as_of_ms)))
    bad = (
        read.bad_records.select(*BAD_RECORD.fieldNames())
        .unionByName(_other_queue(read.records))
        .unionByName(duplicate_records(marked))
        .unionByName(unparsable_properties(fields))
    )
    return usable, bad


def counted_real_queues(usable: DataFrame, as_of_ms: int) -> tuple[list[tuple[str, str, int]], int]:
    """(broker, topic, queue id) the discard records before T name, one per queue, and how
    many discard records there are before T: one aggregate for both."""
    counted = (
        with_half_fields(usable.filter(stored_before(as_of_ms)))
        .groupBy("broker", "real_topic", "real_queue_id")
        .agg(F.count(F.lit(1)).alias("records"))
        .collect()  # one row per named real queue, and one per broker for the unnamed
    )
    named = sorted(
        (row[0], row[1], row[2]) for row in counted if row[1] is not None and row[2] is not None
    )
    return named, sum(row["records"] for row in counted)


def readable_queues(
    stores: Sequence[str], named: Sequence[tuple[str, str, int]]
) -> list[tuple[str, str, int]]:
    """The named queues whose consume queue exists in their store (read-only checks of file
    names): the ones a committed message can be looked for in. Any topic name is looked
    for, whatever its length or characters, except one that cannot be a folder name
    (``layout.topic_path_problem``: ``_unread_queue_notes`` reports it)."""
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


def read_real_queues(
    spark: SparkSession,
    stores: Sequence[str],
    queues: Sequence[tuple[str, str, int]],
    config: JobConfig,
    filters: Mapping[str, OffsetFilter],
) -> tuple[DataFrame, DataFrame, Callable[[], None]]:
    """(records, bad records, release) of exactly ``queues``, through their consume queues:
    their committed transactional messages only, as ``COMMIT_MESSAGE`` (``commit_times``
    reads nothing else, and a business queue holds far more other messages than commits
    of discarded ones), and of those only the ones ``filters`` (``commit_filters``) say may
    name a discarded transaction's half record."""
    if not queues:
        commits = spark.createDataFrame([], COMMIT_MESSAGE)
        return commits, spark.createDataFrame([], BAD_RECORD), lambda: None
    brokers = {broker for broker, _, _ in queues}
    specs = [spec for spec in map(parse_store_arg, stores) if spec.broker in brokers]
    topics = sorted({topic for _, topic, _ in queues})
    read = read_stores(
        spark,
        specs,
        verify_crc=config.verify_crc,
        topics=topics,
        only_queues=frozenset(queues),
        commits_only=True,
        commit_filters=filters,
    )
    return read.messages, read.bad_records, read.unpersist


def commit_filters(linked: DataFrame) -> dict[str, OffsetFilter]:
    """Per broker, a filter of the commit-log offsets of the discarded transactions' half
    records (``DiscardEvidence.linked``): the business-queue read then decodes only the
    commits that may name one (the queues hold every committed message of the store, far
    more than the discarded transactions).
    Built in one task, which sizes each filter from its count; one row per broker reaches
    the driver."""
    offsets = linked.select("broker", F.col("half_commitlog_offset").alias("offset"))
    filters = offsets.repartition(1).mapInArrow(filter_batches, _FILTER_ROWS)
    rows = filters.collect()  # one row per broker: its filter, never its offsets
    return {row["broker"]: OffsetFilter(bytes(row["bits"])) for row in rows}


def _read_discards(spark: SparkSession, request: JobRequest, config: JobConfig) -> DiscardRead:
    if request.stores:
        return read_store_discards(spark, request.stores, config)
    assert request.fmt is not None and request.broker is not None  # validated
    return read_export_discards(spark, request.discards, request.fmt, request.broker)


def _unread_queue_notes(
    named: Sequence[tuple[str, str, int]], readable: Sequence[tuple[str, str, int]]
) -> list[str]:
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


def _not_reported(bad: DataFrame, state: RoundState) -> DataFrame:
    """The discard read's bad records less the ones the round reported already: a commit-log
    scan for the discard topic meets every broken record of the file, and one the round
    met through a consume queue is one bad record, not two. The round reports it at its
    commit-log place (a truncated tail) or, when no record starts there (a bad magic
    code), at the consume-queue entry whose reason names that place."""
    named = state.bad_records.filter(F.col("reason").rlike(NO_RECORD_PLACE)).select(
        "broker",
        F.regexp_extract("reason", NO_RECORD_PLACE, 1).alias("source"),
        F.regexp_extract("reason", NO_RECORD_PLACE, 2).cast("long").alias("position"),
    )
    reported = state.bad_records.select(*_BAD_PLACE).unionByName(named).distinct()
    return bad.join(reported, on=_BAD_PLACE, how="left_anti")


def _evidence_with_commits(
    spark: SparkSession,
    request: JobRequest,
    config: JobConfig,
    state: RoundState,
    usable: DataFrame,
    queues: Sequence[tuple[str, str, int]],
    discarded: int,
    materializer: SparkMaterializer,
) -> tuple[DiscardEvidence, DataFrame, Callable[[], None]]:
    """(the evidence, the real queues' bad records, their release) of ``discarded`` discard
    records (``usable``) whose real queues ``queues`` can be read."""
    params = state.params
    assert state.evidence is not None  # checked by the caller
    # The discarded transactions' half records are cached: the history's rules and the
    # findings read them, and each read of them is a scan of every half record. The
    # discard records are broadcast against every half record when they fit the round's
    # bound; a discarded transaction has about check_max + 2 half records before T (its
    # original, its check copies, an immunity copy), and that many rows per discard
    # decide whether they are broadcast against every op item and commit.
    few = discarded <= materializer.broadcast_rows
    small = discarded * (params.check_max + 2) <= materializer.broadcast_rows
    no_commits = spark.createDataFrame([], COMMIT_MESSAGE)
    evidence = evidence_from(
        state.evidence,
        usable,
        state.pending,
        no_commits,
        queues,
        params.as_of_ms,
        materializer.kept,
        small,
        few,
    )
    # The real queues are read once the discarded transactions' half records are known:
    # their commit-log offsets say which commits are worth decoding.
    filters = commit_filters(evidence.linked) if queues else {}
    commits, real_bad, release = read_real_queues(spark, request.stores, queues, config, filters)
    return replace(evidence, commits=commits), real_bad, release


def build_discard_history(
    spark: SparkSession,
    request: JobRequest,
    config: JobConfig,
    state: RoundState,
) -> DiscardHistory:
    """Read the discard records and the evidence beside the round's own frames (``state``:
    its half, op and op-item records, pending rows and bad records), and decide every
    discard record's row. The rows and bad records are cached: the writer and the summary
    both read them."""
    params = state.params
    if state.evidence is None:
        raise ValueError("the discard history reads the round's records: this round kept none")
    # The job's one way of caching a small frame several readers share (released below).
    materializer = SparkMaterializer()
    keep = materializer.kept

    read = _read_discards(spark, request, config)
    usable, bad = _usable(read, params.as_of_ms)
    usable = keep(usable)
    named, discarded = counted_real_queues(usable, params.as_of_ms)
    named = named if request.stores else []
    queues = readable_queues(request.stores, named)
    if not discarded:
        # Nothing discarded (the usual case): the evidence joins would read the round's
        # records for nothing, and no discard record names a real queue.
        history = spark.createDataFrame([], DISCARD_HISTORY)
        unchecked = spark.createDataFrame([], ANOMALY)
        real_bad, release_real = spark.createDataFrame([], BAD_RECORD), lambda: None
    else:
        evidence, real_bad, release_real = _evidence_with_commits(
            spark, request, config, state, usable, queues, discarded, materializer
        )
        history = discard_history(evidence, params)
        unchecked = discarded_without_check(discarded_unchecked(evidence))
    history, unchecked = keep(history), keep(unchecked)
    bad = keep(bad.unionByName(real_bad.select(*BAD_RECORD.fieldNames())))
    if bad.isEmpty():
        # The usual case: no bad discard record, and the round's own bad records (a
        # recomputation of their stage) need not be read to drop the ones it reported.
        bad_count = 0
    else:
        bad = keep(_not_reported(bad, state))
        bad_count = bad.count()
    counts = {
        row["broker"]: row["discard_history_rows"]
        for row in discard_history_counts(history).collect()  # one row per broker
    }

    def release() -> None:
        materializer.release()
        release_real()
        read.release()

    notes = [*read.notes, *_unread_queue_notes(named, queues)]
    return DiscardHistory(history, unchecked, bad, counts, bad_count, notes, release)


def summary_lines(history: DiscardHistory, output_root: str) -> list[str]:
    """The printed lines: the rows by outcome (unresolved ones split into resumable and
    futile), the reader's notes, and where the table is."""
    rows = (
        history.history.groupBy("outcome", "resume_futile")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()  # one row per (outcome, resume_futile): at most a dozen
    )
    by_outcome: dict[str, int] = {}
    for row in rows:
        by_outcome[row["outcome"]] = by_outcome.get(row["outcome"], 0) + row["n"]
    futile = sum(row["n"] for row in rows if row["outcome"] == UNRESOLVED and row["resume_futile"])
    total = sum(by_outcome.values())
    parts = "  ".join(f"{name}={by_outcome.get(name, 0)}" for name in OUTCOMES)
    table = Path(output_root).resolve() / "discard_history"
    lines = [
        f"discard history: {total} discard record(s) before T  {parts}"
        f"  (resumable {by_outcome.get(UNRESOLVED, 0) - futile}, resume futile {futile}): rows in {table}"
    ]
    return lines + [f"  note: {note}" for note in history.notes]


def discard_inputs(request: JobRequest) -> list[str]:
    """The ``--discards`` export as run_summary's ``inputs`` names it (stores: nothing more,
    the store is named already)."""
    if request.discards is None:
        return []
    return [f"discards:{request.fmt}:{request.broker}:{Path(request.discards).resolve()}"]
