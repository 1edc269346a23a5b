"""codec: decoding of commit-log records, consume-queue entries, properties, hosts, hashes.

Expected values come from the real RocketMQ file, from RocketMQ's own test cases
(MessageDecoderTest.testString2messageProperties) and from the naive reference decoder in
``reference.py``, never from codec itself."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import lz4.frame
import numpy as np
import pyarrow as pa
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.rocketmq import arrays, codec, layout
from simulator import encoding
from tests.connectors import reference
from tests.fixtures import REAL_COMMITLOG

FIXTURE = REAL_COMMITLOG
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _fixture() -> tuple[np.ndarray, bytes]:
    return codec.open_read_only(FIXTURE), FIXTURE.read_bytes()


# --- the real file --------------------------------------------------------------------------------


def test_real_file_walk_finds_47_records_and_the_blank_tail():
    buf, data = _fixture()
    walk = codec.walk_records(buf)
    assert walk.error is None
    assert len(walk.positions) == 47
    assert walk.positions.tolist() == [172 * i for i in range(47)]
    assert walk.positions.tolist() == reference.walk(data)
    # The BLANK filler fills the last 108 bytes: int32 108, then 0xCBD43194.
    assert walk.stop == 8192 - 108
    assert struct.unpack_from(">iI", data, walk.stop) == (108, 0xCBD43194)


def test_real_file_decodes_exactly():
    buf, data = _fixture()
    walk = codec.walk_records(buf)
    result = codec.decode_records(buf, walk.positions, verify_crc=True, body_topics=None)
    assert result.bad == []
    rows = result.records.to_pylist()
    assert len(rows) == 47
    assert [r["queue_offset"] for r in rows] == list(range(47))
    for pos, row in zip(walk.positions.tolist(), rows, strict=True):
        ref = reference.decode_one(data, pos)
        assert ref["body_crc_ok"]
        assert row["topic"] == "abc"
        assert row["body"] == b"Once, there was a chance for me!"
        assert row["position"] == pos
        assert row["commitlog_offset"] == pos
        assert row["stored_size"] == 172
        assert row["magic_version"] == 1
        assert row["tags"] == "TAG1"
        props = dict(row["properties"])
        assert props == ref["properties"]
        assert list(props) == ["0", "KEYS", "TAGS"]  # stored order
        assert props["0"] == "imagoodperson0"
        assert props["KEYS"] == str(row["born_timestamp_ms"])
        assert row["body_crc"] == zlib.crc32(row["body"]) & 0x7FFFFFFF
        for name in (
            "queue_id",
            "flag",
            "sys_flag",
            "born_timestamp_ms",
            "born_host",
            "store_timestamp_ms",
            "store_host",
            "reconsume_times",
            "prepared_transaction_offset",
            "body_crc",
            "queue_offset",
        ):
            assert row[name] == ref[name], name
    assert rows[0]["born_host"] == "127.0.0.1:0"
    assert rows[0]["store_host"] == "10.1.30.38:8123"
    assert rows[0]["born_timestamp_ms"] == 1551613204833


# --- properties -------------------------------------------------------------------------------------

# RocketMQ MessageDecoderTest.testString2messageProperties, plus the trailing separator forms.
PROPERTY_CASES = [
    (b"k1\x01v1", {"k1": "v1"}),
    (b"k1\x01v1\x02", {"k1": "v1"}),
    (b"", {}),
    (b" ", {}),
    (b"aaa", {}),
    (b"k1\x01", {}),
    (b"\x01v1", {}),
    (b"k1\x01v1\x02k2\x01v2", {"k1": "v1", "k2": "v2"}),
    (b"k1\x01v1\x02k2\x01v2\x02", {"k1": "v1", "k2": "v2"}),
    (b"k1\x01v1\x02\x01v2", {"k1": "v1"}),
    (b"k1\x01v1\x02k2\x01", {"k1": "v1"}),
    (b"\x01v1\x02k2\x01v2", {"k2": "v2"}),
    (b"k1\x01\x02k2\x01v2", {"k2": "v2"}),
    (b"1\x01\x02" + b"2\x012", {"2": "2"}),
    (b"k\x01a\x01b\x02", {"k": "a\x01b"}),  # the value is everything after the first 0x01
    (b"\x02\x02k\x01v\x02\x02", {"k": "v"}),
]


def test_properties_follow_rocketmq_cases():
    maps, tags = codec.decode_properties(pa.array([raw for raw, _ in PROPERTY_CASES], pa.binary()))
    assert [dict(m) for m in maps.to_pylist()] == [expected for _, expected in PROPERTY_CASES]
    assert tags.null_count == len(PROPERTY_CASES)


def test_duplicate_property_names_last_wins_and_tags_extracted():
    raw = [b"a\x011\x02TAGS\x01x\x02a\x012\x02TAGS\x01d", b"TAGS\x01d\x02", None, b"b\x01\xff\xfe"]
    maps, tags = codec.decode_properties(pa.array(raw, pa.binary()))
    assert [dict(m) for m in maps.to_pylist()] == [
        {"a": "2", "TAGS": "d"},
        {"TAGS": "d"},
        {},
        {"b": "\ufffd\ufffd"},
    ]
    assert tags.to_pylist() == ["d", "d", None, None]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(["a", "b", "TAGS", "é", "\x01", "\x02", "k1", "v"]), max_size=12
        ).map("".join),
        max_size=12,
    )
)
def test_properties_match_reference_parser(texts):
    raw = [t.encode() for t in texts]
    maps, tags = codec.decode_properties(pa.array(raw, pa.binary()))
    for text, m, tag in zip(raw, maps.to_pylist(), tags.to_pylist(), strict=True):
        expected = reference.parse_properties(text)
        assert dict(m) == expected
        assert len(m) == len(expected)
        assert tag == expected.get("TAGS")


def test_encode_properties_round_trip_and_separator():
    maps = pa.array(
        [[("k1", "v1"), ("k2", "v2")], [], None, [("a", None), ("b", "c")]], reference.MAP
    )
    assert encoding.encode_properties(maps).to_pylist() == [
        b"k1\x01v1\x02k2\x01v2\x02",
        b"",
        b"",
        b"b\x01c\x02",
    ]
    assert encoding.encode_properties(maps, trailing_separator=False).to_pylist() == [
        b"k1\x01v1\x02k2\x01v2",
        b"",
        b"",
        b"b\x01c",
    ]
    sliced = maps.slice(1, 3)
    assert encoding.encode_properties(sliced).to_pylist() == [b"", b"", b"b\x01c\x02"]


# --- hashes, hosts, slices -------------------------------------------------------------------------------


def test_java_hash_known_values():
    hashes = layout.java_string_hash(
        pa.array(["d", "", None, "TagA", "héllo wörld", "😀"])
    ).tolist()
    assert hashes[0] == 100
    assert hashes[1:3] == [0, 0]
    assert hashes[3:] == [
        reference.java_hash("TagA"),
        reference.java_hash("héllo wörld"),
        reference.java_hash("😀"),
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=20))
def test_java_hash_matches_reference(texts):
    assert layout.java_string_hash(pa.array(texts, pa.string())).tolist() == [
        reference.java_hash(t) for t in texts
    ]


def test_hosts_format_and_parse():
    texts = ["127.0.0.1:0", "[::1]:9876", "[2001:db8::1:0:0:1]:10911", "10.1.30.38:8123", None]
    addr, port, v6 = encoding.parse_hosts(pa.array(texts), len(texts))
    assert v6.tolist() == [False, True, True, False, False]
    assert codec.format_hosts(addr, port, v6).to_pylist() == [*texts[:4], "0.0.0.0:0"]
    # non-compressed input comes back compressed
    addr, port, v6 = encoding.parse_hosts(
        pa.array(["[2001:0db8:0000:0000:0000:0000:0000:0001]:1"]), 1
    )
    assert codec.format_hosts(addr, port, v6).to_pylist() == ["[2001:db8::1]:1"]


@settings(max_examples=100, deadline=None)
@given(
    st.binary(min_size=1, max_size=64),
    st.lists(st.tuples(st.integers(0, 63), st.integers(0, 20)), max_size=20),
)
def test_slices_any_order_or_overlap(data, cuts):
    buf = np.frombuffer(data, dtype=np.uint8)
    cuts = [(s % len(data), min(n, len(data) - s % len(data))) for s, n in cuts]
    starts = np.array([s for s, _ in cuts], dtype=np.int64)
    lengths = np.array([n for _, n in cuts], dtype=np.int64)
    assert arrays.slices(buf, starts, lengths).to_pylist() == [data[s : s + n] for s, n in cuts]


# --- compression ------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec_id", [0, 1, 2, 3])
def test_decompress_each_codec(codec_id):
    body = b"transaction body " * 300
    flag = 0x1 | codec_id << 8
    assert codec.decompress_body(encoding.compress_body(body, flag), flag) == body


def test_decompress_java_style_frames():
    body = b"x" * 5000 + bytes(range(256))
    # lz4-java LZ4FrameOutputStream: independent blocks, 4 MB blocks; zstd-jni ZstdOutputStream:
    # a streamed frame without content size; java.util.zip Deflater: zlib header.
    lz4_frame = lz4.frame.compress(
        body, block_size=lz4.frame.BLOCKSIZE_MAX4MB, block_linked=False, content_checksum=False
    )
    assert codec.decompress_body(lz4_frame, 0x101) == body
    zobj = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
    zstd_frame = zobj.compress(body) + zobj.flush()
    assert codec.decompress_body(zstd_frame, 0x201) == body
    assert codec.decompress_body(zlib.compress(body, 5), 0x001) == body


@pytest.mark.parametrize("flag", [0x001, 0x101, 0x201, 0x301, 0x501])
def test_decompress_garbage_raises_value_error(flag):
    with pytest.raises(ValueError):
        codec.decompress_body(b"definitely not compressed", flag)
    with pytest.raises(ValueError):
        good = encoding.compress_body(b"y" * 1000, flag) if flag != 0x501 else b""
        codec.decompress_body(good[: len(good) // 2], flag)


# --- bad positions ------------------------------------------------------------------------------------


def _encoded(rows: list[dict], file_size: int = 1 << 16) -> bytes:
    """Records encoded by the codec's encoder, back to back (offsets from 0)."""
    table = reference.messages_table(rows)
    n = table.num_rows
    props = encoding.encode_properties(table.column("properties").combine_chunks())
    topics = table.column("topic").combine_chunks().cast(pa.binary())
    bodies = table.column("body").combine_chunks().fill_null(b"")
    born_addr, born_port, born_v6 = encoding.parse_hosts(
        table.column("born_host").combine_chunks(), n
    )
    store_addr, store_port, store_v6 = encoding.parse_hosts(
        table.column("store_host").combine_chunks(), n
    )
    sys_flag = (
        np.array([r.get("sys_flag", 0) for r in rows])
        | np.where(born_v6, 0x10, 0)
        | np.where(store_v6, 0x20, 0)
    )
    lens = lambda a: np.diff(arrays.binary_parts(a)[0])  # noqa: E731
    magic = np.array([r.get("magic_version", 1) for r in rows])
    sizes = layout.record_sizes(sys_flag, lens(bodies), lens(topics), lens(props), magic)
    phys = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    zeros = np.zeros(n, dtype=np.int64)
    crc = np.array([zlib.crc32(b) & 0x7FFFFFFF for b in bodies.to_pylist()])
    data = encoding.encode_records(
        phys=phys,
        sizes=sizes,
        magic_version=magic,
        body_crc=crc,
        queue_id=zeros,
        flag=zeros,
        queue_offset=np.arange(n),
        sys_flag=sys_flag,
        born_ts=zeros + 5,
        born_addr=born_addr,
        born_port=born_port,
        store_ts=zeros + 6,
        store_addr=store_addr,
        store_port=store_port,
        reconsume=zeros,
        prepared=zeros,
        bodies=bodies,
        topics=topics,
        props=props,
    )
    return bytes(data)


