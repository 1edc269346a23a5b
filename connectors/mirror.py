"""The store's mirror (docs/spec/reconcile.md section 10): the decoded half and op records of
every queue read through its consume queue, kept as a Delta table under the output root
(``mirror_records``, partitioned by broker and topic), so that a record is decoded once in
its life. A run decodes what the store appended since the last run
(``connectors.rocketmq.mirror_plan``) into the mirror, then reads its rows back with a
columnar scan.

How far each queue was read, and what the store held there (the marks), is written in the
metadata of the commit that adds the files: files and marks move together, so a run killed
before or after the commit repeats cleanly. The whole extension (marks read, plan, decode,
commit) holds the output root's commit lock: two runs on one root never decode the same
entries twice. The decode tasks write the mirror's files (``connectors.mirror_write``) and
delta-rs commits them from the driver: it needs a local output root (or storage mounted as
one) that every executor shares, like the delta-rs writer (docs/cluster.md).
"""

from __future__ import annotations

import functools
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.arrow import to_arrow_schema
from connectors.delta_commit import TABLE_PROPERTIES, commit_lock, local_root
from connectors.delta_read import newest_data_commit
from connectors.delta_rs import check_committed_rows, partition_folder
from connectors.errors import InputError
from connectors.mirror_write import StagedFile, StagedWrite, write_units
from connectors.rocketmq.combined import ReadOptions
from connectors.rocketmq.mirror_plan import MirrorPlan, QueueKey, QueueMark, plan_mirror
from connectors.rocketmq.read_plan import QueueUnit, Unit
from connectors.rocketmq.reader import (
    COMBINED,
    COMMITS_COMBINED,
    LEAN_COMBINED,
    StorePlan,
    StoreRead,
    decode_units,
    split_read,
)

MIRROR_PARTITIONS = ("broker", "topic")
# The commit metadata key that holds the marks (``MirrorState``), and their format.
STATE_KEY = "rmq_txn_reconcile_mirror"
# Commits that carry no state: a vacuum writes a start and an end commit (jobs.maintenance
# vacuum). The state is read from the newest other commit (a compaction carries it).
NO_STATE = ("VACUUM START", "VACUUM END")
STATE_FORMAT = 1


@dataclass(frozen=True)
class MirrorKind:
    """One mirror table: its folder under the output root, the combined rows it holds
    (records and bad records, as the reader decodes them) and what they are, in a line."""

    table: str
    schema: T.StructType
    what: str


# The half and op records, in the round's lean columns; the discard topic's records, with
# their properties (the discard history reads them whole).
RECORDS = MirrorKind("mirror_records", LEAN_COMBINED, "half/op records")
DISCARDS = MirrorKind("mirror_discards", COMBINED, "discard records")
# The committed transactional messages of the business queues discard records name: every
# one of each queue, so that a later discard of the same queue finds its commit mirrored.
COMMITS = MirrorKind("mirror_commits", COMMITS_COMBINED, "committed messages")
MIRROR_KINDS = (RECORDS, DISCARDS, COMMITS)
MIRROR_TABLE = RECORDS.table
MIRROR_SCHEMA = RECORDS.schema


@dataclass(frozen=True)
class Derived:
    """Columns a run derives from the decoded rows and keeps beside them (``fields``):
    derived once, when the rows are mirrored (``arrays``, on each decoded Arrow batch in
    the mirror's tasks), and for the rows a run decodes for itself (``add``); a row
    mirrored before a column existed reads it as null. The job passes them (the derivations
    are transforms), the mirror keeps them."""

    fields: T.StructType
    add: Callable[[DataFrame], DataFrame]
    arrays: Callable[[pa.RecordBatch], Sequence[pa.Array]]


def _no_rows_derived(rows: DataFrame) -> DataFrame:
    return rows


def _no_arrays_derived(batch: pa.RecordBatch) -> list[pa.Array]:
    return []


NOTHING_DERIVED = Derived(T.StructType([]), _no_rows_derived, _no_arrays_derived)


def decode_settings(options: ReadOptions) -> dict[str, bool]:
    """The read options that change a decoded row: a broker's mirror holds rows of one."""
    return {"verify_crc": options.verify_crc, "half_body": options.body_topics is None}


@dataclass(frozen=True)
class BrokerMirror:
    """One broker's part of the mirror's state: the settings its rows were decoded with
    and its marks."""

    settings: dict[str, bool]
    marks: dict[tuple[str, int], QueueMark] = field(default_factory=dict)


MirrorState = dict[str, BrokerMirror]


