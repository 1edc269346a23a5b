"""Which real queues the discard history reads, and the one-line notes for the others
(``connectors.rocketmq.discards``): no Spark, a store's folders only."""

from __future__ import annotations

from pathlib import Path

from connectors.rocketmq.discards import readable_queues, unread_queue_notes

LONG_TOPIC = "Orders_" + "x" * 188 + "_eu-1"


def test_any_topic_with_a_consume_queue_is_read_and_every_other_one_is_a_note(
    tmp_path: Path,
) -> None:
    for topic in (LONG_TOPIC, "a\nb"):
        queue = tmp_path / "consumequeue" / topic / "1"
        queue.mkdir(parents=True)
        (queue / "00000000000000000000").write_bytes(b"\0" * 20)
    (tmp_path / "etc" / "1").mkdir(parents=True)  # what "../etc" would reach from consumequeue/
    (tmp_path / "etc" / "1" / "00000000000000000000").write_bytes(b"\0" * 20)
    named = sorted(
        [
            ("a", LONG_TOPIC, 1),
            ("a", "a\nb", 1),
            ("a", "a\nb", 2),
            ("a", "Gone", 0),
            ("a", "../etc", 1),
            ("a", "../etc", 2),
            ("a", "", 0),
        ]
    )

    readable = readable_queues([f"a={tmp_path}"], named)
    notes = unread_queue_notes(named, readable)

    assert readable == [("a", LONG_TOPIC, 1), ("a", "a\nb", 1)]
    assert all("\n" not in note for note in notes)
    assert notes == [
        "a: real queue Gone/0 cannot be read (no consume queue): its ended transactions show"
        " as ended",
        "a: real queue 'a\\nb'/2 cannot be read (no consume queue): its ended transactions"
        " show as ended",
        "a: real topic '' is not read: its name is empty, so it is never made a path; the"
        " ended transactions of its queue(s) 0 show as ended",
        "a: real topic '../etc' is not read: its name holds a path separator, so it is never"
        " made a path; the ended transactions of its queue(s) 1, 2 show as ended",
    ]
