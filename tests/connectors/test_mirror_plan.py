"""The mirror's plan (``connectors.rocketmq.mirror_plan``) on simulated stores that grow
(``simulator.growth``): what a run decodes into the mirror, what it reads from it, what it
decodes live, and the stores it refuses to go on from."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from connectors.rocketmq.mirror_plan import MirrorPlan, QueueMark, clip, plan_mirror
from connectors.rocketmq.probe import CommitLogHeads, queue_span
from connectors.rocketmq.read_plan import QueueUnit, plan_store
from connectors.rocketmq.store_files import StoreSpec
from schemas.messages import HALF_TOPIC, OP_TOPIC
from simulator.growth import copy_prefix, expire_head, record_ends
from simulator.simulation import SimConfig, write_store

HALF = ("a", HALF_TOPIC, 0)
OP = ("a", OP_TOPIC, 0)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mirror-plan") / "full"
    config = SimConfig(transactions=600, seed=5, commitlog_file_size=128 << 10, cq_file_entries=200)
    write_store(config, root)
    return root


def _plan(store: Path, marks: dict, rebuild: dict | None = None) -> MirrorPlan:
    units, _ = plan_store(StoreSpec("a", store))
    return plan_mirror({"a": store}, units, marks, rebuild or {})


def _offsets(units: list) -> set[tuple[str, int]]:
    """(topic, queue offset) of every entry the units cover."""
    return {
        (u.topic, u.cq_start // 20 + i) for u in units for i in range(u.entry_begin, u.entry_end)
    }


def _grown(full: Path, store: Path, share: float) -> Path:
    ends = record_ends(full, HALF_TOPIC)
    copy_prefix(full, store, int(ends[int(share * (len(ends) - 1))]))
    return store


def test_clip_keeps_the_entries_of_a_queue_offset_range() -> None:
    unit = QueueUnit("a", "/s", HALF_TOPIC, 0, "cq", 4000, 10, 50, 4000, ())  # entries 210..249
    clipped = clip(unit, 230, 240)
    assert clipped is not None and (clipped.entry_begin, clipped.entry_end) == (30, 40)
    assert clip(unit, 0, 210) is None and clip(unit, 250, 300) is None


def test_a_first_run_decodes_every_entry_into_the_mirror(full: Path, tmp_path: Path) -> None:
    store = _grown(full, tmp_path / "a", 1.0)
    plan = _plan(store, {})
    spans = {topic: queue_span(store, topic, 0) for topic in (HALF_TOPIC, OP_TOPIC)}
    assert plan.ranges == {HALF: spans[HALF_TOPIC], OP: spans[OP_TOPIC]}
    assert _offsets(plan.extend) == {
        (topic, offset) for topic, (first, end) in spans.items() for offset in range(first, end)
    }
    assert plan.live == [] and plan.rebuilt == {}
    assert {key: mark.next_offset for key, mark in plan.marks.items()} == {
        HALF: spans[HALF_TOPIC][1],
        OP: spans[OP_TOPIC][1],
    }


def test_the_next_run_decodes_only_what_the_store_appended(full: Path, tmp_path: Path) -> None:
    store = _grown(full, tmp_path / "a", 0.4)
    marks = _plan(store, {}).marks
    _grown(full, store, 0.9)
    plan = _plan(store, marks)
    assert plan.rebuilt == {}
    assert min(offset for topic, offset in _offsets(plan.extend) if topic == HALF_TOPIC) == (
        marks[HALF].next_offset
    )
    assert plan.ranges[HALF] == (0, plan.marks[HALF].next_offset)
    assert plan.marks[HALF].next_offset == queue_span(store, HALF_TOPIC, 0)[1]
    assert _plan(store, plan.marks).extend == []


def test_entries_whose_commit_log_expired_are_read_live_and_not_from_the_mirror(
    full: Path, tmp_path: Path
) -> None:
    store = _grown(full, tmp_path / "a", 1.0)
    marks = _plan(store, {}).marks
    expire_head(store)
    plan = _plan(store, marks)
    first_log = CommitLogHeads.of(store).files[0].start
    assert plan.rebuilt == {} and plan.extend == []
    live = _offsets(plan.live)
    assert live and all(topic in (HALF_TOPIC, OP_TOPIC) for topic, _ in live)
    first, end = plan.ranges[HALF]
    assert 0 < first < end == marks[HALF].next_offset
    assert (HALF_TOPIC, first - 1) in live and (HALF_TOPIC, first) not in live
    assert first_log > 0


def test_a_store_replaced_by_another_brokers_is_read_whole_again(
    full: Path, tmp_path: Path
) -> None:
    store = _grown(full, tmp_path / "a", 0.5)
    marks = _plan(store, {}).marks
    other = tmp_path / "other"
    write_store(SimConfig(transactions=600, seed=6, commitlog_file_size=128 << 10), other)
    shutil.rmtree(store)
    copy_prefix(other, store, int(record_ends(other, HALF_TOPIC)[-1]))
    plan = _plan(store, marks)
    assert set(plan.rebuilt) == {"a"}
    assert _offsets(plan.extend) == _offsets(_plan(store, {}).extend)


def test_a_store_reset_to_fewer_entries_is_read_whole_again(full: Path, tmp_path: Path) -> None:
    store = _grown(full, tmp_path / "a", 0.8)
    marks = _plan(store, {}).marks
    shutil.rmtree(store)
    _grown(full, store, 0.3)
    plan = _plan(store, marks)
    assert "ends at offset" in plan.rebuilt["a"]
    assert plan.marks[HALF].next_offset == queue_span(store, HALF_TOPIC, 0)[1]


def test_a_mark_naming_another_record_is_a_mismatch(full: Path, tmp_path: Path) -> None:
    store = _grown(full, tmp_path / "a", 0.5)
    mark = _plan(store, {}).marks[HALF]
    moved = QueueMark(
        mark.next_offset, mark.commitlog_offset, mark.size, mark.store_timestamp_ms + 1
    )
    assert "stored at" in _plan(store, {HALF: moved}).rebuilt["a"]
    assert _plan(store, {HALF: mark}).rebuilt == {}


def test_rebuild_ignores_the_marks(full: Path, tmp_path: Path) -> None:
    store = _grown(full, tmp_path / "a", 1.0)
    marks = _plan(store, {}).marks
    plan = _plan(store, marks, {"a": "--rebuild"})
    assert plan.rebuilt == {"a": "--rebuild"}
    assert _offsets(plan.extend) == _offsets(_plan(store, {}).extend)


def test_records_readable_before_the_first_the_mirror_read_are_a_mismatch(
    full: Path, tmp_path: Path
) -> None:
    store = _grown(full, tmp_path / "a", 0.5)
    mark = _plan(store, {}).marks[HALF]
    assert mark.first_offset == 0
    later = replace(mark, first_offset=1)  # as if the first entry was unreadable back then
    assert "before the first the mirror read (1)" in _plan(store, {HALF: later}).rebuilt["a"]
