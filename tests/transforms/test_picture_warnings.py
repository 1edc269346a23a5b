"""The pure warning transforms of issue 11 on small inline frames: a store that looks
copied (transforms/staleness.py) and committed offsets that are missing
(transforms/offsets.py)."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from transforms.offsets import with_missing_offset_warnings
from transforms.staleness import (
    broker_newest,
    stale_after_ms,
    with_stale_store_warning,
)

T = 1_000_000_000
QUEUES = "broker STRING, queue_id INT, check LONG, immune LONG, discard_expired LONG, warnings ARRAY<STRING>"


def test_stale_after_is_three_intervals_or_the_timeout() -> None:
    assert stale_after_ms(30_000, 6_000) == 90_000
    assert stale_after_ms(1_000, 6_000) == 6_000


def test_stale_warning_only_where_a_live_broker_would_have_written_since(
    spark: SparkSession,
) -> None:
    # newest_ms per queue; the warning judges a broker by its newest record of any queue.
    queues = spark.createDataFrame(
        [
            ("old", 0, 1, 0, 0, ["x"], T - 200),  # a check, broker's newest 100 ms old: warned
            ("old", 1, 0, 0, 0, [], T - 100),  # nothing pending: no warning
            ("recent", 0, 0, 1, 0, [], T - 1_000),  # immune; its broker wrote 10 ms ago: fine
            ("recent", 1, 0, 0, 0, [], T - 10),
            ("expired", 0, 0, 0, 3, [], T - 1_000),  # only expired discards, older than retention
            ("unread", 0, 1, 0, 0, [], None),  # no record at all: nothing to judge
        ],
        f"{QUEUES}, newest_ms LONG",
    )
    newest = broker_newest(queues.select("broker", "newest_ms").collect())
    assert newest == {"old": T - 100, "recent": T - 10, "expired": T - 1_000}
    out = with_stale_store_warning(queues, T, limit_ms=50, reserved_ms=500, newest_by_broker=newest)
    flags = out.select(
        "broker",
        "queue_id",
        F.size("warnings").alias("n"),
        F.exists("warnings", lambda w: w.contains("--as-of latest")).alias("stale"),
    )
    assert_df_equality(
        flags,
        spark.createDataFrame(
            [
                ("old", 0, 2, True),
                ("old", 1, 0, False),
                ("recent", 0, 0, False),
                ("recent", 1, 0, False),
                ("expired", 0, 1, True),
                ("unread", 0, 0, False),
            ],
            "broker STRING, queue_id INT, n INT, stale BOOLEAN",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert out.columns == queues.columns


def test_missing_offset_warnings_name_the_file_and_the_queue(spark: SparkSession) -> None:
    queues = spark.createDataFrame(
        [
            ("a", 0, 5, 5, None, 0, []),
            ("b", 3, None, 7, 2, 2, []),
            ("c", 0, None, None, None, None, []),
        ],
        "broker STRING, queue_id INT, h_committed LONG, h0 LONG, p_committed LONG, p0 LONG,"
        " warnings ARRAY<STRING>",
    )
    files = [
        ("a", "config/consumerOffset.json", None),
        ("b", "config/consumerOffset.json.bak", "why"),
    ]
    out = with_missing_offset_warnings(queues, files).select("broker", "warnings")
    op, half = "RMQ_SYS_TRANS_OP_HALF_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC"
    assert_df_equality(
        out,
        spark.createDataFrame(
            [
                (
                    "a",
                    [
                        f"{op} queue 0: no committed offset (key {op}@CID_RMQ_SYS_TRANS) in"
                        " config/consumerOffset.json; starting at the queue's smallest"
                        " available offset 0"
                    ],
                ),
                (
                    "b",
                    [
                        "queue 3: why",
                        f"{half} queue 3: no committed offset (key {half}@CID_RMQ_SYS_TRANS) in"
                        " config/consumerOffset.json.bak; starting at the queue's smallest"
                        " available offset 7",
                    ],
                ),
                ("c", []),  # a bad-records-only row (no h0): nothing to say
            ],
            "broker STRING, warnings ARRAY<STRING>",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )
