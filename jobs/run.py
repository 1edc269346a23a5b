"""One command-line run of the job's pipeline (``jobs.pipeline``), phase by phase: read
(``jobs.extract``) -> resolve and classify -> discard history and earlier runs -> write
(``jobs.output``) and print the summary. ``jobs.cli`` calls ``run``; the notebook functions
(``jobs.notebook``) run the same pipeline.

Each phase labels its Spark jobs (``PHASE_PREFIX``): the Spark UI and the event log show
them, and ``bench/`` reads stage times per phase from it.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from connectors.errors import InputError
from connectors.mirror import MirrorRequest, mirror_root
from connectors.rocketmq.reader import StorePlan, parse_store_arg
from jobs import interrupt
from jobs.anomalies import EXIT_ANOMALIES, anomaly_counts, failing
from jobs.config import JobConfig
from jobs.discards import discard_source, summary_lines
from jobs.extract import (
    AsOfChoice,
    Inputs,
    latest_round,
    read_segment_inputs,
    read_store_inputs,
    resolve_as_of,
)
from jobs.materialize import SMALL_READ_PARTITIONS, wants_adaptive
from jobs.output import (
    AfterCommit,
    Progress,
    Written,
    bad_records_line,
    format_summary,
    write_offset_fragments,
    write_tables,
)
from jobs.pipeline import Reconciled, queues_newest, run_round, with_discards_and_history
from jobs.progress import (
    ProgressLines,
    phase_started,
    planned_read,
    spark_tasks,
    stop_heartbeat,
    write_stderr,
)
from jobs.session import (
    build_session,
    clear_phase_label,
    label_phase,
    own_connect_session,
    probe_workers,
)
from schemas.outputs import BAD_RECORDS_TABLE, CLASSES, RESOLVED
from transforms.round import RoundState

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
    rebuild: bool = False  # read every store whole again into the mirror (implies it)
    # What ``auto`` chose and why (``jobs.extract.settle_as_of``; ``as_of`` is then its
    # mode); None when T was given explicitly.
    as_of_choice: AsOfChoice | None = None


def refuse_far_past_store(queues: DataFrame, as_of_ms: int, config: JobConfig) -> None:
    """--strict: T beyond a broker's newest half/op record by more than the retention
    (``file_reserved_hours``) would make every transaction of it expired: refuse (exit 2).
    ``queues``: the round's per-queue rows, already on the driver; their ``newest_ms`` is
    the stale-store warning's, so the check runs no Spark job."""
    limit = config.file_reserved_hours * 3_600_000
    for broker, newest_ms in sorted(queues_newest(queues).items()):
        if as_of_ms - newest_ms > limit:
            raise InputError(
                f"broker {broker}: T={as_of_ms} is {as_of_ms - newest_ms} ms after its newest"
                f" half/op record, more than the retention ({config.file_reserved_hours} h)"
                " and --strict is set: the store looks copied; use --as-of latest or the"
                " instant the store was copied"
            )


def round_totals(queues: DataFrame) -> tuple[int, int, int]:
    """(half/op records read, bad records, unresolved records from h0) summed over a
    round's per-queue rows."""
    unresolved = [name for name in CLASSES if name != RESOLVED]
    rows = queues.select("records_read", "bad_records", *unresolved).collect()  # per queue
    return (
        sum(row["records_read"] for row in rows),
        sum(row["bad_records"] for row in rows),
        sum(row[name] for row in rows for name in unresolved),
    )


# -- the command line's run, phase by phase -------------------------------------------------


def _phase(spark: SparkSession, name: str) -> None:
    """Label the Spark jobs that follow (Spark UI, event log; ``bench/`` reads stage times
    per phase from it)."""
    label_phase(spark, PHASE_PREFIX + name)
    phase_started(name)  # the heartbeat's label


def progress_printer(started: float) -> ProgressLines:
    """Progress lines on stderr (under spark-submit too), each with the seconds since
    ``started``; ``start`` adds the heartbeat of a long phase (``jobs.progress``)."""
    return ProgressLines(started)


def session_shape(config: JobConfig, planned_records: int | None) -> tuple[bool, int]:
    """(adaptive execution, shuffle partitions) of the job's own session for a read of
    ``planned_records`` (``jobs.materialize.wants_adaptive``)."""
    if wants_adaptive(planned_records):
        return True, config.shuffle_partitions
    return False, SMALL_READ_PARTITIONS


