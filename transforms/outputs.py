"""Every output table of a run, shaped in one place (spec section 6): ``shape_tables``
derives each table, every column included, from the classified round
(``transforms.round.classify_round``) and what the job read beside it (``RunExtras``: the
discard history, earlier runs of the output root, the run's facts).

Stage order: half rows per status (check_requests, discards, pending, with the first
sightings carried from earlier runs) -> the run summary's rows (round facts, attention
counts, discard-history rows per broker, settings, run facts) -> the anomalies (the
round's rules, what may make the picture wrong, discards without a check, stalled
offsets) -> their counts on the run summary -> consume_offsets -> bad records (the round's
and the discard read's). Nothing here runs a Spark job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
    CONSUME_OFFSETS_TABLE,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    DISCARD_HISTORY,
    REASON_CHECK_MAX,
    REASON_EXPIRED,
    RUN_SUMMARY_TABLE,
    half_row_schema,
)
from transforms.anomalies import (
    narrowed,
    round_anomalies,
    windowed,
    with_anomaly_counts,
    with_run_columns,
)
from transforms.anomaly_rules.broker_view import settled_discards
from transforms.anomaly_rules.cross_run import stalled_offset
from transforms.broker_round import broker_offsets
from transforms.broker_view import (
    broker_action_rows,
    broker_view_columns,
    settled_discard_counts,
)
from transforms.discard_history import discard_history_counts
from transforms.merge import carried, merged
from transforms.messages import QUEUE_KEY, offset_msg_id
from transforms.operator_fields import (
    attention_counts,
    checks_left,
    discard_at_ms,
    message_keys,
    utc_timestamp,
    with_queue_round_facts,
)
from transforms.params import RoundParams
from transforms.pending_history import carry_pending_since, first_seen_now
from transforms.picture import held, picture_anomalies
from transforms.round import Materializer, RoundState, classify_round

# The tables small by nature (a row per queue and topic at most): the job brings them to
# the driver together and commits them from there.
SMALL_TABLES = (RUN_SUMMARY_TABLE, CONSUME_OFFSETS_TABLE)


@dataclass(frozen=True)
class RoundOutputs:
    """The output tables of one run, with the schemas of ``schemas.outputs``."""

    check_requests: DataFrame
    discards: DataFrame
    pending: DataFrame
    consume_offsets: DataFrame
    run_summary: DataFrame
    bad_records: DataFrame
    anomalies: DataFrame
    discard_history: DataFrame
    # Frees what was cached to compute these frames; they stay usable, computed again.
    release: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    def tables(self) -> dict[str, DataFrame]:
        """Name -> frame, in the order tables are written (offsets last)."""
        return {
            "bad_records": self.bad_records,
            "check_requests": self.check_requests,
            "discards": self.discards,
            "pending": self.pending,
            "run_summary": self.run_summary,
            "anomalies": self.anomalies,
            "discard_history": self.discard_history,
            "consume_offsets": self.consume_offsets,
        }


@dataclass(frozen=True)
class RunFacts:
    """What ``run_summary`` records about the run beside the round: its inputs, the writer
    (None: nothing written, a notebook's frames), the job's version, when the tables were
    written and how long the run took until then (None until the job writes)."""

    inputs: tuple[str, ...] | None = None
    writer: str | None = None
    job_version: str | None = None
    written_at_ms: int | None = None
    duration_ms: int | None = None


@dataclass(frozen=True)
class RunExtras:
    """What the job read beside the round, for the tables it shapes.

    Attributes:
        discard_history: ``DISCARD_HISTORY`` rows (None: not computed; run_summary's
            ``discard_history_rows`` then stays null and the table is empty).
        discard_findings: ``ANOMALY`` rows of discards without a check (no run columns).
        discard_bad_records: ``BAD_RECORD`` rows of the discard read the round did not
            report.
        earlier_pending: earlier runs' pending rows (``jobs.history``) to carry first
            sightings from.
        earlier_offsets: earlier runs' h0/p0 per queue (``stalled_offset``).
        facts: the run's facts (``RunFacts``).
    """

    discard_history: DataFrame | None = None
    discard_findings: DataFrame | None = None
    discard_bad_records: DataFrame | None = None
    earlier_pending: DataFrame | None = None
    earlier_offsets: DataFrame | None = None
    facts: RunFacts = RunFacts()


def _half_rows(
    pending: DataFrame,
    params: RoundParams,
    extra: list[Column],
    copy_reached: Column | None = None,
) -> DataFrame:
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
        "discard_at_ms": discard_at_ms(params, copy_reached),
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


# The columns of a queue row that consume_offsets reads (one row per topic from each).
_QUEUE_OFFSETS = ("h_committed", "h0", "h1", "h_safe", "p_committed", "p0", "p1", "p_safe")


def _with_broker_offsets(queues: DataFrame, broker: DataFrame) -> DataFrame:
    """The queue rows with ``BROKER_OFFSETS`` (null for a queue the walk did not reach),
    merged in one aggregate: the walk is read once, by this table's query."""
    rows = queues.filter(F.col("h0").isNotNull()).select(*QUEUE_KEY, *_QUEUE_OFFSETS, "offset_hold")
    return merged(carried(rows), broker_offsets(broker))


def _consume_offsets(queues: DataFrame, params: RoundParams, broker: DataFrame) -> DataFrame:
    per_topic = F.explode(
        F.array(
            F.struct(
                F.lit(HALF_TOPIC).alias("topic"),
                F.col("h_committed").alias("offset_committed"),
                F.col("h0").alias("offset_before"),
                F.col("h1").alias("offset_after"),
                F.col("h_safe").alias("offset_safe"),
                F.col("broker_h1").alias("broker_offset_after"),
                F.col("broker_copies").alias("broker_copies"),
            ),
            F.struct(
                F.lit(OP_TOPIC).alias("topic"),
                F.col("p_committed").alias("offset_committed"),
                F.col("p0").alias("offset_before"),
                F.col("p1").alias("offset_after"),
                F.col("p_safe").alias("offset_safe"),
                F.col("broker_p1").alias("broker_offset_after"),
                F.lit(None).cast("long").alias("broker_copies"),  # copies go to the half queue
            ),
        )
    ).alias("row")
    rows = _with_broker_offsets(queues, broker).select(*QUEUE_KEY, per_topic, "offset_hold")
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
        "row.broker_offset_after",
        "row.broker_copies",
        *_run_columns(params),
    ).select(
        *[
            (held(f.name) if f.name in HELD_OFFSETS else F.col(f.name)).cast(f.dataType)
            for f in CONSUME_OFFSETS.fields
        ]
    )


