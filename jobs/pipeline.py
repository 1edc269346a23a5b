"""The job's one pipeline, which the command line (``jobs.run``), the notebook functions
(``jobs.notebook``) and the Airflow task (through the command line) all run: read
(``jobs.extract``) -> round (``transforms.round``, with the job's warnings of a picture that
may be wrong) -> discard history (``jobs.discards``) -> earlier runs of the output root
(``jobs.history``, ``jobs.anomalies``) -> every table shaped by
``transforms.outputs.shape_tables`` -> written (``jobs.output``).

``jobs/`` only reads, decides what is materialised and writes: each table is shaped once,
in ``transforms.outputs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame, SparkSession

from connectors.rocketmq.discards import DiscardSource
from jobs.anomalies import earlier_offsets_frame
from jobs.config import JobConfig
from jobs.discards import Views, build_discard_history, discard_inputs
from jobs.extract import AsOfChoice, Inputs, derive_run_id, resolve_as_of
from jobs.history import decided_view, earlier_discard_history, earlier_pending
from jobs.materialize import SparkMaterializer
from schemas.decided_view import DecidedView
from transforms.offsets import with_missing_offset_warnings
from transforms.outputs import RoundOutputs, RunExtras, RunFacts, shape_tables
from transforms.params import RoundParams
from transforms.picture import with_run_warnings
from transforms.round import RoundState, classify_round
from transforms.staleness import broker_newest, stale_after_ms, with_stale_store_warning


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
    bounds: DataFrame | None = None,
) -> RoundState:
    """The round over what was read, with the job's warnings (``with_picture_warnings``;
    ``choice``: how ``--as-of auto`` chose T, a warning when the store looks copied;
    ``bounds``: the round's per-queue bounds at T, read with it, ``latest_round``)."""
    as_of_ms = resolve_as_of(as_of, inputs.messages)
    run_id = run_id or derive_run_id(inputs.identity, as_of_ms, config)
    state = classify_round(
        inputs.messages,
        inputs.committed_offsets,
        round_params(config, as_of_ms, run_id),
        bad_input=inputs.bad_records,
        notes=inputs.notes,
        # The job's one decision on caching, collecting and broadcasting.
        materialize=SparkMaterializer.for_session(inputs.messages.sparkSession),
        offsets_unique=inputs.offsets_unique,
        bounds=bounds,
    )
    run_warnings = [choice.line] if choice is not None and choice.warns else []
    return with_picture_warnings(state, inputs, config, run_warnings)


def queues_newest(queues: DataFrame) -> dict[str, int]:
    """Per broker, the newest record before T of its queues (``broker_newest``), read from
    the round's per-queue rows: local rows, so no Spark job (the stale-store warning and
    ``--strict`` judge a broker by it)."""
    return broker_newest(queues.select("broker", "newest_ms").collect())  # one row per queue


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
    newest = queues_newest(queues)
    warned = with_stale_store_warning(
        queues, as_of_ms, limit, state.params.reserved_ms, newest
    ).transform(with_run_warnings, run_warnings)
    # A projection of local rows: Spark folds it into them in every plan that reads it.
    return replace(state, queues=warned)


@dataclass(frozen=True)
class Reconciled:
    """A run's round and what was read beside it, ready to be shaped into tables
    (``tables``) once the run's facts are known; ``release`` frees every cache."""

    state: RoundState
    extras: RunExtras
    notes: list[str]  # the discard read's notes, for the summary
    identity: list[str]  # every input, as run_summary's ``inputs`` names them
    history_release: Callable[[], None]  # frees what the discard history cached
    inputs_release: Callable[[], None]  # frees what the read cached
    mirror_lines: tuple[str, ...] = ()  # what the discard topic's read through its mirror says
    view: DecidedView | None = None  # what the discard history was decided against (mirror)

    def release(self) -> None:
        """Free every cache of the run, the latest first (Spark re-plans every cached
        frame built on one it drops)."""
        self.history_release()
        self.state.materialize.release()
        self.inputs_release()

    @property
    def params(self) -> RoundParams:
        return self.state.params

    def tables(self, facts: RunFacts | None = None) -> RoundOutputs:
        """Every output table (``transforms.outputs.shape_tables``); ``facts``: the run's
        (default: none, nothing written: the columns a write fills stay null)."""
        facts = facts or RunFacts()
        outputs = shape_tables(self.state, replace(self.extras, facts=facts))
        return replace(outputs, release=self.release)


def reconcile_inputs(
    spark: SparkSession,
    inputs: Inputs,
    config: JobConfig,
    as_of: int | str,
    discards: DiscardSource,
    *,
    run_id: str | None = None,
    choice: AsOfChoice | None = None,
    output_root: str | None = None,
) -> Reconciled:
    """The pipeline up to the tables: the round over ``inputs``, the discard history from
    ``discards``, and what the earlier runs of ``output_root`` (if any) carry over."""
    state = run_round(inputs, config, as_of, run_id, choice)
    return with_discards_and_history(spark, inputs, state, config, discards, output_root)


def with_discards_and_history(
    spark: SparkSession,
    inputs: Inputs,
    state: RoundState,
    config: JobConfig,
    discards: DiscardSource,
    output_root: str | None,
) -> Reconciled:
    """``state`` with the discard history and the earlier runs of ``output_root``."""
    earlier = earlier_discard_history(spark, output_root) if output_root is not None else None
    views = _views(inputs, discards, output_root)
    history = build_discard_history(spark, discards, config, state, earlier, views)
    params = state.params
    extras = RunExtras(
        discard_history=history.history,
        discard_findings=history.unchecked,
        discard_bad_records=history.bad_records,
    )
    if output_root is not None:
        extras = replace(
            extras,
            earlier_pending=earlier_pending(spark, output_root, params.run_id, params.as_of_ms),
            earlier_offsets=earlier_offsets_frame(spark, output_root, params),
        )

    identity = [*inputs.identity, *discard_inputs(discards)]
    return Reconciled(
        state,
        extras,
        history.notes,
        identity,
        history.release,
        inputs.unpersist,
        tuple(history.mirror_lines),
        history.view,
    )


def _views(inputs: Inputs, discards: DiscardSource, output_root: str | None) -> Views | None:
    """What the discard history is decided against (``jobs.discards.Views``): only through
    the mirror; the last run's view is not used by a ``--rebuild`` run."""
    mirror = discards.mirror
    if mirror is None or output_root is None:
        return None
    earlier = None if mirror.rebuild else decided_view(output_root)
    return Views(earlier, inputs.op_read_ends, inputs.mirror_rebuilt)
