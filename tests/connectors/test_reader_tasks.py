"""How the store reader cuts its work into tasks for a cluster: at least as many tasks as
cores when the store allows it, the same records however it is cut, and paths that an
executor in another working directory can open."""

from __future__ import annotations

import bisect
import dataclasses
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from connectors.rocketmq import codec, read_tasks
from connectors.rocketmq.offset_filter import OffsetFilter
from connectors.rocketmq.reader import (
    COMBINED_ARROW,
    MIN_TASK_ENTRIES,
    TASK_ENTRIES,
    TRANSACTION_TOPICS,
    QueueUnit,
    ReadOptions,
    StoreSpec,
    in_log_order,
    pack_tasks,
    plan_store,
    run_unit,
    split_units,
    task_size,
)
from connectors.rocketmq.store_files import written_entries
from schemas.messages import COMMIT_MESSAGE
from simulator.writer import StoreWriter
from tests.connectors import reference


def _store(root: Path) -> Path:
    rows = reference.txn_rows(300)
    with StoreWriter(root, commitlog_file_size=8192, cq_file_entries=100) as writer:
        writer.append(reference.messages_table(rows))
    return root


def _read(units) -> list[dict]:
    batches = [b for unit in units for b in run_unit(unit, ReadOptions())]
    table = pa.Table.from_batches(batches, schema=COMBINED_ARROW)
    return sorted(table.to_pylist(), key=lambda r: (r["source"], r["position"]))


def test_cut_ranges_read_the_same_records(tmp_path: Path) -> None:
    units, _ = plan_store(StoreSpec("b", _store(tmp_path / "s")))

    pieces = split_units(units, 7)

    assert len(pieces) > len(units)
    assert all(p.weight <= 7 for p in pieces if isinstance(p, QueueUnit))
    assert sum(p.weight for p in pieces) == sum(u.weight for u in units)
    assert _read(pieces) == _read(units)


def _business_store(root: Path) -> Path:
    """Six business queues whose messages alternate, over commit-log files of 8 KiB."""
    rows = reference.txn_rows(120, compress_every=0)
    for i, row in enumerate(rows):
        row.update(topic=f"Topic{i % 3}", queue_id=i % 2, sys_flag=0)
    with StoreWriter(root, commitlog_file_size=8192, cq_file_entries=30) as writer:
        writer.append(reference.messages_table(rows))
    return root


def _entries(units) -> Counter:
    return Counter((u.cq_name, e) for u in units for e in range(u.entry_begin, u.entry_end))


def _entry_offset(unit: QueueUnit, entry: int) -> int:
    raw = (Path(unit.root) / unit.cq_name).read_bytes()
    return int(codec.decode_cq_entries(raw)[0][entry])


def test_log_order_cuts_ranges_at_commit_log_files_and_orders_them(tmp_path: Path) -> None:
    """``in_log_order`` cuts each consume-queue range where its entries cross into the next
    commit-log file and orders the pieces by the commit-log place of their first entry: the
    same entries, each once, and the same records; each piece inside one commit-log file."""
    root = _business_store(tmp_path / "s")
    topics = ("Topic0", "Topic1", "Topic2")
    units = split_units(plan_store(StoreSpec("b", root), topics=topics)[0], TASK_ENTRIES)
    files = units[0].commitlog

    pieces = in_log_order(units)
    firsts = [_entry_offset(p, p.entry_begin) for p in pieces]
    lasts = [_entry_offset(p, p.entry_end - 1) for p in pieces]

    assert len(files) >= 3 and len({(u.topic, u.queue_id) for u in units}) == 6
    assert len(pieces) > len(units)
    assert _entries(pieces) == _entries(units)
    assert firsts == sorted(firsts)
    starts = [f.start for f in files]
    assert all(
        bisect.bisect_right(starts, a) == bisect.bisect_right(starts, b)
        for a, b in zip(firsts, lasts, strict=True)
    )
    assert _read(pieces) == _read(units)


