"""One run of the job, phase by phase: read (``jobs.extract``) -> resolve and classify
(``transforms.round``, plus the job's warnings of a picture that may be wrong) -> write
(``jobs.output``). The command line (``jobs.cli``) calls ``run``; the notebook functions
(``jobs.notebook``) call ``run_round``.

Each phase labels its Spark jobs (``PHASE_PREFIX``): the Spark UI and the event log show
them, and ``bench/`` reads stage times per phase from it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame, SparkSession

from connectors.errors import InputError
from connectors.rocketmq.reader import parse_store_arg
from jobs import interrupt
from jobs.anomalies import EXIT_ANOMALIES
from jobs.config import JobConfig
from jobs.discards import DiscardHistory, build_discard_history, discard_inputs, summary_lines
from jobs.extract import (
    AsOfChoice,
    Inputs,
    derive_run_id,
    read_segment_inputs,
    read_store_inputs,
    resolve_as_of,
)
from jobs.materialize import SparkMaterializer
from jobs.output import (
    AfterCommit,
    Progress,
    bad_records_line,
    format_summary,
    run_facts,
    write_offset_fragments,
    write_outputs,
)
from jobs.progress import (
    ProgressLines,
    phase_started,
    planned_read,
    spark_tasks,
    stop_heartbeat,
    write_stderr,
)
from jobs.session import build_session, probe_workers
from schemas.outputs import CLASSES, RESOLVED
from transforms.offsets import with_missing_offset_warnings
from transforms.params import RoundParams
from transforms.picture import with_run_warnings
from transforms.round import RoundState, classify_round, shape_outputs
from transforms.staleness import (
    broker_newest,
    newest_records,
    stale_after_ms,
    with_stale_store_warning,
)

EXIT_OK = 0
PHASE_PREFIX = "rmq-txn-reconcile: "


class StrictModeError(RuntimeError):
    """--strict and the input has bad records."""


@dataclass(frozen=True)
class JobRequest:
    """What one command-line run reads and where it writes; the round's settings are in
    ``JobConfig``. Exactly one of ``stores`` and the segment fields (``half``, ``op``,
    ``fmt``, ``broker``, optional ``offsets``) is given (``jobs.cli.validate_arguments``)."""

    output: str
    as_of: int | str  # epoch ms, ``now``, ``latest`` or ``auto`` (``jobs.extract.parse_as_of``)
    stores: tuple[str, ...] = ()
    half: str | None = None
    op: str | None = None
    fmt: str | None = None
    broker: str | None = None
    offsets: str | None = None
    discards: str | None = None  # exported TRANS_CHECK_MAX_TIME_TOPIC records (segments only)
    run_id: str | None = None
    verbose: bool = False
    # What ``auto`` chose and why (``jobs.extract.settle_as_of``; ``as_of`` is then its
    # mode); None when T was given explicitly.
    as_of_choice: AsOfChoice | None = None


# -- the round of one run ------------------------------------------------------------------


def round_params(config: JobConfig, as_of_ms: int, run_id: str) -> RoundParams:
    """The round's parameters from the job's settings, T and the run id."""
    return RoundParams(
        as_of_ms=as_of_ms,
        run_id=run_id,
        check_max=config.check_max,
        transaction_timeout_ms=config.transaction_timeout_ms,
        file_reserved_hours=config.file_reserved_hours,
        include_body=config.include_body,
        broker_version=config.broker_version,
        check_interval_ms=config.check_interval_ms,
        slow_producer_percent=config.slow_producer_percent,
        slow_producer_min_transactions=config.slow_producer_min_transactions,
        op_backlog_records=config.op_backlog_records,
        stalled_offset_runs=config.stalled_offset_runs,
    )


def run_round(
    inputs: Inputs,
    config: JobConfig,
    as_of: int | str,
    run_id: str | None,
    choice: AsOfChoice | None = None,
) -> RoundState:
    """The round over what was read, with the job's warnings (``with_picture_warnings``;
    ``choice``: how ``--as-of auto`` chose T, a warning when the store looks copied)."""
    as_of_ms = resolve_as_of(as_of, inputs.messages)
    run_id = run_id or derive_run_id(inputs.identity, as_of_ms, config)
    state = classify_round(
        inputs.messages,
        inputs.committed_offsets,
        round_params(config, as_of_ms, run_id),
        bad_input=inputs.bad_records,
        notes=inputs.notes,
        materialize=SparkMaterializer(),  # the job's one decision on caching and collecting
    )
    run_warnings = [choice.line] if choice is not None and choice.warns else []
    return with_picture_warnings(state, inputs, config, run_warnings)


def with_picture_warnings(
    state: RoundState, inputs: Inputs, config: JobConfig, run_warnings: Sequence[str] = ()
) -> RoundState:
    """The round's state with the warnings of a picture that may be wrong added to
    ``run_summary.warnings`` (spec section 1): a committed offset missing (naming the
    offsets file used), a broker's newest record too old for a live broker, and
    ``run_warnings`` (about the whole run, e.g. a T chosen because a store looks copied)
    on every queue the round has offsets for."""
    as_of_ms = state.params.as_of_ms
    limit = stale_after_ms(config.check_interval_ms, config.transaction_timeout_ms)
    queues = state.materialize.per_queue(
        with_missing_offset_warnings(state.queues, inputs.offsets_files)
    )
    # Local rows, one per queue: their brokers' newest records are read without a job.
    newest = broker_newest(queues.select("broker", "newest_ms").collect())  # one row per queue
    warned = with_stale_store_warning(
        queues, as_of_ms, limit, state.params.reserved_ms, newest
    ).transform(with_run_warnings, run_warnings)
    # A projection of local rows: Spark folds it into them in every plan that reads it
    # (bringing it to the driver again would be a job of its own).
    return replace(state, queues=warned)


def refuse_far_past_store(messages: DataFrame, as_of_ms: int, config: JobConfig) -> None:
    """--strict: T beyond a broker's newest half/op record by more than the retention
    (``file_reserved_hours``) would make every transaction of it expired: refuse (exit 2)."""
    limit = config.file_reserved_hours * 3_600_000
    for row in newest_records(messages, as_of_ms).orderBy("broker").collect():  # per broker
        if row["newest_ms"] is not None and as_of_ms - row["newest_ms"] > limit:
            raise InputError(
                f"broker {row['broker']}: T={as_of_ms} is {as_of_ms - row['newest_ms']} ms after"
                f" its newest half/op record, more than the retention ({config.file_reserved_hours}"
                " h) and --strict is set: the store looks copied; use --as-of latest or the"
                " instant the store was copied"
            )


def round_totals(queues: DataFrame) -> tuple[int, int]:
    """(bad records, unresolved records from h0) summed over a round's per-queue rows."""
    unresolved = [name for name in CLASSES if name != RESOLVED]
    rows = queues.select("bad_records", *unresolved).collect()  # one row per queue
    return (
        sum(row["bad_records"] for row in rows),
        sum(row[name] for row in rows for name in unresolved),
    )


