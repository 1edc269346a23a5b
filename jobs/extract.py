"""Extract: what one run reads (broker stores or exported segments) and who the run is
(the instant T it reconciles at and its run id)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.errors import InputError
from connectors.mirror import (
    RECORDS,
    Derived,
    MirrorRequest,
    mirror_lines,
    read_through_mirror,
)
from connectors.rocketmq.mirror_plan import QueueKey
from connectors.rocketmq.offsets_file import committed_rows, read_consumer_offsets
from connectors.rocketmq.probe import StoreTimes, transaction_times
from connectors.rocketmq.reader import (
    StorePlan,
    StoreSpec,
    parse_store_arg,
    plan_stores,
    read_options,
    read_stores,
)
from connectors.segments import read_segments
from jobs.config import JobConfig
from jobs.materialize import SparkMaterializer
from schemas.messages import COMMITTED_OFFSET, MAY_BE_BAD_FIELDS, OP_TOPIC
from transforms.bad_records import may_be_bad_columns, with_may_be_bad
from transforms.messages import as_lean, is_half, is_op
from transforms.offsets import round_bounds
from transforms.round import NOTE
from transforms.staleness import stale_after_ms

# The settings that change a round's result, hence its default run id.
RUN_ID_SETTINGS = (
    "check_max",
    "transaction_timeout_ms",
    "file_reserved_hours",
    "include_body",
    "verify_crc",
    "broker_version",
)


# -- time and identity -------------------------------------------------------------------


# An epoch-ms --as-of below this (1973-03-03T09:46:40Z) is taken for epoch seconds given by
# mistake: no broker store of this job's RocketMQ versions holds a record that old.
SECONDS_BELOW_MS = 100_000_000_000
# One at or above this (5138-11-16) is taken for epoch microseconds or nanoseconds.
MICROS_FROM_MS = 100_000_000_000_000
AS_OF_WORDS = ("auto", "now", "latest")


def instant_text(ms: int) -> str:
    """Epoch ms as an ISO-8601 UTC instant, with milliseconds only when there are some:
    ``2025-06-15T15:06:39Z``, ``1970-01-21T06:06:39.999Z``."""
    instant = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    text = instant.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def _check_epoch_ms(value: int, text: str) -> int:
    """``value`` (from ``--as-of`` given as a number) unless it is negative or looks like
    epoch seconds, microseconds or nanoseconds: one line reading it back as a date and
    giving the fix."""
    if value < 0:
        raise InputError(
            f"--as-of {text} is negative ({instant_text(value)}, before 1970): give auto, now,"
            " latest, an ISO-8601 instant (e.g. 2025-06-15T15:06:39Z) or epoch ms"
        )
    if value * 1000 < SECONDS_BELOW_MS:
        raise InputError(
            f"--as-of {text} is {instant_text(value)}, before any store: give auto, now,"
            " latest, an ISO-8601 instant (e.g. 2025-06-15T15:06:39Z) or epoch ms"
        )
    if value < SECONDS_BELOW_MS:
        raise InputError(
            f"--as-of {text} looks like epoch seconds: {value} ms is {instant_text(value)};"
            f" as seconds it is {instant_text(value * 1000)}: give --as-of {value * 1000}"
        )
    if value >= MICROS_FROM_MS:
        unit, per_ms = (
            ("nanoseconds", 1_000_000) if value >= 1000 * MICROS_FROM_MS else ("microseconds", 1000)
        )
        raise InputError(
            f"--as-of {text} looks like epoch {unit} (as ms it is after the year 5000); as"
            f" {unit} it is {instant_text(value // per_ms)}: give --as-of {value // per_ms}"
        )
    return value


def parse_as_of(text: str) -> int | str:
    """``auto``, ``now`` and ``latest`` stay symbolic; an ISO-8601 instant or epoch ms becomes
    epoch ms. Refused (one line, exit 2): a negative instant and a number that looks like
    epoch seconds (below ``SECONDS_BELOW_MS``) or micro/nanoseconds."""
    if text in AS_OF_WORDS:
        return text
    if text.lstrip("-").isdigit():
        return _check_epoch_ms(int(text), text)
    try:
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"--as-of must be auto, now, latest, an ISO-8601 instant or epoch ms: {text}"
        ) from None
    if instant.tzinfo is None:
        raise InputError(f"--as-of needs a time zone (e.g. {text}Z): {text}")
    value = int(instant.timestamp() * 1000)
    if value < 0:
        raise InputError(
            f"--as-of {text} is before 1970: give auto, now, latest or a later instant"
        )
    return value


def resolve_as_of(as_of: int | str, messages: DataFrame) -> int:
    """``latest``: 1 ms after the newest record read (all brokers and queues); ``now`` when
    there is none. ``auto`` left to this point (exported segments: ``settle_as_of``)
    is ``latest``."""
    if isinstance(as_of, int):
        return as_of
    if as_of in ("latest", "auto"):
        row = messages.agg(F.max("store_timestamp_ms")).first()  # one row
        newest = row[0] if row is not None else None
        if newest is not None:
            return int(newest) + 1
    return int(time.time() * 1000)


@dataclass(frozen=True)
class LatestRound:
    """T = ``latest`` and the round's per-queue bounds at it, from one aggregate."""

    as_of_ms: int
    bounds: DataFrame  # local rows (``transforms.offsets.round_bounds``)


