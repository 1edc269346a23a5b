"""The reconciliation round (spec sections 4-6) over any number of brokers and queues.

Two steps, so that a job can materialise what several output tables share:
``classify_round`` composes the stages of ``transforms.round_stages`` (resolution and
classification, the heavy joins) into a ``RoundState``; ``shape_outputs`` derives the
output tables from it. ``reconcile`` runs both.

Nothing here runs a Spark job by itself. Where the round would profit from caching a
frame several stages read, from bringing a per-queue frame to the driver, or from
broadcasting the records from h0, it asks a ``Materializer`` passed in: the job's
(``jobs.materialize``) cuts lineages and collects; ``LAZY`` (tests, notebooks that materialise
themselves) leaves every frame lazy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.messages import HALF_TOPIC, OP_TOPIC, TRANS_GROUP
from schemas.outputs import (
    ANOMALY,
    BAD_RECORD,
    CHECK,
    CLASSES,
    CONSUME_OFFSETS,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    REASON_CHECK_MAX,
    REASON_EXPIRED,
    half_row_schema,
)
from transforms.anomalies import (
    RoundEvidence,
    narrowed,
    round_anomalies,
    windowed,
    with_anomaly_counts,
    with_run_columns,
)
from transforms.messages import QUEUE_KEY, is_half, is_op, offset_msg_id, stored_before
from transforms.offsets import (
    round_starts,
    window_facts,
    window_rows,
    with_h1,
    with_h_safe,
)
from transforms.operator_fields import (
    attention_counts,
    checks_left,
    discard_at_ms,
    message_keys,
    utc_timestamp,
    with_queue_round_facts,
)
from transforms.ops import explode_op_items
from transforms.params import RoundParams
from transforms.pending_history import first_seen_now
from transforms.picture import held, picture_anomalies
from transforms.queue_values import joined_values
from transforms.resolve import transaction_records
from transforms.round_stages import (
    NOTE,
    bad_record_facts,
    classified,
    marked_records,
    no_duplicates,
    note_facts,
    queue_summary,
    records_from_h0,
    records_from_h0_bound,
    round_bad_records,
    round_records,
    status_facts,
    stop_facts,
    unresolved_from_h0,
    with_statuses,
)


class Materializer(Protocol):
    """How a round's shared frames are materialised; decided by the caller (``jobs/``)."""

    def records(self, frame: DataFrame) -> DataFrame:
        """A record-level frame several stages read (the job runs its shuffles once and cuts
        its lineage)."""
        ...

    def kept(self, frame: DataFrame) -> DataFrame:
        """A record-level frame filtered down to what several stages read, usually a few
        rows (the job caches it, so that they do not filter every record again)."""
        ...

    def per_queue(self, frame: DataFrame) -> DataFrame:
        """A frame of one row per queue (or broker) that many joins read (the job brings
        it to the driver and back as a local relation)."""
        ...

    def is_small(self, bound: DataFrame) -> bool:
        """Whether the records from h0 may be broadcast (else Spark shuffles); ``bound``
        has per queue an upper bound of their number (``rows``, ``records_from_h0_bound``)."""
        ...

    def attach(self, records: DataFrame, queues: DataFrame, columns: Sequence[str]) -> DataFrame:
        """``records`` of the queues of ``queues`` (a per-queue frame) with its ``columns``
        (``transforms.queue_values``: a join, or literals the records look up)."""
        ...

    def release(self) -> None:
        """Free whatever ``records`` and ``kept`` kept."""
        ...


@dataclass(frozen=True)
class Lazy:
    """The identity ``Materializer``: every frame stays lazy; ``small`` answers
    ``is_small`` (both answers give the same round)."""

    small: bool = False

    def records(self, frame: DataFrame) -> DataFrame:
        return frame

    def kept(self, frame: DataFrame) -> DataFrame:
        return frame

    def per_queue(self, frame: DataFrame) -> DataFrame:
        return frame

    def is_small(self, bound: DataFrame) -> bool:
        return self.small

    def attach(self, records: DataFrame, queues: DataFrame, columns: Sequence[str]) -> DataFrame:
        return joined_values(records, queues, columns)

    def release(self) -> None:
        return None


LAZY = Lazy()