def state_text(state: Mapping[str, BrokerMirror]) -> str:
    """The state as the commit metadata holds it (JSON, sorted, one list per mark)."""
    brokers = {
        broker: {
            "settings": part.settings,
            "marks": [
                [topic, queue_id, *asdict(mark).values()]
                for (topic, queue_id), mark in sorted(part.marks.items())
            ],
        }
        for broker, part in sorted(state.items())
    }
    return json.dumps({"format": STATE_FORMAT, "brokers": brokers}, sort_keys=True)


def parse_state(text: str) -> MirrorState | None:
    """``state_text`` read back; None for a format this release does not know."""
    document = json.loads(text)
    if document.get("format") != STATE_FORMAT:
        return None
    return {
        broker: BrokerMirror(
            dict(part["settings"]),
            {(m[0], int(m[1])): QueueMark(*(int(v) for v in m[2:])) for m in part["marks"]},
        )
        for broker, part in document["brokers"].items()
    }


def load_state(path: Path) -> MirrorState | None:
    """The state of the mirror at ``path``: ``{}`` when there is no mirror yet, None when
    its newest commit carries no state this release can read (another tool committed to
    it, or a newer release wrote it): every broker of the run is then read whole again."""
    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        return {}
    newest = newest_data_commit(table, NO_STATE)
    if newest is None or newest.get("version") == 0:
        return {}  # created, nothing committed into it yet
    text = newest.get(STATE_KEY)
    return parse_state(text) if isinstance(text, str) else None


def mirror_root(output: str) -> Path:
    """The output root the mirror lives under, absolute; InputError (exit 2) for one that is
    not local: delta-rs commits the mirror from the driver (module docstring)."""
    root = local_root(output)
    if root is None:
        raise InputError(
            f"--output {output}: the mirror needs a local output root (or storage mounted as"
            " one); run without --mirror/--rebuild"
        )
    return root.resolve()


@dataclass(frozen=True)
class MirrorRequest:
    """Read the stores through their mirror under the output root ``root`` (local);
    ``rebuild``: read every store of the run whole again into it."""

    root: Path
    rebuild: bool = False


@dataclass(frozen=True)
class Extension:
    """What one run added to the mirror."""

    plan: MirrorPlan
    records: int  # rows decoded into the mirror (records and bad records)
    committed: bool  # False: the decode could not place every row; read live instead
    seconds: float  # the extension's time under the lock: marks read, plan, decode, commit

    def read_ends(self, topic: str | None = None) -> dict[QueueKey, int]:
        """Per queue (of ``topic``, or all) read from the mirror, the first queue offset the
        run did not read from it (``schemas.decided_view``); none when the run read live."""
        if not self.committed:
            return {}
        return {
            key: end
            for key, (_, end) in self.plan.ranges.items()
            if topic is None or key[1] == topic
        }