def test_encoder_output_decodes_with_reference():
    rows = reference.txn_rows(40, compress_every=0)
    data = _encoded(rows)
    starts = reference.walk(data)
    assert len(starts) == 40
    for pos, row in zip(starts, rows, strict=True):
        ref = reference.decode_one(data, pos)
        assert ref["topic"] == row["topic"]
        assert ref["stored_body"] == row["body"]
        assert ref["properties"] == row["properties"]
        assert ref["born_host"] == row["born_host"]
        assert ref["store_host"] == row["store_host"]
        assert ref["magic_version"] == row["magic_version"]
        assert ref["body_crc_ok"]


def _mutable(data: bytes) -> np.ndarray:
    return np.frombuffer(bytearray(data), dtype=np.uint8)


def test_each_kind_of_bad_position_is_reported_not_raised():
    rows = reference.txn_rows(6, compress_every=0, ipv6_every=0, v2_every=0)
    data = bytearray(_encoded(rows))
    starts = reference.walk(bytes(data))
    end = len(data)
    data += struct.pack(">iI", 64, 0xCBD43194) + bytes(56)  # a BLANK filler at `end`
    # record 1: corrupt body length; record 2: physical offset field; record 3: body byte (CRC)
    struct.pack_into(">i", data, starts[1] + 84, 1)
    struct.pack_into(">q", data, starts[2] + 28, 999)
    data[starts[3] + 90] ^= 0xFF
    buf = _mutable(bytes(data))
    positions = [
        starts[0],
        starts[1],
        starts[2],
        starts[3],
        starts[4] + 3,
        end,
        end + 8,
        len(data) - 4,
        starts[5],
    ]
    result = codec.decode_records(buf, positions, verify_crc=True, body_topics=None)
    reasons = {b.index: b for b in result.bad}
    assert result.index.tolist() == [0, 8]
    assert sorted(reasons) == [1, 2, 3, 4, 5, 6, 7]
    assert reasons[1].reason.startswith("inconsistent record lengths")
    assert not reasons[1].no_record
    assert reasons[2].reason.startswith("physical offset field 999")
    assert reasons[3].reason.startswith("body CRC mismatch")
    assert (reasons[3].topic, reasons[3].queue_offset) == (rows[3]["topic"], 3)
    assert reasons[4].reason.startswith("bad magic code") and reasons[4].no_record
    assert reasons[5].reason.startswith("BLANK") and reasons[5].no_record
    assert reasons[6].reason == "no record (zero bytes)" and reasons[6].no_record
    assert reasons[7].reason.startswith("truncated record header") and reasons[7].no_record
    # without CRC checking the damaged body is not noticed
    assert 3 in codec.decode_records(buf, positions, verify_crc=False).index.tolist()


