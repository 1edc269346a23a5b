"""Independent, deliberately naive helpers for the store tests: a record-at-a-time decoder
written from the spec with ``struct`` (no numpy, nothing shared with ``codec``), Java's
``String.hashCode`` and builders of message tables."""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Sequence

import pyarrow as pa

V1 = 0xDAA320A7
V2 = 0xDAA320AB
BLANK = 0xCBD43194
HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"


def java_hash(text: str) -> int:
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def parse_properties(raw: bytes) -> dict[str, str]:
    """RocketMQ ``string2messageProperties``, transcribed character by character."""
    text = raw.decode("utf-8", errors="replace")
    result: dict[str, str] = {}
    index = 0
    while index < len(text):
        new_index = text.find("\x02", index)
        if new_index < 0:
            new_index = len(text)
        if new_index - index >= 3:
            kv = text.find("\x01", index)
            if index < kv < new_index - 1:
                result[text[index:kv]] = text[kv + 1 : new_index]
        index = new_index + 1
    return result


def host(raw: bytes) -> str:
    if len(raw) == 8:
        return f"{ipaddress.IPv4Address(raw[:4])}:{struct.unpack('>i', raw[4:])[0]}"
    return f"[{ipaddress.IPv6Address(raw[:16]).compressed}]:{struct.unpack('>i', raw[16:])[0]}"


def decode_one(data: bytes, pos: int) -> dict:
    """Decode the record at ``pos`` (assumed valid) into the canonical field names."""
    total, magic, crc, qid, flag, qoff, phys, sysflag, born_ts = struct.unpack_from(
        ">iIiiiqqiq", data, pos
    )
    at = pos + 48
    born_len = 20 if sysflag & 0x10 else 8
    born = data[at : at + born_len]
    at += born_len
    (store_ts,) = struct.unpack_from(">q", data, at)
    at += 8
    store_len = 20 if sysflag & 0x20 else 8
    store = data[at : at + store_len]
    at += store_len
    reconsume, prepared, body_len = struct.unpack_from(">iqi", data, at)
    at += 16
    body = data[at : at + body_len]
    at += body_len
    if magic == V2:
        (topic_len,) = struct.unpack_from(">h", data, at)
        at += 2
    else:
        (topic_len,) = struct.unpack_from(">b", data, at)
        at += 1
    topic = data[at : at + topic_len].decode()
    at += topic_len
    (props_len,) = struct.unpack_from(">h", data, at)
    at += 2
    props_raw = data[at : at + props_len]
    at += props_len
    assert at - pos == total, (at - pos, total)
    props = parse_properties(props_raw)
    return {
        "topic": topic,
        "queue_id": qid,
        "queue_offset": qoff,
        "commitlog_offset": phys,
        "stored_size": total,
        "sys_flag": sysflag,
        "body_crc": crc,
        "flag": flag,
        "born_timestamp_ms": born_ts,
        "born_host": host(born),
        "store_timestamp_ms": store_ts,
        "store_host": host(store),
        "reconsume_times": reconsume,
        "prepared_transaction_offset": prepared,
        "tags": props.get("TAGS"),
        "properties": props,
        "stored_body": body,
        "body_crc_ok": (zlib.crc32(body) & 0x7FFFFFFF) == crc,
        "magic_version": 2 if magic == V2 else 1,
        "props_raw": props_raw,
    }


def walk(data: bytes) -> list[int]:
    """Record starts of one commit-log file, following TOTALSIZE until BLANK/zero/end."""
    pos, found = 0, []
    while pos + 8 <= len(data):
        total, magic = struct.unpack_from(">iI", data, pos)
        if magic in (V1, V2):
            found.append(pos)
            pos += total
            continue
        break
    return found


MAP = pa.map_(pa.string(), pa.string())


def messages_table(rows: Sequence[dict]) -> pa.Table:
    """A table with MESSAGE-like columns from dicts (missing keys -> null / default)."""
    columns = {
        "topic": pa.string(),
        "queue_id": pa.int32(),
        "queue_offset": pa.int64(),
        "sys_flag": pa.int32(),
        "body_crc": pa.int32(),
        "flag": pa.int32(),
        "born_timestamp_ms": pa.int64(),
        "born_host": pa.string(),
        "store_timestamp_ms": pa.int64(),
        "store_host": pa.string(),
        "reconsume_times": pa.int32(),
        "prepared_transaction_offset": pa.int64(),
        "properties": MAP,
        "body": pa.binary(),
        "magic_version": pa.int32(),
    }
    data = {}
    for name, typ in columns.items():
        values = [row.get(name) for row in rows]
        if name == "properties":
            values = [None if v is None else list(v.items()) for v in values]
        data[name] = pa.array(values, type=typ)
    return pa.table(data)


def txn_rows(
    count: int,
    *,
    start_ms: int = 1_700_000_000_000,
    other_every: int = 4,
    ipv6_every: int = 5,
    v2_every: int = 7,
    compress_every: int = 6,
    op_queue: int = 0,
    half_queue: int = 0,
    big_body_every: int = 0,
) -> list[dict]:
    """Half, op and foreign-topic records interleaved, with IPv6 hosts, v2 magic and
    compressed bodies (zlib, LZ4, zstd) sprinkled in."""
    rows = []
    for i in range(count):
        if other_every and i % other_every == other_every - 1:
            topic, queue = "TopicTest", i % 3
        elif i % 2 == 0:
            topic, queue = HALF, half_queue
        else:
            topic, queue = OP, op_queue
        props = {"UNIQ_KEY": f"7F00000100002A9F0000{i:012X}", "WAIT": "true"}
        if topic == HALF:
            props.update(
                {
                    "TRAN_MSG": "true",
                    "PGROUP": f"group-{i % 3}",
                    "REAL_TOPIC": "TopicTest",
                    "REAL_QID": str(i % 4),
                }
            )
            body = (
                f"half message {i} " * (40 if big_body_every and i % big_body_every == 0 else 1)
            ).encode()
        elif topic == OP:
            props["TAGS"] = "d"
            body = f"{i // 2},".encode()
        else:
            props["TAGS"] = "TagA"
            body = f"other {i}".encode()
        sys_flag = 0
        if compress_every and i % compress_every == 0 and topic != OP:
            sys_flag |= 0x1 | ((i // compress_every) % 4) << 8  # codecs 0..3
        rows.append(
            {
                "topic": topic,
                "queue_id": queue,
                "sys_flag": sys_flag,
                "flag": i % 5,
                "born_timestamp_ms": start_ms + i * 10,
                "store_timestamp_ms": start_ms + i * 10 + 3,
                "born_host": f"[2001:db8::{i % 9 + 1:x}]:{40000 + i % 50}"
                if ipv6_every and i % ipv6_every == 0
                else f"192.168.1.{i % 200}:{50000 + i % 17}",
                "store_host": "[fe80::1]:10911"
                if ipv6_every and i % (ipv6_every * 2) == 1
                else "10.0.0.7:10911",
                "reconsume_times": i % 3,
                "prepared_transaction_offset": 0,
                "properties": props,
                "body": body,
                "magic_version": 2 if v2_every and i % v2_every == 0 else 1,
            }
        )
    return rows