def start_session(
    request: JobRequest,
    config: JobConfig,
    spark: SparkSession | None,
    planned_records: int | None = None,
) -> SparkSession:
    """The caller's session, or a new one configured for the job (adaptive execution only
    for a large read: ``jobs.materialize.wants_adaptive``); then the checks that need one:
    the Python workers can run the job, the writer asked for is there."""
    from connectors.delta import choose_writer

    adaptive, partitions = session_shape(config, planned_records)
    if spark is None:
        under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit decides the master
        spark = build_session(
            master=None if under_submit else config.master,
            shuffle_partitions=partitions,
            driver_memory=config.driver_memory,
            verbose=request.verbose,
            delta=config.writer == "delta-spark",  # Delta's extension (jars via the Ivy cache)
            adaptive=adaptive,
        )
        interrupt.reclaim()  # the new SparkContext put PySpark's SIGINT handler in place
    probe_workers(spark)
    choose_writer(spark, config.writer)  # --writer delta-spark without Delta: exit 2 now
    return spark


def mirror_request(request: JobRequest, config: JobConfig) -> MirrorRequest | None:
    """Whether the run reads its stores through the mirror (``--mirror``, ``--rebuild``),
    and where it is: under a local output root (InputError for another, exit 2)."""
    if not request.stores or not (config.mirror or request.rebuild):
        return None
    return MirrorRequest(mirror_root(request.output), request.rebuild)


def read_phase(
    spark: SparkSession,
    request: JobRequest,
    config: JobConfig,
    plan: StorePlan | None = None,
    progress: Progress | None = None,
) -> Inputs:
    """Plan the read of the stores (or use ``plan``, made for the progress line) or the
    segments; their records are decoded once, by the round's first query, and cached for
    the rest of the run. Through the mirror, its new records are decoded into it first."""
    _phase(spark, "decode")
    if request.stores:
        inputs = read_store_inputs(
            spark, request.stores, config, plan, mirror_request(request, config)
        )
        for line in inputs.mirror_lines:
            (progress or write_stderr)(line)
        return inputs
    assert request.half and request.op and request.fmt and request.broker  # validated
    inputs = read_segment_inputs(
        spark, request.half, request.op, request.fmt, request.broker, request.offsets
    )
    return inputs.persist()


def round_phase(
    spark: SparkSession,
    inputs: Inputs,
    request: JobRequest,
    config: JobConfig,
    progress: Progress,
) -> RoundState:
    """Resolve and classify. ``--strict`` refuses a store far older than T and fails on any
    bad record."""
    # T = latest and the round's start offsets from one aggregate, where the read allows.
    latest = latest_round(inputs, request.as_of)
    as_of = latest.as_of_ms if latest else resolve_as_of(request.as_of, inputs.messages)
    _phase(spark, "resolve and classify")
    bounds = latest.bounds if latest else None
    state = run_round(inputs, config, as_of, request.run_id, request.as_of_choice, bounds)
    if config.strict:  # before any output is written
        refuse_far_past_store(state.queues, as_of, config)
    # The totals from the per-queue rows the round already brought to the driver: every
    # record read, bad record and unresolved record from h0 is counted in one queue's row,
    # so no Spark job counts them again.
    records, bad, pending = round_totals(state.queues)
    progress(f"read {records} half/op records from {len(inputs.identity)} input(s)")
    progress(
        f"resolved and classified: {pending} unresolved half records from h0, {bad} bad records"
    )
    if config.strict and bad:
        _fail_strict(bad, "bad record(s)", state.bad_records)
    return state


def _fail_strict(count: int | None, what: str, bad: DataFrame) -> None:
    """--strict and bad records (``count``, None: some): fail naming the first."""
    first = bad.orderBy("broker", "source", "position").first()  # --strict only: one row
    if first is None:
        return
    how_many = f"{count} {what}" if count is not None else what
    raise StrictModeError(
        f"{how_many} and --strict is set; first: {first['reason']} at"
        f" {first['source']}:{first['position']}"
    )