def _settings_columns(params: RoundParams) -> list[Column]:
    """The round's effective settings, recorded in run_summary."""
    return [
        F.lit(params.check_max).alias("check_max"),
        F.lit(params.transaction_timeout_ms).alias("transaction_timeout_ms"),
        F.lit(params.file_reserved_hours).alias("file_reserved_hours"),
        F.lit(params.check_interval_ms).alias("check_interval_ms"),
    ]


def _fact_columns(facts: RunFacts) -> list[Column]:
    """The run's facts as run_summary columns (``RunFacts``)."""
    return [
        (F.lit(None) if facts.inputs is None else F.array(*[F.lit(i) for i in facts.inputs]))
        .cast("array<string>")
        .alias("inputs"),
        F.lit(facts.writer).cast(T.StringType()).alias("writer"),
        F.lit(facts.job_version).cast(T.StringType()).alias("job_version"),
        F.lit(facts.written_at_ms).cast(T.LongType()).alias("written_at_ms"),
        F.lit(facts.duration_ms).cast(T.LongType()).alias("duration_ms"),
    ]


def _history_rows(history: DataFrame | None) -> tuple[DataFrame | None, Column]:
    """Per broker, the discard history's rows (None without a history) and run_summary's
    column of them: 0 on a broker without any, null when no history was computed."""
    if history is None:
        return None, F.lit(None).cast(T.LongType()).alias("discard_history_rows")
    counts = discard_history_counts(history)
    return counts, F.coalesce(F.col("discard_history_rows"), F.lit(0)).alias("discard_history_rows")


def _summary_rows(state: RoundState, pending: DataFrame, extras: RunExtras) -> DataFrame:
    """run_summary's rows before the anomaly counts: the round's per-queue facts, the
    attention counts, the broker's re-discards, the discard history's rows per broker,
    settings and run facts."""
    params = state.params
    attention = attention_counts(pending, params)
    queues = state.queues.join(attention, QUEUE_KEY, how="left")
    queues = queues.join(settled_discard_counts(state.broker), QUEUE_KEY, how="left")
    history_counts, history_rows = _history_rows(extras.discard_history)
    if history_counts is not None:
        queues = queues.join(history_counts, "broker", how="left")
    return queues.select(
        *QUEUE_KEY,
        "h0",
        "h1",
        held("h_safe"),
        "p0",
        "p1",
        held("p_safe"),
        *CLASSES,
        "bad_records",
        history_rows,
        *[
            F.coalesce(F.col(name), F.lit(0)).alias(name)
            for name in ("discard_next_round", "past_last_check")
        ],
        "warnings",
        *_settings_columns(params),
        *_fact_columns(extras.facts),
        "offset_hold",
        # Null for a queue the broker's walk does not reach (the round has no start for it).
        "settled_discards",
        *_run_columns(params),
    )