def test_log_order_keeps_every_entry_of_a_damaged_or_missing_consume_queue(
    tmp_path: Path,
) -> None:
    """Entries out of order (a damaged consume queue) and a file gone since planning only
    spoil the order: every entry is still in exactly one piece."""
    root = _business_store(tmp_path / "s")
    topics = ("Topic0", "Topic1")
    units = split_units(plan_store(StoreSpec("b", root), topics=topics)[0], TASK_ENTRIES)
    damaged, gone, ends_swapped = units[0], units[1], units[2]

    def point(unit: QueueUnit, entry: int, offset: int) -> None:
        with open(Path(unit.root) / unit.cq_name, "r+b") as f:
            f.seek(entry * codec.CQ_ENTRY_SIZE)
            f.write(offset.to_bytes(8, "big"))

    point(damaged, 2, 1 << 40)  # the third entry points far beyond the log
    point(ends_swapped, ends_swapped.entry_end - 1, 0)  # the last entry before the first
    (Path(gone.root) / gone.cq_name).unlink()

    pieces = in_log_order(units)

    assert _entries(pieces) == _entries(units)
    assert gone in pieces


def test_a_preallocated_file_is_read_up_to_its_last_written_entry(tmp_path: Path) -> None:
    """Queues of a few records in files of 100 000 entries (the broker's preallocated,
    zero-tailed files): one unit per file, of its written entries, and the same records as a
    read of every entry of the files. A small store is not cut into tasks of empty tail."""
    rows = reference.txn_rows(30)
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=1 << 20, cq_file_entries=100_000) as writer:
        writer.append(reference.messages_table(rows))
    per_queue = Counter(
        (row["topic"], row["queue_id"]) for row in rows if row["topic"] in TRANSACTION_TOPICS
    )

    units, _ = plan_store(StoreSpec("b", root))
    every_entry = [dataclasses.replace(u, entry_end=100_000) for u in units]

    assert sorted(((u.topic, u.queue_id), u.entry_end) for u in units) == sorted(per_queue.items())
    assert all(u.entry_begin == 0 for u in units)
    assert len(pack_tasks(split_units(units, MIN_TASK_ENTRIES), MIN_TASK_ENTRIES)) == 1
    assert _read(units) == _read(every_entry)


def test_written_entries_end_at_the_last_entry_with_a_byte_that_is_not_zero(
    tmp_path: Path,
) -> None:
    entry = 20
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as file:
        file.write(b"\x01" * (3 * entry))
        file.truncate(100_000 * entry)  # a hole, as the broker preallocates
    dense = tmp_path / "dense"
    # Zeros written out (a store copied without holes), one zero entry inside the records,
    # and a last entry whose only set byte is its last one.
    dense.write_bytes(
        b"\x01" * entry + bytes(entry) + b"\x00" * (entry - 1) + b"\x07" + bytes(5_000 * entry)
    )
    empty = tmp_path / "empty"
    empty.write_bytes(bytes(2_000_000))

    assert written_entries(sparse, sparse.stat().st_size) == 3
    assert written_entries(dense, dense.stat().st_size) == 3
    assert written_entries(empty, empty.stat().st_size) == 0


def test_task_size_gives_at_least_the_cores_when_the_store_is_big_enough() -> None:
    unit = QueueUnit("b", "/s", "T", 0, "consumequeue/T/0/0", 0, 0, 50_000, 50_000 * 20, ())

    size = task_size([unit], 8)
    tasks = pack_tasks(split_units([unit], size), size)

    assert size == 50_000 // 8
    assert len(tasks) >= 8
    assert task_size([unit], 1) == 50_000
    assert task_size([unit], 1_000) == MIN_TASK_ENTRIES  # never tiny tasks
    big = QueueUnit("b", "/s", "T", 0, "cq", 0, 0, 10**7, 10**7 * 20, ())
    assert task_size([big], 2) == TASK_ENTRIES  # never bigger than the usual task


def test_units_carry_an_absolute_store_path(tmp_path: Path, monkeypatch) -> None:
    _store(tmp_path / "s")
    monkeypatch.chdir(tmp_path)

    units, _ = plan_store(StoreSpec("b", Path("s")))

    assert units
    assert all(os.path.isabs(unit.root) for unit in units)
    assert {unit.root for unit in units} == {str(tmp_path / "s")}


