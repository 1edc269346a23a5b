"""The driver-side probe of a store's transaction queues (connectors/rocketmq/probe.py): queue
spans past a late queue head, single entries and record heads, and the oldest and newest
half/op store times of whole stores, clean, truncated, expired and copied-with-nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from connectors.rocketmq import codec
from connectors.rocketmq.probe import (
    WALK_ENTRIES,
    RecordHead,
    StoreTimes,
    entry_at,
    queue_span,
    record_head,
    transaction_times,
)
from connectors.rocketmq.store_files import list_commitlog
from simulator.simulation import SimConfig, write_store
from tests.robustness.store import HALF, LOG0, OP, T, base_rows, half, halves, op, write


def _many(count: int) -> list[dict]:
    """An op, then ``count`` halves, stored one second apart up to T - 1 s + 1 ms."""
    first = T - (count + 1) * 1_000
    rows = [{**op(b"0,"), "born_timestamp_ms": first, "store_timestamp_ms": first}]
    for i in range(count):
        row = half(i, age_ms=(count - i) * 1_000)
        rows.append(row)
    return rows


def test_a_small_store_spans_its_queues_and_reads_its_records(tmp_path: Path) -> None:
    rows = write(tmp_path, base_rows())
    assert queue_span(tmp_path, HALF, 0) == (0, 4)
    assert queue_span(tmp_path, OP, 0) == (0, 1)
    assert queue_span(tmp_path, HALF, 1) is None  # no consume-queue directory
    last = halves(rows)[-1]
    assert entry_at(tmp_path, HALF, 0, 3) == (last["commitlog_offset"], last["stored_size"])
    assert entry_at(tmp_path, HALF, 0, 4) is None  # the unwritten tail
    assert entry_at(tmp_path, HALF, 0, -1) is None
    assert entry_at(tmp_path, HALF, 0, 10_000) is None  # beyond every file
    assert record_head(tmp_path, last["commitlog_offset"]) == RecordHead(
        commitlog_offset=last["commitlog_offset"],
        queue_id=0,
        queue_offset=3,
        store_timestamp_ms=last["store_timestamp_ms"],
        born_timestamp_ms=last["born_timestamp_ms"],
        topic=HALF,
    )
    assert record_head(tmp_path, last["commitlog_offset"] + 1) is None  # not a record start
    assert record_head(tmp_path, 1 << 40) is None  # in no commit-log file
    # op stored at T - 50 s, the halves from T - 60 s + 1
    assert transaction_times(tmp_path) == StoreTimes(T - 60_000 + 1, T - 50_000, 0)


def test_a_late_queue_head_starts_after_its_pad_entries(tmp_path: Path) -> None:
    rows = base_rows()
    rows[1] = {**rows[1], "queue_offset": 5}  # the first half; the next ones follow it
    written = write(tmp_path, rows)
    assert [r["queue_offset"] for r in halves(written)] == [5, 6, 7, 8]
    assert queue_span(tmp_path, HALF, 0) == (5, 9)
    assert entry_at(tmp_path, HALF, 0, 4) is None  # a pad entry
    first = halves(written)[0]
    assert entry_at(tmp_path, HALF, 0, 5) == (first["commitlog_offset"], first["stored_size"])


def test_a_queue_over_several_files_on_both_sides(tmp_path: Path) -> None:
    # 150 halves: three consume-queue files of 64 entries, many commit-log files.
    rows = write(tmp_path, _many(150), commitlog_file_size=4096)
    assert len(list_commitlog(tmp_path)[0]) > 3
    assert queue_span(tmp_path, HALF, 0) == (0, 150)
    second_file = halves(rows)[64]
    assert entry_at(tmp_path, HALF, 0, 64) == (
        second_file["commitlog_offset"],
        second_file["stored_size"],
    )
    newest = halves(rows)[-1]["store_timestamp_ms"]
    assert transaction_times(tmp_path) == StoreTimes(T - 151_000, newest, 0)


def test_a_truncated_commit_log_counts_its_unreadable_tail(tmp_path: Path) -> None:
    # One big commit-log file truncated after half 99: halves 100..299 point past its end.
    count = 300
    rows = write(tmp_path, _many(count), commitlog_file_size=1 << 20)
    cut = halves(rows)[100]["commitlog_offset"] + 10
    os.truncate(tmp_path / LOG0, cut)
    times = transaction_times(tmp_path)
    # more than WALK_ENTRIES unreadable: found by bisection, exactly
    assert count - 100 > WALK_ENTRIES
    assert times == StoreTimes(
        rows[0]["store_timestamp_ms"], halves(rows)[99]["store_timestamp_ms"], count - 100
    )
    assert record_head(tmp_path, halves(rows)[100]["commitlog_offset"]) is None


def test_a_few_unreadable_entries_are_walked_back_over(tmp_path: Path) -> None:
    rows = write(tmp_path, _many(20), commitlog_file_size=1 << 20)
    os.truncate(tmp_path / LOG0, halves(rows)[17]["commitlog_offset"] + 40)
    assert transaction_times(tmp_path) == StoreTimes(
        rows[0]["store_timestamp_ms"], halves(rows)[16]["store_timestamp_ms"], 3
    )


def test_an_expired_queue_head_is_skipped_to_the_first_readable_record(tmp_path: Path) -> None:
    rows = write(tmp_path, _many(300), commitlog_file_size=4096)
    # The first commit-log files expired: the oldest half still readable is the first one
    # in the first file left. The op queue, in the first file, expired whole: no unreadable
    # tail.
    files = list_commitlog(tmp_path)[0]
    for log in files[:10]:
        os.remove(tmp_path / log.name)
    kept = [r for r in halves(rows) if r["commitlog_offset"] >= files[10].start]
    assert len(halves(rows)) - len(kept) > WALK_ENTRIES
    times = transaction_times(tmp_path)
    assert times == StoreTimes(kept[0]["store_timestamp_ms"], kept[-1]["store_timestamp_ms"], 0)


def test_a_queue_unreadable_at_both_ends_is_sampled_then_bisected(tmp_path: Path) -> None:
    rows = write(tmp_path, _many(300), commitlog_file_size=4096)
    files = list_commitlog(tmp_path)[0]
    for log in (*files[:5], *files[-5:]):  # expired head, lost tail
        os.remove(tmp_path / log.name)
    kept = [r for r in halves(rows) if files[5].start <= r["commitlog_offset"] < files[-5].start]
    lost = [r for r in halves(rows) if r["commitlog_offset"] >= files[-5].start]
    assert len(halves(rows)) - len(kept) - len(lost) > WALK_ENTRIES < len(lost)
    assert transaction_times(tmp_path) == StoreTimes(
        kept[0]["store_timestamp_ms"], kept[-1]["store_timestamp_ms"], len(lost)
    )


def test_a_store_with_no_readable_transaction_record(tmp_path: Path) -> None:
    write(tmp_path, base_rows())
    shutil.rmtree(tmp_path / "consumequeue")
    assert transaction_times(tmp_path) == StoreTimes(None, None, 0)
    # consume queues that point only at a commit log that is gone
    other = tmp_path / "other"
    write(other, base_rows())
    os.truncate(other / LOG0, 0)
    assert transaction_times(other) == StoreTimes(None, None, 5)


def test_an_entry_pointing_at_another_queues_record_is_not_read_as_its_own(
    tmp_path: Path,
) -> None:
    rows = write(tmp_path, base_rows())
    # The op queue's one entry is made to point at half 0: not an op record.
    cq = tmp_path / "consumequeue" / OP / "0" / "00000000000000000000"
    entry = np.array([(halves(rows)[0]["commitlog_offset"], 100, 0)], codec.CQ_DTYPE)
    raw = bytearray(cq.read_bytes())
    raw[:20] = entry.tobytes()
    cq.write_bytes(bytes(raw))
    times = transaction_times(tmp_path)
    assert times == StoreTimes(T - 60_000 + 1, T - 60_000 + 1, 1)


def _decoded_times(root: Path) -> tuple[int, int]:
    """The oldest and newest store time of every half/op record, decoded whole."""
    times: list[int] = []
    for log in list_commitlog(root)[0]:
        buf = codec.open_read_only(root / log.name)
        walk = codec.walk_records(buf)
        records = codec.decode_records(buf, walk.positions, file_offset=log.start).records
        for row in records.select(["topic", "store_timestamp_ms"]).to_pylist():
            if row["topic"] in (HALF, OP):
                times.append(row["store_timestamp_ms"])
    return min(times), max(times)


@pytest.mark.parametrize("seed", [3, 8])
def test_a_simulated_store_gives_the_times_of_its_records(tmp_path: Path, seed: int) -> None:
    config = SimConfig(
        transactions=300,
        duration_s=600,
        seed=seed,
        commitlog_file_size=64 << 10,
        cq_file_entries=128,
    )
    write_store(config, tmp_path)
    assert len(list_commitlog(tmp_path)[0]) > 2
    oldest, newest = _decoded_times(tmp_path)
    assert transaction_times(tmp_path) == StoreTimes(oldest, newest, 0)
