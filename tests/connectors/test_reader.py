"""The store reader: consume queues followed into the commit log, rebuilds from the commit log,
bad records, read-only access, and the Spark side (one pass, schemas, several stores)."""

from __future__ import annotations

import builtins
import hashlib
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from connectors.errors import InputError
from connectors.rocketmq import reader
from connectors.rocketmq.combined import SAME_AS_UNIQ_KEY, TRANSACTION_ID
from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets
from connectors.rocketmq.reader import (
    COMBINED_ARROW,
    StoreSpec,
    parse_store_arg,
    read_batches,
    read_stores,
    validate_store,
)
from schemas.messages import (
    COMMITTED_OFFSET,
    PROP_TRANSACTION_ID,
    PROP_UNIQ_KEY,
    PROPERTY_COLUMNS,
    SOURCED_MESSAGE,
)
from schemas.outputs import BAD_RECORD
from simulator import encoding
from simulator.writer import StoreWriter
from tests.connectors import reference
from tests.fixtures import REAL_COMMITLOG

FIXTURE = REAL_COMMITLOG
HALF, OP = reference.HALF, reference.OP


def _write(root: Path, rows: list[dict], **kwargs) -> list[dict]:
    """Write rows; return them with the assigned commitlog_offset/queue_offset/stored_size."""
    with StoreWriter(root, **kwargs) as writer:
        assigned = writer.append(reference.messages_table(rows)).to_pylist()
    return [{**row, **got} for row, got in zip(rows, assigned, strict=True)]


def _key(row) -> tuple:
    return (row["topic"], row["queue_id"], row["queue_offset"])


def _txn(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["topic"] in (HALF, OP)]


def _cq_file(offset: int, entries: int) -> str:
    return f"{(offset // entries) * entries * 20:020d}"


def _table(batches) -> pa.Table:
    batches = list(batches)
    for batch in batches:
        assert batch.schema == COMBINED_ARROW
    return pa.Table.from_batches(batches, schema=COMBINED_ARROW)


def _split(table: pa.Table) -> tuple[list[dict], list[dict]]:
    rows = table.to_pylist()
    return [r for r in rows if r["reason"] is None], [r for r in rows if r["reason"] is not None]


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# --- stores used by the Spark tests (built once) ------------------------------------------------------


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("stores")
    # A: three commit-log files or more; the first one expired (deleted); the op queue's
    # consume queue is missing (rebuilt, because half queue 0 exists).
    a_rows = _write(
        base / "a", reference.txn_rows(240), commitlog_file_size=3000, cq_file_entries=16
    )
    os.remove(base / "a" / "commitlog" / "00000000000000000000")
    shutil.rmtree(base / "a" / "consumequeue" / OP / "0")
    # B: no consume queue at all (scan everything), queue 1, bigger bodies.
    b_rows = _write(
        base / "b",
        reference.txn_rows(120, half_queue=1, op_queue=1, big_body_every=3),
        commitlog_file_size=4096,
        cq_file_entries=1000,
    )
    shutil.rmtree(base / "b" / "consumequeue")
    # C: half queue starting at offset 5 (padded consume-queue head) and an offsets file.
    c_input = reference.txn_rows(30, other_every=0)
    for i, row in enumerate(c_input):
        if row["topic"] == HALF and i == 0:
            row["queue_offset"] = 5
    c_rows = _write(base / "c", c_input, commitlog_file_size=2500, cq_file_entries=8)
    write_consumer_offsets(
        base / "c" / "config" / "consumerOffset.json",
        {HALF_KEY: {0: 7}, OP_KEY: {0: 2}, "X@Y": {0: 1}},
    )
    return base, {"broker-a": a_rows, "broker-b": b_rows, "broker-c": c_rows}


def _expected_messages(rows_by_broker) -> dict[tuple, dict]:
    expected = {}
    for broker, rows in rows_by_broker.items():
        for row in _txn(rows):
            if broker == "broker-a" and row["commitlog_offset"] < 3000:
                continue  # expired with the first commit-log file
            expected[(broker, *_key(row))] = row
    return expected


