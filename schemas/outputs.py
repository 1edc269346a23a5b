"""Schemas of the output tables (spec section 6) and of reader-level bad records (section 7).

Each output table is a Delta table partitioned by ``run_id``: a rerun of the same round
replaces exactly its own partition. Column order here is the order written.
"""

from __future__ import annotations

from pyspark.sql import types as T

RUN_COLUMNS = [
    T.StructField("run_id", T.StringType(), nullable=False),
    T.StructField("as_of_ms", T.LongType(), nullable=False),
]

# Columns shared by check_requests, discards and pending (spec section 6): first the round's
# own results (what the reference round in tests/ recomputes) ...
ROUND_ROW_FIELDS = [
    T.StructField("broker", T.StringType()),
    T.StructField("queue_id", T.IntegerType()),
    T.StructField("half_offset", T.LongType()),
    T.StructField("commitlog_offset", T.LongType()),
    T.StructField("offset_msg_id", T.StringType()),
    T.StructField("uniq_key", T.StringType()),
    T.StructField("producer_group", T.StringType()),
    T.StructField("real_topic", T.StringType()),
    T.StructField("real_queue_id", T.IntegerType()),
    T.StructField("born_timestamp_ms", T.LongType()),
    T.StructField("store_timestamp_ms", T.LongType()),
    T.StructField("age_ms", T.LongType()),
    T.StructField("check_times", T.IntegerType()),
    T.StructField("immunity_ms", T.LongType()),
]

# ... then what an on-call engineer searches by and acts on (spec section 6, "operator
# columns"). Timestamps are TimestampType (an instant, UTC in Delta), never
# timestamp-without-zone: delta-rs and Delta both read and write it.
OPERATOR_FIELDS = [
    T.StructField("keys", T.ArrayType(T.StringType())),
    T.StructField("tags", T.StringType()),
    T.StructField("transaction_id", T.StringType()),
    T.StructField("born_host", T.StringType()),
    T.StructField("checks_left", T.IntegerType()),
    T.StructField("discard_at_ms", T.LongType()),
    T.StructField("born_at", T.TimestampType()),
    T.StructField("stored_at", T.TimestampType()),
    T.StructField("as_of", T.TimestampType()),
]

HALF_ROW_FIELDS = ROUND_ROW_FIELDS + OPERATOR_FIELDS

# Only present when the run is asked for bodies (--include-body): bodies can hold personal data.
BODY_FIELD = T.StructField("body", T.BinaryType())

# check_requests and discards list every action of the broker's own next round; these say
# for each whether its transaction is really pending (no op record settled it) or which op
# record settled it, and whether the record is a copy this round appends (spec section 6).
BROKER_ACTION_FIELDS = [
    T.StructField("really_pending", T.BooleanType()),
    T.StructField("settled_by_op_offset", T.LongType()),
    T.StructField("own_copy", T.BooleanType()),
]

CHECK_REQUESTS = T.StructType(HALF_ROW_FIELDS + BROKER_ACTION_FIELDS + RUN_COLUMNS)

DISCARDS = T.StructType(
    HALF_ROW_FIELDS + [T.StructField("reason", T.StringType())] + BROKER_ACTION_FIELDS + RUN_COLUMNS
)

# Pending across runs: the earliest earlier run of the output root that had the transaction
# pending (this run when none did) and its T (transforms.pending_history).
PENDING_SINCE_FIELDS = [
    T.StructField("first_seen_run_id", T.StringType()),
    T.StructField("pending_since_ms", T.LongType()),
]

PENDING = T.StructType(
    HALF_ROW_FIELDS + [T.StructField("status", T.StringType())] + PENDING_SINCE_FIELDS + RUN_COLUMNS
)

CONSUME_OFFSETS = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("group", T.StringType()),
        T.StructField("offset_committed", T.LongType()),
        T.StructField("offset_before", T.LongType()),
        T.StructField("offset_after", T.LongType()),
        T.StructField("offset_safe", T.LongType()),
        # Why the queue's offsets must not be installed (null: they may); offset_after
        # and offset_safe are null then (transforms.picture).
        T.StructField("offset_hold", T.StringType()),
        # The broker's own offset after its next round (its copies included), and on the
        # half topic the copies that round appends (transforms.broker_round): what the
        # broker will do, never an offset to install.
        T.StructField("broker_offset_after", T.LongType()),
        T.StructField("broker_copies", T.LongType()),
    ]
    + RUN_COLUMNS
)

# Class names (spec section 5) and pending statuses.
RESOLVED = "resolved"
DISCARD_CHECK_MAX = "discard_check_max"
DISCARD_EXPIRED = "discard_expired"
IMMUNE = "immune"
TOO_YOUNG = "too_young"
CHECK = "check"
NOT_REACHED = "not_reached"
CLASSES = (RESOLVED, CHECK, IMMUNE, DISCARD_CHECK_MAX, DISCARD_EXPIRED, TOO_YOUNG, NOT_REACHED)

# Discard reasons (the `reason` column of discards).
REASON_CHECK_MAX = "check_max"
REASON_EXPIRED = "expired"