@dataclass(frozen=True)
class RoundState:
    """What the output tables are shaped from.

    Attributes:
        pending: one row per unresolved half record at offsets >= h0 (half fields,
            ``status``, ``counter_after``, ``immunity_ms``, ``age_ms``).
        queues: one row per (broker, queue_id) of the domain: committed offsets,
            h0/h1/h_safe, p0/p1/p_safe, class counts, warnings.
        bad_records: ``schemas.outputs.BAD_RECORD`` rows (reader's and round's).
        materialize: what materialised the round's frames (``unpersist`` releases them).
        evidence: the half and op records the anomaly rules read (``transforms.anomalies``);
            None: no anomaly is looked for.
    """

    pending: DataFrame
    queues: DataFrame
    bad_records: DataFrame
    params: RoundParams
    materialize: Materializer = LAZY
    evidence: RoundEvidence | None = None

    def persist(self) -> RoundState:
        """Materialise the unresolved records once (a job writes several tables from them)."""
        return replace(self, pending=self.materialize.records(self.pending))

    def unpersist(self) -> None:
        self.materialize.release()


@dataclass(frozen=True)
class RoundOutputs:
    """The output tables of one round, with the schemas of ``schemas.outputs``.

    ``run_summary`` has ``written_at_ms`` and ``duration_ms`` null: they are run-time
    columns filled by the writer.
    """

    check_requests: DataFrame
    discards: DataFrame
    pending: DataFrame
    consume_offsets: DataFrame
    run_summary: DataFrame
    bad_records: DataFrame
    anomalies: DataFrame
    # Added by the job (jobs.discards): the round alone does not read the discard topic.
    discard_history: DataFrame | None = None
    # Frees what was cached to compute these frames; they stay usable, computed again.
    release: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    def tables(self) -> dict[str, DataFrame]:
        """Name -> frame, in the order tables are written (offsets last)."""
        tables = {
            "bad_records": self.bad_records,
            "check_requests": self.check_requests,
            "discards": self.discards,
            "pending": self.pending,
            "run_summary": self.run_summary,
            "anomalies": self.anomalies,
        }
        if self.discard_history is not None:
            tables["discard_history"] = self.discard_history
        tables["consume_offsets"] = self.consume_offsets
        return tables


def classify_round(
    messages: DataFrame,
    committed_offsets: DataFrame,
    params: RoundParams,
    bad_input: DataFrame | None = None,
    notes: DataFrame | None = None,
    *,
    materialize: Materializer,
) -> RoundState:
    """Resolve and classify every half record of every queue in ``messages``.

    Args:
        messages: readable records (``SOURCED_MESSAGE``, or the store reader's lean
            records) of the half and op topics, any store time, duplicates allowed; an
            ``offset_unique`` column (the store reader's) spares its records the
            duplicate check.
        committed_offsets: ``COMMITTED_OFFSET`` rows.
        params: T, run id, broker configuration.
        bad_input: ``BAD_RECORD`` rows the readers produced (optional).
        notes: reader warnings (``NOTE``: broker, queue_id or null for the whole broker,
            warning), shown in ``run_summary.warnings``.
        materialize: caching, per-queue collection and the broadcast choice. The result
            does not depend on it, but a whole round needs one that cuts the lineage of
            its per-queue frames: with ``LAZY`` each consumer of a per-queue frame inlines
            the plan that made it, and the plan grows past what a driver can optimise
            (a worked case ran out of a 1 GiB heap). ``LAZY`` suits single stages.
    """
    m = materialize
    # Every later stage reads the deduplicated records: materialised once so that the
    # duplicate check and the property lookups are not redone per consumer.
    marked = m.records(marked_records(round_records(messages, params)))
    readable = no_duplicates(marked)
    current = readable.filter(stored_before(params.as_of_ms))
    half, ops = current.filter(is_half()), current.filter(is_op())
    # Op bodies are split and parsed once: named offsets, done-ness, unparsable items.
    op_items = m.records(explode_op_items(ops))
    starts = m.per_queue(round_starts(readable, committed_offsets, params.as_of_ms))
    # Only records from h0 on are classified, and only their transactions resolved.
    from_h0 = m.records(records_from_h0(half, starts, m.attach))
    small = m.is_small(records_from_h0_bound(starts))
    # Every half record of the transactions from h0: resolution reads them, and the anomaly
    # rules' transactions (a record in [h0, h1)) are among them. Kept when few, so that the
    # rules do not scan every half record again; else cut after its shuffle.
    linked_records = transaction_records(half, from_h0, small)
    linked = m.kept(linked_records) if small else m.records(linked_records)
    unresolved = unresolved_from_h0(linked, op_items, from_h0, small=small)
    # Materialised: the stop offsets are aggregated from them before statuses are set.
    candidates = m.records(classified(unresolved, params))
    h1s = m.per_queue(with_h1(starts, stop_facts(candidates)))
    # Kept (cached): counted per queue now, then read by every output table, the anomaly
    # rules and the discard history. Their plan has no shuffle (every join broadcasts),
    # so a cut lineage would scan every record again for each reader.
    pending = m.kept(with_statuses(candidates, h1s, m.attach))
    safe = m.per_queue(with_h_safe(h1s, status_facts(pending, params)))
    # Found once: counted per queue below, then counted and written by the job.
    bad_records = m.records(round_bad_records(marked, op_items, half, bad_input))
    note_rows = notes if notes is not None else messages.sparkSession.createDataFrame([], NOTE)
    # The half and op records the end offsets read, joined with the queues' window once.
    rows = window_rows(half, ops, op_items, safe, params, m.attach)
    queues = queue_summary(
        safe,
        window_facts(rows),
        bad_record_facts(bad_records),
        note_facts(note_rows),
    )
    # Left lazy: its consumer materialises it once (the job adds its warnings first).
    evidence = RoundEvidence(half, ops, op_items, linked)
    return RoundState(pending, queues, bad_records, params, m, evidence)


