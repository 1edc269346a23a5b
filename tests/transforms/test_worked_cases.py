"""Spec section 8, one test per worked case, through ``transforms.round.reconcile``.

The cases themselves (inputs and expected round) live in ``worked_cases.py``, shared with
``test_reference.py``. Each test compares, with chispa, the rows that matter of its case:
pending, check requests, discards, run_summary, consume_offsets and bad records. That is
several ``assert_df_equality`` calls per test rather than one: a case is a single round.

Speed: all worked cases (and the few extra contract checks at the end) run in one round
computed once for the module, each case as its own broker named after it: brokers never
influence each other, so the spec's "one broker" is the case's broker. Building and running
a round costs from ten seconds to over a minute on a busy two-core machine; one per case
would make this module take many minutes.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from chispa import assert_df_equality
from chispa.schema_comparer import assert_schema_equality
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.materialize import SparkMaterializer
from schemas.messages import HALF_TOPIC, OP_TOPIC, TRANS_GROUP
from schemas.outputs import (
    BAD_RECORD,
    BAD_RECORDS,
    CHECK_REQUESTS,
    CLASSES,
    CONSUME_OFFSETS,
    DISCARDS,
    PENDING,
    RUN_SUMMARY,
)
from tests.reference import KIND_DUPLICATE, KIND_OP_BODY, PROPERTY_KINDS, offset_msg_id
from tests.transforms.builders import (
    BORN_HOST,
    RUN_ID,
    STORE_HOST,
    T,
    committed,
    frame,
    half,
    op,
    params,
)
from tests.transforms.collecting import WITH_ANOMALIES, local_outputs
from tests.transforms.worked_cases import CASES, S
from transforms.outputs import reconcile


def reason_kind(reason: Column) -> Column:
    """The coarse kind of a bad-record reason (the same rule as ``tests.reference.reason_kind``)."""
    kind = F.when(F.lower(reason).contains("duplicate"), F.lit(KIND_DUPLICATE)).when(
        F.lower(reason).contains("op body"), F.lit(KIND_OP_BODY)
    )
    for name in PROPERTY_KINDS:
        kind = kind.when(reason.contains(name), F.lit(name))
    return kind.otherwise(F.concat(F.lit("other: "), reason))


def assert_rows(spark: SparkSession, actual: DataFrame, ddl: str, expected: list[tuple]) -> None:
    """``actual``'s columns named in ``ddl`` equal ``expected`` (any row order, nullability)."""
    expected_df = spark.createDataFrame(expected, ddl)
    assert_df_equality(
        actual.select(*expected_df.columns),
        expected_df,
        ignore_row_order=True,
        ignore_nullable=True,
    )


Outputs = dict[str, DataFrame]  # table name -> its rows


# Extra brokers of the module's round, beside the worked cases (see the last tests).
ROW_FIELDS = "row-fields"
READER_BAD = "reader-bad"
EXTRA_RECORDS = [
    half(
        3,
        60 * S,
        key="TX-1",
        counter=2,
        immunity="10",
        real_qid=5,
        commitlog=4_242,
        broker=ROW_FIELDS,
    ),
    half(0, 60 * S, broker=READER_BAD),
    op(0, "x,", broker=READER_BAD),
]


@pytest.fixture(scope="module")
def worked(spark: SparkSession) -> Outputs:
    """The round over every worked case at once (case name = broker), as local frames."""
    records = [
        {**record, "broker": name} for name, case in CASES.items() for record in case.records
    ]
    offsets = [(name, *row[1:]) for name, case in CASES.items() for row in case.committed_rows]
    reader_bad = spark.createDataFrame(
        [(READER_BAD, "commitlog/00000000000000000000", 77, None, 0, None, "CRC mismatch", "00ff")],
        BAD_RECORD,
    )
    out = reconcile(
        frame(spark, records + EXTRA_RECORDS),
        committed(spark, offsets),
        params(),
        bad_input=reader_bad,
        materialize=SparkMaterializer(),
    )
    return local_outputs(spark, out, WITH_ANOMALIES)


def of_broker(worked: Outputs, broker: str) -> Outputs:
    return {table: rows.filter(F.col("broker") == broker) for table, rows in worked.items()}