def test_round_trip_several_stores(spark, stores):
    base, rows_by_broker = stores
    specs = [
        StoreSpec("broker-a", base / "a"),
        StoreSpec("broker-b", base / "b"),
        parse_store_arg(f"broker-c={base / 'c'}"),
    ]
    read = read_stores(spark, specs)
    try:
        # one pass: both outputs are cut from the same persisted DataFrame
        assert read.combined is not None and read.combined.is_cached
        for frame in (read.messages, read.bad_records):
            assert "InMemoryTableScan" in frame._jdf.queryExecution().executedPlan().toString()
        assert read.messages.schema == SOURCED_MESSAGE
        assert read.bad_records.schema == BAD_RECORD
        assert read.committed_offsets.schema == COMMITTED_OFFSET
        messages = [r.asDict() for r in read.messages.collect()]
        bad = [r.asDict() for r in read.bad_records.collect()]
    finally:
        read.unpersist()
    expected = _expected_messages(rows_by_broker)
    got = {(m["broker"], m["topic"], m["queue_id"], m["queue_offset"]): m for m in messages}
    assert len(got) == len(messages)
    assert sorted(got) == sorted(expected)
    for key, m in got.items():
        row = expected[key]
        assert m["commitlog_offset"] == row["commitlog_offset"]
        assert m["stored_size"] == row["stored_size"]
        assert int(m["source"].split("/")[1]) + m["position"] == m["commitlog_offset"]
        assert m["born_host"] == row["born_host"] and m["store_host"] == row["store_host"]
        assert m["properties"] == row["properties"]
        assert m["tags"] == row["properties"].get("TAGS")
        assert m["magic_version"] == row["magic_version"]
        assert m["sys_flag"] & 0xF01 == row["sys_flag"] & 0xF01
        assert (
            m["born_timestamp_ms"],
            m["store_timestamp_ms"],
            m["flag"],
            m["reconsume_times"],
        ) == (
            row["born_timestamp_ms"],
            row["store_timestamp_ms"],
            row["flag"],
            row["reconsume_times"],
        )
        # op bodies always, half bodies only when asked for
        assert m["body"] == (row["body"] if m["topic"] == OP else None)
    # broker-a: the half entries into the expired file are bad records at their CQ entry.
    expired = [
        r for r in rows_by_broker["broker-a"] if r["topic"] == HALF and r["commitlog_offset"] < 3000
    ]
    assert len(expired) > 3
    assert sorted(
        (b["broker"], b["source"], b["position"], b["topic"], b["queue_id"], b["queue_offset"])
        for b in bad
    ) == sorted(
        (
            "broker-a",
            f"consumequeue/{HALF}/0/{_cq_file(r['queue_offset'], 16)}",
            (r["queue_offset"] % 16) * 20,
            HALF,
            0,
            r["queue_offset"],
        )
        for r in expired
    )
    assert all("expired" in b["reason"] and len(b["raw_hex"]) == 40 for b in bad)
    # notes: the rebuilt op queue of A, the scan of B
    assert (
        "broker-a",
        0,
        f"consume queue consumequeue/{OP}/0 missing: queue rebuilt from the commit log",
    ) in read.notes
    assert any(
        n[0] == "broker-b" and n[1] is None and "rebuilt by scanning" in n[2] for n in read.notes
    )
    assert not any(n[0] == "broker-c" for n in read.notes)
    # committed offsets of broker-c only (the others have no offsets file)
    assert sorted(tuple(r) for r in read.committed_offsets.collect()) == [
        ("broker-c", HALF, 0, 7),
        ("broker-c", OP, 0, 2),
    ]
    # broker-c's half queue starts at 5 (padded head skipped, not bad)
    assert min(k[3] for k in got if k[0] == "broker-c" and k[1] == HALF) == 5


def test_half_bodies_and_crc_when_asked(spark, stores):
    base, rows_by_broker = stores
    read = read_stores(
        spark, [StoreSpec("broker-b", base / "b")], include_half_body=True, verify_crc=True
    )
    try:
        messages = {(m.topic, m.queue_offset): m for m in read.messages.collect()}
        assert read.bad_records.count() == 0
    finally:
        read.unpersist()
    rows = _txn(rows_by_broker["broker-b"])
    assert sorted(messages) == sorted((r["topic"], r["queue_offset"]) for r in rows)
    compressed = 0
    for row in rows:
        m = messages[(row["topic"], row["queue_offset"])]
        assert m.body == row["body"]  # decompressed
        compressed += bool(row["sys_flag"] & 1)
    assert compressed >= 5


