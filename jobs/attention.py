"""What needs attention first, in words: shared by the printed summary and the HTML report.

Plain Python over the few rows of ``run_summary`` (one per queue) and ``consume_offsets``
(one per queue and topic); never over records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

SETTINGS = ("check_max", "transaction_timeout_ms", "file_reserved_hours", "check_interval_ms")
INSTALL = "python -m jobs.offsets install"


def _total(rows: Iterable[Mapping], column: str) -> int:
    return sum(int(row.get(column) or 0) for row in rows)


def _queue(row: Mapping) -> str:
    return f"{row['broker']} queue {row['queue_id']}"


def _per_queue(rows: Sequence[Mapping], column: str) -> str:
    parts = [f"{_queue(row)}: {int(row[column])}" for row in rows if row.get(column)]
    return "; ".join(parts)


def offsets_to_install(offset_rows: Iterable[Mapping]) -> dict[str, list[str]]:
    """Per broker, the queues whose safe offset differs from the committed one (a held
    queue has none: ``offset_safe`` is null)."""
    moves: dict[str, list[str]] = {}
    for row in sorted(offset_rows, key=lambda r: (r["broker"], r["topic"], r["queue_id"])):
        if row.get("offset_safe") is not None and row["offset_safe"] != row["offset_committed"]:
            moves.setdefault(row["broker"], []).append(
                f"{row['topic']} queue {row['queue_id']} "
                f"{row['offset_committed']} -> {row['offset_safe']}"
            )
    return moves


def picture_lines(rows: Sequence[Mapping], output_root: str) -> list[str]:
    """What may make the picture wrong, before any count: held offsets, bad records and
    every warning of ``run_summary`` (``rows``, sorted by queue)."""
    lines = [
        f"{_queue(row)}: offsets held, nothing to install: {row['offset_hold']}"
        for row in rows
        if row.get("offset_hold")
    ]
    bad = _total(rows, "bad_records")
    if bad:
        table = Path(output_root).resolve() / "bad_records"
        lines.append(
            f"{bad} bad half/op record(s) took no part in the round ({_per_queue(rows, 'bad_records')}):"
            f" rows in {table}; the picture leaves them out"
        )
    for row in rows:
        lines += [f"{_queue(row)}: {warning}" for warning in row.get("warnings") or []]
    return lines


def attention_lines(
    summary_rows: Sequence[Mapping],
    offset_rows: Iterable[Mapping],
    output_root: str,
    run_notes: Sequence[str] = (),
) -> list[str]:
    """What may make the picture wrong (``run_notes``, e.g. how T was chosen, then
    ``picture_lines``), then discards coming next round, checks that are the last,
    discards of this round, and the offsets to install, most urgent first; one line each."""
    rows = sorted(summary_rows, key=lambda r: (str(r["broker"]), r["queue_id"] or -1))
    lines = [*run_notes, *picture_lines(rows, output_root)]
    upcoming = _total(rows, "discard_next_round")
    if upcoming:
        interval = rows[0].get("check_interval_ms")
        lines.append(
            f"{upcoming} pending transaction(s) are discarded by the next round (in {interval} ms"
            f" at the earliest) if nobody answers ({_per_queue(rows, 'discard_next_round')});"
            " pending rows by discard_at_ms"
        )
    last = _total(rows, "past_last_check")
    if last:
        lines.append(
            f"{last} check request(s) are the last before a discard: the counter reached"
            f" check_max ({_per_queue(rows, 'past_last_check')}); check_requests with"
            " checks_left = 0 and really_pending"
        )
    discarded = _total(rows, "discard_check_max") + _total(rows, "discard_expired")
    if discarded:
        lines.append(
            f"{discarded} transaction(s) discarded this round: table discards, really_pending"
        )
    settled = _total(rows, "settled_discards")
    if settled:
        lines.append(
            f"{settled} discard(s) of the broker's round are re-discards of transactions an op"
            f" record already settled ({_per_queue(rows, 'settled_discards')}): harmless;"
            " discards with really_pending = false"
        )
    moves = offsets_to_install(offset_rows)
    for broker, changes in moves.items():
        fragment = Path(output_root) / "offset_fragments" / broker / "consumerOffset.safe.json"
        lines.append(
            f"offsets to install into stopped broker {broker}: {', '.join(changes)}:"
            f" {INSTALL} {fragment} --into <its store>/config/consumerOffset.json"
        )
    if not moves:
        held = any(row.get("offset_hold") for row in rows)
        why = "held queues above" if held else "the safe offsets are the committed ones"
        lines.append(f"offsets: nothing to install ({why})")
    return lines


def settings_line(summary_rows: Sequence[Mapping]) -> str:
    """The run's effective settings, as recorded in run_summary."""
    if not summary_rows:
        return "settings: (no summary row)"
    row = summary_rows[0]
    parts = [f"{name}={row.get(name)}" for name in SETTINGS]
    parts += [f"writer={row.get('writer')}", f"job_version={row.get('job_version')}"]
    inputs = row.get("inputs")
    if inputs is not None:
        parts.append("inputs=" + ",".join(str(item) for item in inputs))
    return "settings: " + " ".join(parts)