def discard_phase(
    spark: SparkSession,
    inputs: Inputs,
    state: RoundState,
    request: JobRequest,
    config: JobConfig,
    progress: Progress | None = None,
) -> Reconciled:
    """The discard history (a small read of its own beside the round) and what the output
    root's earlier runs carry over; ``--strict`` fails on a bad discard record too."""
    _phase(spark, "discard history")
    source = discard_source(
        request.stores,
        request.discards,
        request.fmt,
        request.broker,
        mirror_request(request, config),
    )
    reconciled = with_discards_and_history(spark, inputs, state, config, source, request.output)
    for line in reconciled.mirror_lines:
        (progress or write_stderr)(line)
    if config.strict:
        bad = reconciled.extras.discard_bad_records
        assert bad is not None  # the pipeline always reads the discard records
        _fail_strict(None, "bad discard record(s)", bad)
    return reconciled


def write_phase(
    spark: SparkSession,
    reconciled: Reconciled,
    request: JobRequest,
    config: JobConfig,
    started: float,
    progress: Progress,
    after_commit: AfterCommit | None = None,
) -> tuple[Written, int]:
    """Write the tables (offsets last) and the offset fragments; print the summary from the
    small tables written. Returns what was written and how many anomalies are as severe as
    ``--fail-on`` or worse (0 without it)."""
    _phase(spark, "write")
    written = write_tables(
        spark, reconciled, request.output, config, started, progress, after_commit
    )
    params = reconciled.params
    stores = {spec.broker: spec.root for spec in map(parse_store_arg, request.stores)}
    write_offset_fragments(written.consume_offsets, request.output, params.run_id, stores)
    counts = anomaly_counts(written.kinds)
    stop_heartbeat(progress)  # nothing of it after the summary
    print(
        format_summary(
            written.run_summary,
            request.output,
            params.run_id,
            params.as_of_ms,
            written.consume_offsets,
            counts,
            run_notes=_choice_note(request.as_of_choice),
        )
    )
    print("\n".join(summary_lines(written.outcomes, reconciled.notes, request.output)))
    return written, failing(counts, config.fail_on)


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
    remote: str = "",
) -> int:
    """One command-line run (arguments validated by ``jobs.cli``); returns the exit code.
    ``after_commit``: see ``jobs.output.write_tables``. ``remote``: a Spark Connect
    server to run on in a session of the run's own (``spark`` None)."""
    started = time.time() if started is None else started
    progress = progress_printer(started)
    if request.as_of_choice is not None:
        progress(request.as_of_choice.line)
    progress.planned = planned_read(request.stores) if request.stores else None
    if progress.planned is not None:
        progress(progress.planned.line())
    planned = progress.planned.entries if progress.planned is not None else None
    plan = progress.planned.plan if progress.planned is not None else None  # read it, not again
    with contextlib.ExitStack() as own:
        if spark is None and remote:
            adaptive, partitions = session_shape(config, planned)
            spark = own.enter_context(
                own_connect_session(remote, partitions, request.verbose, adaptive)
            )
        spark = start_session(request, config, spark, planned)
        progress.start(spark_tasks(spark))
        try:
            return _run_phases(spark, request, config, started, progress, after_commit, plan)
        finally:
            progress.stop()


def _run_phases(
    spark: SparkSession,
    request: JobRequest,
    config: JobConfig,
    started: float,
    progress: Progress,
    after_commit: AfterCommit | None,
    plan: StorePlan | None = None,
) -> int:
    """``run``'s phases in a started session; returns the exit code."""
    # Released on failure too: a notebook or a test session runs the job again, and every
    # cached frame left behind fills the executors.
    with contextlib.ExitStack() as cached:
        inputs = read_phase(spark, request, config, plan, progress)
        cached.callback(inputs.unpersist)
        state = round_phase(spark, inputs, request, config, progress)
        cached.callback(state.materialize.release)
        reconciled = discard_phase(spark, inputs, state, request, config, progress)
        cached.callback(reconciled.history_release)
        written, severe = write_phase(
            spark, reconciled, request, config, started, progress, after_commit
        )
        bad = written.counts[BAD_RECORDS_TABLE]
        if bad:
            print(bad_records_line(bad, request.output, reconciled.params.run_id))
    clear_phase_label(spark)
    progress("done")
    if severe:
        # Everything is written: the exit code only tells a scheduler to alert.
        write_stderr(
            f"fail-on: {severe} anomalies of severity {config.fail_on} or worse (everything is"
            f" written): rows in {request.output}/anomalies (run_id {reconciled.params.run_id});"
            f" exit {EXIT_ANOMALIES}"
        )
        return EXIT_ANOMALIES
    return EXIT_OK