def test_real_file_through_the_commit_log_scan(spark, tmp_path):
    (tmp_path / "commitlog").mkdir()
    shutil.copy(FIXTURE, tmp_path / "commitlog" / FIXTURE.name)
    read = read_stores(
        spark,
        [parse_store_arg(str(tmp_path))],
        topics=("abc",),
        include_half_body=True,
        verify_crc=True,
    )
    try:
        rows = sorted(
            (r.asDict() for r in read.messages.collect()), key=lambda r: r["queue_offset"]
        )
        assert read.bad_records.count() == 0
    finally:
        read.unpersist()
    assert [r["queue_offset"] for r in rows] == list(range(47))
    assert {r["broker"] for r in rows} == {tmp_path.name}
    data = FIXTURE.read_bytes()
    for r in rows:
        ref = reference.decode_one(data, r["position"])
        assert r["source"] == "commitlog/00000000000000000000"
        assert r["body"] == b"Once, there was a chance for me!"
        assert r["properties"] == ref["properties"] and r["tags"] == "TAG1"
        assert (r["born_host"], r["store_host"]) == (ref["born_host"], ref["store_host"])
    assert read.notes == [
        (tmp_path.name, None, "no consume queue for abc: queues rebuilt by scanning the commit log")
    ]


def test_read_only_store_is_not_changed(spark, stores, tmp_path):
    base, _ = stores
    copy = tmp_path / "ro"
    shutil.copytree(base / "c", copy)
    before = _hashes(copy)
    os.system(f"chmod -R a-w '{copy}'")
    try:
        read = read_stores(spark, [StoreSpec("ro", copy)], verify_crc=True, include_half_body=True)
        assert read.messages.count() > 20
        assert read.bad_records.count() == 0
        read.unpersist()
        assert _hashes(copy) == before  # same files, same bytes
        assert all(not (p.stat().st_mode & 0o222) for p in copy.rglob("*"))
    finally:
        os.system(f"chmod -R u+w '{copy}'")


def test_files_are_only_opened_for_reading(stores, monkeypatch):
    """Every open of a store file (builtins.open, os.open, np.memmap) asks for read only."""
    base, _ = stores
    modes = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, mode="r", *args, **kwargs):
        if str(base) in str(file):
            modes.append(("open", mode))
        return real_open(file, mode, *args, **kwargs)

    def spy_os_open(path, flags, *args, **kwargs):
        if str(base) in str(path):
            modes.append(("os.open", flags))
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    specs = [StoreSpec(n, base / n) for n in ("a", "b", "c")]
    table = _table(read_batches(specs, verify_crc=True, include_half_body=True))
    assert table.num_rows > 250
    assert modes, "no file opened"
    for kind, mode in modes:
        if kind == "open":
            assert set(mode) <= set("rb"), mode
        else:
            assert mode & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND) == 0


# --- bad input (no Spark) -------------------------------------------------------------------------------------


@pytest.fixture()
def damaged(tmp_path):
    rows = _write(
        tmp_path,
        [
            dict(r, topic=HALF, queue_id=0)
            for r in reference.txn_rows(10, other_every=0, compress_every=0)
        ],
        commitlog_file_size=4096,
        cq_file_entries=64,
    )
    cq = tmp_path / "consumequeue" / HALF / "0" / "00000000000000000000"
    data = bytearray(cq.read_bytes())
    struct.pack_into(
        ">qi", data, 2 * 20, rows[2]["commitlog_offset"] + 3, rows[2]["stored_size"]
    )  # middle of a record
    struct.pack_into(
        ">qi", data, 3 * 20, rows[4]["commitlog_offset"], rows[4]["stored_size"]
    )  # another record
    struct.pack_into(">qi", data, 5 * 20, 10**9, rows[5]["stored_size"])  # past the end
    struct.pack_into(">qi", data, 8 * 20, rows[8]["commitlog_offset"], 0)  # invalid size
    cq.write_bytes(bytes(data) + b"\x07\x07\x07")  # and a truncated entry at the end
    log = tmp_path / "commitlog" / "00000000000000000000"
    body_at = rows[6]["commitlog_offset"] + 88 + 1
    raw = bytearray(log.read_bytes())
    raw[body_at] ^= 0x55
    log.write_bytes(bytes(raw))
    return tmp_path, rows