# -- the command line's run, phase by phase -------------------------------------------------


def _phase(spark: SparkSession, name: str) -> None:
    """Label the Spark jobs that follow (Spark UI, event log; ``bench/`` reads stage times
    per phase from it)."""
    spark.sparkContext.setJobDescription(PHASE_PREFIX + name)
    phase_started(name)  # the heartbeat's label


def progress_printer(started: float) -> ProgressLines:
    """Progress lines on stderr (under spark-submit too), each with the seconds since
    ``started``; ``start`` adds the heartbeat of a long phase (``jobs.progress``)."""
    return ProgressLines(started)


def start_session(
    request: JobRequest, config: JobConfig, spark: SparkSession | None
) -> SparkSession:
    """The caller's session, or a new one configured for the job; then the checks that
    need one: the Python workers can run the job, the writer asked for is there."""
    from connectors.delta import choose_writer

    if spark is None:
        under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit decides the master
        spark = build_session(
            master=None if under_submit else config.master,
            shuffle_partitions=config.shuffle_partitions,
            driver_memory=config.driver_memory,
            verbose=request.verbose,
            delta=config.writer == "delta-spark",  # Delta's extension (jars via the Ivy cache)
        )
        interrupt.reclaim()  # the new SparkContext put PySpark's SIGINT handler in place
    probe_workers(spark)
    choose_writer(spark, config.writer)  # --writer delta-spark without Delta: exit 2 now
    return spark