def test_undecompressable_body_is_bad_even_when_the_body_is_not_returned():
    rows = [
        {
            "topic": reference.HALF,
            "queue_id": 0,
            "born_timestamp_ms": 1,
            "store_timestamp_ms": 2,
            "sys_flag": 0x201,
            "body": b"not zstd at all",
            "born_host": "1.2.3.4:5",
            "store_host": "1.2.3.4:6",
            "properties": {"a": "b"},
        }
    ]
    buf = _mutable(_encoded(rows))
    result = codec.decode_records(buf, [0], body_topics=())
    assert len(result.index) == 0
    assert result.bad[0].reason.startswith("cannot decompress body (zstd)")
    assert result.bad[0].topic == reference.HALF


def test_bodies_returned_only_for_asked_topics_and_decompressed():
    rows = reference.txn_rows(24, compress_every=2, other_every=0)
    plain = [r["body"] for r in rows]
    for r in rows:
        if r["sys_flag"] & 1:
            r["body"] = encoding.compress_body(r["body"], r["sys_flag"])
    buf = _mutable(_encoded(rows))
    starts = reference.walk(bytes(buf))
    everything = codec.decode_records(buf, starts, body_topics=None)
    assert everything.bad == []
    assert everything.records.column("body").to_pylist() == plain
    ops_only = codec.decode_records(buf, starts, body_topics=[reference.OP])
    assert ops_only.records.column("body").to_pylist() == [
        b if r["topic"] == reference.OP else None for b, r in zip(plain, rows, strict=True)
    ]


