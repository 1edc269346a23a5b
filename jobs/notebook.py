"""Notebook functions: the round in the caller's session, as DataFrames
(``reconcile_stores``, ``reconcile_segments``) or written to Delta tables
(``reconcile_stores_to_delta``). Import them from ``jobs.reconcile``, which also makes the
session's Python workers run this interpreter."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from pyspark.sql import SparkSession

from connectors.mirror import MirrorRequest, mirror_root
from connectors.rocketmq.discards import DiscardSource
from connectors.rocketmq.reader import parse_store_arg
from jobs.config import JobConfig, load_config
from jobs.extract import (
    AsOfChoice,
    parse_as_of,
    read_segment_inputs,
    read_store_inputs,
    settle_as_of,
)
from jobs.output import write_tables
from jobs.pipeline import reconcile_inputs
from jobs.session import probe_workers
from transforms.outputs import RoundOutputs


def reconcile_stores(
    spark: SparkSession,
    stores: Sequence[str],
    *,
    as_of: str | int = "latest",
    run_id: str | None = None,
    **settings: object,
) -> RoundOutputs:
    """Notebook entry point: the round over broker stores, as DataFrames; nothing written.

    Args:
        spark: the caller's session.
        stores: ``"[NAME=]DIR"`` strings, one per broker.
        as_of: ``latest``, ``auto`` (``now`` when the stores look live, ``latest`` when
            one looks copied), ``now``, an ISO-8601 instant or epoch ms; checked as on the
            command line.
        run_id: default derived from the inputs, T and settings.
        settings: any ``JobConfig`` field (check_max, transaction_timeout_ms, ...).

    Returns:
        ``transforms.outputs.RoundOutputs``: the command line's tables (its pipeline,
        ``jobs.pipeline``), with the columns only a write fills (``inputs``, ``writer``,
        ``job_version``, ``written_at_ms``, ``duration_ms`` of run_summary) null. Call its
        ``release()`` once done with the frames: it frees what the read and the round
        cached (the frames stay usable, computed again). Each call otherwise keeps its
        cache for the session's life.
    """
    config = load_config(None, dict(settings))
    probe_workers(spark)
    settled, choice = _settled(as_of, stores, config)
    inputs = read_store_inputs(spark, stores, config)
    source = DiscardSource(stores=tuple(stores))
    return reconcile_inputs(
        spark, inputs, config, settled, source, run_id=run_id, choice=choice
    ).tables()


def _settled(
    as_of: str | int, stores: Sequence[str], config: JobConfig
) -> tuple[int | str, AsOfChoice | None]:
    """T parsed and checked as on the command line (``jobs.extract.settle_as_of``), and
    what ``auto`` chose (printed on stderr, one line; a warning in the tables as on the
    command line)."""
    specs = [parse_store_arg(arg) for arg in stores]
    settled, choice = settle_as_of(parse_as_of(str(as_of)), specs, config)
    if choice is not None:
        print(choice.line, file=sys.stderr)
    return settled, choice


def reconcile_segments(
    spark: SparkSession,
    half: str,
    op: str,
    *,
    fmt: str,
    broker: str,
    offsets: str | None = None,
    as_of: str | int = "latest",
    run_id: str | None = None,
    **settings: object,
) -> RoundOutputs:
    """Notebook entry point for exported segments (see ``reconcile_stores``)."""
    config = load_config(None, dict(settings))
    probe_workers(spark)
    settled, choice = _settled(as_of, (), config)
    inputs = read_segment_inputs(spark, half, op, fmt, broker, offsets).persist()
    source = DiscardSource(fmt=fmt, broker=broker)
    return reconcile_inputs(
        spark, inputs, config, settled, source, run_id=run_id, choice=choice
    ).tables()


def reconcile_stores_to_delta(
    spark: SparkSession,
    stores: Sequence[str],
    output: str,
    *,
    as_of: str | int = "latest",
    run_id: str | None = None,
    writer: str = "auto",
    catalog_schema: str = "",
    **settings: object,
) -> dict[str, int]:
    """Notebook entry point that also writes: the round over ``stores`` into ``output``.

    In a session that has Delta (a Databricks-like notebook, or ``build_session(delta=True)``)
    ``writer="auto"`` writes through Spark (delta-spark); elsewhere through delta-rs. Same
    tables and semantics as the command line (a rerun of a run id replaces its rows).
    ``mirror=True`` (a setting, as ``job.mirror`` in a conf file) reads the stores through
    their mirror under ``output``, like ``--mirror`` (it needs a local ``output``).

    Returns:
        Table name -> rows written.
    """
    config = load_config(None, {**settings, "writer": writer, "catalog_schema": catalog_schema})
    started = time.time()
    probe_workers(spark)
    settled, choice = _settled(as_of, stores, config)
    mirror = MirrorRequest(mirror_root(output)) if config.mirror else None
    inputs = read_store_inputs(spark, stores, config, mirror=mirror)
    source = DiscardSource(stores=tuple(stores), mirror=mirror)
    reconciled = reconcile_inputs(
        spark, inputs, config, settled, source, run_id=run_id, choice=choice, output_root=output
    )
    try:
        return write_tables(spark, reconciled, output, config, started, lambda message: None).counts
    finally:
        reconciled.release()