def test_commits_only_decodes_the_committed_messages_and_nothing_else(tmp_path: Path) -> None:
    """A business queue of plain messages and commits (TRANSACTION_COMMIT_TYPE, with the
    half record's commit-log offset): with ``commits_only`` the reader returns exactly the
    commits, with the commit columns (``COMMIT_MESSAGE``) as the full read has them, and no
    bad record."""
    rows = reference.txn_rows(12, compress_every=0)
    for i, row in enumerate(rows):
        commit = i % 3 == 0
        row.update(
            topic="TopicTest",
            queue_id=0,
            sys_flag=0x8 if commit else 0,
            prepared_transaction_offset=4096 + i if commit else 0,
        )
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=8192, cq_file_entries=100) as writer:
        writer.append(reference.messages_table(rows))
    units, _ = plan_store(StoreSpec("b", root), topics=("TopicTest",))

    def read(options: ReadOptions) -> list[dict]:
        batches = [b for unit in units for b in run_unit(unit, options)]
        table = pa.Table.from_batches(batches, schema=options.arrow_schema)
        return sorted(table.to_pylist(), key=lambda r: r["queue_offset"])

    everything = read(ReadOptions())
    commits = read(ReadOptions(commits_only=True))

    assert len(everything) == 12 and all(r["reason"] is None for r in everything)
    assert [r["queue_offset"] for r in commits] == [0, 3, 6, 9]
    assert [r["prepared_transaction_offset"] for r in commits] == [4096, 4099, 4102, 4105]
    assert list(commits[0]) == [*COMMIT_MESSAGE.fieldNames(), "reason", "raw_hex"]
    full = [r for r in everything if r["sys_flag"] & 0xC == 0x8]
    assert commits == [{name: r[name] for name in commits[0]} for r in full]


def test_commit_filters_decode_the_commits_they_may_hold(tmp_path: Path) -> None:
    """With ``commit_filters``, a broker's commits are decoded when its filter may hold their
    prepared-transaction offset: every wanted one, and of the others exactly those the
    filter lets through; a broker without a filter has none decoded, and a broken record
    is reported whatever the filter."""
    rows = reference.txn_rows(40, compress_every=0)
    for i, row in enumerate(rows):
        row.update(
            topic="TopicTest", queue_id=0, sys_flag=0x8, prepared_transaction_offset=4096 * i
        )
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=8192, cq_file_entries=100) as writer:
        writer.append(reference.messages_table(rows))
    units, _ = plan_store(StoreSpec("b", root), topics=("TopicTest",))

    def read(filters) -> list[dict]:
        options = ReadOptions(commits_only=True, commit_filters=filters)
        batches = [b for unit in units for b in run_unit(unit, options)]
        return pa.Table.from_batches(batches, schema=options.arrow_schema).to_pylist()

    every = sorted(r["prepared_transaction_offset"] for r in read(None))
    wanted = np.array([4096 * i for i in (3, 17, 30)], dtype=np.int64)
    found = OffsetFilter.of(wanted)
    through = [p for p in every if found.might_contain(np.array([p]))[0]]

    assert every == [4096 * i for i in range(40)]
    assert sorted(r["prepared_transaction_offset"] for r in read((("b", found),))) == through
    assert set(wanted.tolist()) <= set(through) and len(through) < len(every)
    assert read((("other", found),)) == []

    # A broken record (its size field cut) is still decoded and reported.
    log = next((root / "commitlog").iterdir())
    with open(log, "r+b") as f:
        f.write((7).to_bytes(4, "big"))  # the first record's TOTALSIZE
    broken = read((("other", found),))
    assert len(broken) == 1 and broken[0]["reason"] is not None


def test_chunks_bounded_by_file_span_read_the_same_records(tmp_path: Path, monkeypatch) -> None:
    """A worker maps at most CHUNK_SPAN of a commit-log file at a time: chunks cut by the span
    of the file they cover (a queue's records lie among other queues') give the same records
    and bad records as one chunk per file, in more batches, through a consume queue and
    through a commit-log scan alike."""
    root = _store(tmp_path / "s")
    units, _ = plan_store(StoreSpec("b", root))
    shutil.copytree(root, tmp_path / "scan")
    shutil.rmtree(tmp_path / "scan" / "consumequeue")
    scans, _ = plan_store(StoreSpec("b", tmp_path / "scan"))
    assert any(isinstance(u, QueueUnit) for u in units)
    assert scans and not any(isinstance(u, QueueUnit) for u in scans)

    def batches(units) -> int:
        return sum(1 for unit in units for _ in run_unit(unit, ReadOptions()))

    whole = (_read(units), _read(scans), batches(units), batches(scans))
    monkeypatch.setattr(read_tasks, "CHUNK_SPAN", 600)  # a few records of the 8 KiB files
    cut = (_read(units), _read(scans), batches(units), batches(scans))

    assert cut[:2] == whole[:2]
    assert len(cut[0]) == len(whole[0]) > 0
    assert cut[2] > whole[2] and cut[3] > whole[3]
