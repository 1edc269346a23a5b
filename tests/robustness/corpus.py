"""The bad-input corpus: one small store per case, generated from ``StoreWriter`` rows and
then damaged on disk. Each builder returns the rows it wrote (with their assigned
commit-log offsets) so that tests can compute expected sources and positions."""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets
from simulator.discard_cases import commit_of, discard_of
from simulator.writer import StoreWriter
from tests.connectors.reference import messages_table
from tests.robustness.store import HALF, LOG0, T, base_rows, half, halves, op, patch, write


def truncated_mid_record(root: Path) -> list[dict]:
    rows = write(root, base_rows())
    last = halves(rows)[3]
    log = root / LOG0
    log.write_bytes(log.read_bytes()[: last["commitlog_offset"] + last["stored_size"] // 2])
    return rows


def truncated_mid_record_walked(root: Path) -> list[dict]:
    """The same truncation with no consume queue: the commit-log walk meets it."""
    rows = truncated_mid_record(root)
    shutil.rmtree(root / "consumequeue")
    return rows


def garbage_inside_record(root: Path) -> list[dict]:
    rows = write(root, base_rows())
    # reconsume times, prepared offset and body length (bytes 72..92 of an IPv4 record)
    patch(root / LOG0, halves(rows)[2]["commitlog_offset"] + 72, b"\xde\xad\xbe\xef" * 5)
    return rows


def wrong_magic(root: Path) -> list[dict]:
    rows = write(root, base_rows())
    patch(root / LOG0, halves(rows)[1]["commitlog_offset"] + 4, struct.pack(">I", 0x12345678))
    return rows


def totalsize_past_end(root: Path) -> list[dict]:
    rows = write(root, base_rows())
    patch(root / LOG0, halves(rows)[2]["commitlog_offset"], struct.pack(">i", 1_000_000))
    return rows


def cq_entry_past_commitlog(root: Path) -> list[dict]:
    rows = write(root, base_rows())
    patch(
        root / "consumequeue" / HALF / "0" / "00000000000000000000",
        2 * 20,
        struct.pack(">q", 10**9),
    )
    return rows


def cq_entry_into_expired_file(root: Path) -> list[dict]:
    """1000-byte commit-log files: the first one (op 0, halves 0-3) is deleted."""
    rows = write(root, [*base_rows(), half(4), half(5)], commitlog_file_size=1000)
    (root / LOG0).unlink()
    write_consumer_offsets(
        root / "config" / "consumerOffset.json", {HALF_KEY: {0: 0}, OP_KEY: {0: 0}}
    )
    return rows


def missing_half_cq_directory(root: Path) -> list[dict]:
    rows = write(root, base_rows())
    shutil.rmtree(root / "consumequeue" / HALF / "0")
    return rows


def no_consumequeue_at_all(root: Path) -> list[dict]:
    rows = write(root, base_rows())
    shutil.rmtree(root / "consumequeue")
    return rows


def empty_store(root: Path) -> list[dict]:
    (root / "commitlog").mkdir(parents=True)
    return []


def offset_beyond_queue_end(root: Path) -> list[dict]:
    rows = write(root, base_rows())
    write_consumer_offsets(
        root / "config" / "consumerOffset.json", {HALF_KEY: {0: 100}, OP_KEY: {0: 50}}
    )
    return rows


# Op bodies: empty, non-numeric, negative, huge (beyond 64 bits), huge (in range), mixed.
OP_BODIES = [b"", b"abc", b"-1", b"99999999999999999999", b"9223372036854775807", b"1,x,", b"0,"]


def op_bodies(root: Path) -> list[dict]:
    return write(root, [*(op(body) for body in OP_BODIES), *(half(i) for i in range(4))])


def duplicate_queue_offsets(root: Path) -> list[dict]:
    """Half offsets 0, 1, 1, 2: the consume queue can hold one entry per offset, so the
    duplicate is only visible when the queue is rebuilt from the commit log."""
    rows = write(
        root,
        [
            op(b"0,"),
            half(0, queue_offset=0),
            half(1, queue_offset=1),
            half(9, queue_offset=1),
            half(2, queue_offset=2),
        ],
    )
    shutil.rmtree(root / "consumequeue" / HALF / "0")
    return rows


def half_without_keys(root: Path) -> list[dict]:
    return write(
        root,
        [
            op(b"0,"),
            half(0),
            half(1, drop=("UNIQ_KEY",)),
            half(2, drop=("PGROUP",)),
            half(3, drop=("UNIQ_KEY", "PGROUP")),
        ],
    )


def unparsable_properties(root: Path) -> list[dict]:
    return write(
        root,
        [
            op(b"0,"),
            half(0),
            half(1, TRANSACTION_CHECK_TIMES="abc"),
            half(2, CHECK_IMMUNITY_TIME_IN_SECONDS="x1"),
            half(3, age_ms=2_000, CHECK_IMMUNITY_TIME_IN_SECONDS="1.5"),
            half(4, TRANSACTION_CHECK_TIMES="99999999999"),
        ],
    )


# A 5.x real topic longer than the 127 characters a v1 record carries (a v2 record), and a
# real topic that cannot be a path: a REAL_TOPIC property is any text.
LONG_REAL_TOPIC = "Orders_" + "x" * 188 + "_eu-1"
UNSAFE_REAL_TOPIC = "../etc"


def real_topics(root: Path) -> list[dict]:
    """The base rows, then halves 4 and 5 discarded 30 s before T and ended by an op 20 s
    before T: half 4 committed into ``LONG_REAL_TOPIC`` queue 1, half 5 naming
    ``UNSAFE_REAL_TOPIC``."""
    with StoreWriter(root, commitlog_file_size=1 << 16, cq_file_entries=64) as writer:

        def append(rows: list[dict]) -> list[dict]:
            assigned = writer.append(messages_table(rows)).to_pylist()
            return [{**row, **got} for row, got in zip(rows, assigned, strict=True)]

        rows = append(
            [
                *base_rows(),
                half(4, REAL_TOPIC=LONG_REAL_TOPIC),
                half(5, REAL_TOPIC=UNSAFE_REAL_TOPIC),
            ]
        )
        ended = halves(rows)[4:]
        rows += append([discard_of(row, T - 30_000, 16) for row in ended])
        ends = {"born_timestamp_ms": T - 20_000, "store_timestamp_ms": T - 20_000}
        rows += append([{**op(b"4,5,"), **ends}, commit_of(ended[0], T - 20_000)])
    return rows


# Cases that complete the run (broker name -> builder).
COMPLETING: dict[str, Callable[[Path], list[dict]]] = {
    "truncated": truncated_mid_record,
    "truncated-walk": truncated_mid_record_walked,
    "garbage": garbage_inside_record,
    "magic": wrong_magic,
    "oversize": totalsize_past_end,
    "cq-past-end": cq_entry_past_commitlog,
    "cq-expired": cq_entry_into_expired_file,
    "no-half-cq": missing_half_cq_directory,
    "no-cq": no_consumequeue_at_all,
    "empty": empty_store,
    "offset-beyond": offset_beyond_queue_end,
    "op-bodies": op_bodies,
    "duplicates": duplicate_queue_offsets,
    "no-keys": half_without_keys,
    "bad-props": unparsable_properties,
    "real-topics": real_topics,
}

# consumerOffset.json contents that stop the run with exit code 2 (no .bak beside them):
# text, message fragment. An empty file is not among them: like the broker, the job then
# starts at the queues' heads with a warning (tests/jobs/test_wrong_pictures.py).
_KEY = "RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS"
BAD_OFFSETS_FILES = {
    "malformed": ("{not json", "not a consumerOffset.json file (Expecting property name"),
    "negative": (
        f'{{"offsetTable":{{"{_KEY}":{{0:-1}}}}}}',
        f"offset or queue id out of range in '{_KEY}' queue 0: -1",
    ),
    "string-offset": (
        f'{{"offsetTable":{{"{_KEY}":{{0:"12"}}}}}}',
        f"offset of '{_KEY}' queue 0 is not an integer: '12'",
    ),
    "bare-word-offset": (
        f'{{"offsetTable":{{"{_KEY}":{{0:abc}}}}}}',
        "not a consumerOffset.json file (Expecting value",
    ),
    "fractional-offset": (
        f'{{"offsetTable":{{"{_KEY}":{{0:1.5}}}}}}',
        f"offset of '{_KEY}' queue 0 is not an integer: 1.5",
    ),
    "no-offset-table": ('{"dataVersion":{}}', "no 'offsetTable' object in the offsets file"),
    "queue-not-object": (
        f'{{"offsetTable":{{"{_KEY}":[1]}}}}',
        f"offsets of '{_KEY}' are not an object",
    ),
}

# Integers that parse but do not fit the columns (offset: long, queue id: int). Spec section 7
# wants exit 2 before anything runs.
OUT_OF_RANGE_OFFSETS_FILES = {
    "offset-beyond-64-bits": f'{{"offsetTable":{{"{_KEY}":{{0:99999999999999999999}}}}}}',
    "queue-id-beyond-32-bits": f'{{"offsetTable":{{"{_KEY}":{{99999999999:1}}}}}}',
}
