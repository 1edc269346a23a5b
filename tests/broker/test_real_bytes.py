"""What the simulator claims about a broker's transactional records (docs/simulator.md),
checked on the bytes real brokers wrote (every snapshot of the checked-in fixtures and of
``RMQ_BROKER_RUN``): each test would have caught the simulator getting that record wrong."""

from __future__ import annotations

import functools
from collections import defaultdict
from pathlib import Path

import pytest

from connectors.rocketmq.reader import StoreSpec, read_batches
from schemas.messages import (
    DISCARD_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_PREPARED_QUEUE_OFFSET,
    PROP_REAL_QUEUE_ID,
    PROP_REAL_TOPIC,
    PROP_TRAN_MSG,
    PROP_UNIQ_KEY,
)

SYSFLAG_COMMIT = 0x8


@functools.lru_cache(maxsize=8)
def _records(snapshot: Path) -> tuple[list[dict], int]:
    """Every record of the half, op and discard topics and of the real topics (the store's
    other consume queues), and the number of bad records."""
    topics = sorted(p.name for p in (snapshot / "consumequeue").iterdir() if p.is_dir())
    rows, bad = [], 0
    for batch in read_batches([StoreSpec("real", snapshot)], include_half_body=True, topics=topics):
        for row in batch.to_pylist():
            if row["reason"] is not None:
                bad += 1
            else:
                row["props"] = dict(row["properties"] or [])
                rows.append(row)
    return rows, bad


def _snapshot_of(source: str, recorded) -> Path:
    if source == "error":
        pytest.fail(str(recorded), pytrace=False)
    return recorded.snapshot


def test_every_record_decodes(source, recorded):
    rows, bad = _records(_snapshot_of(source, recorded))
    assert bad == 0
    assert any(r["topic"] == HALF_TOPIC for r in rows)


def test_put_back_copies_keep_the_message_and_reset_flag(source, recorded):
    """Copies (counter set) keep born time, born host, body and sysflag of their
    transaction's original; FLAG and reconsume times are 0 (renewHalfMessageInner). A
    snapshot taken before the first round has no copy yet."""
    rows, _ = _records(_snapshot_of(source, recorded))
    half = [r for r in rows if r["topic"] == HALF_TOPIC]
    by_key = defaultdict(list)
    for r in sorted(half, key=lambda r: r["queue_offset"]):
        by_key[r["props"].get(PROP_UNIQ_KEY)].append(r)
    copies = 0
    for records in by_key.values():
        first = records[0]
        for copy in records[1:]:
            assert PROP_CHECK_TIMES in copy["props"], copy["queue_offset"]
            assert (copy["born_timestamp_ms"], copy["born_host"], copy["body"]) == (
                first["born_timestamp_ms"],
                first["born_host"],
                first["body"],
            )
            assert (copy["flag"], copy["reconsume_times"], copy["sys_flag"]) == (
                0,
                0,
                first["sys_flag"],
            )
            copies += 1
    assert copies == sum(PROP_CHECK_TIMES in r["props"] for r in half)


def test_immunity_copies_point_at_the_original(source, recorded):
    rows, _ = _records(_snapshot_of(source, recorded))
    half = {r["queue_offset"]: r for r in rows if r["topic"] == HALF_TOPIC}
    first_of = {}
    for offset in sorted(half):
        first_of.setdefault(half[offset]["props"].get(PROP_UNIQ_KEY), offset)
    pointing = [r for r in half.values() if PROP_PREPARED_QUEUE_OFFSET in r["props"]]
    for r in pointing:
        key = r["props"][PROP_UNIQ_KEY]
        assert int(r["props"][PROP_PREPARED_QUEUE_OFFSET]) == first_of[key], r["queue_offset"]


def test_client_properties_wait_msg_region_trace_on(source, recorded):
    """The broker's immunity re-put sets WAIT=false and later copies keep it; every other
    half record sent by a producer has the client's WAIT=true (the simulator writes the
    same). Only the harness's old half messages, written through the broker's own
    half-message path with no client, have no WAIT at all. A snapshot taken before the
    first round has no copy of any kind yet; every later one has an immunity copy."""
    rows, _ = _records(_snapshot_of(source, recorded))
    half = [r for r in rows if r["topic"] == HALF_TOPIC]
    reserved_ms = recorded.settings.file_reserved_hours * 3_600_000
    if recorded.number == 1:
        assert not any(PROP_CHECK_TIMES in r["props"] for r in half)
    else:
        assert any(PROP_PREPARED_QUEUE_OFFSET in r["props"] for r in half)
    for r in half:
        if "WAIT" not in r["props"]:
            assert r["store_timestamp_ms"] - r["born_timestamp_ms"] > reserved_ms, r["queue_offset"]
            continue
        expected = "false" if PROP_PREPARED_QUEUE_OFFSET in r["props"] else "true"
        assert r["props"]["WAIT"] == expected, r["queue_offset"]
        client_5x = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}  # the simulator's too
        present = {k: r["props"].get(k) for k in client_5x}
        assert present == (
            client_5x if recorded.version.startswith("5.") else dict.fromkeys(client_5x)
        )


def test_op_records_are_the_brokers_own(source, recorded):
    """Tag d, properties WAIT and TAGS only, born = stored (host and time); bodies: one
    decimal (4.9) or items each followed by a comma (5.x)."""
    rows, _ = _records(_snapshot_of(source, recorded))
    ops = [r for r in rows if r["topic"] == OP_TOPIC]
    assert ops
    for op in ops:
        assert op["tags"] == "d" and set(op["props"]) == {"WAIT", "TAGS"}
        assert op["born_host"] == op["store_host"]
        body = op["body"].decode()
        if recorded.line == "4.9.x":
            assert body.isdigit(), body
        else:
            assert body.endswith(",") and all(x.isdigit() for x in body[:-1].split(",")), body


def test_discards_and_real_messages_carry_the_half_record(source, recorded):
    """A discard copies its half record (body, born time, properties); a committed real
    message has sysflag COMMIT, the half record's properties verbatim (TRAN_MSG, REAL_TOPIC,
    REAL_QID included) and points at a half record of its transaction."""
    rows, _ = _records(_snapshot_of(source, recorded))
    half = [r for r in rows if r["topic"] == HALF_TOPIC]
    born = {r["props"].get(PROP_UNIQ_KEY): (r["born_timestamp_ms"], r["body"]) for r in half}
    clog = {r["commitlog_offset"]: r for r in half}
    for d in (r for r in rows if r["topic"] == DISCARD_TOPIC):
        assert born[d["props"][PROP_UNIQ_KEY]] == (d["born_timestamp_ms"], d["body"])
    real = [r for r in rows if r["topic"] not in (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC)]
    committed = [r for r in real if r["sys_flag"] & SYSFLAG_COMMIT]
    assert committed
    for r in committed:
        source_half = clog.get(r["prepared_transaction_offset"])
        if source_half is None:  # its half record lies before the snapshot's queues
            continue
        assert source_half["props"][PROP_UNIQ_KEY] == r["props"][PROP_UNIQ_KEY]
        for name in (PROP_TRAN_MSG, PROP_REAL_TOPIC, PROP_REAL_QUEUE_ID):
            assert r["props"].get(name) == source_half["props"].get(name), name