def _half_rows(pending: DataFrame, params: RoundParams, extra: list[Column]) -> DataFrame:
    schema = half_row_schema(params.include_body)
    values = {
        "broker": F.col("broker"),
        "queue_id": F.col("queue_id"),
        "half_offset": F.col("queue_offset"),
        "commitlog_offset": F.col("commitlog_offset"),
        "offset_msg_id": offset_msg_id(F.col("store_host"), F.col("commitlog_offset")),
        "uniq_key": F.col("uniq_key"),
        "producer_group": F.col("producer_group"),
        "real_topic": F.col("real_topic"),
        "real_queue_id": F.col("real_queue_id"),
        "born_timestamp_ms": F.col("born_timestamp_ms"),
        "store_timestamp_ms": F.col("store_timestamp_ms"),
        "age_ms": F.col("age_ms"),
        "check_times": F.col("counter_after"),
        "immunity_ms": F.col("immunity_ms"),
        "keys": message_keys(F.col("keys_raw")),
        "tags": F.col("tags"),
        "transaction_id": F.col("transaction_id"),
        "born_host": F.col("born_host"),
        "checks_left": checks_left(params),
        "discard_at_ms": discard_at_ms(params),
        "born_at": utc_timestamp(F.col("born_timestamp_ms")),
        "stored_at": utc_timestamp(F.col("store_timestamp_ms")),
        "as_of": utc_timestamp(F.lit(params.as_of_ms).cast(T.LongType())),
        "body": F.col("body"),
    }
    columns = [values[field.name].cast(field.dataType).alias(field.name) for field in schema.fields]
    return pending.select(*columns, *extra)


def _run_columns(params: RoundParams) -> list[Column]:
    return [
        F.lit(params.run_id).alias("run_id"),
        F.lit(params.as_of_ms).cast("long").alias("as_of_ms"),
    ]


# The offsets of consume_offsets that a held queue leaves null (transforms.picture).
HELD_OFFSETS = ("offset_after", "offset_safe")


def _consume_offsets(queues: DataFrame, params: RoundParams) -> DataFrame:
    per_topic = F.explode(
        F.array(
            F.struct(
                F.lit(HALF_TOPIC).alias("topic"),
                F.col("h_committed").alias("offset_committed"),
                F.col("h0").alias("offset_before"),
                F.col("h1").alias("offset_after"),
                F.col("h_safe").alias("offset_safe"),
            ),
            F.struct(
                F.lit(OP_TOPIC).alias("topic"),
                F.col("p_committed").alias("offset_committed"),
                F.col("p0").alias("offset_before"),
                F.col("p1").alias("offset_after"),
                F.col("p_safe").alias("offset_safe"),
            ),
        )
    ).alias("row")
    rows = queues.filter(F.col("h0").isNotNull()).select(*QUEUE_KEY, per_topic, "offset_hold")
    return rows.select(
        "broker",
        F.col("row.topic").alias("topic"),
        "queue_id",
        F.lit(TRANS_GROUP).alias("group"),
        "row.offset_committed",
        "row.offset_before",
        "row.offset_after",
        "row.offset_safe",
        "offset_hold",
        *_run_columns(params),
    ).select(
        *[
            (held(f.name) if f.name in HELD_OFFSETS else F.col(f.name)).cast(f.dataType)
            for f in CONSUME_OFFSETS.fields
        ]
    )


# run_summary columns only the writer knows (null in the frames a notebook gets).
WRITER_FILLED = ("inputs", "writer", "job_version", "written_at_ms", "duration_ms")


