"""The broker's own next check round, per queue, over any number of brokers and queues.

Beside the job's round (``transforms.round``: what is really pending), ``broker_round``
computes what ``TransactionalMessageServiceImpl.check()`` itself will do in its next round
(``transforms.broker_walk``: exact-offset op matching, op records pulled 32 at a time, the
walk into the round's own copies, 4.9 and 5.x parsing). Stages: the half records from h0 and
the op records from p0 of each queue, stored before T, and one start row per queue ->
grouped by (broker, queue_id) -> ``walk_queue`` once per queue (``applyInArrow``: one Arrow
task per queue; the walk is sequential by nature) -> action rows, each with the columns
the caller asked the records to carry (``carried``: the tables' row columns), and one end
row per queue (``broker_actions`` / ``broker_ends`` split them).

Only the records from the committed offsets on travel to the walk: a queue's backlog, not
its history. Nothing here runs a Spark job by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from transforms.broker_state import CQ_FILE_ENTRIES, OP_MSG_PULL_NUMS, BrokerSettings
from transforms.broker_walk import ACTIONS, WalkEnd, walk_queue
from transforms.merge import Facts
from transforms.messages import QUEUE_KEY, stored_before
from transforms.params import RoundParams
from transforms.queue_values import Attach, joined_values

HALF_COLUMNS = (
    "queue_offset",
    "uniq_key",
    "check_times_raw",
    "immunity_raw",
    "prepared_queue_offset_raw",
    "born_timestamp_ms",
    "store_timestamp_ms",
)
OP_COLUMNS = ("queue_offset", "tags", "body", "store_timestamp_ms")
ROUND_END = "round_end"  # ``action`` of a queue's end row (its ``WalkEnd``)

_KIND, _HALF, _OP, _START = "_kind", "half", "op", "start"

# One row per broker action (``END_COLUMNS`` null), then one ``ROUND_END`` row per queue
# (``ACTIONS`` columns null but ``step``, the number of actions before it).
END_COLUMNS = T.StructType(
    [
        T.StructField("h0", T.LongType()),
        T.StructField("p0", T.LongType()),
        T.StructField("h1", T.LongType()),
        T.StructField("p1", T.LongType()),
        T.StructField("half_end", T.LongType()),
        T.StructField("copies", T.LongType()),
        T.StructField("stop", T.StringType()),
        T.StructField("op_next", T.LongType()),
    ]
)
BROKER_ROUND = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("step", T.LongType()),
        T.StructField("half_offset", T.LongType()),
        T.StructField("uniq_key", T.StringType()),
        T.StructField("action", T.StringType()),
        T.StructField("counter", T.IntegerType()),
        T.StructField("op_offset", T.LongType()),
        T.StructField("copy_offset", T.LongType()),
        T.StructField("own_copy", T.BooleanType()),
        T.StructField("record_offset", T.LongType()),
        T.StructField("copy_discarded", T.BooleanType()),
        *END_COLUMNS.fields,
    ]
)
assert BROKER_ROUND.fieldNames()[2 : 2 + len(ACTIONS.names)] == ACTIONS.names


def broker_settings(
    params: RoundParams, cq_file_entries: int = CQ_FILE_ENTRIES, op_window: int = OP_MSG_PULL_NUMS
) -> BrokerSettings:
    """The walk's settings from the round's parameters."""
    return BrokerSettings(
        check_max=params.check_max,
        transaction_timeout_ms=params.transaction_timeout_ms,
        file_reserved_hours=params.file_reserved_hours,
        version=params.broker_version,
        cq_file_entries=cq_file_entries,
        op_window=op_window,
    )


def walk_input(
    half: DataFrame,
    ops: DataFrame,
    starts: DataFrame,
    as_of_ms: int,
    attach: Attach = joined_values,
    carried: Sequence[str] = (),
) -> DataFrame:
    """What the walks read, as one frame keyed by ``broker, queue_id`` with ``_kind``: the
    half records from h0 and the op records from p0 stored before T (their ``HALF_COLUMNS``
    and ``carried`` / ``OP_COLUMNS``), and a start row per queue of ``starts`` (``h0,
    p0``), so that a queue with nothing from its offsets on still gets its end row."""
    before = stored_before(as_of_ms)
    # A queue the round has no start for (no half record, no committed offset) is not walked.
    starts = starts.filter(F.col("h0").isNotNull() & F.col("p0").isNotNull())
    from_h0 = attach(half.filter(before), starts, ["h0"]).filter(
        F.col("queue_offset") >= F.col("h0")
    )
    from_p0 = attach(ops.filter(before), starts, ["p0"]).filter(
        F.col("queue_offset") >= F.col("p0")
    )
    parts = [
        from_h0.select(*QUEUE_KEY, F.lit(_HALF).alias(_KIND), *_half_columns(carried)),
        from_p0.select(*QUEUE_KEY, F.lit(_OP).alias(_KIND), *OP_COLUMNS),
        starts.select(*QUEUE_KEY, F.lit(_START).alias(_KIND), "h0", "p0"),
    ]
    rows = parts[0]
    for part in parts[1:]:
        rows = rows.unionByName(part, allowMissingColumns=True)
    return rows


def _half_columns(carried: Sequence[str]) -> list[str]:
    return [*HALF_COLUMNS, *(name for name in carried if name not in HALF_COLUMNS)]


def round_schema(half: T.StructType, carried: Sequence[str] = ()) -> T.StructType:
    """``BROKER_ROUND`` and the ``carried`` columns of the half records (as typed in
    ``half``): what ``broker_round`` returns."""
    clash = set(carried) & {"queue_offset", *BROKER_ROUND.fieldNames()}
    assert not clash, f"carried columns named like the walk's own: {sorted(clash)}"
    return T.StructType([*BROKER_ROUND.fields, *(half[name] for name in carried)])


def _walk_group(
    settings: BrokerSettings,
    as_of_ms: int,
    schema: pa.Schema,
    carried: Sequence[str],
    key: Any,
    table: pa.Table,
) -> pa.Table:
    """One queue's rows of ``walk_input`` -> its ``round_schema`` rows (runs in a worker)."""
    kind = table[_KIND]
    start = table.filter(pc.equal(kind, _START))
    h0, p0 = start["h0"][0].as_py(), start["p0"][0].as_py()
    half = table.filter(pc.equal(kind, _HALF))
    ops = table.filter(pc.equal(kind, _OP)).select(list(OP_COLUMNS))
    actions, end = walk_queue(half.select(list(HALF_COLUMNS)), ops, h0, p0, as_of_ms, settings)
    # Each action carries its stored record's columns (null when no record was read).
    at = pc.index_in(actions["record_offset"], value_set=half["queue_offset"])
    records = half.select(list(carried)).take(at)
    return _as_rows(schema, key[0].as_py(), key[1].as_py(), actions, records, end)