SUMMARY_DDL = (
    "broker STRING, queue_id INT, h0 BIGINT, h1 BIGINT, h_safe BIGINT, p0 BIGINT, p1 BIGINT, "
    "p_safe BIGINT, " + ", ".join(f"{name} BIGINT" for name in CLASSES) + ", bad_records BIGINT, "
    "written_at_ms BIGINT, duration_ms BIGINT, run_id STRING, as_of_ms BIGINT"
)
OFFSETS_DDL = (
    "broker STRING, topic STRING, queue_id INT, `group` STRING, offset_committed BIGINT, "
    "offset_before BIGINT, offset_after BIGINT, offset_safe BIGINT"
)


def assert_round(spark: SparkSession, worked: Outputs, name: str) -> Outputs:
    """Check every table of one worked case's round; return its rows for extra checks."""
    case = CASES[name]
    out = of_broker(worked, name)
    h0, h1, h_safe, p0, p1, p_safe = case.offsets
    half_committed, op_committed = case.committed
    # A held queue proposes nothing: its safe offsets are null, and so is offset_after.
    h_after, p_after = (None, None) if case.held else (h1, p1)
    if case.held:
        h_safe = p_safe = None

    assert_rows(
        spark,
        out["pending"],
        "half_offset BIGINT, status STRING, check_times INT, immunity_ms BIGINT",
        case.pending,
    )
    broker_view = "settled_by_op_offset BIGINT, own_copy BOOLEAN"
    assert_rows(
        spark,
        out["check_requests"],
        f"half_offset BIGINT, check_times INT, {broker_view}",
        case.check_requests,
    )
    assert_rows(
        spark,
        out["discards"],
        f"half_offset BIGINT, reason STRING, check_times INT, {broker_view}",
        case.discards,
    )
    assert_rows(
        spark,
        out["run_summary"],
        SUMMARY_DDL,
        [
            (
                name,
                0,
                h0,
                h1,
                h_safe,
                p0,
                p1,
                p_safe,
                *tuple(case.counts.get(c, 0) for c in CLASSES),
                len(case.bad),
                None,
                None,
                RUN_ID,
                T,
            )
        ],
    )
    assert_rows(
        spark,
        out["consume_offsets"],
        OFFSETS_DDL,
        [
            (name, HALF_TOPIC, 0, TRANS_GROUP, half_committed, h0, h_after, h_safe),
            (name, OP_TOPIC, 0, TRANS_GROUP, op_committed, p0, p_after, p_safe),
        ],
    )
    assert_rows(
        spark,
        out["bad_records"].withColumn("kind", reason_kind(F.col("reason"))),
        "topic STRING, queue_offset BIGINT, kind STRING",
        case.bad,
    )
    if not case.warns:
        assert_rows(
            spark,
            out["run_summary"].withColumn(
                "warnings", F.coalesce("warnings", F.array().cast("array<string>"))
            ),
            "broker STRING, warnings ARRAY<STRING>",
            [(name, [])],
        )
    return out