# Anomaly severities (the anomalies table), mildest first, and the run_summary column that
# counts each.
INFO, WARNING, CRITICAL = "info", "warning", "critical"
SEVERITIES = (INFO, WARNING, CRITICAL)
ANOMALY_COUNT_COLUMNS = tuple(f"anomalies_{severity}" for severity in SEVERITIES)

# Anomaly kinds of a picture that may be wrong (transforms.picture, docs/spec/anomalies.md):
# they come first in every summary, and --fail-on covers them like any other kind.
OFFSETS_HELD = "offsets_held"
BAD_RECORDS_FOUND = "bad_records"
PICTURE_WARNING = "picture_warning"
PICTURE_KINDS = (OFFSETS_HELD, BAD_RECORDS_FOUND, PICTURE_WARNING)
# The kinds of the round's anomaly rules (transforms.anomalies), and every kind in the
# order the summaries and the report list them.
RECHECK_OF_RESOLVED = "recheck_of_resolved"
IMMUNITY_EXHAUSTS_CHECKS = "immunity_exhausts_checks"
SLOW_PRODUCER = "slow_producer"
OP_BACKLOG = "op_backlog"
OP_QUEUE_GAP = "op_queue_gap"
STALLED_OFFSET = "stalled_offset"
SYSTEM_TOPIC_OR_DELAY = "system_topic_or_delay"
OP_STALL_4_9 = "op_stall_4_9"
UNPARSABLE_IMMUNITY = "unparsable_immunity"
SETTLED_DISCARDS = "settled_discards"
ANOMALY_KINDS = (
    *PICTURE_KINDS,
    RECHECK_OF_RESOLVED,
    IMMUNITY_EXHAUSTS_CHECKS,
    SLOW_PRODUCER,
    OP_BACKLOG,
    OP_QUEUE_GAP,
    STALLED_OFFSET,
    SYSTEM_TOPIC_OR_DELAY,
    OP_STALL_4_9,
    UNPARSABLE_IMMUNITY,
    SETTLED_DISCARDS,
)

# discard_history: why the broker discarded a message (reason: the counter, the age, or
# neither readable) and what became of it since (outcome, in the order the rules of
# transforms.discard_history are tried).
REASON_UNDETERMINED = "undetermined"
DISCARD_REASONS = (REASON_CHECK_MAX, REASON_EXPIRED, REASON_UNDETERMINED)
OUTCOME_UNKNOWN = "unknown"
OUTCOME_PENDING_AGAIN = "pending_again"
OUTCOME_COMMITTED = "committed"
OUTCOME_ROLLED_BACK = "rolled_back"
OUTCOME_ENDED = "ended"
OUTCOME_UNRESOLVED = "unresolved"
OUTCOMES = (
    OUTCOME_UNKNOWN,
    OUTCOME_PENDING_AGAIN,
    OUTCOME_COMMITTED,
    OUTCOME_ROLLED_BACK,
    OUTCOME_ENDED,
    OUTCOME_UNRESOLVED,
)
# An outcome that is final: once a run has seen it, later runs keep the row as it is (the
# evidence may be gone from the store by then). Kept only for the same discard record: a
# row whose identity differs is another broker's record at the same offset (a replaced
# store) and is decided again.
FINAL_OUTCOMES = (OUTCOME_COMMITTED, OUTCOME_ROLLED_BACK, OUTCOME_ENDED)
DISCARD_RECORD_IDENTITY = ("offset_msg_id", "uniq_key", "discarded_at_ms")

RUN_SUMMARY = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("h0", T.LongType()),
        T.StructField("h1", T.LongType()),
        T.StructField("h_safe", T.LongType()),
        T.StructField("p0", T.LongType()),
        T.StructField("p1", T.LongType()),
        T.StructField("p_safe", T.LongType()),
    ]
    + [T.StructField(name, T.LongType()) for name in CLASSES]
    + [
        T.StructField("bad_records", T.LongType()),
        # Rows of discard_history this run wrote for the broker (on each of its queue rows).
        T.StructField("discard_history_rows", T.LongType()),
        # What needs attention first (spec section 6).
        T.StructField("discard_next_round", T.LongType()),
        T.StructField("past_last_check", T.LongType()),
        T.StructField("warnings", T.ArrayType(T.StringType())),
        # The effective settings of the run; inputs, writer and job_version are filled
        # by the writer (null in a notebook's frames), like the two run-time columns.
        T.StructField("check_max", T.IntegerType()),
        T.StructField("transaction_timeout_ms", T.LongType()),
        T.StructField("file_reserved_hours", T.IntegerType()),
        T.StructField("check_interval_ms", T.LongType()),
        T.StructField("inputs", T.ArrayType(T.StringType())),
        T.StructField("writer", T.StringType()),
        T.StructField("job_version", T.StringType()),
        T.StructField("written_at_ms", T.LongType()),
        T.StructField("duration_ms", T.LongType()),
    ]
    # Anomalies of this run on this queue, per severity (the anomalies table); last, so an
    # output root written before them gains them at the end of its schema.
    + [T.StructField(name, T.LongType()) for name in ANOMALY_COUNT_COLUMNS]
    # Why the queue's offsets must not be installed (null: they may); h_safe and p_safe
    # are null then (transforms.picture).
    + [T.StructField("offset_hold", T.StringType())]
    # The broker's discards in its next round of transactions an op record already settled
    # (discards with really_pending false): harmless re-discards.
    + [T.StructField("settled_discards", T.LongType())]
    + RUN_COLUMNS
)