def latest_round(inputs: Inputs, as_of: int | str) -> LatestRound | None:
    """T for ``latest`` (or ``auto`` left to this point) over the store reader's records
    (``offsets_unique``: half and op records, no duplicate to settle) and the round's
    per-queue bounds, from one aggregate: the bounds of every record are the bounds at
    any T after the newest one, and the newest is among them. T is ``resolve_as_of``'s;
    the round reads the bounds instead of its own. None for any other T or input."""
    if as_of not in ("latest", "auto") or not inputs.offsets_unique:
        return None
    records = inputs.messages.filter(is_half() | is_op())
    frame = round_bounds(records, inputs.committed_offsets, None)
    bounds, table = SparkMaterializer().per_queue_table(frame)  # one row per queue
    newest = pc.max(table["newest_ms"]).as_py()
    as_of_ms = int(newest) + 1 if newest is not None else int(time.time() * 1000)
    return LatestRound(as_of_ms, bounds)


@dataclass(frozen=True)
class AsOfChoice:
    """What ``--as-of auto`` chose for the run (``mode``: ``now`` or ``latest``) and why."""

    mode: str
    reason: str
    # The store looks copied (or shows nothing live), or its tail is damaged: a picture
    # that may be wrong, a warning on every queue of the run; an export's ``latest`` is no
    # such thing.
    warns: bool = False
    given: str = "auto"  # what --as-of said: ``auto``, or ``latest`` over a damaged tail

    @property
    def line(self) -> str:
        """The one line the run prints: ``as-of auto: latest (...)``."""
        return f"as-of {self.given}: {self.mode} ({self.reason})"


EXPORT_CHOICE = AsOfChoice(
    "latest", "exported segments are a copy: T is 1 ms after their newest record"
)


