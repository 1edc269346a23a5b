"""A picture that may be wrong, and the offsets the job must never advise (spec sections 5
and 6, "Offsets only move forward").

The broker only ever moves its consume offsets forward, and it reads every record from
them on. So the job advises no offset below the committed one, and none for a queue whose
picture it cannot vouch for. Stages, in the order the round uses them:

1. ``bad_record_places``: per queue, where its bad records lie (``queue_summary`` merges
   them with the other per-queue facts in its one aggregate).
2. ``offset_hold``: per queue, why none of its offsets may be installed (null: they may).
   Three causes, all named when several apply: a committed offset is missing (where the
   broker stands is unknown); an end or safe offset of the round lies below the committed
   one (T before what the broker already passed, or a damaged or half-copied store tail);
   a bad record of the queue at or after the committed offset, or at an unknown offset
   (the broker will read a record the round could not).
3. ``held``: an offset column, null when its queue is held (``run_summary``,
   ``consume_offsets`` and so the fragments).
4. ``picture_anomalies``: one ``anomalies`` row per held queue (critical), per queue with
   bad records and per warning of ``run_summary.warnings`` (warning), so that the summary
   lists them first and ``--fail-on`` covers them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.messages import HALF_TOPIC, OP_TOPIC
from schemas.outputs import BAD_RECORDS_FOUND, CRITICAL, OFFSETS_HELD, PICTURE_WARNING, WARNING
from transforms.anomalies import finding
from transforms.merge import Facts

BAD_PLACES = ("bad_last_half", "bad_last_op", "bad_unplaced")


def bad_record_places(rows: DataFrame) -> Facts:
    """Per queue (``rows``: bad records keyed by broker and queue id), the largest queue
    offset of a bad half record (``bad_last_half``) and of a bad op record
    (``bad_last_op``), and how many bad records of either topic, or of no known topic,
    have no queue offset (``bad_unplaced``)."""
    topic, offset = F.col("topic"), F.col("queue_offset")
    transactional = topic.isNull() | topic.isin(HALF_TOPIC, OP_TOPIC)
    return Facts(
        rows.select(
            "broker",
            "queue_id",
            F.when(topic == HALF_TOPIC, offset).alias("_bad_half"),
            F.when(topic == OP_TOPIC, offset).alias("_bad_op"),
            F.when(transactional & offset.isNull(), 1).alias("_bad_unplaced"),
        ),
        (
            F.max("_bad_half").alias("bad_last_half"),
            F.max("_bad_op").alias("bad_last_op"),
            F.count("_bad_unplaced").alias("bad_unplaced"),
        ),
    )


def _below(offset: str, committed: str) -> Column:
    return F.col(offset) < F.col(committed)


def offset_hold() -> Column:
    """Why none of the queue's offsets may be installed, or null (columns of
    ``queue_summary``: ``h_committed``, ``h0``, ``h1``, ``h_safe``, ``p_committed``,
    ``p1``, ``p_safe`` and ``BAD_PLACES``). A queue the round has no offsets for (``h0``
    null) is never held: it has nothing to install."""
    h_committed, p_committed = F.col("h_committed"), F.col("p_committed")
    missing = h_committed.isNull() | p_committed.isNull()
    backwards = (
        _below("h1", "h_committed")
        | _below("h_safe", "h_committed")
        | _below("p1", "p_committed")
        | _below("p_safe", "p_committed")
    )
    bad_after = (
        (F.col("bad_last_half") >= F.coalesce(h_committed, F.lit(0)))
        | (F.col("bad_last_op") >= F.coalesce(p_committed, F.lit(0)))
        | (F.coalesce(F.col("bad_unplaced"), F.lit(0)) > 0)
    )
    reasons = [
        F.when(
            missing,
            F.lit("no committed offset in the offsets file: where the broker stands is unknown"),
        ),
        F.when(
            backwards,
            F.format_string(
                "the round ends below the committed offsets (half %d -> %d, safe %d; op %d ->"
                " %d, safe %d): T is before what the broker already passed, or the store's"
                " tail is damaged or half-copied",
                h_committed,
                F.col("h1"),
                F.col("h_safe"),
                p_committed,
                F.col("p1"),
                F.col("p_safe"),
            ),
        ),
        F.when(
            F.coalesce(bad_after, F.lit(False)),
            F.lit(
                "bad records at or after the committed offset: the broker will read records"
                " the round could not (table bad_records)"
            ),
        ),
    ]
    found = F.concat_ws("; ", *reasons)
    return F.when(F.col("h0").isNotNull() & (found != ""), found)


def held(offset: str) -> Column:
    """``offset`` (a column of a row with ``offset_hold``), null when the queue is held:
    no output proposes an offset the job cannot vouch for."""
    return F.when(F.col("offset_hold").isNull(), F.col(offset)).alias(offset)


def with_run_warnings(queues: DataFrame, warnings: Sequence[str]) -> DataFrame:
    """``queues`` (``run_summary`` shape) with ``warnings`` about the whole run appended to
    the warnings of every queue the round has offsets for (``h0`` set)."""
    if not warnings:
        return queues
    extra = F.array(*[F.lit(warning) for warning in warnings])
    appended = F.when(F.col("h0").isNotNull(), F.concat(F.col("warnings"), extra))
    return queues.withColumn("warnings", appended.otherwise(F.col("warnings")))


def picture_anomalies(summary: DataFrame) -> DataFrame:
    """``ANOMALY`` rows from ``run_summary``'s rows (``offset_hold``, ``bad_records``,
    ``warnings``): ``offsets_held`` (critical) per held queue, ``bad_records`` (warning,
    value = the count) per queue with bad records, ``picture_warning`` (warning) per
    warning. They are the lines a summary shows before any count."""
    holds = finding(
        summary.filter(F.col("offset_hold").isNotNull()),
        OFFSETS_HELD,
        F.lit(CRITICAL),
        F.lit(None),
        F.lit(None),
        F.format_string("no offset to install: %s", F.col("offset_hold")),
    )
    bad = finding(
        summary.filter(F.col("bad_records") > 0),
        BAD_RECORDS_FOUND,
        F.lit(WARNING),
        F.col("bad_records"),
        F.lit(0),
        F.format_string(
            "%d bad record(s) of the half and op topics took no part in the round (table"
            " bad_records)",
            F.col("bad_records"),
        ),
    )
    warned = summary.select("broker", "queue_id", F.explode("warnings").alias("_warning"))
    warnings = finding(
        warned, PICTURE_WARNING, F.lit(WARNING), F.lit(None), F.lit(None), F.col("_warning")
    )
    return holds.unionByName(bad).unionByName(warnings)