def read_phase(
    spark: SparkSession, request: JobRequest, config: JobConfig, progress: Progress
) -> Inputs:
    """Read the stores or the segments once (cached) and count the records read."""
    if request.stores:
        inputs = read_store_inputs(spark, request.stores, config)
    else:
        assert request.half and request.op and request.fmt and request.broker  # validated
        inputs = read_segment_inputs(
            spark, request.half, request.op, request.fmt, request.broker, request.offsets
        )
    inputs = inputs.persist()
    _phase(spark, "decode")
    records = inputs.messages.count()
    progress(f"read {records} half/op records from {len(inputs.identity)} input(s)")
    return inputs


def round_phase(
    spark: SparkSession,
    inputs: Inputs,
    request: JobRequest,
    config: JobConfig,
    progress: Progress,
) -> tuple[RoundState, int]:
    """Resolve and classify (cached); (the round's state, its bad records). ``--strict``
    refuses a store far older than T and fails on any bad record."""
    as_of = resolve_as_of(request.as_of, inputs.messages)
    if config.strict:
        refuse_far_past_store(inputs.messages, as_of, config)
    _phase(spark, "resolve and classify")
    state = run_round(inputs, config, as_of, request.run_id, request.as_of_choice).persist()
    # Both totals from the per-queue rows the round already brought to the driver: every
    # bad record and every unresolved record from h0 is counted in one queue's row, so no
    # Spark job counts them again.
    bad, pending = round_totals(state.queues)
    progress(
        f"resolved and classified: {pending} unresolved half records from h0, {bad} bad records"
    )
    if config.strict and bad:
        first = state.bad_records.orderBy("broker", "source", "position").first()
        assert first is not None  # bad > 0
        raise StrictModeError(
            f"{bad} bad record(s) and --strict is set; first: {first['reason']} at {first['source']}:{first['position']}"
        )
    return state, bad


def discard_phase(
    spark: SparkSession,
    inputs: Inputs,
    state: RoundState,
    request: JobRequest,
    config: JobConfig,
    progress: Progress,
) -> DiscardHistory:
    """The discard history (``jobs.discards``): a small read of its own beside the round;
    ``--strict`` fails on a bad discard record too."""
    _phase(spark, "discard history")
    history = build_discard_history(spark, request, config, state)
    progress(
        f"discard history: {sum(history.counts.values())} discard records, {history.bad_count} bad"
    )
    if config.strict and history.bad_count:
        first = history.bad_records.orderBy("broker", "source", "position").first()
        assert first is not None  # bad_count > 0
        raise StrictModeError(
            f"{history.bad_count} bad discard record(s) and --strict is set; first:"
            f" {first['reason']} at {first['source']}:{first['position']}"
        )
    return history


