"""The decoder never raises on arbitrary bytes (no Spark: ``reader.read_batches``, the same
code the Spark tasks run). Deterministic hypothesis runs; the longer target is fuzz/."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.rocketmq import codec
from connectors.rocketmq.reader import COMBINED_ARROW, StoreSpec, read_batches
from simulator import encoding
from tests.robustness.store import HALF, LOG0, OP, base_rows, half, write

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def read_all(root: Path, **options) -> list[dict]:
    """Every combined row of the store; checks the shape of each one."""
    batches = list(read_batches([StoreSpec("fz", root)], **options))
    for batch in batches:
        assert batch.schema == COMBINED_ARROW
    rows = pa.Table.from_batches(batches, schema=COMBINED_ARROW).to_pylist()
    for row in rows:
        assert row["broker"] == "fz" and row["source"] and row["position"] is not None
        if row["reason"] is None:
            assert (
                row["topic"] in (HALF, OP)
                and row["queue_offset"] is not None
                and row["born_timestamp_ms"] is not None
            )
        else:
            assert row["raw_hex"] is None or len(row["raw_hex"]) <= 128
    return rows


def live_entries(cq: bytes) -> list[int]:
    """Logical offsets of the consume-queue entries the reader must account for."""
    whole = len(cq) // 20 * 20
    phys, size, tags = codec.decode_cq_entries(np.frombuffer(cq[:whole], dtype=np.uint8))
    live = ~(
        ((phys == 0) & (size == 0) & (tags == 0))
        | ((phys == 0) & (size == codec.CQ_PAD_SIZE) & (tags == 0))
    )
    return [int(i) for i in np.flatnonzero(live)]


def assert_every_entry_accounted(rows: list[dict], cq: bytes, topic: str) -> None:
    """Each live entry yields its record or at least one bad record naming its offset."""
    seen = {r["queue_offset"] for r in rows if r["topic"] == topic}
    missing = [i for i in live_entries(cq) if i not in seen]
    assert not missing, missing


@pytest.fixture(scope="module")
def valid_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("valid")
    rows = [*base_rows(), half(4, CHECK_IMMUNITY_TIME_IN_SECONDS="60")]
    rows[1]["sys_flag"] = 0x1  # one zlib-compressed body
    write(root, rows)
    return root


def _copy(src: Path) -> Path:
    dst = Path(tempfile.mkdtemp(prefix="fz-"))
    shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


# Positions a consume-queue entry may point at: real record starts and anything near them.
entries = st.lists(st.tuples(st.integers(-8, 1200), st.integers(-4, 1300)), max_size=12)


@FUZZ
@given(log=st.binary(max_size=1200), points=entries, verify=st.booleans())
def test_arbitrary_bytes_as_a_commit_log_file(log, points, verify):
    root = Path(tempfile.mkdtemp(prefix="fz-"))
    try:
        (root / "commitlog").mkdir()
        (root / LOG0).write_bytes(log)
        qdir = root / "consumequeue" / HALF / "0"
        qdir.mkdir(parents=True)
        cq = encoding.encode_cq_entries(
            np.array([p for p, _ in points], np.int64),
            np.array([s for _, s in points], np.int64),
            np.zeros(len(points), np.int64),
        )
        (qdir / "00000000000000000000").write_bytes(cq)
        rows = read_all(root, verify_crc=verify, include_half_body=True)
        # (the op queue has no directory: it is rebuilt by walking the same bytes)
        assert_every_entry_accounted(rows, cq, HALF)
    finally:
        shutil.rmtree(root)


@FUZZ
@given(cq=st.binary(max_size=400), verify=st.booleans())
def test_arbitrary_bytes_as_a_consume_queue_file(valid_store, cq, verify):
    root = _copy(valid_store)
    try:
        target = root / "consumequeue" / HALF / "0" / "00000000000000000000"
        target.write_bytes(cq)
        rows = read_all(root, verify_crc=verify)
        assert_every_entry_accounted(rows, cq, HALF)
        # the op queue is untouched: its record is still read
        assert [r["queue_offset"] for r in rows if r["topic"] == OP and r["reason"] is None] == [0]
    finally:
        shutil.rmtree(root)


@FUZZ
@given(log=st.binary(max_size=1500))
def test_arbitrary_bytes_walked_when_no_consume_queue_exists(log):
    root = Path(tempfile.mkdtemp(prefix="fz-"))
    try:
        (root / "commitlog").mkdir()
        (root / LOG0).write_bytes(log)
        read_all(root, include_half_body=True)
    finally:
        shutil.rmtree(root)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 1300), st.integers(1, 255)), min_size=1, max_size=6))
def test_damaged_valid_store_loses_only_the_damaged_records(valid_store, flips):
    """Bytes of a valid commit log XOR-ed: a record whose bytes were not touched is still
    read, and every entry is accounted for."""
    root = _copy(valid_store)
    try:
        log = bytearray((root / LOG0).read_bytes())
        for at, mask in flips:
            log[at] ^= mask
        (root / LOG0).write_bytes(bytes(log))
        rows = read_all(root, verify_crc=True)
        clean = read_all(valid_store)
        touched = {at for at, _ in flips}
        for record in (r for r in clean if r["reason"] is None):
            start, end = (
                record["commitlog_offset"],
                record["commitlog_offset"] + record["stored_size"],
            )
            if not any(start <= at < end for at in touched):
                assert any(r["reason"] is None and r["commitlog_offset"] == start for r in rows), (
                    record["queue_offset"]
                )
        for topic in (HALF, OP):
            cq = (root / "consumequeue" / topic / "0" / "00000000000000000000").read_bytes()
            assert_every_entry_accounted(rows, cq, topic)
    finally:
        shutil.rmtree(root)
