"""The discard history's inputs (transforms/discard_inputs.py), each stage alone on inline
discard records: which records are used, which are bad records, which real queues they
name, and which bad records the round reported already."""

from __future__ import annotations

from typing import Any

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.rocketmq.read_tasks import NO_RECORD_AT, NO_RECORD_PLACE
from schemas.messages import DISCARD_TOPIC, HALF_TOPIC, PROP_CHECK_TIMES
from schemas.outputs import BAD_RECORD
from tests.transforms.builders import BROKER, COMMITLOG_SOURCE, frame
from tests.transforms.test_discard_history import discard
from transforms.discard_inputs import (
    named_real_queues,
    not_reported,
    other_queue_records,
    usable_discards,
)
from transforms.messages import RECORD_KEY

HOUR = 3_600_000
S = 1_000
T = 1_700_000_000_000  # the builders' as-of instant
PLACE = "broker STRING, topic STRING, queue_id INT, queue_offset LONG, position LONG"
CQ_SOURCE = f"consumequeue/{HALF_TOPIC}/0/00000000000000000000"


def _bad(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, BAD_RECORD)


def _places(records: DataFrame) -> DataFrame:
    return records.select(*RECORD_KEY, "position")


def test_a_record_of_another_queue_is_a_bad_record(spark: SparkSession) -> None:
    records = frame(
        spark,
        [discard(0, "K0", 15, HOUR), discard(1, "K1", 15, HOUR, queue=3)],
    )
    expected = _bad(
        spark,
        [
            (
                BROKER,
                COMMITLOG_SOURCE,
                9_001_000,
                DISCARD_TOPIC,
                3,
                1,
                f"{DISCARD_TOPIC} has one queue (0): a record of queue 3 is not used",
                None,
            )
        ],
    )
    assert_df_equality(other_queue_records(records), expected, ignore_nullable=True)


def _usable_case(spark: SparkSession) -> tuple[DataFrame, DataFrame]:
    winner = discard(0, "K0", 15, HOUR)
    loser = {**discard(0, "K0", 15, HOUR), "commitlog_offset": 9_500_000, "position": 9_500_000}
    records = [
        loser,
        winner,
        # An unparsable counter stored before T is a bad record; one stored after T is
        # not looked at.
        discard(1, "K1", None, HOUR, extra_properties={PROP_CHECK_TIMES: "x"}),
        discard(
            2, "K2", None, HOUR, stored_age_ms=-5 * S, extra_properties={PROP_CHECK_TIMES: "y"}
        ),
        discard(3, "K3", 15, HOUR, queue=1),  # another queue: a bad record, not used
    ]
    reader_bad = _bad(
        spark, [(BROKER, COMMITLOG_SOURCE, 7_000, None, None, None, "truncated record", None)]
    )
    return usable_discards(frame(spark, records), reader_bad, T)


def test_usable_discards_are_queue_0_without_duplicates(spark: SparkSession) -> None:
    usable, _ = _usable_case(spark)
    expected = spark.createDataFrame(
        [
            (BROKER, DISCARD_TOPIC, 0, 0, 9_000_000),  # the smaller commit-log offset wins
            (BROKER, DISCARD_TOPIC, 0, 1, 9_001_000),  # unparsable, still used
            (BROKER, DISCARD_TOPIC, 0, 2, 9_002_000),  # stored after T, still used
        ],
        PLACE,
    )
    assert "duplicate_of" not in usable.columns
    assert_df_equality(_places(usable), expected, ignore_row_order=True, ignore_nullable=True)


def test_every_bad_discard_record_with_the_readers_own(spark: SparkSession) -> None:
    _, bad = _usable_case(spark)
    expected = _bad(
        spark,
        [
            (BROKER, COMMITLOG_SOURCE, 7_000, None, None, None, "truncated record", None),
            (
                BROKER,
                COMMITLOG_SOURCE,
                9_003_000,
                DISCARD_TOPIC,
                1,
                3,
                f"{DISCARD_TOPIC} has one queue (0): a record of queue 1 is not used",
                None,
            ),
            (
                BROKER,
                COMMITLOG_SOURCE,
                9_500_000,
                DISCARD_TOPIC,
                0,
                0,
                "duplicate queue offset: the record at commit-log offset 9000000 is used instead",
                None,
            ),
            (
                BROKER,
                COMMITLOG_SOURCE,
                9_001_000,
                DISCARD_TOPIC,
                0,
                1,
                "unparsable TRANSACTION_CHECK_TIMES 'x'",
                "78",
            ),
        ],
    )
    assert_df_equality(bad, expected, ignore_row_order=True, ignore_nullable=True)