def write_phase(
    spark: SparkSession,
    state: RoundState,
    identity: Sequence[str],
    request: JobRequest,
    config: JobConfig,
    started: float,
    progress: Progress,
    after_commit: AfterCommit | None = None,
    discards: DiscardHistory | None = None,
) -> int:
    """Write the tables (offsets last) and the offset fragments; print the summary. Returns
    how many anomalies are as severe as ``--fail-on`` or worse (0 without it)."""
    from connectors.delta import open_output
    from jobs.anomalies import anomaly_counts, failing, with_stalled_offsets
    from jobs.history import with_pending_history  # deltalake: driver only

    params = state.params
    _phase(spark, "history and anomalies")
    outputs = with_pending_history(spark, shape_outputs(state), request.output, params)
    if discards is not None:
        outputs = discards.apply(outputs, params)
    outputs = with_stalled_offsets(spark, outputs, request.output, params)
    _phase(spark, "write")
    # The per-queue tables are written, then printed: brought to the driver once (the
    # summary's second read re-ran its aggregate over the unresolved records).
    per_queue = state.materialize.per_queue
    outputs = replace(
        outputs,
        run_summary=per_queue(outputs.run_summary),
        consume_offsets=per_queue(outputs.consume_offsets),
    )
    facts = run_facts(open_output(spark, request.output), identity)
    write_outputs(
        spark,
        outputs,
        params.run_id,
        request.output,
        config.include_body,
        started,
        progress,
        facts,
        writer_choice=config.writer,
        catalog_schema=config.catalog_schema,
        after_commit=after_commit,
    )
    # One row per queue and topic; local rows (no Spark job).
    offset_rows = [row.asDict() for row in outputs.consume_offsets.collect()]  # per queue
    stores = {spec.broker: spec.root for spec in map(parse_store_arg, request.stores)}
    write_offset_fragments(offset_rows, request.output, params.run_id, stores)
    summary_rows = [
        {**row.asDict(), **facts} for row in outputs.run_summary.collect()
    ]  # one row per queue
    counts = anomaly_counts(outputs)
    stop_heartbeat(progress)  # nothing of it after the summary
    print(
        format_summary(
            summary_rows,
            request.output,
            params.run_id,
            params.as_of_ms,
            offset_rows,
            counts,
            run_notes=_choice_note(request.as_of_choice),
        )
    )
    if discards is not None:
        print("\n".join(summary_lines(discards, request.output)))
    return failing(counts, config.fail_on)


def _choice_note(choice: AsOfChoice | None) -> list[str]:
    """How ``--as-of auto`` chose T, for the summary's first lines; a choice that warns is
    among every queue's warnings already."""
    return [choice.line] if choice is not None and not choice.warns else []


def run(
    request: JobRequest,
    config: JobConfig,
    spark: SparkSession | None = None,
    started: float | None = None,
    after_commit: AfterCommit | None = None,
) -> int:
    """One command-line run (arguments validated by ``jobs.cli``); returns the exit code.
    ``after_commit``: see ``jobs.output.write_outputs``."""
    started = time.time() if started is None else started
    progress = progress_printer(started)
    if request.as_of_choice is not None:
        progress(request.as_of_choice.line)
    progress.planned = planned_read(request.stores) if request.stores else None
    if progress.planned is not None:
        progress(progress.planned.line())
    spark = start_session(request, config, spark)
    progress.start(spark_tasks(spark))
    try:
        return _run_phases(spark, request, config, started, progress, after_commit)
    finally:
        progress.stop()


def _run_phases(
    spark: SparkSession,
    request: JobRequest,
    config: JobConfig,
    started: float,
    progress: Progress,
    after_commit: AfterCommit | None,
) -> int:
    """``run``'s phases in a started session; returns the exit code."""
    # Released on failure too: a notebook or a test session runs the job again, and every
    # cached plan left behind slows and fills the driver.
    with ExitStack() as cached:
        inputs = read_phase(spark, request, config, progress)
        cached.callback(inputs.unpersist)
        state, bad = round_phase(spark, inputs, request, config, progress)
        cached.callback(state.unpersist)
        discards = discard_phase(spark, inputs, state, request, config, progress)
        cached.callback(discards.release)
        identity = [*inputs.identity, *discard_inputs(request)]
        severe = write_phase(
            spark, state, identity, request, config, started, progress, after_commit, discards
        )
        bad += discards.bad_count
        if bad:
            print(bad_records_line(bad, request.output, state.params.run_id))
    spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]  # clears the label
    progress("done")
    if severe:
        # Everything is written: the exit code only tells a scheduler to alert.
        write_stderr(
            f"fail-on: {severe} anomalies of severity {config.fail_on} or worse (everything is"
            f" written): rows in {request.output}/anomalies (run_id {state.params.run_id});"
            f" exit {EXIT_ANOMALIES}"
        )
        return EXIT_ANOMALIES
    return EXIT_OK