def _as_rows(
    schema: pa.Schema,
    broker: str,
    queue_id: int,
    actions: pa.Table,
    records: pa.Table,
    end: WalkEnd,
) -> pa.Table:
    """The actions with their queue, their records' columns and null end columns, then the
    queue's end row (null record columns)."""
    n = actions.num_rows
    columns: dict[str, Any] = {
        "broker": pa.array([broker] * n, pa.string()),
        "queue_id": pa.array([queue_id] * n, pa.int32()),
    }
    columns |= {name: actions[name] for name in ACTIONS.names}
    columns |= {name: pa.nulls(n, schema.field(name).type) for name in END_COLUMNS.fieldNames()}
    columns |= {name: records[name] for name in records.column_names}
    ending = {"broker": broker, "queue_id": queue_id, "step": n, "action": ROUND_END}
    ending |= {name: getattr(end, name) for name in END_COLUMNS.fieldNames()}
    tail = pa.Table.from_pylist([ending], schema=schema)
    return pa.concat_tables([pa.table(columns, schema=schema), tail])


def broker_round(
    half: DataFrame,
    ops: DataFrame,
    starts: DataFrame,
    params: RoundParams,
    *,
    cq_file_entries: int = CQ_FILE_ENTRIES,
    op_window: int = OP_MSG_PULL_NUMS,
    attach: Attach = joined_values,
    carried: Sequence[str] = (),
) -> DataFrame:
    """The broker's next round over every queue of ``starts`` at T (``params.as_of_ms``).

    Args:
        half: half records (deduplicated; any store time) with ``HALF_COLUMNS`` (the raw
            property columns of ``transforms.messages.with_half_fields``).
        ops: op records (deduplicated; any store time) with ``OP_COLUMNS``.
        starts: one row per queue with ``h0, p0`` (``transforms.offsets.round_starts``).
        params: T, the broker's settings and version.
        cq_file_entries, op_window: consume-queue entries per file and op records per pull.
        attach: how ``h0``/``p0`` reach the records (``transforms.queue_values``).
        carried: columns of ``half`` each action row carries from the stored record it is
            about (``record_offset``); none may be named like a ``BROKER_ROUND`` column.

    Returns:
        ``round_schema`` rows: per queue its actions in order (``step`` 0, 1, ...), then
        its ``ROUND_END`` row (h1, p1, the copies appended, the stop).
    """
    settings = broker_settings(params, cq_file_entries, op_window)
    schema = round_schema(half.schema, carried)
    arrow_schema = to_arrow_schema(schema)
    rows = walk_input(half, ops, starts, params.as_of_ms, attach, carried)
    as_of_ms = params.as_of_ms
    # A lambda, not functools.partial: applyInArrow infers its calling convention from the
    # function's signature and fails on a partial (pyspark 4.2).
    walked = rows.groupBy(*QUEUE_KEY).applyInArrow(
        lambda key, table: _walk_group(settings, as_of_ms, arrow_schema, carried, key, table),
        schema,
    )
    return walked.select(*schema.fieldNames())


def broker_actions(walked: DataFrame) -> DataFrame:
    """The action rows of ``broker_round``: ``broker, queue_id`` and the ``ACTIONS`` columns."""
    return walked.filter(F.col("action") != ROUND_END).select(*QUEUE_KEY, *ACTIONS.names)


def broker_ends(walked: DataFrame) -> DataFrame:
    """One row per queue: ``broker, queue_id``, the actions taken (``actions``) and the
    ``END_COLUMNS`` of its walk."""
    ends = walked.filter(F.col("action") == ROUND_END)
    return ends.select(*QUEUE_KEY, F.col("step").alias("actions"), *END_COLUMNS.fieldNames())


# The broker's own offsets after its next round, per queue (``broker_offsets``), as the
# queue rows and ``consume_offsets`` carry them.
BROKER_OFFSETS = ("broker_h1", "broker_p1", "broker_copies")


def broker_offsets(walked: DataFrame) -> Facts:
    """``broker_h1``, ``broker_p1`` and ``broker_copies`` of each walked queue (its end row
    of ``broker_round``), as ``Facts`` to merge with per-queue rows (``transforms.merge``):
    one aggregate, no join of the walk with them."""
    ends = broker_ends(walked).select(
        *QUEUE_KEY,
        F.col("h1").alias("broker_h1"),
        F.col("p1").alias("broker_p1"),
        F.col("copies").alias("broker_copies"),
    )
    return Facts(ends, tuple(F.max(name).alias(name) for name in BROKER_OFFSETS))
