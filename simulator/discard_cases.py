"""The broker's actions around a discard, as message rows for ``simulator.writer.StoreWriter``:
what hand-built stores of the discard history need and the timeline simulation does not
produce on purpose (a resume by an operator, a commit that arrives after the discard, a real
queue deleted since).

Rows are dicts with the columns of ``schemas.messages.MESSAGE`` that the writer takes; a row
given to ``commit_of`` or ``op_naming`` must already carry what the writer assigned
(``commitlog_offset``, ``queue_offset``). RocketMQ references: ``docs/broker-check.md`` §5
(``resolveDiscardMsg``, ``resumeCheckHalfMessage``) and §1.2 (commit and op records).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from schemas.messages import (
    DISCARD_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_REAL_QUEUE_ID,
    PROP_REAL_TOPIC,
    PROP_TAGS,
    PROP_TRAN_MSG,
    REMOVE_TAG,
)

# MessageSysFlag.TRANSACTION_COMMIT_TYPE: the transaction bits of a committed real message.
COMMIT_TYPE = 0x8

Row = dict[str, Any]


def _copy(row: Mapping[str, Any], topic: str, store_ms: int, **properties: str) -> Row:
    """A copy of ``row`` as the broker writes one: same born time, hosts, body and
    properties (``properties`` override), a new topic, queue 0 and store time."""
    copied = {
        key: value
        for key, value in row.items()
        if key not in ("commitlog_offset", "queue_offset", "stored_size")
    }
    return {
        **copied,
        "topic": topic,
        "queue_id": 0,
        "queue_offset": None,
        "store_timestamp_ms": store_ms,
        "properties": {**row["properties"], **properties},
    }


def discard_of(half: Mapping[str, Any], store_ms: int, counter: int | None = None) -> Row:
    """``resolveDiscardMsg``: the half record copied to ``TRANS_CHECK_MAX_TIME_TOPIC`` queue 0
    with all its properties; ``counter`` sets TRANSACTION_CHECK_TIMES (a discard by age
    carries the incremented counter)."""
    extra = {PROP_CHECK_TIMES: str(counter)} if counter is not None else {}
    return _copy(half, DISCARD_TOPIC, store_ms, **extra)


def resumed_copy(discard: Mapping[str, Any], store_ms: int) -> Row:
    """``resumeCheckHalfMessage`` (admin request 323): the discard record copied back into
    the half topic queue 0 with TRANSACTION_CHECK_TIMES=0; it keeps its born time."""
    return _copy(discard, HALF_TOPIC, store_ms, **{PROP_CHECK_TIMES: "0"})


def commit_of(half: Mapping[str, Any], store_ms: int) -> Row:
    """The real message of a commit of ``half`` (``EndTransactionProcessor``): topic and
    queue from REAL_TOPIC / REAL_QID, sysflag COMMIT, prepared-transaction offset = the half
    record's commit-log offset, TRAN_MSG dropped."""
    properties = {k: v for k, v in half["properties"].items() if k != PROP_TRAN_MSG}
    row = _copy(half, half["properties"][PROP_REAL_TOPIC], store_ms)
    return {
        **row,
        "queue_id": int(half["properties"][PROP_REAL_QUEUE_ID]),
        "sys_flag": int(half.get("sys_flag") or 0) | COMMIT_TYPE,
        "prepared_transaction_offset": half["commitlog_offset"],
        "properties": properties,
    }


def op_naming(halves: Iterable[Mapping[str, Any]], store_ms: int, broker_host: str) -> Row:
    """An op record (5.x batch body) naming the queue offsets of ``halves``."""
    body = "".join(f"{row['queue_offset']}," for row in halves)
    return {
        "topic": OP_TOPIC,
        "queue_id": 0,
        "born_timestamp_ms": store_ms,
        "store_timestamp_ms": store_ms,
        "born_host": broker_host,
        "store_host": broker_host,
        "properties": {PROP_TAGS: REMOVE_TAG},
        "body": body.encode(),
    }


def delete_queue(root: Path, topic: str, queue_id: int) -> None:
    """A real queue deleted since (topic deleted, or its consume queue removed): its
    consume-queue folder is gone, its records stay in the commit log."""
    shutil.rmtree(Path(root) / "consumequeue" / topic / str(queue_id))
