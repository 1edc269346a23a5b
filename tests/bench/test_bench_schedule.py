"""bench.schedule's earlier store: where a simulated store ended some minutes before its
newest half record."""

from __future__ import annotations

from pathlib import Path

from bench.schedule import cut_before
from connectors.rocketmq.probe import entry_at, record_head
from schemas.messages import HALF_TOPIC
from simulator.growth import record_ends
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
