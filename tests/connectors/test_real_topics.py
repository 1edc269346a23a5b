"""Real topics of any name: which names can be a folder of ``consumequeue/``
(``layout.topic_path_problem``), and a real queue whose topic is longer than 127 characters
(a v2 record, two-byte topic length) read through its consume queue for its commits."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from connectors.rocketmq import layout
from connectors.rocketmq.offset_filter import OffsetFilter
from connectors.rocketmq.reader import StoreSpec, plan_store, read_stores
from simulator.discard_cases import commit_of
from simulator.writer import StoreWriter
from tests.connectors.reference import messages_table
from tests.robustness.store import half

# A 5.x topic name: longer than the 127 characters a v1 record can carry.
LONG_TOPIC = "Orders_" + "x" * 188 + "_eu-1"


def _append(writer: StoreWriter, rows: list[dict]) -> list[dict]:
    assigned = writer.append(messages_table(rows)).to_pylist()
    return [{**row, **got} for row, got in zip(rows, assigned, strict=True)]


@pytest.mark.parametrize(
    "topic",
    [
        LONG_TOPIC,
        "TopicOrder",
        "%RETRY%group-a",
        "a|b",
        "with space",
        "主题",
        "a.b",
        "..a",
        "x" * 255,
    ],
)
def test_any_single_folder_name_is_a_topic_folder(topic: str, tmp_path: Path) -> None:
    assert layout.topic_path_problem(topic) is None
    assert layout.topic_folder(tmp_path, topic) == tmp_path / "consumequeue" / topic


@pytest.mark.parametrize(
    ("topic", "problem"),
    [
        ("", "is empty"),
        (".", "is '.'"),
        ("..", "is '..'"),
        ("a/b", "holds a path separator"),
        ("../../etc", "holds a path separator"),
        ("/abs", "holds a path separator"),
        ("a\x00b", "holds a NUL character"),
        ("x" * 256, "is 256 bytes long, more than a file name can be (255)"),
        ("é" * 128, "is 256 bytes long, more than a file name can be (255)"),
        ("a\udc00b", "cannot be encoded as a file name"),
    ],
)
def test_a_name_that_is_not_one_folder_is_never_a_path(
    topic: str, problem: str, tmp_path: Path
) -> None:
    assert layout.topic_path_problem(topic) == problem
    with pytest.raises(ValueError, match="it is no folder of consumequeue/"):
        layout.topic_folder(tmp_path, topic)
    # The planner never joins such a name to the store's path either.
    with pytest.raises(ValueError, match="it is no folder of consumequeue/"):
        plan_store(StoreSpec("a", tmp_path), topics=(topic,))


def test_a_real_queue_with_a_200_character_topic_is_read_and_its_commit_found(
    spark, tmp_path: Path
) -> None:
    """The half record names a 200-character real topic; the store holds that queue (a plain
    message, then the commit whose prepared-transaction offset is the half record's): the
    commits-only read of exactly that queue finds the commit, stored as a v2 record."""
    assert len(LONG_TOPIC) == 200
    root = tmp_path / "broker-a"
    props = {"REAL_TOPIC": LONG_TOPIC, "REAL_QID": "1"}
    with StoreWriter(root, commitlog_file_size=1 << 16, cq_file_entries=64) as writer:
        (prepared,) = _append(writer, [half(0, **props)])
        committed = commit_of(prepared, prepared["store_timestamp_ms"] + 2)
        plain = {**committed, "sys_flag": 0, "prepared_transaction_offset": 0}
        rows = _append(writer, [plain, committed])
    assert (root / "consumequeue" / LONG_TOPIC / "1").is_dir()
    log = root / "commitlog" / layout.offset_file_name(0)
    magic = struct.unpack_from(">i", log.read_bytes(), rows[1]["commitlog_offset"] + 4)[0]
    assert magic == layout.MAGIC_CODE_V2

    wanted = OffsetFilter.of(np.array([prepared["commitlog_offset"]], dtype=np.int64))
    read = read_stores(
        spark,
        [StoreSpec("a", root)],
        topics=(LONG_TOPIC,),
        only_queues=frozenset({("a", LONG_TOPIC, 1)}),
        commits_only=True,
        commit_filters={"a": wanted},
    )
    try:
        found = [row.asDict() for row in read.messages.collect()]  # one commit
        assert read.bad_records.isEmpty()
    finally:
        read.unpersist()
    assert [
        (r["topic"], r["queue_id"], r["queue_offset"], r["prepared_transaction_offset"])
        for r in found
    ] == [(LONG_TOPIC, 1, 1, prepared["commitlog_offset"])]
