"""The broker's own round as rows of the tables (spec section 6): its checks and discards
as the half rows ``transforms.outputs`` shapes into check_requests and discards, the columns
that say whether each one's transaction is really pending, and the re-discards of settled
transactions per queue. The rows come from ``transforms.broker_round`` (one per action,
each with its record's columns); nothing here runs a Spark job."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.outputs import DISCARD_CHECK_MAX, DISCARD_EXPIRED
from transforms.messages import QUEUE_KEY
from transforms.resolve import SETTLED_BY

# What each action of the broker's round carries from the record it is about: the
# columns the half rows of check_requests and discards read (``transforms.outputs``),
# besides the offset, key and counter the action itself has, and the op that settled the
# record's transaction.
BROKER_ROW_COLUMNS = (
    "commitlog_offset",
    "store_host",
    "producer_group",
    "real_topic",
    "real_queue_id",
    "born_timestamp_ms",
    "store_timestamp_ms",
    "age_ms",
    "immunity_ms",
    "keys_raw",
    "tags",
    "transaction_id",
    "born_host",
    "body",
    SETTLED_BY,
)

# A copy the broker's round appends is not stored yet: no commit-log offset, no store time.
_UNSTORED = ("commitlog_offset", "store_timestamp_ms")


def broker_action_rows(broker: DataFrame, actions: tuple[str, ...]) -> DataFrame:
    """The broker's actions of ``actions`` (``transforms.broker_round``; the action names
    are the statuses') as the rows the half-row tables are shaped from
    (``transforms.outputs``): ``status``, ``counter_after`` and the columns of the record
    each is about, without a commit-log offset or store time for a copy of this round."""
    own = F.col("own_copy")
    carried = [
        F.when(~own, F.col(name)).alias(name) if name in _UNSTORED else F.col(name)
        for name in BROKER_ROW_COLUMNS
    ]
    return broker.filter(F.col("action").isin(*actions)).select(
        *QUEUE_KEY,
        F.col("half_offset").alias("queue_offset"),
        "uniq_key",
        F.col("action").alias("status"),
        F.col("counter").alias("counter_after"),
        "own_copy",
        "copy_discarded",
        *carried,
    )


def broker_view_columns() -> list[Column]:
    """``BROKER_ACTION_FIELDS``: really pending (no op settled the transaction), the op
    that settled it, and whether the record is a copy this round appends."""
    settled = F.col(SETTLED_BY)
    return [settled.isNull().alias("really_pending"), settled.alias(SETTLED_BY), F.col("own_copy")]


def settled_discard_counts(broker: DataFrame) -> DataFrame:
    """Per walked queue, ``settled_discards``: the broker's discards of transactions an op
    record already settled."""
    settled = (
        F.col("action").isin(DISCARD_CHECK_MAX, DISCARD_EXPIRED) & F.col(SETTLED_BY).isNotNull()
    )
    return broker.groupBy(*QUEUE_KEY).agg(F.count(F.when(settled, 1)).alias("settled_discards"))