def age_text(ms: int) -> str:
    """A duration in its largest whole unit: ``850 ms``, ``12 s``, ``5 min``, ``3 h``, ``531 d``."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if abs(ms) >= 2 * size:
            return f"{ms // size if ms >= 0 else -(-ms // size)} {unit}"
    return f"{ms} ms"


def choose_as_of(times: Mapping[str, StoreTimes], now_ms: int, limit_ms: int) -> AsOfChoice:
    """``--as-of auto`` over the run's stores (broker -> ``probe.transaction_times``):
    ``latest`` when a store looks copied (its newest half/op record is older than
    ``limit_ms`` at ``now_ms``: ``transforms.staleness.stale_after_ms``, the stale-store
    warning's limit) or shows no half/op record, ``now`` when every one looks live. T is one
    for the run: one copied store makes it ``latest`` for all (spec section 1)."""
    ages = {broker: now_ms - t.newest_ms for broker, t in times.items() if t.newest_ms is not None}
    limit = f"a live broker's is at most {age_text(limit_ms)} old"
    stale = sorted((age, broker) for broker, age in ages.items() if age > limit_ms)
    if stale:
        age, broker = stale[-1]
        more = f"; {len(stale) - 1} more broker(s) look copied" if len(stale) > 1 else ""
        return AsOfChoice(
            "latest",
            f"broker {broker}'s newest half/op record is {age_text(age)} old, {limit}: the store"
            f" looks copied{more}",
            warns=True,
        )
    unknown = sorted(broker for broker, t in times.items() if t.newest_ms is None)
    if unknown:
        return AsOfChoice(
            "latest",
            f"broker {unknown[0]} has no half/op record readable through its consume queues:"
            " nothing shows the store live",
            warns=True,
        )
    age, broker = max((age, broker) for broker, age in ages.items())
    when = f"{age_text(age)} old" if age >= 0 else f"{age_text(-age)} ahead of this clock"
    return AsOfChoice(
        "now", f"broker {broker}'s newest half/op record is {when}: the store looks live"
    )


def check_after_oldest(as_of_ms: int, times: Mapping[str, StoreTimes]) -> None:
    """An instant T at or before a store's oldest half/op record reads nothing of it (a
    round sees the records stored before T) and would put its offsets back: exit 2."""
    for broker, t in sorted(times.items()):
        if t.oldest_ms is not None and as_of_ms <= t.oldest_ms:
            raise InputError(
                f"--as-of {instant_text(as_of_ms)} ({as_of_ms} ms) is not after the oldest"
                f" half/op record of broker {broker} ({instant_text(t.oldest_ms)}): the round"
                " would read none of its records; give a later instant, or auto, now or latest"
            )


def store_times(specs: Sequence[StoreSpec]) -> dict[str, StoreTimes]:
    """Broker -> the oldest and newest store time of its half/op records, read before Spark
    starts (a few reads per queue); a store the probe cannot read shows none."""
    times = {}
    for spec in specs:
        try:
            times[spec.broker] = transaction_times(spec.root)
        except OSError:  # the read reports what is wrong with the store, with its path
            times[spec.broker] = StoreTimes(None, None)
    return times


def settle_as_of(
    as_of: int | str, specs: Sequence[StoreSpec], config: JobConfig
) -> tuple[int | str, AsOfChoice | None]:
    """T checked against the stores (``check_after_oldest``) and ``auto`` decided, before
    Spark starts: (``now``, ``latest`` or epoch ms; the choice ``auto`` made, else None).
    Without stores (exported segments) nothing can be checked before the read and ``auto``
    is ``latest``."""
    if not specs:
        return ("latest", EXPORT_CHOICE) if as_of == "auto" else (as_of, None)
    times = store_times(specs)
    if isinstance(as_of, int):
        check_after_oldest(as_of, times)
        return as_of, None
    choice = None
    if as_of == "auto":
        limit = stale_after_ms(config.check_interval_ms, config.transaction_timeout_ms)
        choice = choose_as_of(times, int(time.time() * 1000), limit)
    tail = damaged_tail(times)
    if tail is not None and "latest" in (as_of, getattr(choice, "mode", None)):
        reasons = [choice.reason, tail] if choice is not None else [tail]
        choice = AsOfChoice("latest", "; ".join(reasons), warns=True, given=str(as_of))
    return (choice.mode if choice is not None else as_of), choice


def damaged_tail(times: Mapping[str, StoreTimes]) -> str | None:
    """Why ``latest`` may be early: a store whose last consume-queue entries point at no
    readable record (a damaged or half-copied tail) gives T from its newest readable
    record, before what the broker already wrote (None when no store shows that)."""
    damaged = sorted(
        (t.unreadable_tail, broker) for broker, t in times.items() if t.unreadable_tail
    )
    if not damaged:
        return None
    count, broker = damaged[-1]
    return (
        f"broker {broker}'s last {count} consume-queue entries point at no readable record (a"
        " damaged or half-copied tail): T comes from the newest readable record and may be"
        " before what the broker already passed"
    )


def derive_run_id(inputs: Sequence[str], as_of_ms: int, config: JobConfig) -> str:
    """Same inputs, T and settings -> same id, so a rerun replaces its own rows."""
    settings = {k: v for k, v in asdict(config).items() if k in RUN_ID_SETTINGS}
    digest = hashlib.sha256(json.dumps([sorted(inputs), as_of_ms, settings]).encode()).hexdigest()
    return f"r{as_of_ms}-{digest[:12]}"


# -- what was read ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """What was read: records, reader bad records, committed offsets, reader notes."""

    messages: DataFrame
    bad_records: DataFrame
    committed_offsets: DataFrame
    notes: DataFrame
    identity: list[str]  # for the default run id
    release: Callable[[], None] | None = None  # set when the reader already caches its output
    # (broker, offsets file used, why the usual file was not used or None), for warnings
    offsets_files: tuple[tuple[str, str, str | None], ...] = ()
    # No record's queue offset can repeat (the store reader's, usually): no duplicate check.
    offsets_unique: bool = False
    # What a read through the mirror prints (``mirror_lines``).
    mirror_lines: tuple[str, ...] = ()
    # Read through the mirror: per op queue, the first offset not read (what the run's
    # decisions saw, ``schemas.decided_view``), and the brokers read again from the store.
    op_read_ends: Mapping[QueueKey, int] = field(default_factory=dict)
    mirror_rebuilt: frozenset[str] = frozenset()

    def persist(self) -> Inputs:
        """Cache the records once; the store reader's output is cached already."""
        if self.release is not None:
            return self
        messages, bad_records = self.messages.persist(), self.bad_records.persist()

        def release() -> None:
            messages.unpersist()
            bad_records.unpersist()

        return replace(self, messages=messages, bad_records=bad_records, release=release)

    def unpersist(self) -> None:
        if self.release is not None:
            self.release()