def test_damaged_entries_and_records_are_bad_records(damaged):
    root, rows = damaged
    messages, bad = _split(_table(read_batches([StoreSpec("d", root)], verify_crc=True)))
    assert sorted(m["queue_offset"] for m in messages) == [0, 1, 4, 7, 9]
    cq_name = f"consumequeue/{HALF}/0/00000000000000000000"
    by_position = {(b["source"], b["position"]): b for b in bad}
    assert len(by_position) == len(bad) == 6
    assert "points at no record" in by_position[(cq_name, 40)]["reason"]
    assert "does not match the record" in by_position[(cq_name, 60)]["reason"]
    assert "past the end of the commit log" in by_position[(cq_name, 100)]["reason"]
    assert "invalid size 0" in by_position[(cq_name, 160)]["reason"]
    assert "truncated consume-queue entry" in by_position[(cq_name, 64 * 20)]["reason"]
    crc = by_position[("commitlog/00000000000000000000", rows[6]["commitlog_offset"])]
    assert crc["reason"].startswith("body CRC mismatch")
    assert (crc["topic"], crc["queue_id"], crc["queue_offset"]) == (HALF, 0, 6)
    assert (
        bytes.fromhex(crc["raw_hex"])
        == (root / "commitlog" / "00000000000000000000").read_bytes()[
            rows[6]["commitlog_offset"] :
        ][:64]
    )
    for key in [(cq_name, 40), (cq_name, 60), (cq_name, 100)]:
        b = by_position[key]
        assert (b["topic"], b["queue_id"], b["queue_offset"]) == (HALF, 0, key[1] // 20)
        assert len(b["raw_hex"]) == 40
    # without CRC checking, record 6 is readable
    messages, bad = _split(_table(read_batches([StoreSpec("d", root)])))
    assert sorted(m["queue_offset"] for m in messages) == [0, 1, 4, 6, 7, 9]
    assert len(bad) == 5


def test_corrupt_commit_log_during_a_scan_skips_to_the_next_file(tmp_path):
    rows = _write(tmp_path, reference.txn_rows(60, other_every=0), commitlog_file_size=2048)
    shutil.rmtree(tmp_path / "consumequeue")
    victim = next(r for r in rows if r["commitlog_offset"] > 200 and r["commitlog_offset"] < 1500)
    log = tmp_path / "commitlog" / "00000000000000000000"
    raw = bytearray(log.read_bytes())
    raw[victim["commitlog_offset"] + 4 : victim["commitlog_offset"] + 8] = b"\xde\xad\xbe\xef"
    log.write_bytes(bytes(raw))
    messages, bad = _split(_table(read_batches([StoreSpec("e", tmp_path)])))
    assert [(b["source"], b["position"], b["topic"]) for b in bad] == [
        ("commitlog/00000000000000000000", victim["commitlog_offset"], None)
    ]
    assert "bad magic code 0xDEADBEEF" in bad[0]["reason"]
    lost = {
        _key(r)
        for r in rows
        if r["commitlog_offset"] >= victim["commitlog_offset"] and r["commitlog_offset"] < 2048
    }
    assert {_key(m) for m in messages} == {_key(r) for r in rows} - lost


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.binary(max_size=300), st.binary(max_size=200), st.booleans())
def test_arbitrary_files_give_only_records_and_bad_records(commitlog, cq, other_log, verify):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "commitlog").mkdir()
        (root / "commitlog" / "00000000000000000000").write_bytes(commitlog)
        (root / "commitlog" / f"{max(len(commitlog), 1):020d}").write_bytes(other_log)
        (root / "commitlog" / "junk").write_bytes(b"x")
        qdir = root / "consumequeue" / HALF / "0"
        qdir.mkdir(parents=True)
        (qdir / "00000000000000000000").write_bytes(cq)
        table = _table(
            read_batches([StoreSpec("r", root)], verify_crc=verify, include_half_body=True)
        )
        for row in table.to_pylist():
            assert row["broker"] == "r" and row["source"] and row["position"] is not None
            if row["reason"] is None:
                assert row["topic"] == HALF and row["queue_id"] == 0
            else:
                assert row["reason"] and len(row["raw_hex"]) <= 128


def test_random_consume_queue_over_real_commit_log(tmp_path):
    """Entries pointing anywhere into a real file: every entry is a record or a bad record."""
    (tmp_path / "commitlog").mkdir()
    shutil.copy(FIXTURE, tmp_path / "commitlog" / FIXTURE.name)
    rng = np.random.default_rng(7)
    offsets = np.concatenate([np.arange(47) * 172, rng.integers(-5, 9000, 60)])
    sizes = np.concatenate([np.full(47, 172), rng.integers(-1, 300, 60)])
    qdir = tmp_path / "consumequeue" / "abc" / "0"
    qdir.mkdir(parents=True)
    (qdir / "00000000000000000000").write_bytes(
        encoding.encode_cq_entries(offsets, sizes, np.zeros(len(offsets), np.int64))
    )
    messages, bad = _split(_table(read_batches([StoreSpec("x", tmp_path)], topics=("abc",))))
    assert sorted(m["queue_offset"] for m in messages) == list(range(47))
    assert len(messages) + len(bad) == len(offsets) - int(np.sum((offsets == 0) & (sizes == 0)))


# --- arguments and store validation ------------------------------------------------------------------