# What a reader reports for a record it could not decode or use (spec section 7).
# `queue_id` is an addition to the spec's columns: it lets run_summary count bad records
# per queue; it is null when the queue is unknown (e.g. a corrupt commit-log region).
BAD_RECORD = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("source", T.StringType()),
        T.StructField("position", T.LongType()),
        T.StructField("topic", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("queue_offset", T.LongType()),
        T.StructField("reason", T.StringType()),
        T.StructField("raw_hex", T.StringType()),
    ]
)

BAD_RECORDS = T.StructType(BAD_RECORD.fields + RUN_COLUMNS)

# One row per record of TRANS_CHECK_MAX_TIME_TOPIC, merged on (broker, discard_offset): not
# partitioned by run, it keeps every discard ever seen (transforms.discard_history).
DISCARD_HISTORY = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("discard_offset", T.LongType()),
        T.StructField("offset_msg_id", T.StringType()),
        T.StructField("uniq_key", T.StringType()),
        T.StructField("producer_group", T.StringType()),
        T.StructField("real_topic", T.StringType()),
        T.StructField("real_queue_id", T.IntegerType()),
        T.StructField("check_times", T.IntegerType()),
        T.StructField("born_timestamp_ms", T.LongType()),
        T.StructField("discarded_at_ms", T.LongType()),
        T.StructField("reason", T.StringType()),
        T.StructField("outcome", T.StringType()),
        T.StructField("ended_before_discard", T.BooleanType()),
        T.StructField("resume_futile", T.BooleanType()),
        T.StructField("resume_topic", T.StringType()),
        T.StructField("resume_offset_msg_id", T.StringType()),
        T.StructField("first_seen_run_id", T.StringType()),
        # What the discarded transaction is searched by (the operator columns of the
        # half-row tables, from the discard record's copied properties); last, so an
        # output root written before them gains them at the end of its schema.
        T.StructField("keys", T.ArrayType(T.StringType())),
        T.StructField("tags", T.StringType()),
        T.StructField("transaction_id", T.StringType()),
    ]
    + RUN_COLUMNS
)

# One row per finding of the anomaly rules (transforms.anomalies, docs/spec/anomalies.md).
# uniq_key, half_offset and op_offset are null for queue- or group-level findings.
ANOMALY = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("kind", T.StringType()),
        T.StructField("severity", T.StringType()),
        T.StructField("uniq_key", T.StringType()),
        T.StructField("producer_group", T.StringType()),
        T.StructField("half_offset", T.LongType()),
        T.StructField("op_offset", T.LongType()),
        T.StructField("value", T.DoubleType()),
        T.StructField("threshold", T.DoubleType()),
        T.StructField("detail", T.StringType()),
    ]
)

ANOMALIES = T.StructType(ANOMALY.fields + RUN_COLUMNS)

CHECK_REQUESTS_TABLE = "check_requests"
DISCARDS_TABLE = "discards"
PENDING_TABLE = "pending"
CONSUME_OFFSETS_TABLE = "consume_offsets"
RUN_SUMMARY_TABLE = "run_summary"
BAD_RECORDS_TABLE = "bad_records"
DISCARD_HISTORY_TABLE = "discard_history"
# Tables merged on a key instead of partitioned by run (they must not grow per run).
DISCARD_HISTORY_MERGE_KEYS = ("broker", "discard_offset")
ANOMALIES_TABLE = "anomalies"

# Write order: the offsets table is committed last, so it never moves ahead of the
# tables that justify it.
TABLE_SCHEMAS: dict[str, T.StructType] = {
    BAD_RECORDS_TABLE: BAD_RECORDS,
    CHECK_REQUESTS_TABLE: CHECK_REQUESTS,
    DISCARDS_TABLE: DISCARDS,
    PENDING_TABLE: PENDING,
    RUN_SUMMARY_TABLE: RUN_SUMMARY,
    DISCARD_HISTORY_TABLE: DISCARD_HISTORY,
    ANOMALIES_TABLE: ANOMALIES,
    CONSUME_OFFSETS_TABLE: CONSUME_OFFSETS,
}


def half_row_schema(include_body: bool) -> T.StructType:
    """The row columns of check_requests/discards/pending, with ``body`` when asked for."""
    return T.StructType(HALF_ROW_FIELDS + ([BODY_FIELD] if include_body else []))


def table_schema(table: str, include_body: bool = False) -> T.StructType:
    """The full schema of an output table (``body`` added to the half-row tables on request)."""
    schema = TABLE_SCHEMAS[table]
    if not include_body or table not in (CHECK_REQUESTS_TABLE, DISCARDS_TABLE, PENDING_TABLE):
        return schema
    position = len(HALF_ROW_FIELDS)
    return T.StructType(schema.fields[:position] + [BODY_FIELD] + schema.fields[position:])