def test_c01_named_offsets_are_resolved_and_the_rest_is_checked(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C01")


def test_c02_a_too_young_first_record_stops_the_round_at_once(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C02")


def test_c03_counter_at_check_max_is_discarded_unchanged(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C03")


def test_c04_counter_below_check_max_is_checked_and_incremented(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C04")


def test_c05_older_than_the_reserved_time_is_discarded_as_expired(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C05")


def test_c05_exactly_the_reserved_time_is_still_checked(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C05_exactly_72h")


def test_c06_within_its_immunity_is_immune_and_bounds_h_safe(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C06")


def test_c07_past_its_immunity_is_checked(spark: SparkSession, worked: Outputs) -> None:
    assert_round(spark, worked, "C07")


def test_c08_immunity_zero_means_zero_ms_not_too_young(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C08")


def test_c09_unparsable_immunity_means_the_timeout_and_is_a_finding_not_a_bad_record(
    spark: SparkSession, worked: Outputs
) -> None:
    """The broker reads "abc" as the transaction timeout too: the record takes part in the
    round (no bad record, so nothing holds the queue), and the anomalies say so."""
    out = assert_round(spark, worked, "C09")

    assert_rows(
        spark,
        out["anomalies"],
        "broker STRING, queue_id INT, kind STRING, severity STRING, half_offset BIGINT,"
        " value DOUBLE, detail STRING",
        [
            ("C09", 0, "unparsable_immunity", "warning", 0, 6000.0,
             'half offset 0: CHECK_IMMUNITY_TIME_IN_SECONDS "abc" is not a whole number of'
             " seconds; the broker reads the transaction timeout (6000 ms) instead"),
        ],
    )  # fmt: skip


def test_c10_resolved_then_too_young_and_an_op_naming_past_h1_is_not_done(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C10")


def test_c11_op_items_below_h0_are_settled(spark: SparkSession, worked: Outputs) -> None:
    assert_round(spark, worked, "C11")


def test_c12_an_op_with_another_tag_names_nothing_and_is_done(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C12")


def test_c13_a_batch_naming_an_offset_at_or_past_h1_is_not_done(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C13")


def test_c14_two_ops_naming_the_same_offset_are_both_done(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C14")


def test_c15_committed_offset_below_the_smallest_available_starts_there_with_a_warning(
    spark: SparkSession, worked: Outputs
) -> None:
    out = assert_round(spark, worked, "C15")

    warnings = out["run_summary"].select(F.explode("warnings").alias("warning")).collect()
    # Not the exact text: some warning names the half queue's corrected start (5).
    assert any(
        "5" in row.warning and ("half" in row.warning.lower() or HALF_TOPIC in row.warning)
        for row in warnings
    ), warnings


def test_c16_nothing_in_the_queues_leaves_the_offsets_unchanged(
    spark: SparkSession, worked: Outputs
) -> None:
    out = assert_round(spark, worked, "C16")

    assert all(
        frame.count() == 0
        for table, frame in out.items()
        if table not in ("run_summary", "consume_offsets")
    )


def test_c17_an_immunity_copy_of_a_resolved_original_is_resolved_by_rule_2(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C17")


def test_c18_a_put_back_copy_of_a_resolved_transaction_is_resolved_by_rule_3(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C18")


def test_c19_records_after_the_stop_are_not_reached(spark: SparkSession, worked: Outputs) -> None:
    assert_round(spark, worked, "C19")


def test_c20_born_in_the_future_without_immunity_is_checked(
    spark: SparkSession, worked: Outputs
) -> None:
    assert_round(spark, worked, "C20")


# ---------------------------------------------------------------------------------------
# Contracts around the worked cases: schemas, full rows, reader bad records.


def test_outputs_have_the_schemas_of_the_output_tables(worked: Outputs) -> None:
    # The local frames keep the schemas of reconcile's outputs.
    for table, expected in (
        ("check_requests", CHECK_REQUESTS),
        ("discards", DISCARDS),
        ("pending", PENDING),
        ("consume_offsets", CONSUME_OFFSETS),
        ("run_summary", RUN_SUMMARY),
        ("bad_records", BAD_RECORDS),
    ):
        assert_schema_equality(worked[table].schema, expected, ignore_nullable=True)


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)  # aware: the same instant in any local zone


def test_a_check_request_row_carries_the_half_record_fields(
    spark: SparkSession, worked: Outputs
) -> None:
    born = T - 60 * S
    assert_df_equality(
        of_broker(worked, ROW_FIELDS)["check_requests"],
        spark.createDataFrame(
            [
                (
                    ROW_FIELDS,
                    0,
                    3,
                    4_242,
                    offset_msg_id(STORE_HOST, 4_242),
                    "TX-1",
                    "PG_ORDERS",
                    "ORDERS",
                    5,
                    born,
                    born + 1,
                    60 * S,
                    3,
                    10 * S,
                    [],  # no KEYS
                    None,  # no TAGS
                    None,  # no __transactionId__
                    BORN_HOST,
                    12,  # 15 - 3
                    T + 13 * 30 * S,  # counter 3: checked in 12 more rounds, then discarded
                    _utc(born),
                    _utc(born + 1),
                    _utc(T),
                    True,  # really pending: no op record settled it
                    None,
                    False,  # a stored record, not a copy of this round
                    RUN_ID,
                    T,
                )
            ],
            CHECK_REQUESTS,
        ),
        ignore_nullable=True,
    )


def test_reader_bad_records_pass_through_and_are_counted_per_queue(
    spark: SparkSession, worked: Outputs
) -> None:
    out = of_broker(worked, READER_BAD)

    assert_rows(
        spark,
        out["bad_records"].withColumn("kind", reason_kind(F.col("reason"))),
        "position BIGINT, topic STRING, queue_id INT, kind STRING, run_id STRING, as_of_ms BIGINT",
        [
            (77, None, 0, "other: CRC mismatch", RUN_ID, T),
            (5_000_000, OP_TOPIC, 0, KIND_OP_BODY, RUN_ID, T),
        ],
    )
    assert_rows(
        spark,
        out["bad_records"].where(F.col("position") == 77),
        "source STRING, reason STRING, raw_hex STRING",
        [("commitlog/00000000000000000000", "CRC mismatch", "00ff")],
    )
    assert_rows(spark, out["run_summary"], "queue_id INT, bad_records BIGINT", [(0, 2)])
