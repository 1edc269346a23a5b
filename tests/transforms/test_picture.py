"""A picture that may be wrong (``transforms.picture``): the offsets a queue is held at, and
the findings every summary lists first."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from schemas.outputs import ANOMALY
from transforms.merge import merged
from transforms.picture import bad_record_places, held, offset_hold, picture_anomalies

HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
QUEUE = (
    "broker STRING, queue_id INT, h_committed LONG, h0 LONG, h1 LONG, h_safe LONG,"
    " p_committed LONG, p1 LONG, p_safe LONG, bad_last_half LONG, bad_last_op LONG,"
    " bad_unplaced LONG"
)
BACKWARDS = (
    "the round ends below the committed offsets (half 10 -> 6, safe 6; op 4 -> 2, safe 2):"
    " T is before what the broker already passed, or the store's tail is damaged or"
    " half-copied"
)
BAD_AFTER = (
    "bad records at or after the committed offset: the broker will read records the round"
    " could not (table bad_records)"
)
MISSING = "no committed offset in the offsets file: where the broker stands is unknown"


def test_bad_record_places_are_the_last_offset_per_topic_and_the_unplaced(
    spark: SparkSession,
) -> None:
    bad = spark.createDataFrame(
        [("a", 0, HALF, 7), ("a", 0, HALF, 9), ("a", 0, OP, 3), ("a", 0, HALF, None)]
        + [("a", -1, None, None), ("b", 0, "TopicOrder", None)],
        "broker STRING, queue_id INT, topic STRING, queue_offset LONG",
    )

    actual = merged(bad_record_places(bad))

    expected = spark.createDataFrame(
        [("a", 0, 9, 3, 1), ("a", -1, None, None, 1), ("b", 0, None, None, 0)],
        "broker STRING, queue_id INT, bad_last_half LONG, bad_last_op LONG, bad_unplaced LONG",
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_queue_is_held_for_a_missing_committed_offset_a_move_backwards_or_bad_records_after_it(
    spark: SparkSession,
) -> None:
    queues = spark.createDataFrame(
        [
            ("forward", 0, 10, 10, 14, 12, 4, 6, 5, 9, 3, 0),  # bad records before: installable
            ("backwards", 0, 10, 6, 6, 6, 4, 2, 2, None, None, 0),  # T early / tail gone
            ("bad-half", 0, 10, 10, 14, 12, 4, 6, 5, 10, None, 0),
            ("bad-op", 0, 10, 10, 14, 12, 4, 6, 5, None, 4, 0),
            ("unplaced", 0, 10, 10, 14, 12, 4, 6, 5, None, None, 1),
            ("missing", 0, None, 0, 3, 3, 4, 4, 4, None, None, 0),
            ("both", 0, 10, 6, 6, 6, 4, 2, 2, 12, None, 0),
            ("no-queue", 0, None, None, None, None, None, None, None, None, None, 2),
        ],
        QUEUE,
    )

    actual = queues.select("broker", offset_hold().alias("offset_hold"))

    expected = spark.createDataFrame(
        [
            ("forward", None),
            ("backwards", BACKWARDS),
            ("bad-half", BAD_AFTER),
            ("bad-op", BAD_AFTER),
            ("unplaced", BAD_AFTER),
            ("missing", MISSING),
            ("both", f"{BACKWARDS}; {BAD_AFTER}"),
            ("no-queue", None),
        ],
        "broker STRING, offset_hold STRING",
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_held_queue_proposes_no_offset(spark: SparkSession) -> None:
    rows = spark.createDataFrame(
        [("a", 5, None), ("b", 5, "why")], "broker STRING, offset_safe LONG, offset_hold STRING"
    )

    actual = rows.select("broker", held("offset_safe"))

    expected = spark.createDataFrame([("a", 5), ("b", None)], "broker STRING, offset_safe LONG")
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_picture_anomalies_hold_bad_records_and_warnings(spark: SparkSession) -> None:
    summary = spark.createDataFrame(
        [
            ("a", 0, "why", 2, ["store looks copied", "offsets from .bak"]),
            ("b", 0, None, 0, []),
            ("c", None, None, 3, []),
        ],
        "broker STRING, queue_id INT, offset_hold STRING, bad_records LONG, warnings ARRAY<STRING>",
    )

    actual = picture_anomalies(summary)

    bad = "bad record(s) of the half and op topics took no part in the round (table bad_records)"
    found = [
        ("a", 0, "offsets_held", "critical", None, None, "no offset to install: why"),
        ("a", 0, "bad_records", "warning", 2.0, 0.0, f"2 {bad}"),
        ("c", None, "bad_records", "warning", 3.0, 0.0, f"3 {bad}"),
        ("a", 0, "picture_warning", "warning", None, None, "store looks copied"),
        ("a", 0, "picture_warning", "warning", None, None, "offsets from .bak"),
    ]
    columns = "broker STRING, queue_id INT, kind STRING, severity STRING, value DOUBLE,"
    columns += " threshold DOUBLE, detail STRING"
    expected = spark.createDataFrame(found, columns).select(
        *[
            F.col(f.name).cast(f.dataType)
            if f.name in columns
            else F.lit(None).cast(f.dataType).alias(f.name)
            for f in ANOMALY.fields
        ]
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
