"""The "needs attention first" lines of the printed summary and the report."""

from __future__ import annotations

from pathlib import Path

from jobs.attention import attention_lines, settings_line
from jobs.reconcile import format_summary

HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"


def summary(broker: str, **counts: int) -> dict:
    row = {"broker": broker, "queue_id": 0, "discard_next_round": 0, "past_last_check": 0}
    row.update({"discard_check_max": 0, "discard_expired": 0, "check_interval_ms": 30_000})
    row.update({"check_max": 15, "transaction_timeout_ms": 6000, "file_reserved_hours": 72})
    row.update({"writer": "delta-rs", "job_version": "0.1.0", "inputs": [f"store:{broker}=/s"]})
    return {**row, **counts}


def offsets(broker: str, topic: str, committed: int | None, safe: int | None) -> dict:
    return {
        "broker": broker,
        "topic": topic,
        "queue_id": 0,
        "offset_committed": committed,
        "offset_safe": safe,
    }


def test_urgent_first_then_the_offsets_to_install_with_the_command() -> None:
    rows = [
        summary("b", discard_next_round=2, past_last_check=1),
        summary("a", discard_expired=4, settled_discards=3),
    ]
    moves = [offsets("a", HALF, 10, 10), offsets("a", OP, 3, 3)]
    moves += [offsets("b", HALF, 26, 31), offsets("b", OP, None, 6)]

    lines = attention_lines(rows, moves, "out")

    assert lines == [
        "2 pending transaction(s) are discarded by the next round (in 30000 ms at the earliest)"
        " if nobody answers (b queue 0: 2); pending rows by discard_at_ms",
        "1 check request(s) are the last before a discard: the counter reached check_max"
        " (b queue 0: 1); check_requests with checks_left = 0 and really_pending",
        "4 transaction(s) discarded this round: table discards, really_pending",
        "3 discard(s) of the broker's round are re-discards of transactions an op record"
        " already settled (a queue 0: 3): harmless; discards with really_pending = false",
        f"offsets to install into stopped broker b: {HALF} queue 0 26 -> 31, {OP} queue 0 None -> 6:"
        " python -m jobs.offsets install out/offset_fragments/b/consumerOffset.safe.json"
        " --into <its store>/config/consumerOffset.json",
    ]


def test_nothing_to_install_is_said_too() -> None:
    lines = attention_lines([summary("a")], [offsets("a", HALF, 5, 5)], "out")
    assert lines == ["offsets: nothing to install (the safe offsets are the committed ones)"]


def test_the_printed_summary_echoes_the_settings_before_the_attention_lines() -> None:
    row = {**summary("a", discard_expired=1), "h0": None, "warnings": []}
    row.update({name: 0 for name in ("resolved", "check", "immune", "too_young", "not_reached")})
    row["bad_records"] = 0

    text = format_summary([row], "out", "r1", 1_700_000_000_000, [offsets("a", HALF, 5, 5)])

    lines = text.splitlines()
    assert lines[1] == settings_line([row])
    assert lines[1] == (
        "settings: check_max=15 transaction_timeout_ms=6000 file_reserved_hours=72"
        " check_interval_ms=30000 writer=delta-rs job_version=0.1.0 inputs=store:a=/s"
    )
    assert lines[2:4] == [
        "needs attention first:",
        "  1 transaction(s) discarded this round: table discards, really_pending",
    ]


def test_what_may_make_the_picture_wrong_comes_before_any_count() -> None:
    held = summary("a", discard_expired=3, bad_records=2, offset_hold="no committed offset")
    held["warnings"] = ["the store looks copied"]
    rows = [held, summary("b", discard_next_round=1)]
    moves = [offsets("a", HALF, None, None), offsets("b", HALF, 4, 4)]

    lines = attention_lines(rows, moves, "out", ["as-of auto: latest"])

    bad_table = Path("out").resolve() / "bad_records"
    assert lines[:4] == [
        "as-of auto: latest",
        "a queue 0: offsets held, nothing to install: no committed offset",
        f"2 bad half/op record(s) took no part in the round (a queue 0: 2): rows in {bad_table};"
        " the picture leaves them out",
        "a queue 0: the store looks copied",
    ]
    assert lines[-1] == "offsets: nothing to install (held queues above)"