def _run_anomalies(state: RoundState, summary: DataFrame, extras: RunExtras) -> DataFrame:
    """Every anomaly of the run, with its columns: what may make the picture wrong (listed
    first, and --fail-on covers it), the round's rules, discards without a check and
    offsets stalled across runs."""
    params = state.params
    parts = [picture_anomalies(summary), *_round_findings(state), settled_discards(summary)]
    if extras.discard_findings is not None:
        parts.append(extras.discard_findings)
    if extras.earlier_offsets is not None:
        parts.append(stalled_offset(summary, extras.earlier_offsets, params))
    found = parts[0].select(*ANOMALY.fieldNames())
    for part in parts[1:]:
        found = found.unionByName(part.select(*ANOMALY.fieldNames()))
    return with_run_columns(found, params)


def _round_findings(state: RoundState) -> list[DataFrame]:
    """The anomaly rules over the round's evidence (``transforms.anomalies``)."""
    if state.evidence is None:
        return []
    m = state.materialize
    # The per-queue rows are local already (the job's warnings were added to them there).
    evidence = narrowed(windowed(state.evidence, state.queues, m.attach), m.kept)
    return [round_anomalies(evidence, state.pending, state.params)]


def _bad_records(state: RoundState, extras: RunExtras) -> DataFrame:
    """The round's bad records and the discard read's, with the run's columns."""
    bad = state.bad_records.select(*BAD_RECORD.fieldNames())
    if extras.discard_bad_records is not None:
        bad = bad.unionByName(extras.discard_bad_records.select(*BAD_RECORD.fieldNames()))
    return bad.select(*bad.columns, *_run_columns(state.params))


def _status_rows(state: RoundState, pending: DataFrame, extras: RunExtras) -> list[DataFrame]:
    """check_requests and discards: the half rows of the broker's checks and discards;
    pending: the half rows of every unresolved record, with its status."""
    params = state.params
    run = _run_columns(params)
    discard_reason = F.when(F.col("status") == DISCARD_CHECK_MAX, REASON_CHECK_MAX).otherwise(
        REASON_EXPIRED
    )
    # The broker's walk knows whether a check's copy is discarded in the same round.
    reached = F.col("copy_discarded")
    check_requests = _half_rows(
        broker_action_rows(state.broker, (CHECK,)), params, [*broker_view_columns(), *run], reached
    )
    discards = _half_rows(
        broker_action_rows(state.broker, (DISCARD_CHECK_MAX, DISCARD_EXPIRED)),
        params,
        [discard_reason.alias("reason"), *broker_view_columns(), *run],
        reached,
    )
    # New to this run, unless an earlier run saw them (transforms.pending_history).
    since = first_seen_now(params.run_id, params.as_of_ms)
    pending_rows = _half_rows(pending, params, [F.col("status"), *since, *run])
    if extras.earlier_pending is not None:
        pending_rows = carry_pending_since(pending_rows, extras.earlier_pending)
    return [check_requests, discards, pending_rows]


def shape_tables(state: RoundState, extras: RunExtras = RunExtras()) -> RoundOutputs:
    """Every output table (spec section 6) from a classified round and ``extras``."""
    m = state.materialize
    pending = with_queue_round_facts(state.pending, state.queues, m.attach)
    check_requests, discards, pending_rows = _status_rows(state, pending, extras)
    summary = _summary_rows(state, pending, extras)
    # Held: the table and run_summary's counts both read them.
    anomalies = m.kept(_run_anomalies(state, summary, extras))
    history = extras.discard_history
    if history is None:
        history = state.pending.sparkSession.createDataFrame([], DISCARD_HISTORY)
    return RoundOutputs(
        check_requests=check_requests,
        discards=discards,
        pending=pending_rows,
        consume_offsets=_consume_offsets(state.queues, state.params, state.broker),
        run_summary=with_anomaly_counts(summary, anomalies),
        bad_records=_bad_records(state, extras),
        anomalies=anomalies,
        discard_history=history,
        release=state.materialize.release,
    )


def reconcile(
    messages: DataFrame,
    committed_offsets: DataFrame,
    params: RoundParams,
    bad_input: DataFrame | None = None,
    notes: DataFrame | None = None,
    *,
    materialize: Materializer,
) -> RoundOutputs:
    """Run one round over decoded half and op records of any number of brokers, and shape
    its tables (no discard history, no earlier runs, no run facts).

    Args:
        messages: readable records (``schemas.messages.SOURCED_MESSAGE``) of the half and
            op topics, any store time; duplicates allowed (section 7 settles them).
        committed_offsets: ``schemas.messages.COMMITTED_OFFSET`` rows from the offsets files.
        params: as-of time, run id and broker configuration.
        bad_input: ``schemas.outputs.BAD_RECORD`` rows the readers already produced.
        notes: reader warnings for ``run_summary.warnings`` (``NOTE`` schema).
        materialize: see ``classify_round``.
    """
    state = classify_round(
        messages, committed_offsets, params, bad_input, notes, materialize=materialize
    )
    return shape_tables(state)
