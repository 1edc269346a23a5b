"""The broker's round as table rows (transforms/broker_view.py) and its finding
(transforms/anomaly_rules/broker_view.py), on inline frames."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from schemas.outputs import ANOMALY
from transforms.anomaly_rules.broker_view import settled_discards
from transforms.broker_view import broker_action_rows, settled_discard_counts


def test_a_queue_with_re_discards_of_settled_transactions_is_one_info_row(
    spark: SparkSession,
) -> None:
    summary = spark.createDataFrame(
        [("b", 0, 3), ("b", 1, 0), ("b", 2, None)],  # none, or a queue the walk never reached
        "broker STRING, queue_id INT, settled_discards BIGINT",
    )
    detail = (
        "3 discard(s) of the broker's next round are re-discards of transactions an op record"
        " already settled (table discards, really_pending = false): harmless, though the"
        " broker writes them to TRANS_CHECK_MAX_TIME_TOPIC again"
    )
    expected = spark.createDataFrame(
        [("b", 0, "settled_discards", "info", None, None, None, None, 3.0, 0.0, detail)], ANOMALY
    )
    assert_df_equality(settled_discards(summary), expected, ignore_nullable=True)


def test_settled_discards_count_the_walks_discards_of_settled_transactions(
    spark: SparkSession,
) -> None:
    walked = spark.createDataFrame(
        [
            ("b", 0, "discard_check_max", 5),  # settled by op 5
            ("b", 0, "discard_expired", 6),
            ("b", 0, "discard_check_max", None),  # really pending: no re-discard
            ("b", 0, "check", 7),  # a re-check, not a discard
            ("b", 1, "round_end", None),  # a queue without any: 0
        ],
        "broker STRING, queue_id INT, action STRING, settled_by_op_offset BIGINT",
    )
    expected = spark.createDataFrame(
        [("b", 0, 2), ("b", 1, 0)], "broker STRING, queue_id INT, settled_discards BIGINT"
    )
    assert_df_equality(
        settled_discard_counts(walked), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_action_rows_are_the_checks_asked_for_and_a_copy_of_this_round_is_not_stored(
    spark: SparkSession,
) -> None:
    walked = spark.createDataFrame(
        [
            ("b", 0, 4, "K", "check", 15, False, True, 4_000, 40, 7),
            ("b", 0, 9, "K", "discard_check_max", 15, True, False, 4_000, 40, 7),
            ("b", 0, 5, "L", "resolved", None, False, False, 5_000, 50, 8),
        ],
        "broker STRING, queue_id INT, half_offset BIGINT, uniq_key STRING, action STRING,"
        " counter INT, own_copy BOOLEAN, copy_discarded BOOLEAN, commitlog_offset BIGINT,"
        " store_timestamp_ms BIGINT, settled_by_op_offset BIGINT",
    )
    for name in ("store_host", "producer_group", "real_topic", "keys_raw", "tags"):
        walked = walked.withColumn(name, F.lit(None).cast("string"))
    for name in ("real_queue_id",):
        walked = walked.withColumn(name, F.lit(None).cast("int"))
    for name in ("born_timestamp_ms", "age_ms", "immunity_ms"):
        walked = walked.withColumn(name, F.lit(1).cast("long"))
    walked = walked.withColumns(
        {
            "transaction_id": F.lit(None).cast("string"),
            "born_host": F.lit(None).cast("string"),
            "body": F.lit(None).cast("binary"),
        }
    )
    rows = broker_action_rows(walked, ("check", "discard_check_max")).select(
        "queue_offset", "status", "counter_after", "commitlog_offset", "store_timestamp_ms"
    )
    expected = spark.createDataFrame(
        [(4, "check", 15, 4_000, 40), (9, "discard_check_max", 15, None, None)],
        "queue_offset BIGINT, status STRING, counter_after INT, commitlog_offset BIGINT,"
        " store_timestamp_ms BIGINT",
    )
    assert_df_equality(rows, expected, ignore_row_order=True, ignore_nullable=True)