def test_v2_magic_and_ipv6_fields():
    rows = [
        {
            "topic": "T" * 200,
            "queue_id": 0,
            "born_timestamp_ms": 1,
            "store_timestamp_ms": 2,
            "magic_version": 2,
            "born_host": "[::ffff:1.2.3.4]:7",
            "store_host": "[2001:db8::2]:10911",
            "properties": {"TAGS": "x"},
            "body": b"b",
        }
    ]
    buf = _mutable(_encoded(rows))
    result = codec.decode_records(buf, [0], body_topics=None)
    row = result.records.to_pylist()[0]
    assert row["magic_version"] == 2 and row["topic"] == "T" * 200
    assert row["born_host"] == "[::ffff:102:304]:7"
    assert row["store_host"] == "[2001:db8::2]:10911"
    assert row["sys_flag"] & 0x30 == 0x30
    assert struct.unpack_from(">I", bytes(buf), 4)[0] == 0xDAA320AB


# --- consume queue ----------------------------------------------------------------------------------------


def test_cq_entries_round_trip():
    raw = encoding.encode_cq_entries(
        np.array([0, 172, 0]), np.array([172, 172, 0x7FFFFFFF]), np.array([100, -5, 0])
    )
    assert raw[:20] == struct.pack(">qiq", 0, 172, 100)
    offsets, sizes, tags = codec.decode_cq_entries(np.frombuffer(raw + b"\x01\x02", dtype=np.uint8))
    assert (
        offsets.tolist() == [0, 172, 0]
        and sizes.tolist() == [172, 172, 0x7FFFFFFF]
        and tags.tolist() == [100, -5, 0]
    )


