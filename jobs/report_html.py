"""The report's HTML tables, each built from one run's tables (``RunTables``): the
per-queue summary, the oldest pending messages, the consume offsets and the bad records
grouped by kind; and ``html_table``/``cell_text``, the table builder the other report
sections use too."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from jobs.charts import esc, human_ms, ident, iso_ms, num
from jobs.report_tables import RunTables
from schemas.outputs import CLASSES

TOP_OLDEST = 25


def html_table(
    name: str,
    frame: pd.DataFrame,
    columns: Mapping[str, Callable[[Any], str]],
    empty_message: str,
    wrap: Sequence[str] = (),
) -> str:
    if frame.empty:
        return f'<p id="table-{name}" data-table="{name}" data-rows="0" class="empty">{esc(empty_message)}</p>'
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    rows = []
    for record in frame.to_dict("records"):
        cells = "".join(
            ('<td class="wrap">' if c in wrap else "<td>") + f"{fmt(record.get(c))}</td>"
            for c, fmt in columns.items()
        )
        rows.append(f"<tr>{cells}</tr>")
    return (
        f'<div class="scroll"><table id="table-{name}" data-table="{name}" data-rows="{len(frame)}">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def cell_text(value: object) -> str:
    if value is None or (not isinstance(value, list | tuple) and pd.isna(value)):
        return ""
    return esc(value)


def summary_table(run: RunTables) -> str:
    """The per-queue counts; the rows' warnings are at the top of the page (attention)."""
    columns: dict[str, Callable[[Any], str]] = {"broker": cell_text, "queue_id": ident}
    for name in ("h0", "h1", "h_safe", "p0", "p1", "p_safe"):
        columns[name] = ident
    for name in (*CLASSES, "bad_records"):
        columns[name] = num
    frame = run.run_summary.sort_values(["broker", "queue_id"])
    return html_table("run-summary", frame, columns, "no summary rows")


def oldest_pending_table(run: RunTables) -> str:
    pending = run.pending
    if not pending.empty:
        pending = pending.sort_values(
            ["age_ms", "broker", "half_offset"], ascending=[False, True, True]
        )
        pending = pending.head(TOP_OLDEST)
        # discard_at_ms is absent from output roots written before it existed.
        discard_at = pending.get("discard_at_ms", pd.Series(None, index=pending.index))
        pending = pending.assign(
            age=pending["age_ms"].map(human_ms),
            born_at=pending["born_timestamp_ms"].map(iso_ms),
            discard_at=discard_at.map(iso_ms),
        )
    # Instants are named for what they are (born_at, discard_at) and shown in ISO-8601 UTC.
    columns: dict[str, Callable[[Any], str]] = {
        "age": cell_text,
        "status": cell_text,
        "broker": cell_text,
        "queue_id": ident,
        "half_offset": ident,
        "uniq_key": cell_text,
        "producer_group": cell_text,
        "real_topic": cell_text,
        "check_times": num,
        "born_at": cell_text,
        "discard_at": cell_text,
        "offset_msg_id": cell_text,
    }
    return html_table("oldest-pending", pending, columns, "nothing pending in this run")


def offsets_table(run: RunTables) -> str:
    offsets = run.consume_offsets
    if not offsets.empty:
        offsets = offsets.sort_values(["broker", "queue_id", "topic"])
    columns: dict[str, Callable[[Any], str]] = {
        "broker": cell_text,
        "topic": cell_text,
        "queue_id": ident,
        "group": cell_text,
        "offset_committed": ident,
        "offset_before": ident,
        "offset_after": ident,
        "offset_safe": ident,
    }
    if "offset_end" in offsets:
        columns["offset_end"] = ident
    if "offset_hold" in offsets:  # why the queue's offsets must not be installed
        columns["offset_hold"] = cell_text
    return html_table(
        "offsets", offsets, columns, "no consume offsets in this run", wrap=("offset_hold",)
    )


def bad_records_table(run: RunTables) -> str:
    """Bad records grouped by broker, topic and kind of reason: a reason names the offset
    or size it is about, so its numbers are replaced by ``N`` to group (one example kept)."""
    bad = run.bad_records
    if not bad.empty:
        bad = (
            bad.assign(
                topic=bad["topic"].fillna(""),
                kind=bad["reason"].fillna("").str.replace(r"\d+", "N", regex=True),
            )
            .groupby(["broker", "topic", "kind"], as_index=False, dropna=False)
            .agg(
                count=("kind", "size"),
                example_reason=("reason", "first"),
                example_source=("source", "first"),
                example_position=("position", "first"),
            )
            .sort_values(["count", "broker", "topic", "kind"], ascending=[False, True, True, True])
        )
    columns = {
        "broker": cell_text,
        "topic": cell_text,
        "kind": cell_text,
        "count": num,
        "example_reason": cell_text,
        "example_source": cell_text,
        "example_position": ident,
    }
    return html_table("bad-records", bad, columns, "no bad records in this run")