class Mirror:
    """The mirror under one output root (module docstring)."""

    def __init__(
        self,
        spark: SparkSession,
        root: Path,
        kind: MirrorKind = RECORDS,
        derived: Derived = NOTHING_DERIVED,
    ) -> None:
        self.spark = spark
        self.root = root
        self.kind = kind
        self.derived = derived
        self.path = root / kind.table
        # The table's columns: the kind's, then the derived ones; its files hold all but
        # the partition columns (those are in the Delta log).
        self.schema = T.StructType([*kind.schema.fields, *derived.fields.fields])
        self.file_schema = T.StructType(
            [f for f in self.schema.fields if f.name not in MIRROR_PARTITIONS]
        )

    def _ensure_table(self) -> None:
        try:
            DeltaTable(str(self.path))
        except TableNotFoundError:
            self.path.mkdir(parents=True, exist_ok=True)
            DeltaTable.create(
                str(self.path),
                to_arrow_schema(self.schema),
                mode="ignore",
                partition_by=list(MIRROR_PARTITIONS),
                configuration=TABLE_PROPERTIES,
            )

    def _ensure_derived(self, state: MirrorState | None) -> None:
        """Add the derived columns a table made before them lacks, in a commit that carries
        the state forward (``state``: the table's; None, unreadable: carried as none)."""
        table = DeltaTable(str(self.path))
        known = {field.name for field in table.schema().fields}
        missing = [field for field in self.derived.fields.fields if field.name not in known]
        if not missing:
            return
        fields = Schema.from_arrow(to_arrow_schema(T.StructType(missing))).fields
        carried = {STATE_KEY: state_text(state)} if state is not None else {}
        table.alter.add_columns(fields, commit_properties=CommitProperties(custom_metadata=carried))

    def extend(
        self,
        roots: Mapping[str, Path],
        units: Sequence[Unit],
        options: ReadOptions,
        rebuild: Mapping[str, str],
    ) -> Extension:
        """Bring the mirror of the brokers of ``roots`` up to their stores: plan against its
        marks (``plan_mirror``; ``rebuild``: brokers to read whole again, and why), decode
        the new entries into Parquet files and commit them with the new marks."""
        settings = decode_settings(options)
        with commit_lock(str(self.root)):
            started = time.monotonic()  # not the wait for the lock
            self._ensure_table()
            state = load_state(self.path)
            self._ensure_derived(state)
            rebuild = dict(rebuild)
            for broker in roots:
                if state is None:
                    rebuild.setdefault(broker, "the mirror's state is unreadable")
                elif broker in state and state[broker].settings != settings:
                    rebuild.setdefault(broker, "the run decodes with other settings")
            state = state or {}
            marks = {
                (broker, topic, queue_id): mark
                for broker, part in state.items()
                if broker in roots
                for (topic, queue_id), mark in part.marks.items()
            }
            plan = plan_mirror(roots, units, marks, rebuild)
            placed = self._write(plan.extend, options)
            if placed is None:
                # Nothing is committed: the run reads its stores whole, as without the mirror.
                nothing = MirrorPlan([], list(units), {}, {}, {})
                return Extension(nothing, 0, False, time.monotonic() - started)
            adds, written = placed
            new_state = dict(state)
            for broker in roots:
                new_state[broker] = BrokerMirror(
                    settings,
                    {(k[1], k[2]): m for k, m in plan.marks.items() if k[0] == broker},
                )
            # A broker the state does not know has no rows the marks account for (a
            # first run, or a state that could not be read): its partition is replaced.
            replaced = sorted(b for b in roots if b in plan.rebuilt or b not in state)
            if adds or replaced or new_state != state:
                self._commit(adds, replaced, new_state)
        return Extension(plan, written, True, time.monotonic() - started)

    def _write(
        self, units: Sequence[QueueUnit], options: ReadOptions
    ) -> tuple[list[AddAction], int] | None:
        """Decode ``units`` into the table's folders: the add actions of the files and the
        rows they hold; None when a row has no queue offset (nothing placed). The staging
        folder is removed whatever happens."""
        staging = self.path / "_staging" / f"write-{uuid.uuid4().hex}"
        try:
            staged = self._decode(units, options, staging)
            if any(file.unplaced for file in staged):
                return None
            written = sum(file.rows for file in staged)
            # Executors write on their file system, the driver lists its own: marks that
            # moved past rows the driver cannot see would lose them (docs/cluster.md).
            check_committed_rows(self.kind.table, written, _rows_found(staged), staging)
            return self._place(staged), written
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _decode(
        self, units: Sequence[QueueUnit], options: ReadOptions, staging: Path
    ) -> list[StagedFile]:
        """Decode ``units`` into Parquet files of the table's columns in ``staging``, each
        of one (broker, topic): the files (``connectors.mirror_write``)."""
        if not units:
            return []
        staging.mkdir(parents=True)
        write = StagedWrite(str(staging), to_arrow_schema(self.file_schema), self.derived.arrays)
        return write_units(self.spark, units, options, write)

    def _place(self, staged: Sequence[StagedFile]) -> list[AddAction]:
        """Move the staged files into the table's partition folders: their add actions."""
        adds = []
        for file in staged:
            folder = (
                self.path
                / partition_folder(file.broker, "broker")
                / partition_folder(file.topic, "topic")
            )
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / Path(file.path).name
            Path(file.path).rename(target)
            stat = target.stat()
            adds.append(
                AddAction(
                    path=target.relative_to(self.path).as_posix(),
                    size=stat.st_size,
                    partition_values={"broker": file.broker, "topic": file.topic},
                    modification_time=int(stat.st_mtime * 1000),
                    data_change=True,
                    stats=json.dumps({"numRecords": file.rows}),
                )
            )
        return adds

    def _commit(
        self, adds: Sequence[AddAction], replaced: Sequence[str], state: Mapping[str, BrokerMirror]
    ) -> None:
        """One commit: the files of ``adds`` with the new ``state``; the rows the brokers
        of ``replaced`` had before are removed by it (Delta replaces their partitions,
        appends to the others)."""
        table = DeltaTable(str(self.path))
        actions: list[AddAction | RemoveAction] = list(adds)
        table.create_write_transaction(
            actions,
            mode="overwrite" if replaced else "append",
            schema=table.schema(),
            partition_by=list(MIRROR_PARTITIONS),
            partition_filters=[("broker", "in", list(replaced))] if replaced else None,
            commit_properties=CommitProperties(custom_metadata={STATE_KEY: state_text(state)}),
        )

    def rows(self, ranges: Mapping[QueueKey, tuple[int, int]]) -> DataFrame | None:
        """The mirror's rows of ``ranges`` (per queue, the [first, end) queue offsets the
        store still holds readable), in the kind's schema; None when there are none."""
        actions = pa.table(DeltaTable(str(self.path)).get_add_actions(flatten=True))
        if not actions.num_rows:  # no file yet: its flattened partitions have no columns
            return None
        files: dict[tuple[str, str], list[str]] = {}
        for row in actions.select(["path", "partition.broker", "partition.topic"]).to_pylist():
            key = (row["partition.broker"], row["partition.topic"])
            files.setdefault(key, []).append(str(self.path / row["path"]))
        frames = []
        for (broker, topic), paths in sorted(files.items()):
            wanted = _queue_ranges(
                (key[2], span) for key, span in ranges.items() if key[:2] == (broker, topic)
            )
            if wanted is None:
                continue
            scanned = self.spark.read.schema(self.file_schema).parquet(*paths)
            frames.append(
                scanned.where(wanted).select(
                    *(
                        F.lit(broker).alias(name)
                        if name == "broker"
                        else F.lit(topic).alias(name)
                        if name == "topic"
                        else F.col(name)
                        for name in self.schema.fieldNames()
                    )
                )
            )
        return functools.reduce(DataFrame.unionByName, frames) if frames else None