# --- never raises ---------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600), st.lists(st.integers(-10, 700), max_size=12), st.booleans())
def test_arbitrary_bytes_only_give_records_or_bad_positions(data, extra_positions, verify):
    buf = np.frombuffer(data, dtype=np.uint8)
    walk = codec.walk_records(buf)
    positions = np.concatenate([walk.positions, np.array(extra_positions, dtype=np.int64)])
    result = codec.decode_records(
        buf, positions, verify_crc=verify, body_topics=None, file_offset=0
    )
    assert result.records.schema == codec.RECORD_SCHEMA
    bad_index = [b.index for b in result.bad]
    assert sorted([*result.index.tolist(), *bad_index]) == list(range(len(positions)))
    assert all(b.reason for b in result.bad)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_real_records_never_raise(data):
    raw = bytearray(FIXTURE.read_bytes()[: 172 * 3])
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    buf = np.frombuffer(bytes(raw), dtype=np.uint8)
    walk = codec.walk_records(buf)
    result = codec.decode_records(buf, walk.positions, verify_crc=True, body_topics=None)
    assert len(result.index) + len(result.bad) == len(walk.positions)


def test_released_pages_read_back_as_the_file() -> None:
    """``release_pages`` unmaps pages a worker is done with; a later read maps the file's
    bytes again (never zeros, never a fault), and an array that maps no file is left alone."""
    buf, data = _fixture()
    before = buf.tobytes()

    codec.release_pages(buf, 0, len(buf))
    codec.release_pages(buf, 5, 4097)  # not page-aligned: the page holding 5 goes too
    codec.release_pages(buf, 10, 3)  # an empty range
    plain = np.frombuffer(data, dtype=np.uint8)
    codec.release_pages(plain, 0, len(plain))

    assert before == data
    assert buf.tobytes() == data
    assert plain.tobytes() == data


def _resident_kib(path) -> int:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_released_pages_leave_the_process() -> None:
    buf, _ = _fixture()
    assert int(buf.sum()) > 0  # touches every page
    touched = _resident_kib(FIXTURE.resolve())

    codec.release_pages(buf, 0, len(buf))

    assert touched > 0
    assert _resident_kib(FIXTURE.resolve()) == 0