def _settings_columns(params: RoundParams) -> list[Column]:
    """The round's effective settings, recorded in run_summary."""
    return [
        F.lit(params.check_max).alias("check_max"),
        F.lit(params.transaction_timeout_ms).alias("transaction_timeout_ms"),
        F.lit(params.file_reserved_hours).alias("file_reserved_hours"),
        F.lit(params.check_interval_ms).alias("check_interval_ms"),
    ]


def shape_outputs(state: RoundState) -> RoundOutputs:
    """The output tables (spec section 6) from a classified round."""
    params = state.params
    run = _run_columns(params)
    pending = with_queue_round_facts(state.pending, state.queues)
    discard_reason = F.when(F.col("status") == DISCARD_CHECK_MAX, REASON_CHECK_MAX).otherwise(
        REASON_EXPIRED
    )
    check_requests = _half_rows(pending.filter(F.col("status") == CHECK), params, run)
    discards = _half_rows(
        pending.filter(F.col("status").isin(DISCARD_CHECK_MAX, DISCARD_EXPIRED)),
        params,
        [discard_reason.alias("reason"), *run],
    )
    # New to this run; the job carries earlier sightings over (transforms.pending_history).
    since = first_seen_now(params.run_id, params.as_of_ms)
    pending_rows = _half_rows(pending, params, [F.col("status"), *since, *run])
    attention = attention_counts(pending, params)
    summary_rows = state.queues.join(attention, QUEUE_KEY, how="left").select(
        *QUEUE_KEY,
        "h0",
        "h1",
        held("h_safe"),
        "p0",
        "p1",
        held("p_safe"),
        *CLASSES,
        "bad_records",
        # Filled by the job from discard_history (null when it is not computed).
        F.lit(None).cast(T.LongType()).alias("discard_history_rows"),
        *[
            F.coalesce(F.col(name), F.lit(0)).alias(name)
            for name in ("discard_next_round", "past_last_check")
        ],
        "warnings",
        *_settings_columns(params),
        *[F.lit(None).alias(name) for name in WRITER_FILLED],
        "offset_hold",
        *run,
    )
    # What may make the picture wrong is a finding too: listed first, and --fail-on
    # covers it.
    picture = with_run_columns(picture_anomalies(summary_rows), params)
    anomalies = _anomalies(state).unionByName(picture)
    summary = summary_rows.transform(with_anomaly_counts, anomalies)
    bad_records = state.bad_records.select(*BAD_RECORD.fieldNames(), *run)
    return RoundOutputs(
        check_requests=check_requests,
        discards=discards,
        pending=pending_rows,
        consume_offsets=_consume_offsets(state.queues, params),
        run_summary=summary,
        bad_records=bad_records,
        anomalies=anomalies,
        release=state.unpersist,
    )


def _anomalies(state: RoundState) -> DataFrame:
    """The anomalies table's rows the round decides (``transforms.anomalies``), materialised
    once: the table and the per-queue counts of ``run_summary`` both read them."""
    params = state.params
    if state.evidence is None:
        empty = state.pending.sparkSession.createDataFrame([], ANOMALY)
        return with_run_columns(empty, params)
    m = state.materialize
    # The per-queue rows once more through the driver: their window is attached to the
    # evidence, and their plan inlined there would grow past what the driver can optimise.
    queues = m.per_queue(state.queues)
    evidence = narrowed(windowed(state.evidence, queues, m.attach), m.kept)
    found = round_anomalies(evidence, state.pending, params)
    return m.records(with_run_columns(found, params))


def reconcile(
    messages: DataFrame,
    committed_offsets: DataFrame,
    params: RoundParams,
    bad_input: DataFrame | None = None,
    notes: DataFrame | None = None,
    *,
    materialize: Materializer,
) -> RoundOutputs:
    """Run one round over decoded half and op records of any number of brokers.

    Args:
        messages: readable records (``schemas.messages.SOURCED_MESSAGE``) of the half and
            op topics, any store time; duplicates allowed (section 7 settles them).
        committed_offsets: ``schemas.messages.COMMITTED_OFFSET`` rows from the offsets files.
        params: as-of time, run id and broker configuration.
        bad_input: ``schemas.outputs.BAD_RECORD`` rows the readers already produced.
        notes: reader warnings for ``run_summary.warnings`` (``NOTE`` schema).
        materialize: see ``classify_round``.

    Returns:
        The output DataFrames; nothing is written.
    """
    return shape_outputs(
        classify_round(
            messages, committed_offsets, params, bad_input, notes, materialize=materialize
        )
    )
