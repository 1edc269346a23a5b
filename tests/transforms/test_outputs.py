"""Shaping the output tables (transforms/outputs.py, ``shape_tables``) from a small
classified round and what the job read beside it (``RunExtras``): the discard history's
rows per broker, the run's facts, the extra anomalies and their counts, the discard read's
bad records and the first sightings carried from an earlier run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.materialize import SparkMaterializer
from schemas.messages import DISCARD_TOPIC, HALF_TOPIC
from schemas.outputs import (
    ANOMALY,
    BAD_RECORD,
    BAD_RECORDS,
    CRITICAL,
    DISCARD_HISTORY,
    INFO,
    STALLED_OFFSET,
    WARNING,
)
from tests.transforms.builders import (
    BROKER,
    COMMITLOG_SOURCE,
    RUN_ID,
    T,
    committed,
    committed_rows,
    frame,
    half,
    params,
)
from transforms.outputs import RoundOutputs, RunExtras, RunFacts, shape_tables
from transforms.round import RoundState, classify_round

S = 1_000
OTHER = "c"
DISCARD_KIND = "discarded_without_check"
FACTS = RunFacts(
    inputs=("store:b=/s/b", "store:c=/s/c"),
    writer="delta-rs",
    job_version="1.2.3",
    written_at_ms=T + 5 * S,
    duration_ms=4 * S,
)
ROUND_BAD = (BROKER, COMMITLOG_SOURCE, 7_000, HALF_TOPIC, 0, 5, "truncated record", None)
DISCARD_BAD = (BROKER, COMMITLOG_SOURCE, 9_000, DISCARD_TOPIC, 0, 3, "bad magic code", None)


@pytest.fixture(scope="module")
def state(spark: SparkSession) -> RoundState:
    """Broker b queue 0: two records to check and a bad record the reader found (so its
    offsets are held); broker c queue 0: one record to check. No anomaly rules run
    (evidence None): the anomalies are the picture's and the extras' only."""
    records = [
        half(0, 60 * S, key="K0"),
        half(1, 60 * S, key="K1"),
        half(0, 60 * S, key="K9", broker=OTHER),
    ]
    offsets = committed(spark, committed_rows(0, 0) + committed_rows(0, 0, broker=OTHER))
    bad = spark.createDataFrame([ROUND_BAD], BAD_RECORD)
    classified = classify_round(
        frame(spark, records), offsets, params(), bad, materialize=SparkMaterializer()
    )
    return replace(classified, evidence=None)


def _history(spark: SparkSession) -> DataFrame:
    """Two discard_history rows of broker b (only the broker matters to the counts)."""
    keys = spark.createDataFrame([(BROKER, 0), (BROKER, 1)], "broker STRING, discard_offset LONG")
    return keys.select(
        *[
            (F.col(f.name) if f.name in keys.columns else F.lit(None))
            .cast(f.dataType)
            .alias(f.name)
            for f in DISCARD_HISTORY.fields
        ]
    )


def _finding(broker: str, queue_id: int | None, severity: str) -> tuple[Any, ...]:
    return (broker, queue_id, DISCARD_KIND, severity, "K", "PG", 4, None, None, None, "d")


def _extras(spark: SparkSession) -> RunExtras:
    findings = spark.createDataFrame(
        [
            _finding(BROKER, 0, WARNING),
            _finding(BROKER, None, CRITICAL),  # no queue: counted on no summary row
            _finding(OTHER, 0, INFO),
        ],
        ANOMALY,
    )
    earlier_pending = spark.createDataFrame(
        [
            # The run that first saw K0 predates these columns: its own run is the sighting.
            (BROKER, 0, 0, "K0", "r1", T - 60 * S, None, None),
            (OTHER, 0, 0, "K9", "r1", T - 60 * S, "r0", T - 120 * S),
            (OTHER, 0, 1, "K1", "r1", T - 60 * S, "r0", T - 120 * S),  # K1 of another broker
        ],
        "broker STRING, queue_id INT, half_offset LONG, uniq_key STRING, run_id STRING,"
        " as_of_ms LONG, first_seen_run_id STRING, pending_since_ms LONG",
    )
    # b's offsets have not moved over two earlier runs 200 s back (3 runs > 3 x 30 s) while
    # records are pending: stalled; c has one earlier run only.
    earlier_offsets = spark.createDataFrame(
        [
            (BROKER, 0, T - 200 * S, 0, 0),
            (BROKER, 0, T - 100 * S, 0, 0),
            (OTHER, 0, T - 100 * S, 0, 0),
        ],
        "broker STRING, queue_id INT, as_of_ms LONG, h0 LONG, p0 LONG",
    )
    return RunExtras(
        discard_history=_history(spark),
        discard_findings=findings,
        discard_bad_records=spark.createDataFrame([DISCARD_BAD], BAD_RECORD),
        earlier_pending=earlier_pending,
        earlier_offsets=earlier_offsets,
        facts=FACTS,
    )


@pytest.fixture(scope="module")
def shaped(spark: SparkSession, state: RoundState) -> RoundOutputs:
    return shape_tables(state, _extras(spark))


@pytest.fixture(scope="module")
def plain(state: RoundState) -> RoundOutputs:
    """The round's tables without extras (the notebook's frames before a write)."""
    return shape_tables(state)


def _columns(frame_: DataFrame, ddl: str) -> DataFrame:
    """``frame_``'s columns named in ``ddl`` (the expected frame's schema)."""
    return frame_.select(*[part.split()[0] for part in ddl.split(",")])


def _summary(out: RoundOutputs, ddl: str) -> DataFrame:
    return _columns(out.run_summary, ddl)


HISTORY_ROWS = "broker STRING, queue_id INT, discard_history_rows LONG"


def test_discard_history_rows_per_broker_and_0_without_any(
    spark: SparkSession, shaped: RoundOutputs
) -> None:
    expected = spark.createDataFrame([(BROKER, 0, 2), (OTHER, 0, 0)], HISTORY_ROWS)
    assert_df_equality(
        _summary(shaped, HISTORY_ROWS), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_discard_history_rows_null_when_no_history_was_computed(
    spark: SparkSession, plain: RoundOutputs
) -> None:
    expected = spark.createDataFrame([(BROKER, 0, None), (OTHER, 0, None)], HISTORY_ROWS)
    assert_df_equality(
        _summary(plain, HISTORY_ROWS), expected, ignore_row_order=True, ignore_nullable=True
    )
    assert plain.discard_history.count() == 0
    assert plain.discard_history.schema == DISCARD_HISTORY


FACT_COLUMNS = (
    "broker STRING, inputs ARRAY<STRING>, writer STRING, job_version STRING,"
    " written_at_ms LONG, duration_ms LONG"
)


def test_run_facts_fill_their_columns(spark: SparkSession, shaped: RoundOutputs) -> None:
    facts = (list(FACTS.inputs), "delta-rs", "1.2.3", T + 5 * S, 4 * S)
    expected = spark.createDataFrame([(BROKER, *facts), (OTHER, *facts)], FACT_COLUMNS)
    assert_df_equality(
        _summary(shaped, FACT_COLUMNS), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_run_facts_columns_are_null_by_default(spark: SparkSession, plain: RoundOutputs) -> None:
    """Nothing written (the notebook functions' frames): every column a write fills is
    null, ``inputs`` included."""
    columns = (
        "broker STRING, inputs ARRAY<STRING>, writer STRING, job_version STRING,"
        " written_at_ms LONG, duration_ms LONG"
    )
    expected = spark.createDataFrame([(BROKER,) + (None,) * 5, (OTHER,) + (None,) * 5], columns)
    assert_df_equality(
        _summary(plain, columns), expected, ignore_row_order=True, ignore_nullable=True
    )


ANOMALY_ROWS = (
    "broker STRING, queue_id INT, kind STRING, severity STRING, half_offset LONG,"
    " op_offset LONG, run_id STRING, as_of_ms LONG"
)


def test_discard_findings_and_stalled_offsets_join_the_anomalies(
    spark: SparkSession, shaped: RoundOutputs
) -> None:
    run = (RUN_ID, T)
    expected = [
        (BROKER, 0, "offsets_held", CRITICAL, None, None, *run),  # the picture's, from b's hold
        (BROKER, 0, "bad_records", WARNING, None, None, *run),
        (BROKER, 0, DISCARD_KIND, WARNING, 4, None, *run),
        (BROKER, None, DISCARD_KIND, CRITICAL, 4, None, *run),
        (OTHER, 0, DISCARD_KIND, INFO, 4, None, *run),
        (BROKER, 0, STALLED_OFFSET, CRITICAL, 0, None, *run),  # half offset 0
        (BROKER, 0, STALLED_OFFSET, CRITICAL, None, 0, *run),  # op offset 0
    ]
    assert_df_equality(
        _columns(shaped.anomalies, ANOMALY_ROWS),
        spark.createDataFrame(expected, ANOMALY_ROWS),
        ignore_row_order=True,
        ignore_nullable=True,
    )


COUNTS = (
    "broker STRING, queue_id INT, anomalies_info LONG, anomalies_warning LONG,"
    " anomalies_critical LONG"
)


def test_run_summary_counts_every_anomaly_of_its_queue(
    spark: SparkSession, shaped: RoundOutputs, plain: RoundOutputs
) -> None:
    # b: bad_records + a discard finding (warning); held + two stalled offsets (critical);
    # b's finding of no queue counts nowhere.
    expected = spark.createDataFrame([(BROKER, 0, 0, 2, 3), (OTHER, 0, 1, 0, 0)], COUNTS)
    assert_df_equality(
        _summary(shaped, COUNTS), expected, ignore_row_order=True, ignore_nullable=True
    )
    without = spark.createDataFrame([(BROKER, 0, 0, 1, 1), (OTHER, 0, 0, 0, 0)], COUNTS)
    assert_df_equality(
        _summary(plain, COUNTS), without, ignore_row_order=True, ignore_nullable=True
    )


def test_the_discard_reads_bad_records_join_with_the_runs_columns(
    spark: SparkSession, shaped: RoundOutputs, plain: RoundOutputs
) -> None:
    run = (RUN_ID, T)
    expected = spark.createDataFrame([(*ROUND_BAD, *run), (*DISCARD_BAD, *run)], BAD_RECORDS)
    assert_df_equality(shaped.bad_records, expected, ignore_row_order=True, ignore_nullable=True)
    alone = spark.createDataFrame([(*ROUND_BAD, *run)], BAD_RECORDS)
    assert_df_equality(plain.bad_records, alone, ignore_nullable=True)


SIGHTINGS = (
    "broker STRING, queue_id INT, half_offset LONG, uniq_key STRING, status STRING,"
    " first_seen_run_id STRING, pending_since_ms LONG"
)


def test_an_earlier_runs_pending_rows_carry_the_first_sighting(
    spark: SparkSession, shaped: RoundOutputs
) -> None:
    expected = [
        (BROKER, 0, 0, "K0", "check", "r1", T - 60 * S),  # earlier row without the columns
        (BROKER, 0, 1, "K1", "check", RUN_ID, T),  # only broker c had a K1 pending
        (OTHER, 0, 0, "K9", "check", "r0", T - 120 * S),
    ]
    assert_df_equality(
        _columns(shaped.pending, SIGHTINGS),
        spark.createDataFrame(expected, SIGHTINGS),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_without_earlier_runs_every_pending_row_is_first_seen_now(
    spark: SparkSession, plain: RoundOutputs
) -> None:
    expected = [
        (BROKER, 0, 0, "K0", "check", RUN_ID, T),
        (BROKER, 0, 1, "K1", "check", RUN_ID, T),
        (OTHER, 0, 0, "K9", "check", RUN_ID, T),
    ]
    assert_df_equality(
        _columns(plain.pending, SIGHTINGS),
        spark.createDataFrame(expected, SIGHTINGS),
        ignore_row_order=True,
        ignore_nullable=True,
    )
