"""Concise builders of input records for the round's tests.

Records are plain dicts with exactly the columns of ``schemas.messages.SOURCED_MESSAGE``,
so the same rows feed both ``transforms.round.reconcile`` (through :func:`frame`) and the
pure-Python reference ``tests.reference`` (directly). Every field is filled
deterministically: the commit-log offset is derived from the topic and queue offset unless
given, the provenance is the commit-log file and the byte position (= commit-log offset),
as a binary store reader would report them.

Times are relative to the fixed as-of instant ``T``: ``age_ms`` is ``T - born``, so
``half(0, 60_000)`` is the spec's "0: 60 s".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from jobs.config import load_config
from jobs.pipeline import round_params
from schemas.messages import (
    COMMITTED_OFFSET,
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_IMMUNITY_SECONDS,
    PROP_PREPARED_QUEUE_OFFSET,
    PROP_PRODUCER_GROUP,
    PROP_REAL_QUEUE_ID,
    PROP_REAL_TOPIC,
    PROP_TAGS,
    PROP_TRAN_MSG,
    PROP_UNIQ_KEY,
    SOURCED_MESSAGE,
)
from transforms.params import RoundParams

T = 1_700_000_000_000
RUN_ID = "test-run"
BROKER = "b"
STORE_HOST = "10.0.0.1:10911"
BORN_HOST = "10.0.0.2:53412"
COMMITLOG_SOURCE = "commitlog/00000000000000000000"

# MessageSysFlag.TRANSACTION_PREPARED_TYPE: how the broker flags a half message.
_PREPARED_SYS_FLAG = 0x4

FIELDS = tuple(SOURCED_MESSAGE.fieldNames())


def params(**overrides: Any) -> RoundParams:
    """Round parameters at ``T`` with the job's defaults (conf/default.toml), unless
    overridden."""
    values = asdict(round_params(load_config(None, {}), T, RUN_ID))
    values.update(overrides)
    return RoundParams(**values)


def _store_time(age_ms: int, stored_age_ms: int | None, as_of: int) -> int:
    """Stored just after birth (born + 1), but never at or after ``as_of`` unless asked."""
    if stored_age_ms is not None:
        return as_of - stored_age_ms
    return min(as_of - age_ms + 1, as_of - 1)


def _text(value: int | str | None) -> str | None:
    return None if value is None else str(value)


def half(
    offset: int,
    age_ms: int,
    *,
    key: str | None = None,
    counter: int | str | None = None,
    immunity: int | str | None = None,
    prepared: int | str | None = None,
    broker: str = BROKER,
    queue: int = 0,
    stored_age_ms: int | None = None,
    group: str | None = "PG_ORDERS",
    real_topic: str | None = "ORDERS",
    real_qid: int | str | None = 0,
    commitlog: int | None = None,
    source: str | None = None,
    position: int | None = None,
    store_host: str = STORE_HOST,
    extra_properties: Mapping[str, str] | None = None,
    as_of: int = T,
) -> dict[str, Any]:
    """A half record (topic ``RMQ_SYS_TRANS_HALF_TOPIC``) at queue offset ``offset``.

    ``counter``, ``immunity``, ``prepared`` and ``real_qid`` become the properties
    TRANSACTION_CHECK_TIMES, CHECK_IMMUNITY_TIME_IN_SECONDS, TRAN_PREPARED_QUEUE_OFFSET and
    REAL_QID as given (strings pass through unchanged, so unparsable values can be built);
    ``None`` leaves the property out. ``stored_age_ms`` is ``T - store time`` (0 or negative
    = stored at or after ``T``).
    """
    properties: dict[str, str] = {PROP_TRAN_MSG: "true"}
    optional = {
        PROP_UNIQ_KEY: key,
        PROP_PRODUCER_GROUP: group,
        PROP_REAL_TOPIC: real_topic,
        PROP_REAL_QUEUE_ID: _text(real_qid),
        PROP_CHECK_TIMES: _text(counter),
        PROP_IMMUNITY_SECONDS: _text(immunity),
        PROP_PREPARED_QUEUE_OFFSET: _text(prepared),
    }
    properties.update({name: value for name, value in optional.items() if value is not None})
    properties.update(extra_properties or {})
    commitlog_offset = (
        commitlog if commitlog is not None else 1_000_000 + 1_000 * offset + 100 * queue
    )
    return {
        "broker": broker,
        "topic": HALF_TOPIC,
        "queue_id": queue,
        "queue_offset": offset,
        "commitlog_offset": commitlog_offset,
        "stored_size": 300,
        "sys_flag": _PREPARED_SYS_FLAG,
        "body_crc": 0,
        "flag": 0,
        "born_timestamp_ms": as_of - age_ms,
        "born_host": BORN_HOST,
        "store_timestamp_ms": _store_time(age_ms, stored_age_ms, as_of),
        "store_host": store_host,
        "reconsume_times": 0,
        "prepared_transaction_offset": 0,
        "tags": None,
        "properties": properties,
        "body": b"order payload",
        "magic_version": 2,
        "source": source if source is not None else COMMITLOG_SOURCE,
        "position": position if position is not None else commitlog_offset,
    }


def op(
    offset: int,
    body: bytes | str | None,
    *,
    tag: str | None = "d",
    broker: str = BROKER,
    queue: int = 0,
    age_ms: int = 1_000,
    stored_age_ms: int | None = None,
    commitlog: int | None = None,
    source: str | None = None,
    position: int | None = None,
    store_host: str = STORE_HOST,
    as_of: int = T,
) -> dict[str, Any]:
    """An op record (topic ``RMQ_SYS_TRANS_OP_HALF_TOPIC``) at queue offset ``offset``.

    ``body`` is the op body as written by the broker (``"12"`` on 4.9, ``"7,9,8,"`` on
    5.1+); a ``str`` is encoded as UTF-8. ``tag`` is the ``tags`` column (and property TAGS).
    """
    encoded = body.encode("utf-8") if isinstance(body, str) else body
    commitlog_offset = (
        commitlog if commitlog is not None else 5_000_000 + 1_000 * offset + 100 * queue
    )
    return {
        "broker": broker,
        "topic": OP_TOPIC,
        "queue_id": queue,
        "queue_offset": offset,
        "commitlog_offset": commitlog_offset,
        "stored_size": 120,
        "sys_flag": 0,
        "body_crc": 0,
        "flag": 0,
        "born_timestamp_ms": as_of - age_ms,
        "born_host": STORE_HOST,
        "store_timestamp_ms": _store_time(age_ms, stored_age_ms, as_of),
        "store_host": store_host,
        "reconsume_times": 0,
        "prepared_transaction_offset": 0,
        "tags": tag,
        "properties": {PROP_TAGS: tag} if tag is not None else {},
        "body": encoded,
        "magic_version": 2,
        "source": source if source is not None else COMMITLOG_SOURCE,
        "position": position if position is not None else commitlog_offset,
    }


def frame(spark: SparkSession, rows: Iterable[Mapping[str, Any]]) -> DataFrame:
    """A ``SOURCED_MESSAGE`` DataFrame of the given record dicts (may be empty)."""
    return spark.createDataFrame(
        [tuple(row[name] for name in FIELDS) for row in rows], SOURCED_MESSAGE
    )


def committed_rows(
    h0: int | None, p0: int | None, *, broker: str = BROKER, queue: int = 0
) -> list[tuple[str, str, int, int]]:
    """Committed-offset tuples ``(broker, topic, queue_id, offset)``; ``None`` = key missing."""
    rows = []
    if h0 is not None:
        rows.append((broker, HALF_TOPIC, queue, h0))
    if p0 is not None:
        rows.append((broker, OP_TOPIC, queue, p0))
    return rows


def committed(spark: SparkSession, rows: Iterable[tuple[str, str, int, int]]) -> DataFrame:
    """A ``COMMITTED_OFFSET`` DataFrame of ``(broker, topic, queue_id, offset)`` tuples."""
    return spark.createDataFrame(list(rows), COMMITTED_OFFSET)


def offsets(
    spark: SparkSession, h0: int | None, p0: int | None, broker: str = BROKER, queue: int = 0
) -> DataFrame:
    """The committed offsets of one queue: ``h0`` (half topic) and ``p0`` (op topic)."""
    return committed(spark, committed_rows(h0, p0, broker=broker, queue=queue))
