"""The report's discard-history section: every message the broker discarded (the whole
``discard_history`` table, not one run: it is merged across runs), by outcome over the time
of the discard and by reason, and the ``unresolved`` rows with the exact arguments of the
admin API's ``resumeCheckHalfMessage``.

Ids: the plots ``plot-discard-history-time`` and ``plot-discard-history-reasons-time``, the tables ``table-discard-history-reasons``
and ``table-discard-history-unresolved``, the section ``discard-history``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from jobs.charts import empty_figure, flag, ident, iso_ms, num, stacked_columns
from jobs.report_figures import category_counts, ordered_values, time_step
from jobs.report_html import cell_text, html_table
from jobs.report_tables import read_table
from schemas.outputs import (
    DISCARD_HISTORY,
    DISCARD_HISTORY_TABLE,
    DISCARD_REASONS,
    OUTCOME_UNRESOLVED,
    OUTCOMES,
)

OUTCOME_COLORS = {
    "unknown": "#8c8c8c",
    "pending_again": "#17becf",
    "committed": "#2ca02c",
    "rolled_back": "#9467bd",
    "ended": "#bcbd22",
    "unresolved": "#d62728",
}
REASON_COLORS = {"check_max": "#d62728", "expired": "#ff7f0e", "undetermined": "#8c8c8c"}
TOP_UNRESOLVED = 200


def load_discard_history(output: str) -> pd.DataFrame:
    """The whole table (empty when the output root has none: written before it existed)."""
    frame = read_table(output, DISCARD_HISTORY_TABLE)
    if frame is None:
        return pd.DataFrame(columns=DISCARD_HISTORY.fieldNames())
    return frame


def _over_time(
    history: pd.DataFrame,
    column: str,
    order: tuple[str, ...],
    colors: dict[str, str],
    name: str,
    title: str,
) -> str:
    """Stacked columns: discards per period of their store time, one colour per ``column``."""
    if history.empty:
        return empty_figure(name, title, "the broker discarded nothing (as far as the store shows)")
    at = history["discarded_at_ms"].astype("int64")
    step, fmt = time_step(float(at.max() - at.min()))
    first = int(at.min()) // step * step
    slots = (at - first) // step
    categories = [
        datetime.fromtimestamp((first + i * step) / 1000, tz=UTC).strftime(fmt)
        for i in range(int(slots.max()) + 1)
    ]
    names = ordered_values(history, column, order)
    series = category_counts(
        history.assign(_slot=slots.map(lambda s: categories[int(s)])),
        column,
        lambda f: f["_slot"],
        categories,
        names,
    )
    return stacked_columns(name, title, categories, series, colors, "discarded messages")


def discard_outcomes_over_time(history: pd.DataFrame) -> str:
    """Discards per period of the time of the discard, by outcome."""
    title = "Discarded messages by outcome, over the time of the discard"
    return _over_time(history, "outcome", OUTCOMES, OUTCOME_COLORS, "discard-history-time", title)


def discard_reasons_over_time(history: pd.DataFrame) -> str:
    """Discards per period of the time of the discard, by reason."""
    title = "Discarded messages by reason, over the time of the discard"
    return _over_time(
        history, "reason", DISCARD_REASONS, REASON_COLORS, "discard-history-reasons-time", title
    )


def reasons_table(history: pd.DataFrame) -> str:
    """Counts per reason (rows) and outcome (columns)."""
    reasons = ordered_values(history, "reason", DISCARD_REASONS)
    outcomes = ordered_values(history, "outcome", OUTCOMES)
    rows = []
    for reason in reasons:
        subset = history[history["reason"] == reason]
        counts = subset["outcome"].value_counts()
        rows.append(
            {"reason": reason, **{o: int(counts.get(o, 0)) for o in outcomes}, "total": len(subset)}
        )
    columns: dict[str, Callable[[Any], str]] = {
        "reason": cell_text,
        **{o: num for o in outcomes},
        "total": num,
    }
    return html_table("discard-history-reasons", pd.DataFrame(rows), columns, "no discard records")


def unresolved_table(history: pd.DataFrame) -> str:
    """The ``unresolved`` rows, newest discard first: what to resume, and what not to."""
    unresolved = history[history["outcome"] == OUTCOME_UNRESOLVED].sort_values(
        ["discarded_at_ms", "broker", "discard_offset"], ascending=[False, True, True]
    )
    unresolved = unresolved.assign(discarded_at=unresolved["discarded_at_ms"].map(iso_ms))
    columns: dict[str, Callable[[Any], str]] = {
        "broker": cell_text,
        "discard_offset": ident,
        "resume_topic": cell_text,
        "resume_offset_msg_id": cell_text,
        "resume_futile": flag,
        "reason": cell_text,
        "discarded_at": cell_text,
        "uniq_key": cell_text,
        "producer_group": cell_text,
        "real_topic": cell_text,
    }
    return html_table(
        "discard-history-unresolved",
        unresolved.head(TOP_UNRESOLVED),
        columns,
        "no unresolved discard: every discarded message ended or is pending again",
    )


def discard_history_section(output: str) -> str:
    """The whole section (heading included)."""
    history = load_discard_history(output)
    unresolved = history[history["outcome"] == OUTCOME_UNRESOLVED]
    futile = int(unresolved["resume_futile"].eq(True).sum())
    return "\n".join(
        [
            '<h2 id="discard-history">Discard history (every run of this output root)</h2>',
            f'<p class="note">{num(len(history))} message(s) the broker discarded to'
            f" TRANS_CHECK_MAX_TIME_TOPIC; {num(len(unresolved))} unresolved, of which"
            f" {num(futile)} would be discarded again at once if resumed (older than the"
            " retention). Resume the others with the admin API's resumeCheckHalfMessage"
            " (topic, offset message id) below. Reasons use this run's check_max, which may"
            " differ from the broker's at the time of the discard.</p>",
            discard_outcomes_over_time(history),
            discard_reasons_over_time(history),
            reasons_table(history),
            f"<h2>Unresolved discards (newest {TOP_UNRESOLVED})</h2>",
            unresolved_table(history),
        ]
    )