def read_store_inputs(
    spark: SparkSession,
    stores: Sequence[str],
    config: JobConfig,
    plan: StorePlan | None = None,
    mirror: MirrorRequest | None = None,
) -> Inputs:
    """The records of broker stores (``[NAME=]DIR`` each), the job's lean columns. ``plan``:
    the stores' plan made before the session started (``jobs.progress.planned_read``), so
    that they are not planned again. ``mirror``: read through the store's mirror
    (``connectors.mirror``); its lines are the inputs' ``mirror_lines``."""
    specs = [parse_store_arg(arg) for arg in stores]
    lines: tuple[str, ...] = ()
    ends: dict[QueueKey, int] = {}
    rebuilt: frozenset[str] = frozenset()
    if mirror is None:
        read = read_stores(
            spark,
            specs,
            verify_crc=config.verify_crc,
            include_half_body=config.include_body,
            lean=True,
            plan=plan,
        )
    else:
        options = read_options(
            verify_crc=config.verify_crc, include_half_body=config.include_body, lean=True
        )
        read, extension = read_through_mirror(
            spark,
            plan if plan is not None else plan_stores(specs),
            {spec.broker: spec.root for spec in specs},
            options,
            mirror,
            # The round filters and projects the mirror's rows per stage: scanned, not held.
            hold=False,
            # Whether the round may find a bad record in a record: found once, not per run.
            derived=Derived(MAY_BE_BAD_FIELDS, with_may_be_bad, may_be_bad_columns),
        )
        lines = tuple(mirror_lines(extension, mirror, RECORDS))
        ends, rebuilt = extension.read_ends(OP_TOPIC), frozenset(extension.plan.rebuilt)
    notes = spark.createDataFrame(list(read.notes), NOTE)
    identity = [f"store:{spec.broker}={spec.root.resolve()}" for spec in specs]
    return Inputs(
        read.messages,
        read.bad_records,
        read.committed_offsets,
        notes,
        identity,
        read.unpersist,
        read.offsets_files,
        read.offsets_unique,
        lines,
        ends,
        rebuilt,
    )


def read_segment_inputs(
    spark: SparkSession, half: str, op: str, fmt: str, broker: str, offsets: str | None
) -> Inputs:
    """The records of exported half and op segments in the round's contract (``as_lean``),
    with an optional consumerOffset.json."""
    table = None
    if offsets is not None:
        table = read_consumer_offsets(offsets)
        if table is None:
            raise InputError(f"{offsets}: offsets file not found")
    read = read_segments(spark, half, op, fmt, broker)
    committed = spark.createDataFrame(committed_rows(broker, table), COMMITTED_OFFSET)
    identity = [f"{fmt}:{broker}:{Path(p).resolve()}" for p in (half, op)] + [f"offsets:{offsets}"]
    used = offsets if offsets is not None else "no --offsets given"
    return Inputs(
        as_lean(read.messages),
        read.bad_records,
        committed,
        spark.createDataFrame([], NOTE),
        identity,
        offsets_files=((broker, used, None),),
    )
