"""The canonical decoded-message schema (spec section 2) and the constants around it.

Every source (binary broker store, Parquet, JSON, Delta) produces exactly ``MESSAGE``
plus the two provenance columns of ``PROVENANCE``; the column names are the contract.
Times are epoch milliseconds.
"""

from __future__ import annotations

from pyspark.sql import types as T

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
QueueKey = tuple[str, str, int]  # (broker, topic, queue id)
TRANS_GROUP = "CID_RMQ_SYS_TRANS"
REMOVE_TAG = "d"

# Property names (RocketMQ MessageConst).
PROP_UNIQ_KEY = "UNIQ_KEY"
PROP_PRODUCER_GROUP = "PGROUP"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QUEUE_ID = "REAL_QID"
PROP_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROP_IMMUNITY_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROP_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROP_TAGS = "TAGS"
PROP_KEYS = "KEYS"
PROP_TRAN_MSG = "TRAN_MSG"
PROP_TRANSACTION_ID = "__transactionId__"
# Delayed delivery (a delay level, 4.x) and timer messages (5.x): a half record carrying one
# loops between the schedule/timer topic and the half topic (RocketMQ #1540).
PROP_DELAY_LEVEL = "DELAY"
PROP_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROP_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROP_TIMER_DELAY_MS = "TIMER_DELAY_MS"

MESSAGE = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("queue_offset", T.LongType()),
        T.StructField("commitlog_offset", T.LongType()),
        T.StructField("stored_size", T.IntegerType()),
        T.StructField("sys_flag", T.IntegerType()),
        T.StructField("body_crc", T.IntegerType()),
        T.StructField("flag", T.IntegerType()),
        T.StructField("born_timestamp_ms", T.LongType()),
        T.StructField("born_host", T.StringType()),
        T.StructField("store_timestamp_ms", T.LongType()),
        T.StructField("store_host", T.StringType()),
        T.StructField("reconsume_times", T.IntegerType()),
        T.StructField("prepared_transaction_offset", T.LongType()),
        T.StructField("tags", T.StringType()),
        T.StructField("properties", T.MapType(T.StringType(), T.StringType())),
        T.StructField("body", T.BinaryType()),
        T.StructField("magic_version", T.IntegerType()),
    ]
)

# Where a record came from: the file (relative to the store root, or the input file)
# and the byte position in it (row number for tabular input). Carried through the
# round so that a record found unusable later (duplicate, bad property) can still be
# reported as a bad record with its place.
PROVENANCE = T.StructType(
    [
        T.StructField("source", T.StringType()),
        T.StructField("position", T.LongType()),
    ]
)

# What every reader returns for readable records.
SOURCED_MESSAGE = T.StructType(MESSAGE.fields + PROVENANCE.fields)

MESSAGE_COLUMNS = tuple(MESSAGE.fieldNames())

# The half properties the round reads, and the column each becomes (raw text; empty means
# absent, spec section 2).
PROPERTY_COLUMNS: dict[str, str] = {
    PROP_UNIQ_KEY: "uniq_key",
    PROP_PRODUCER_GROUP: "producer_group",
    PROP_REAL_TOPIC: "real_topic",
    PROP_REAL_QUEUE_ID: "real_queue_id_raw",
    PROP_CHECK_TIMES: "check_times_raw",
    PROP_IMMUNITY_SECONDS: "immunity_raw",
    PROP_PREPARED_QUEUE_OFFSET: "prepared_queue_offset_raw",
    # Not used by the round itself: what the operator columns of the output tables show.
    PROP_KEYS: "keys_raw",
    PROP_TRANSACTION_ID: "transaction_id",
    # Not used by the round: what the anomaly rule system_topic_or_delay reads.
    PROP_DELAY_LEVEL: "delay_level_raw",
    PROP_TIMER_DELIVER_MS: "timer_deliver_ms_raw",
    PROP_TIMER_DELAY_SEC: "timer_delay_sec_raw",
    PROP_TIMER_DELAY_MS: "timer_delay_ms_raw",
}

# What the store reader gives the job: the sourced message columns with the properties the
# round reads as plain columns in place of the properties map, and without the columns the
# round never reads. Converting and caching a map per record was most of the reader's cost.
# Message columns no step of the round and no output table reads.
UNUSED_BY_ROUND = (
    "properties",
    "stored_size",
    "sys_flag",
    "body_crc",
    "flag",
    "reconsume_times",
    "prepared_transaction_offset",
    "magic_version",
)

# The round's uniqueness flag (a column of the store reader's lean records): true for a
# record whose queue offset cannot repeat (reached through a consume queue), so the round
# skips its duplicate check; records without the column are checked.
OFFSET_UNIQUE = "offset_unique"

# Kept beside each record of the store's mirror (``connectors.mirror``), derived once when
# the record is mirrored (``transforms.bad_records.may_be_bad``): whether the round may find
# a bad record in it. A run reads only the flagged records for its bad records (null: a row
# mirrored before the column existed, read like a flagged one).
MAY_BE_BAD = "may_be_bad"
MAY_BE_BAD_FIELDS = T.StructType([T.StructField(MAY_BE_BAD, T.BooleanType())])

LEAN_MESSAGE = T.StructType(
    [f for f in SOURCED_MESSAGE.fields if f.name not in UNUSED_BY_ROUND]
    + [T.StructField(name, T.StringType()) for name in PROPERTY_COLUMNS.values()]
)

# What the discard history reads of a business queue (``connectors.rocketmq.discards``): each committed
# message's place, transaction bits, store time and the commit-log offset of the half
# record it commits (``transforms.discard_history.commit_times``). A business queue holds
# far more messages than the transactions discarded: its properties, body and hosts are
# not decoded at all.
COMMIT_COLUMNS = (
    "broker",
    "topic",
    "queue_id",
    "queue_offset",
    "sys_flag",
    "store_timestamp_ms",
    "prepared_transaction_offset",
    "source",
    "position",
)
COMMIT_MESSAGE = T.StructType([f for f in SOURCED_MESSAGE.fields if f.name in COMMIT_COLUMNS])
UNUSED_BY_COMMITS = tuple(name for name in MESSAGE_COLUMNS if name not in COMMIT_MESSAGE.names)

# Committed consume offsets of group CID_RMQ_SYS_TRANS, one row per (broker, topic, queue),
# as read from config/consumerOffset.json (the value is the next offset to process).
COMMITTED_OFFSET = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("offset", T.LongType()),
    ]
)