def _rows_found(staged: Sequence[StagedFile]) -> int:
    """The rows the driver finds in the staged files (their footers; a file it cannot see
    holds none)."""
    return sum(pq.read_metadata(file.path).num_rows for file in staged if Path(file.path).exists())


def _queue_ranges(spans: Iterable[tuple[int, tuple[int, int]]]) -> Column | None:
    """The condition that keeps the rows of each (queue id, [first, end)) of ``spans``."""
    condition = None
    for queue_id, (first, end) in sorted(spans):
        one = (F.col("queue_id") == queue_id) & F.col("queue_offset").between(first, end - 1)
        condition = one if condition is None else condition | one
    return condition


def read_through_mirror(
    spark: SparkSession,
    plan: StorePlan,
    roots: Mapping[str, Path],
    options: ReadOptions,
    request: MirrorRequest,
    kind: MirrorKind = RECORDS,
    hold: bool = True,
    derived: Derived = NOTHING_DERIVED,
) -> tuple[StoreRead, Extension]:
    """The read of ``plan``'s stores (``roots``: broker -> store root) through the mirror
    ``kind`` of ``request``: the mirror extended first (``--rebuild``: every broker of the
    run read whole again), then its rows and the live units' read together, held for the
    run like ``read_stores``'s. ``hold=False``: rows of the mirror alone are left a lazy
    scan, which a consumer's filter prunes (live rows are decoded, and always held).
    ``derived``: columns kept beside the rows (``Derived``), which the read's records carry."""
    if to_arrow_schema(kind.schema) != options.arrow_schema:
        raise ValueError(f"{kind.table} holds other columns than this read decodes")
    mirror = Mirror(spark, request.root, kind, derived)
    rebuild = dict.fromkeys(roots, "--rebuild") if request.rebuild else {}
    extension = mirror.extend(roots, plan.units, options, rebuild)
    parts = []
    if extension.committed:
        mirrored = mirror.rows(extension.plan.ranges)
        if mirrored is not None:
            parts.append(mirrored)
    if extension.plan.live:
        parts.append(derived.add(decode_units(spark, extension.plan.live, options)))
    combined = (
        functools.reduce(DataFrame.unionByName, parts)
        if parts
        else spark.createDataFrame([], mirror.schema)
    )
    if hold or extension.plan.live:
        combined = combined.persist(StorageLevel.MEMORY_AND_DISK)
    read = split_read(spark, plan, options, combined)
    return read, extension


def mirror_lines(extension: Extension, request: MirrorRequest, kind: MirrorKind) -> list[str]:
    """What a read through the mirror prints: a broker read whole again and why (first),
    then how many rows it decoded into the mirror."""
    lines = [
        f"warning: {kind.table} of broker {broker} rebuilt from its store: {why}"
        for broker, why in sorted(extension.plan.rebuilt.items())
    ]
    if not extension.committed:
        lines.append(
            f"warning: {kind.table} not extended: a consume-queue range could not be read at"
            " all; this run read its stores whole, as without the mirror"
        )
    else:
        lines.append(
            f"mirror: {extension.records} new {kind.what} decoded into"
            f" {request.root / kind.table} in {extension.seconds:.1f} s"
        )
    return lines
