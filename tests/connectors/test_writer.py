"""StoreWriter: byte layout (checked against the real RocketMQ file and the naive reference
decoder), BLANK fillers, queue offsets, consume-queue entries."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from connectors.rocketmq import codec
from simulator.writer import StoreWriter
from tests.connectors import reference
from tests.fixtures import REAL_COMMITLOG

FIXTURE = REAL_COMMITLOG


def _fixture_table() -> pa.Table:
    buf = codec.open_read_only(FIXTURE)
    return codec.decode_records(buf, codec.walk_records(buf).positions, body_topics=None).records


def _cq(path: Path) -> list[tuple[int, int, int]]:
    data = path.read_bytes()
    return [struct.unpack_from(">qiq", data, i) for i in range(0, len(data), 20)]


@pytest.mark.parametrize("raw_properties", [False, True])
def test_reproduces_the_real_file_byte_for_byte(tmp_path, raw_properties):
    table = _fixture_table()
    if raw_properties:
        data = FIXTURE.read_bytes()
        raw = [
            reference.decode_one(data, p)["props_raw"] for p in table.column("position").to_pylist()
        ]
        table = table.drop_columns(["properties"]).append_column(
            "properties_raw", pa.array(raw, pa.binary())
        )
    with StoreWriter(tmp_path, commitlog_file_size=8192, cq_file_entries=64) as writer:
        assigned = writer.append(table)
        # a 48th record does not fit in the 108 bytes left: BLANK filler, next file
        extra = writer.append(table.slice(0, 1).drop_columns(["queue_offset"]))
    assert (tmp_path / "commitlog" / "00000000000000000000").read_bytes() == FIXTURE.read_bytes()
    assert assigned.column("commitlog_offset").to_pylist() == [172 * i for i in range(47)]
    assert assigned.column("queue_offset").to_pylist() == list(range(47))
    assert assigned.column("stored_size").to_pylist() == [172] * 47
    assert extra.to_pylist() == [{"commitlog_offset": 8192, "queue_offset": 47, "stored_size": 172}]
    entries = _cq(tmp_path / "consumequeue" / "abc" / "0" / "00000000000000000000")
    tag_hash = reference.java_hash("TAG1")
    assert entries[:48] == [(172 * i, 172, tag_hash) for i in range(47)] + [(8192, 172, tag_hash)]
    assert entries[48:] == [(0, 0, 0)] * 16


def _row(i: int, topic: str = "T", body: bytes = b"x", **extra) -> dict:
    return {
        "topic": topic,
        "queue_id": 0,
        "born_timestamp_ms": i,
        "store_timestamp_ms": i,
        "body": body,
        "born_host": "1.2.3.4:5",
        "store_host": "5.6.7.8:10911",
        "properties": {"TAGS": "d"},
        **extra,
    }


def test_blank_filler_leaves_8_bytes_rule(tmp_path):
    one = reference.messages_table([_row(0)])
    with StoreWriter(tmp_path / "probe", commitlog_file_size=4096) as writer:
        record = writer.append(one).column("stored_size")[0].as_py()
    # Room for exactly two records plus 8 bytes: both fit, the third goes to the next file.
    file_size = 2 * record + 8
    with StoreWriter(tmp_path / "a", commitlog_file_size=file_size) as writer:
        got = writer.append(reference.messages_table([_row(i) for i in range(3)]))
    assert got.column("commitlog_offset").to_pylist() == [0, record, file_size]
    first = (tmp_path / "a" / "commitlog" / "00000000000000000000").read_bytes()
    assert struct.unpack_from(">iI", first, 2 * record) == (8, 0xCBD43194)
    # One byte less: the second record no longer fits (it would leave 7 bytes).
    with StoreWriter(tmp_path / "b", commitlog_file_size=file_size - 1) as writer:
        got = writer.append(reference.messages_table([_row(i) for i in range(3)]))
    assert got.column("commitlog_offset").to_pylist() == [0, file_size - 1, 2 * (file_size - 1)]
    first = (tmp_path / "b" / "commitlog" / "00000000000000000000").read_bytes()
    assert struct.unpack_from(">iI", first, record) == (file_size - 1 - record, 0xCBD43194)
    assert len(first) == file_size - 1  # files have their full size, like the broker's


def test_round_trip_through_reference_decoder(tmp_path):
    rows = reference.txn_rows(300, big_body_every=5)
    with StoreWriter(tmp_path, commitlog_file_size=6000, cq_file_entries=25) as writer:
        first = writer.append(reference.messages_table(rows[:120]))
        second = writer.append(reference.messages_table(rows[120:]))
    assigned = pa.concat_tables([first, second]).to_pylist()
    files = sorted((tmp_path / "commitlog").iterdir())
    assert len(files) > 5
    decoded = {}
    for path in files:
        data = path.read_bytes()
        for pos in reference.walk(data):
            record = reference.decode_one(data, pos)
            decoded[int(path.name) + pos] = record
    assert sorted(decoded) == [a["commitlog_offset"] for a in assigned]
    next_offset: dict[tuple[str, int], int] = {}
    for row, got in zip(rows, assigned, strict=True):
        record = decoded[got["commitlog_offset"]]
        key = (row["topic"], row["queue_id"])
        assert record["queue_offset"] == got["queue_offset"] == next_offset.get(key, 0)
        next_offset[key] = got["queue_offset"] + 1
        assert record["commitlog_offset"] == got["commitlog_offset"]
        assert record["stored_size"] == got["stored_size"]
        assert record["topic"] == row["topic"]
        assert record["properties"] == row["properties"]
        assert record["born_host"] == row["born_host"] and record["store_host"] == row["store_host"]
        assert record["magic_version"] == row["magic_version"]
        assert record["body_crc_ok"]
        body = record["stored_body"]
        if row["sys_flag"] & 1:
            body = codec.decompress_body(body, record["sys_flag"])
        assert body == row["body"]
        assert record["sys_flag"] & 0x30 == (0x10 if "[" in row["born_host"] else 0) | (
            0x20 if "[" in row["store_host"] else 0
        )
        for name in ("flag", "born_timestamp_ms", "store_timestamp_ms", "reconsume_times"):
            assert record[name] == row[name]
    # Consume queues: one entry per record, in queue order, across files of 25 entries.
    for (topic, queue), count in next_offset.items():
        qdir = tmp_path / "consumequeue" / topic / str(queue)
        entries = [e for f in sorted(qdir.iterdir()) for e in _cq(f)]
        assert [f.name for f in sorted(qdir.iterdir())] == [
            f"{i * 500:020d}" for i in range((count + 24) // 25)
        ]
        wanted = [
            (a["commitlog_offset"], a["stored_size"])
            for r, a in zip(rows, assigned, strict=True)
            if (r["topic"], r["queue_id"]) == (topic, queue)
        ]
        assert [(o, s) for o, s, _ in entries[:count]] == wanted
        tag = {"RMQ_SYS_TRANS_OP_HALF_TOPIC": 100, "TopicTest": reference.java_hash("TagA")}.get(
            topic, 0
        )
        assert {t for _, _, t in entries[:count]} == {tag}


def test_queue_offsets_explicit_padding_and_transaction_types(tmp_path):
    rows = [
        _row(0, queue_offset=5),
        _row(1),  # continues at 6
        _row(2, sys_flag=0x4),  # prepared: offset 0, no entry
        _row(3, sys_flag=0xC),  # rollback: offset 0, no entry
        _row(4, sys_flag=0x8),  # commit: dispatched, 7
        _row(5, topic="U", queue_id=3),
    ]
    with StoreWriter(tmp_path, commitlog_file_size=1 << 16, cq_file_entries=4) as writer:
        got = writer.append(reference.messages_table(rows))
        more = writer.append(reference.messages_table([_row(6), _row(7, topic="U", queue_id=3)]))
        assert writer.next_queue_offsets == {("T", 0): 9, ("U", 3): 2}
    assert got.column("queue_offset").to_pylist() == [5, 6, 0, 0, 7, 0]
    assert more.column("queue_offset").to_pylist() == [8, 1]
    offsets = (
        got.column("commitlog_offset").to_pylist() + more.column("commitlog_offset").to_pylist()
    )
    sizes = got.column("stored_size").to_pylist() + more.column("stored_size").to_pylist()
    qdir = tmp_path / "consumequeue" / "T" / "0"
    # Offset 5 lies in the second file (entries 4-7): entry 4 is padding, as the broker does.
    assert sorted(p.name for p in qdir.iterdir()) == [
        "00000000000000000080",
        "00000000000000000160",
    ]
    assert _cq(qdir / "00000000000000000080") == [
        (0, 0x7FFFFFFF, 0),
        (offsets[0], sizes[0], 100),
        (offsets[1], sizes[1], 100),
        (offsets[4], sizes[4], 100),
    ]
    assert _cq(qdir / "00000000000000000160")[0] == (offsets[6], sizes[6], 100)
    assert _cq(tmp_path / "consumequeue" / "U" / "3" / "00000000000000000000")[:2] == [
        (offsets[5], sizes[5], 100),
        (offsets[7], sizes[7], 100),
    ]


def test_given_crc_is_written_as_is_and_defaults(tmp_path):
    table = reference.messages_table(
        [
            _row(0, body_crc=12345),
            {"topic": "T", "queue_id": 1, "born_timestamp_ms": 1, "store_timestamp_ms": 2},
        ]
    )
    table = table.select(
        [
            "topic",
            "queue_id",
            "born_timestamp_ms",
            "store_timestamp_ms",
            "body",
            "body_crc",
            "born_host",
        ]
    )
    with StoreWriter(tmp_path, commitlog_file_size=4096) as writer:
        writer.append(table)
    data = (tmp_path / "commitlog" / "00000000000000000000").read_bytes()
    first, second = (reference.decode_one(data, p) for p in reference.walk(data))
    assert first["body_crc"] == 12345 and not first["body_crc_ok"]
    assert second["stored_body"] == b"" and second["body_crc"] == 0
    assert second["born_host"] == "0.0.0.0:0" and second["store_host"] == "0.0.0.0:0"
    assert second["properties"] == {} and second["magic_version"] == 1


def test_long_topic_written_as_v2_and_default_magic(tmp_path):
    with StoreWriter(tmp_path, commitlog_file_size=4096, magic_version=2) as writer:
        writer.append(
            reference.messages_table(
                [_row(0, topic="short"), _row(1, topic="L" * 130, magic_version=1)]
            )
        )
    data = (tmp_path / "commitlog" / "00000000000000000000").read_bytes()
    assert [reference.decode_one(data, p)["magic_version"] for p in reference.walk(data)] == [2, 2]


def test_errors(tmp_path):
    with StoreWriter(tmp_path / "a", commitlog_file_size=512) as writer:
        with pytest.raises(ValueError, match="required"):
            writer.append(pa.table({"topic": ["T"], "queue_id": [0], "born_timestamp_ms": [1]}))
        with pytest.raises(ValueError, match="does not fit"):
            writer.append(reference.messages_table([_row(0, body=b"z" * 600)]))
        assert writer.append(reference.messages_table([])).num_rows == 0
        writer.append(reference.messages_table([_row(0)]))
    with pytest.raises(ValueError, match="not empty"):
        StoreWriter(tmp_path / "a")


def test_empty_and_batch_inputs(tmp_path):
    batch = reference.messages_table([_row(i) for i in range(3)]).to_batches()[0]
    with StoreWriter(tmp_path, commitlog_file_size=4096) as writer:
        got = writer.append(batch)
    assert got.column("queue_offset").to_pylist() == [0, 1, 2]
    assert np.all(
        np.diff(got.column("commitlog_offset").to_numpy())
        == got.column("stored_size").to_numpy()[:-1]
    )
