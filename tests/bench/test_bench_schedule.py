"""bench.schedule's earlier store: where a simulated store ended some minutes before its
newest half record."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.schedule import cut_before, decode_rate, targets
from connectors.rocketmq.probe import entry_at, record_head
from schemas.messages import HALF_TOPIC
from simulator.growth import copy_prefix, record_ends
from simulator.simulation import SimConfig, write_store


def _stored_at(store: Path, index: int) -> int:
    entry = entry_at(store, HALF_TOPIC, 0, index)
    assert entry is not None
    head = record_head(store, entry[0])
    assert head is not None
    return head.store_timestamp_ms


def test_the_cut_ends_the_store_minutes_before_its_newest_half_record(tmp_path: Path) -> None:
    store = tmp_path / "a"
    write_store(SimConfig(transactions=800, seed=4, duration_s=1800), store)
    ends = list(record_ends(store, HALF_TOPIC))
    cut = cut_before(store, 5)
    kept = ends.index(cut)  # a record boundary: the end of half record `kept`
    limit = _stored_at(store, len(ends) - 1) - 5 * 60_000
    assert _stored_at(store, kept) <= limit < _stored_at(store, kept + 1)


def _run(wall_s: float, progress: list[str], read: int = 0, pss: int = 2**30) -> dict:
    return {"wall_s": wall_s, "progress": progress, "disk_read_bytes": read, "peak_pss_bytes": pss}


def _figures(size: str, peer: dict) -> dict:
    first = _run(
        90.0,
        [
            "[    0.0s] reading 2000 consume-queue entries; 1 commit-log file(s)",
            "[    5.0s] decode: 0/3 tasks done in 1 stage(s)",
            "[   10.0s] mirror: 2000 new half/op records decoded into /o/mirror_records in 4.0 s",
            "[   60.0s] mirror: 10 new committed messages decoded into /o/mirror_commits in 1.0 s",
        ],
    )
    scheduled = _run(
        30.0,
        [
            "[    0.0s] reading 2100 consume-queue entries",
            "[    2.0s] mirror: 0 new half/op records decoded into /o/mirror_records in 0.1 s",
        ],
        read=300,
    )
    return {
        "size": size,
        "first": first,
        "scheduled": scheduled,
        "bare": {"wall_s": 10.0},
        "peer": peer,
        "appended_bytes": 100,
    }


def test_decode_rate_is_the_half_op_records_over_the_extensions_seconds() -> None:
    figures = _figures("1m", {})
    assert decode_rate(figures["first"]) == 500.0
    assert decode_rate(figures["scheduled"]) is None  # nothing decoded into the mirror


def test_each_target_is_judged_at_the_size_the_issue_sets_it_for() -> None:
    peer = {"export_wall_s": 20.0, "wall_s": 40.0}
    at_16m = {t.name: t for t in targets(_figures("16m", peer))}
    first = at_16m["first run / (peer export + round)"]
    assert (first.value, first.met("16m")) == (1.5, True)  # 90 / (20 + 40), at the limit
    assert at_16m["scheduled run / peer round"].met("16m") is False  # 30 / 40 > 0.25
    assert at_16m["scheduled run's disk reads / bytes appended"].value == 3.0
    assert at_16m["decode into the mirror, first run"].met("16m") is False  # 200 < 600 000
    net = at_16m["first run net of bare Spark / (peer export + round)"]
    assert (net.value, net.met("16m"), net.met("1m")) == (80 / 60, None, True)
    assert "not judged here" in net.line("16m")
    assert "MISSED" in at_16m["scheduled run / bare Spark"].line("16m")  # 30 / 10 > 2


def test_a_failed_peer_leaves_its_ratios_missing_not_judged() -> None:
    rows = {t.name: t for t in targets(_figures("16m", {"error": "exit 1"}))}
    ratio = rows["scheduled run / peer round"]
    assert ratio.value is None and ratio.met("16m") is None
    assert "missing" in ratio.line("16m")
    assert rows["scheduled run / bare Spark"].value == 3.0


def _allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def _written(path: Path) -> int:
    """The file's length without its all-zero tail."""
    nonzero = np.flatnonzero(np.frombuffer(path.read_bytes(), dtype=np.uint8))
    return int(nonzero[-1]) + 1 if nonzero.size else 0


def test_a_prefix_leaves_the_zero_tails_holes_and_grows_in_place_to_the_same_bytes(
    tmp_path: Path,
) -> None:
    full, store = tmp_path / "full", tmp_path / "store"
    small_files = SimConfig(
        transactions=800,
        seed=4,
        duration_s=1800,
        commitlog_file_size=256 << 10,
        cq_file_entries=500,
    )
    write_store(small_files, full)
    ends = record_ends(full, HALF_TOPIC)
    copy_prefix(full, store, int(ends[len(ends) // 2]))
    files = [p for p in sorted(store.rglob("*")) if p.is_file() and p.parent.name != "config"]
    # As in a broker's preallocated files: the unwritten tail takes no disk blocks (a few
    # blocks of slack for the file system's allocation).
    assert all(_allocated(p) <= _written(p) + (64 << 10) for p in files)
    assert any(_allocated(p) < p.stat().st_size for p in files)
    end = int(ends[-1])
    copy_prefix(full, store, end)  # grown in place, over the holes
    copy_prefix(full, tmp_path / "at-once", end)
    for path in files:
        assert path.read_bytes() == (tmp_path / "at-once" / path.relative_to(store)).read_bytes()
    for log in (store / "commitlog").iterdir():
        start = int(log.name)
        assert (
            log.read_bytes()[: max(0, end - start)]
            == ((full / "commitlog" / log.name).read_bytes()[: max(0, end - start)])
        )