def test_named_real_queues_count_records_before_t(spark: SparkSession) -> None:
    usable = frame(
        spark,
        [
            discard(0, "K0", 15, HOUR),
            discard(1, "K1", 15, HOUR),
            discard(2, "K2", 15, HOUR, real_qid=7),
            discard(3, "K3", 15, HOUR, real_topic="PAYMENTS", real_qid=7),
            discard(4, "K4", 15, HOUR, stored_age_ms=0),  # stored at T: not counted
            discard(5, "K5", 15, HOUR, real_topic=None, real_qid=None),  # names no queue
            discard(0, "K9", 15, HOUR, broker="c"),
        ],
    )
    expected = spark.createDataFrame(
        [
            (BROKER, "ORDERS", 0, 2, 2, 0),
            (BROKER, "ORDERS", 7, 1, 1, 0),
            (BROKER, "PAYMENTS", 7, 1, 1, 0),
            (BROKER, None, None, 1, 1, 0),
            ("c", "ORDERS", 0, 1, 1, 0),
        ],
        "broker STRING, real_topic STRING, real_queue_id INT, records LONG, open_records LONG,"
        " carried_records LONG",
    )
    assert_df_equality(
        named_real_queues(usable, T), expected, ignore_row_order=True, ignore_nullable=True
    )
    # Records whose row earlier runs decided for good are counted, not open: their queues
    # need no read (broker c's record 0 is another broker's offset 0: still open).
    kept = spark.createDataFrame([(BROKER, 1), (BROKER, 3)], "broker STRING, discard_offset LONG")
    expected_open = expected.withColumn(
        "open_records",
        F.when(F.col("real_topic") == "PAYMENTS", 0)
        .when((F.col("broker") == BROKER) & (F.col("real_queue_id") == 0), 1)
        .otherwise(F.col("open_records"))
        .cast("long"),
    )
    assert_df_equality(
        named_real_queues(usable, T, kept),
        expected_open,
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # Open records decided against what arrived since are counted apart; a kept record in
    # ``carried`` (record 1) is not open, so not carried either.
    carried = spark.createDataFrame(
        [(BROKER, 0), (BROKER, 1), (BROKER, 2)], "broker STRING, discard_offset LONG"
    )
    expected_carried = expected_open.withColumn(
        "carried_records",
        F.when((F.col("broker") == BROKER) & F.col("real_topic").isin("ORDERS"), 1)
        .otherwise(0)
        .cast("long"),
    )
    assert_df_equality(
        named_real_queues(usable, T, kept, carried),
        expected_carried,
        ignore_row_order=True,
        ignore_nullable=True,
    )


def _at(broker: str, position: int, reason: str = "bad magic code") -> tuple[Any, ...]:
    return (broker, COMMITLOG_SOURCE, position, None, None, None, reason, None)


def test_not_reported_drops_what_the_round_reported_at_the_same_place(
    spark: SparkSession,
) -> None:
    bad = _bad(spark, [_at(BROKER, 100), _at(BROKER, 200), _at(BROKER, 300), _at("c", 100)])
    entry = NO_RECORD_AT.format(source=COMMITLOG_SOURCE, position=200, reason="bad magic code")
    reported = _bad(
        spark,
        [
            _at(BROKER, 100, "truncated record"),  # the same place: one bad record
            # A consume-queue entry naming commit-log position 200: the same record.
            (BROKER, CQ_SOURCE, 40, HALF_TOPIC, 0, 2, entry, None),
            # The wording not at the start of the reason: it names no place.
            (BROKER, CQ_SOURCE, 60, HALF_TOPIC, 0, 3, f"note: {entry.replace('200', '300')}", None),
        ],
    )
    expected = _bad(spark, [_at(BROKER, 300), _at("c", 100)])  # c: another broker's file
    assert_df_equality(
        not_reported(bad, reported, NO_RECORD_PLACE),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_not_reported_survives_a_reason_that_is_a_literal_of_the_plan(
    spark: SparkSession,
) -> None:
    """A reported bad record whose reason is a fixed wording (a literal the optimiser folds
    before any filter runs) names no place, and the place's cast must not fail the query."""
    bad = _bad(spark, [_at(BROKER, 100)])
    fixed = F.lit("duplicate queue offset: the record at commit-log offset 9 is used instead")
    reported = (
        _bad(spark, [_at(BROKER, 500)]).withColumn("reason", fixed).select(*BAD_RECORD.fieldNames())
    )
    assert_df_equality(
        not_reported(bad, reported, NO_RECORD_PLACE),
        bad,
        ignore_row_order=True,
        ignore_nullable=True,
    )