def test_parse_store_arg():
    assert parse_store_arg("broker-a=/data/store") == StoreSpec("broker-a", Path("/data/store"))
    assert parse_store_arg("/data/broker-b/") == StoreSpec("broker-b", Path("/data/broker-b"))
    assert parse_store_arg("./x=y/store") == StoreSpec("store", Path("./x=y/store"))
    with pytest.raises(InputError):
        parse_store_arg("name=")


def test_validate_store(tmp_path):
    with pytest.raises(InputError, match=re.escape(str(tmp_path / "missing"))):
        validate_store(StoreSpec("m", tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="neither commitlog/ nor consumequeue/"):
        validate_store(StoreSpec("m", tmp_path / "empty"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        validate_store(StoreSpec("m", tmp_path / "file"))
    (tmp_path / "cq" / "consumequeue").mkdir(parents=True)
    validate_store(StoreSpec("m", tmp_path / "cq"))


def test_read_stores_input_errors_before_any_job(spark, tmp_path):
    (tmp_path / "s" / "commitlog").mkdir(parents=True)
    (tmp_path / "s" / "config").mkdir()
    (tmp_path / "s" / "config" / "consumerOffset.json").write_text("{not json")
    with pytest.raises(InputError, match=r"consumerOffset\.json"):
        read_stores(spark, [StoreSpec("s", tmp_path / "s")])
    with pytest.raises(InputError, match="twice"):
        read_stores(spark, [StoreSpec("s", tmp_path / "s"), StoreSpec("s", tmp_path / "s")])
    with pytest.raises(InputError, match="does not exist"):
        read_stores(spark, [StoreSpec("s", tmp_path / "nope")])


def test_empty_store_reads_nothing(spark, tmp_path):
    (tmp_path / "commitlog").mkdir()
    read = read_stores(spark, [StoreSpec("z", tmp_path)])
    assert (
        read.messages.count() == 0
        and read.bad_records.count() == 0
        and read.committed_offsets.count() == 0
    )
    read.unpersist()


def test_a_read_given_its_plan_does_not_plan_the_stores_again(spark, stores, monkeypatch):
    """The job plans the stores before its session starts (the progress line) and hands
    that plan to the read: the read gives the same records without a second driver pass."""
    base, _ = stores
    specs = [StoreSpec("broker-b", base / "b"), parse_store_arg(f"broker-c={base / 'c'}")]
    plan = reader.plan_stores(specs)
    expected = read_stores(spark, specs)

    def planned_again(*args, **kwargs):
        raise AssertionError("the stores were planned again")

    monkeypatch.setattr(reader, "plan_store", planned_again)
    got = read_stores(spark, specs, plan=plan)
    try:
        for frame in ("messages", "bad_records", "committed_offsets"):
            rows = [sorted(getattr(read, frame).collect(), key=repr) for read in (got, expected)]
            assert rows[0] == rows[1], frame
        assert got.notes == expected.notes and got.offsets_files == expected.offsets_files
    finally:
        got.unpersist()
        expected.unpersist()


def test_lean_records_carry_each_property_as_the_full_read_decodes_it(spark, tmp_path):
    """The lean read's property columns are the full read's map values, the transaction id
    included: the cache carries it as SAME_AS_UNIQ_KEY where a producer set it to UNIQ_KEY
    (most records), and the reader gives UNIQ_KEY back."""
    rows = reference.txn_rows(40, other_every=0)
    for i, row in enumerate(rows):
        props = row["properties"]
        if i % 4 == 0:
            props[PROP_TRANSACTION_ID] = props[PROP_UNIQ_KEY]
        elif i % 4 == 1:
            props[PROP_TRANSACTION_ID] = f"other-{i}"
        elif i % 4 == 2:
            props.pop(PROP_UNIQ_KEY)
            props[PROP_TRANSACTION_ID] = f"lone-{i}"
    _write(tmp_path / "s", rows, commitlog_file_size=4096, cq_file_entries=8)
    spec = [StoreSpec("b", tmp_path / "s")]
    full, lean = read_stores(spark, spec), read_stores(spark, spec, lean=True)
    try:
        by_key = {(r["topic"], r["queue_offset"]): r["properties"] for r in full.messages.collect()}
        got = lean.messages.collect()
        shared = lean.combined.filter(F.col(TRANSACTION_ID) == SAME_AS_UNIQ_KEY).count()
    finally:
        full.unpersist()
        lean.unpersist()
    assert len(got) == len(by_key) == 40
    for record in got:
        props = by_key[(record["topic"], record["queue_offset"])]
        for name, column in PROPERTY_COLUMNS.items():
            assert record[column] == props.get(name), (name, record)
    assert shared == 10  # the records whose transaction id is their UNIQ_KEY
