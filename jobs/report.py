"""Audit report of one reconciliation run: a self-contained HTML page with plots.

    python -m jobs.report --output OUT [--run-id ID] [--html report.html]

Reads the Delta tables of one run (default: the newest in ``run_summary`` by
``written_at_ms``) with deltalake/pyarrow/pandas, no Spark, and writes one HTML file
with inline SVG charts and tables: no script or style is fetched from anywhere, so the
page opens the same from a mail attachment, a CI artefact or a file share. Prints the
path of the page. Exit codes: 0 written, 2 no such output or run.

Every plot is an ``<svg>`` with ``id="plot-<name>"`` and ``data-plot="<name>"``; every
table has ``id="table-<name>"``. A short inline script sets ``data-report-ok="true"`` on
``<body>`` once it has counted the plots, which tells a headless browser the page ran
without a script error.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyarrow.fs import LocalFileSystem, SubTreeFileSystem

from jobs.attention import attention_lines, settings_line
from schemas.messages import HALF_TOPIC
from schemas.outputs import (
    BAD_RECORDS_TABLE,
    CHECK,
    CHECK_REQUESTS_TABLE,
    CLASSES,
    CONSUME_OFFSETS_TABLE,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    DISCARDS_TABLE,
    IMMUNE,
    NOT_REACHED,
    PENDING_TABLE,
    REASON_CHECK_MAX,
    REASON_EXPIRED,
    RESOLVED,
    RUN_SUMMARY_TABLE,
    TOO_YOUNG,
)

# The plots every page has (a test looks for each of these ids).
PLOTS = (
    "pending-status-age",
    "pending-group-topic",
    "check-count",
    "discards-time",
    "discards-runs",
    "offsets-lag",
)
TABLES = ("run-summary", "oldest-pending", "offsets", "bad-records")

PENDING_STATUSES = (CHECK, IMMUNE, DISCARD_CHECK_MAX, DISCARD_EXPIRED, TOO_YOUNG, NOT_REACHED)
STATUS_COLORS = {
    RESOLVED: "#9e9e9e",
    CHECK: "#1f77b4",
    IMMUNE: "#17becf",
    DISCARD_CHECK_MAX: "#d62728",
    DISCARD_EXPIRED: "#ff7f0e",
    TOO_YOUNG: "#2ca02c",
    NOT_REACHED: "#8c8c8c",
}
REASON_COLORS = {REASON_CHECK_MAX: "#d62728", REASON_EXPIRED: "#ff7f0e"}
OTHER_COLOR = "#9467bd"

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
# (label, upper bound of age_ms, exclusive). Ages below 0 are "born in the future".
AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("future", 0),
    ("< 6 s", 6 * SECOND),
    ("6 s - 1 min", MINUTE),
    ("1 - 10 min", 10 * MINUTE),
    ("10 min - 1 h", HOUR),
    ("1 - 6 h", 6 * HOUR),
    ("6 - 24 h", DAY),
    ("1 - 3 d", 3 * DAY),
    ("> 3 d", math.inf),
)
TOP_GROUP_TOPICS = 15
TOP_OLDEST = 25
HISTORY_RUNS = 30
WIDTH = 1160


class ReportError(Exception):
    """The output root or the run cannot be reported on (exit code 2)."""


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunTables:
    """The rows of one run, as pandas DataFrames (empty frames for absent tables)."""

    output: str
    run_id: str
    as_of_ms: int
    run_summary: pd.DataFrame
    pending: pd.DataFrame
    check_requests: pd.DataFrame
    discards: pd.DataFrame
    consume_offsets: pd.DataFrame
    bad_records: pd.DataFrame
    runs: pd.DataFrame  # run_id, as_of_ms, written_at_ms of recent runs (discard history)
    discard_history: pd.DataFrame  # run_id, reason, count over those runs


def _table_path(output: str, table: str) -> str:
    return output.rstrip("/") + "/" + table


def _filesystem(path: str) -> SubTreeFileSystem | None:
    # A local SubTreeFileSystem avoids delta-rs' default filesystem, which can abort the
    # process at exit in short scripts; object-store URIs keep the default.
    if "://" in path and not path.startswith("file://"):
        return None
    local = path.removeprefix("file://")
    return SubTreeFileSystem(os.path.abspath(local), LocalFileSystem())


def read_table(
    output: str,
    table: str,
    run_id: str | None = None,
    columns: Sequence[str] | None = None,
) -> pd.DataFrame | None:
    """One Delta table (optionally one run's partition) as pandas; None when the table is absent."""
    path = _table_path(output, table)
    try:
        delta = DeltaTable(path)
    except TableNotFoundError:
        return None
    filters = [("run_id", "=", run_id)] if run_id is not None else None
    arrow = delta.to_pyarrow_table(
        filters=filters,
        columns=list(columns) if columns else None,
        filesystem=_filesystem(path),
    )
    return pa.table(arrow).to_pandas()


def newest_run_id(output: str) -> str:
    """The run with the largest ``written_at_ms`` in ``run_summary``."""
    runs = read_table(output, RUN_SUMMARY_TABLE, columns=["run_id", "written_at_ms"])
    if runs is None:
        raise ReportError(
            f"{_table_path(output, RUN_SUMMARY_TABLE)} is not a Delta table: "
            "give the --output of a reconcile run"
        )
    if runs.empty:
        raise ReportError(f"{_table_path(output, RUN_SUMMARY_TABLE)} has no run yet")
    newest = runs.sort_values(["written_at_ms", "run_id"], na_position="first").iloc[-1]
    return str(newest["run_id"])


def load_run(output: str | os.PathLike[str], run_id: str | None = None) -> RunTables:
    """Read every table of one run (the newest when ``run_id`` is None)."""
    output = os.fspath(output)
    if "://" not in output and not os.path.isdir(output):
        raise ReportError(f"{output}: no such directory (give the --output of a reconcile run)")
    run_id = run_id or newest_run_id(output)

    def one(table: str) -> pd.DataFrame:
        frame = read_table(output, table, run_id)
        return frame if frame is not None else pd.DataFrame()

    summary = one(RUN_SUMMARY_TABLE)
    if summary.empty:
        raise ReportError(f"run {run_id!r} is not in {_table_path(output, RUN_SUMMARY_TABLE)}")
    runs = read_table(output, RUN_SUMMARY_TABLE, columns=["run_id", "as_of_ms", "written_at_ms"])
    assert runs is not None
    runs = (
        runs.groupby("run_id", as_index=False)
        .agg(as_of_ms=("as_of_ms", "max"), written_at_ms=("written_at_ms", "max"))
        .sort_values(["written_at_ms", "run_id"])
        .tail(HISTORY_RUNS)
    )
    history = read_table(output, DISCARDS_TABLE, columns=["run_id", "reason"])
    if history is None or history.empty:
        history = pd.DataFrame({"run_id": [], "reason": [], "count": []})
    else:
        history = history[history["run_id"].isin(runs["run_id"])]
        history = history.groupby(["run_id", "reason"], as_index=False).size()
        history = history.rename(columns={"size": "count"})
    return RunTables(
        output=output,
        run_id=run_id,
        as_of_ms=int(summary["as_of_ms"].max()),
        run_summary=summary,
        pending=one(PENDING_TABLE),
        check_requests=one(CHECK_REQUESTS_TABLE),
        discards=one(DISCARDS_TABLE),
        consume_offsets=one(CONSUME_OFFSETS_TABLE),
        bad_records=one(BAD_RECORDS_TABLE),
        runs=runs,
        discard_history=history,
    )


# --- formatting ------------------------------------------------------------------------------


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def iso_ms(ms: Any) -> str:
    if ms is None or (isinstance(ms, float) and math.isnan(ms)) or pd.isna(ms):
        return ""
    instant = datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
    return instant.strftime("%Y-%m-%d %H:%M:%S.") + f"{instant.microsecond // 1000:03d}Z"


def human_ms(ms: Any) -> str:
    """``93784000`` -> ``1 d 2 h``; negative ages (born in the future) keep their sign."""
    if ms is None or pd.isna(ms):
        return ""
    ms = int(ms)
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    for unit, size, sub_unit, sub_size in (
        ("d", DAY, "h", HOUR),
        ("h", HOUR, "min", MINUTE),
        ("min", MINUTE, "s", SECOND),
    ):
        if ms >= size:
            rest = (ms % size) // sub_size
            return f"{sign}{ms // size} {unit}" + (f" {rest} {sub_unit}" if rest else "")
    return f"{sign}{ms / 1000:g} s"


def num(value: Any) -> str:
    if value is None or pd.isna(value):
        return ""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def age_bucket(age_ms: float) -> str:
    if pd.isna(age_ms):
        return "unknown"
    for label, upper in AGE_BUCKETS:
        if age_ms < upper:
            return label
    return AGE_BUCKETS[-1][0]


def nice_step(maximum: float, ticks: int = 5) -> float:
    """A round tick step (1, 2, 5 x 10^k) so that about ``ticks`` ticks cover ``maximum``."""
    if maximum <= 0:
        return 1
    raw = maximum / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return max(1, factor * power)
    return 10 * power


# --- SVG charts ------------------------------------------------------------------------------


def _legend(names: Sequence[str], colors: dict[str, str], x: float, y: float) -> list[str]:
    parts, offset = [], 0.0
    for name in names:
        color = colors.get(name, OTHER_COLOR)
        parts.append(
            f'<g class="legend-item" data-series="{esc(name)}">'
            f'<rect x="{x + offset:.1f}" y="{y - 10}" width="12" height="12" fill="{color}"/>'
            f'<text x="{x + offset + 16:.1f}" y="{y}" class="legend">{esc(name)}</text></g>'
        )
        offset += 30 + 7.4 * len(name)
    return parts


def _empty(name: str, title: str, message: str, height: int = 90) -> str:
    return (
        f'<svg id="plot-{name}" data-plot="{name}" data-rows="0" class="plot" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>'
        f'<text x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
        f"{esc(message)}</text></svg>"
    )


def stacked_columns(
    name: str,
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    colors: dict[str, str],
    y_label: str,
    empty_message: str = "no rows",
    height: int = 340,
) -> str:
    """Vertical stacked bars: one column per category, one colour per series."""
    totals = [sum(values[i] for values in series.values()) for i in range(len(categories))]
    if not categories or not any(totals):
        return _empty(name, title, empty_message)
    left, right, top, bottom = 70, 20, 40, 70
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    step = nice_step(max(totals))
    y_max = step * math.ceil(max(totals) / step)
    slot = plot_w / len(categories)
    bar_w = max(2.0, min(60.0, slot * 0.7))
    parts = [
        f'<svg id="plot-{name}" data-plot="{name}" data-rows="{int(sum(totals))}" class="plot" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>'
    ]
    tick = 0.0
    while tick <= y_max + 1e-9:
        y = top + plot_h - plot_h * tick / y_max
        parts.append(
            f'<line x1="{left}" x2="{WIDTH - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{num(tick)}</text>'
        )
        tick += step
    parts.append(
        f'<text x="16" y="{top + plot_h / 2}" class="axis" '
        f'transform="rotate(-90 16 {top + plot_h / 2})" text-anchor="middle">{esc(y_label)}</text>'
    )
    label_every = max(1, math.ceil(len(categories) / 24))
    for i, category in enumerate(categories):
        x = left + slot * i + (slot - bar_w) / 2
        base = 0.0
        for series_name, values in series.items():
            value = values[i]
            if not value:
                continue
            y = top + plot_h - plot_h * (base + value) / y_max
            h = plot_h * value / y_max
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{colors.get(series_name, OTHER_COLOR)}" data-category="{esc(category)}" '
                f'data-series="{esc(series_name)}" data-value="{num(value)}">'
                f"<title>{esc(category)} / {esc(series_name)}: {num(value)}</title></rect>"
            )
            base += value
        if totals[i]:
            parts.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{top + plot_h - plot_h * totals[i] / y_max - 4:.1f}" '
                f'text-anchor="middle" class="value">{num(totals[i])}</text>'
            )
        if i % label_every == 0:
            cx, cy = x + bar_w / 2, top + plot_h + 14
            rotate = f' transform="rotate(-30 {cx:.1f} {cy})"' if len(categories) > 10 else ""
            anchor = "end" if rotate else "middle"
            parts.append(
                f'<text x="{cx:.1f}" y="{cy}" text-anchor="{anchor}" class="tick"{rotate}>'
                f"{esc(category)}</text>"
            )
    parts.append(
        f'<line x1="{left}" x2="{WIDTH - right}" y1="{top + plot_h}" y2="{top + plot_h}" class="axisline"/>'
    )
    shown = [s for s, values in series.items() if any(values)]
    parts += _legend(shown, colors, left, 20)
    parts.append("</svg>")
    return "".join(parts)


def stacked_rows(
    name: str,
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    colors: dict[str, str],
    empty_message: str = "no rows",
) -> str:
    """Horizontal stacked bars: one row per label (long labels read better sideways)."""
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    if not labels or not any(totals):
        return _empty(name, title, empty_message)
    left, right, top, row_h = 380, 80, 40, 24
    height = top + row_h * len(labels) + 30
    plot_w = WIDTH - left - right
    x_max = max(totals)
    parts = [
        f'<svg id="plot-{name}" data-plot="{name}" data-rows="{int(sum(totals))}" class="plot" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>'
    ]
    for i, label in enumerate(labels):
        y = top + row_h * i
        shown = label if len(label) <= 52 else label[:50] + "…"
        parts.append(
            f'<text x="{left - 8}" y="{y + row_h * 0.65:.1f}" text-anchor="end" class="tick">'
            f"<title>{esc(label)}</title>{esc(shown)}</text>"
        )
        base = 0.0
        for series_name, values in series.items():
            value = values[i]
            if not value:
                continue
            x = left + plot_w * base / x_max
            w = plot_w * value / x_max
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y + 3}" width="{max(w, 1):.1f}" height="{row_h - 6}" '
                f'fill="{colors.get(series_name, OTHER_COLOR)}" data-category="{esc(label)}" '
                f'data-series="{esc(series_name)}" data-value="{num(value)}">'
                f"<title>{esc(label)} / {esc(series_name)}: {num(value)}</title></rect>"
            )
            base += value
        parts.append(
            f'<text x="{left + plot_w * totals[i] / x_max + 6:.1f}" y="{y + row_h * 0.65:.1f}" '
            f'class="value">{num(totals[i])}</text>'
        )
    shown_series = [s for s, values in series.items() if any(values)]
    parts += _legend(shown_series, colors, left, 20)
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True)
class OffsetLane:
    broker: str
    queue_id: int
    topic: str
    committed: float | None
    before: float
    safe: float
    after: float
    end: float
    end_known: bool


def offsets_lanes(name: str, title: str, lanes: Sequence[OffsetLane]) -> str:
    """One lane per (broker, queue, topic): where the round starts, stops, may safely go, the end."""
    if not lanes:
        return _empty(name, title, "no consume offsets in this run")
    left, right, top, lane_h = 330, 250, 44, 34
    height = top + lane_h * len(lanes) + 20
    plot_w = WIDTH - left - right
    marks = (
        ("committed", "#000000"),
        ("before", "#1f77b4"),
        ("safe", "#2ca02c"),
        ("after", "#ff7f0e"),
        ("end", "#d62728"),
    )
    parts = [
        f'<svg id="plot-{name}" data-plot="{name}" data-rows="{len(lanes)}" class="plot" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>'
    ]
    parts += _legend([m for m, _ in marks], dict(marks), left, 20)
    parts.append(
        f'<text x="{WIDTH - right + 10}" y="20" class="legend">lag: end - after / end - safe</text>'
    )
    for i, lane in enumerate(lanes):
        y = top + lane_h * i
        values = [
            v
            for v in (lane.committed, lane.before, lane.safe, lane.after, lane.end)
            if v is not None
        ]
        low, high = min(values), max(values)
        span = (high - low) or 1

        def px(value: float, low: float = low, span: float = span) -> float:
            return left + plot_w * (value - low) / span

        label = f"{lane.broker} q{lane.queue_id} {lane.topic}"
        lag_after, lag_safe = lane.end - lane.after, lane.end - lane.safe
        key = f"{lane.broker}/{lane.queue_id}/{lane.topic}"
        parts.append(
            f'<g class="lane" data-lane="{esc(key)}" data-lag-after="{int(lag_after)}" '
            f'data-lag-safe="{int(lag_safe)}">'
            f'<text x="{left - 8}" y="{y + 20}" text-anchor="end" class="tick">{esc(label)}</text>'
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y + 16}" y2="{y + 16}" class="track"/>'
            f'<rect x="{px(lane.safe):.1f}" y="{y + 11}" width="{max(px(lane.end) - px(lane.safe), 1):.1f}" '
            f'height="10" class="backlog"><title>not safely settled: {num(lag_safe)}</title></rect>'
        )
        for mark, color in marks:
            value = getattr(lane, mark)
            if value is None:
                continue
            x = px(value)
            text = f"{mark}: {num(value)}" + (
                "" if mark != "end" or lane.end_known else " (estimate)"
            )
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y + 5}" y2="{y + 27}" stroke="{color}" '
                f'stroke-width="3" data-mark="{mark}" data-value="{int(value)}"><title>{esc(text)}</title></line>'
            )
        end_text = ("" if lane.end_known else "≥ ") + num(lane.end)
        parts.append(
            f'<text x="{WIDTH - right + 10}" y="{y + 20}" class="value">'
            f"{num(lane.before)} → {num(lane.after)} of {end_text}: lag {num(lag_after)} / {num(lag_safe)}"
            "</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


# --- figures from tables -----------------------------------------------------------------------


def _counts(
    frame: pd.DataFrame,
    by: str,
    key: Callable[[pd.DataFrame], pd.Series],
    categories: Sequence[str],
    series_names: Sequence[str],
) -> dict[str, list[int]]:
    """Counts of rows per (category from ``key``, value of ``by``) as {series: [count per category]}."""
    if frame.empty:
        return {s: [0] * len(categories) for s in series_names}
    table = pd.crosstab(key(frame), frame[by])
    return {
        s: [
            int(table.at[c, s]) if c in table.index and s in table.columns else 0
            for c in categories
        ]
        for s in series_names
    }


def pending_by_status_and_age(run: RunTables) -> str:
    categories = [label for label, _ in AGE_BUCKETS]
    pending = run.pending
    if not pending.empty and pending["age_ms"].isna().any():
        categories.append("unknown")
    statuses = _ordered(pending, "status", PENDING_STATUSES)
    series = _counts(pending, "status", lambda f: f["age_ms"].map(age_bucket), categories, statuses)
    return stacked_columns(
        "pending-status-age",
        "Pending transactions by age (as-of time minus born time) and status",
        categories,
        series,
        STATUS_COLORS,
        "pending half messages",
        empty_message="nothing pending in this run",
    )


def pending_by_group_and_topic(run: RunTables) -> str:
    pending = run.pending
    if pending.empty:
        return _empty(
            "pending-group-topic",
            "Pending by producer group and real topic",
            "nothing pending in this run",
        )
    keys = (
        pending["producer_group"].fillna("(no group)")
        + "  /  "
        + pending["real_topic"].fillna("(no topic)")
    )
    order = keys.value_counts()
    top = list(order.index[:TOP_GROUP_TOPICS])
    labels = top + ([f"({len(order) - len(top)} more pairs)"] if len(order) > len(top) else [])
    grouped = keys.where(keys.isin(top), labels[-1])
    frame = pending.assign(_key=grouped)
    statuses = _ordered(pending, "status", PENDING_STATUSES)
    series = _counts(frame, "status", lambda f: f["_key"], labels, statuses)
    return stacked_rows(
        "pending-group-topic",
        "Pending transactions by producer group / real topic",
        labels,
        series,
        STATUS_COLORS,
    )


def check_count_distribution(run: RunTables) -> str:
    pending = run.pending
    if pending.empty:
        return _empty("check-count", "Check-count distribution", "nothing pending in this run")
    counters = pending["check_times"]
    known = counters.dropna().astype("int64")
    high = int(known.max()) if not known.empty else 0
    categories = ["none"] + [str(n) for n in range(0, high + 1)]
    statuses = _ordered(pending, "status", PENDING_STATUSES)
    series = _counts(
        pending,
        "status",
        lambda f: f["check_times"].map(lambda v: "none" if pd.isna(v) else str(int(v))),
        categories,
        statuses,
    )
    return stacked_columns(
        "check-count",
        "Check counter of pending half messages (after this round's effect)",
        categories,
        series,
        STATUS_COLORS,
        "pending half messages",
    )


def _time_step(span_ms: float) -> tuple[int, str]:
    for step, fmt in (
        (5 * MINUTE, "%m-%d %H:%M"),
        (HOUR, "%m-%d %H:00"),
        (6 * HOUR, "%m-%d %H:00"),
        (DAY, "%Y-%m-%d"),
        (7 * DAY, "%Y-%m-%d"),
    ):
        if span_ms / step <= 40:
            return step, fmt
    return 30 * DAY, "%Y-%m"


def discards_over_time(run: RunTables) -> str:
    discards = run.discards
    title = "Discards of this run by reason, over the born time of the discarded half message"
    if discards.empty:
        return _empty("discards-time", title, "no discards in this run")
    born = discards["born_timestamp_ms"].fillna(run.as_of_ms).astype("int64")
    step, fmt = _time_step(float(born.max() - born.min()))
    first = int(born.min()) // step * step
    slots = (born - first) // step
    count = int(slots.max()) + 1
    categories = [
        datetime.fromtimestamp((first + i * step) / 1000, tz=UTC).strftime(fmt)
        for i in range(count)
    ]
    reasons = _ordered(discards, "reason", (REASON_CHECK_MAX, REASON_EXPIRED))
    series = _counts(
        discards.assign(_slot=slots.map(lambda s: categories[int(s)])),
        "reason",
        lambda f: f["_slot"],
        categories,
        reasons,
    )
    return stacked_columns(
        "discards-time", title, categories, series, REASON_COLORS, "discarded half messages"
    )


def discards_over_runs(run: RunTables) -> str:
    title = f"Discards per run by reason (last {HISTORY_RUNS} runs, by as-of time)"
    runs = run.runs
    if runs.empty:
        return _empty("discards-runs", title, "no runs")
    categories = [iso_ms(ms)[:16].replace("T", " ") for ms in runs["as_of_ms"]]
    history = run.discard_history
    reasons = _ordered(history, "reason", (REASON_CHECK_MAX, REASON_EXPIRED))
    series = {reason: [0] * len(categories) for reason in reasons}
    position = {rid: i for i, rid in enumerate(runs["run_id"])}
    for row in history.itertuples(index=False):
        if row.run_id in position:
            series[row.reason][position[row.run_id]] += int(row.count)
    if not any(any(v) for v in series.values()):
        return _empty("discards-runs", title, f"no discards in the last {len(runs)} run(s)")
    return stacked_columns(
        "discards-runs", title, categories, series, REASON_COLORS, "discarded half messages"
    )


def offset_lanes(run: RunTables) -> list[OffsetLane]:
    """Lanes of the offsets plot. The tables hold no queue end unless ``offset_end`` is a
    column: then the end is estimated as the largest offset known (``offset_after``, and for
    the half topic 1 + the largest pending offset), a lower bound."""
    offsets = run.consume_offsets
    if offsets.empty:
        return []
    highest_pending = (
        run.pending.groupby(["broker", "queue_id"])["half_offset"].max().to_dict()
        if not run.pending.empty
        else {}
    )
    lanes = []
    for row in offsets.sort_values(["broker", "queue_id", "topic"]).itertuples(index=False):
        before = float(row.offset_before)
        after = float(row.offset_after) if not pd.isna(row.offset_after) else before
        safe = float(row.offset_safe) if not pd.isna(row.offset_safe) else after
        committed = None if pd.isna(row.offset_committed) else float(row.offset_committed)
        end_value = getattr(row, "offset_end", None)
        if end_value is not None and not pd.isna(end_value):
            end, known = float(end_value), True
        else:
            end, known = max(before, after, safe), False
            if row.topic == HALF_TOPIC:
                top = highest_pending.get((row.broker, row.queue_id))
                if top is not None and not pd.isna(top):
                    end = max(end, float(top) + 1)
        lanes.append(
            OffsetLane(
                str(row.broker),
                int(row.queue_id),
                str(row.topic),
                committed,
                before,
                safe,
                after,
                end,
                known,
            )
        )
    return lanes


def _ordered(frame: pd.DataFrame, column: str, preferred: Sequence[str]) -> list[str]:
    """Known values in the preferred order, then any others (sorted), so none is dropped."""
    present = (
        set(frame[column].dropna().astype(str)) if not frame.empty and column in frame else set()
    )
    return [v for v in preferred if v in present] + sorted(present - set(preferred))


# --- HTML tables -----------------------------------------------------------------------------


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


def _text(value: object) -> str:
    if value is None or (not isinstance(value, list | tuple) and pd.isna(value)):
        return ""
    return esc(value)


def _warnings(value: Any) -> str:
    if value is None:
        return ""
    items = list(value) if not isinstance(value, str) else [value]
    return "<br>".join(esc(v) for v in items)


def summary_table(run: RunTables) -> str:
    columns: dict[str, Callable[[Any], str]] = {"broker": _text, "queue_id": num}
    for name in ("h0", "h1", "h_safe", "p0", "p1", "p_safe", *CLASSES, "bad_records"):
        columns[name] = num
    columns["warnings"] = _warnings
    frame = run.run_summary.sort_values(["broker", "queue_id"])
    return html_table("run-summary", frame, columns, "no summary rows", wrap=("warnings",))


def oldest_pending_table(run: RunTables) -> str:
    pending = run.pending
    if not pending.empty:
        pending = pending.sort_values(
            ["age_ms", "broker", "half_offset"], ascending=[False, True, True]
        )
        pending = pending.head(TOP_OLDEST).assign(
            age=lambda f: f["age_ms"].map(human_ms),
            born=lambda f: f["born_timestamp_ms"].map(iso_ms),
        )
    columns: dict[str, Callable[[Any], str]] = {
        "age": _text,
        "status": _text,
        "broker": _text,
        "queue_id": num,
        "half_offset": num,
        "uniq_key": _text,
        "producer_group": _text,
        "real_topic": _text,
        "check_times": num,
        "born": _text,
        "offset_msg_id": _text,
    }
    return html_table("oldest-pending", pending, columns, "nothing pending in this run")


def offsets_table(run: RunTables) -> str:
    offsets = run.consume_offsets
    if not offsets.empty:
        offsets = offsets.sort_values(["broker", "queue_id", "topic"])
    columns: dict[str, Callable[[Any], str]] = {
        "broker": _text,
        "topic": _text,
        "queue_id": num,
        "group": _text,
        "offset_committed": num,
        "offset_before": num,
        "offset_after": num,
        "offset_safe": num,
    }
    if "offset_end" in offsets:
        columns["offset_end"] = num
    return html_table("offsets", offsets, columns, "no consume offsets in this run")


def bad_records_table(run: RunTables) -> str:
    bad = run.bad_records
    if not bad.empty:
        bad = (
            bad.assign(topic=bad["topic"].fillna(""))
            .groupby(["broker", "topic", "reason"], as_index=False, dropna=False)
            .agg(
                count=("reason", "size"),
                example_source=("source", "first"),
                example_position=("position", "first"),
            )
            .sort_values("count", ascending=False)
        )
    columns = {
        "broker": _text,
        "topic": _text,
        "reason": _text,
        "count": num,
        "example_source": _text,
        "example_position": num,
    }
    return html_table("bad-records", bad, columns, "no bad records in this run")


# --- page ------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin-bottom:12px}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:120px}.card b{display:block;font-size:20px}
.card.alert b{color:#d62728}
svg.plot{display:block;max-width:100%;height:auto;border:1px solid #eee;border-radius:4px;margin:6px 0}
svg text{font:12px system-ui,sans-serif;fill:#333}svg .tick{font-size:11px;fill:#555}svg .value{font-size:11px;fill:#222}
svg .axis{font-size:12px;fill:#555}svg .legend{font-size:12px}svg .empty{font-size:14px;fill:#888}
svg .grid{stroke:#eee}svg .axisline{stroke:#999}svg .track{stroke:#ccc;stroke-width:2}svg .backlog{fill:#fde0dd}
svg rect.bar:hover{opacity:.75}
table{border-collapse:collapse;width:100%;font-size:12px;margin:6px 0}th,td{border:1px solid #e3e3e3;padding:3px 6px;text-align:left;vertical-align:top}
td{white-space:nowrap}td.wrap{white-space:normal;min-width:240px}.scroll{overflow-x:auto}
th{background:#f6f6f6}tr:nth-child(even) td{background:#fbfbfb}p.empty{color:#888}
.note{color:#666;font-size:12px}
"""

_SCRIPT = """
(function () {
  var plots = document.querySelectorAll('[data-plot]');
  var tables = document.querySelectorAll('[data-table]');
  document.body.setAttribute('data-plots-rendered', String(plots.length));
  document.body.setAttribute('data-tables-rendered', String(tables.length));
  window.__reportOk = true;
  document.body.setAttribute('data-report-ok', 'true');
})();
"""


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as plain dicts: missing values None, whole floats (pandas' NaN-able ints) int."""

    def plain(value: object) -> object:
        if isinstance(value, list | tuple | np.ndarray):
            return list(value)
        if value is None or pd.isna(value):
            return None
        if isinstance(value, float | np.floating) and float(value).is_integer():
            return int(value)
        return value.item() if isinstance(value, np.generic) else value

    return [{k: plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


def attention_section(run: RunTables) -> str:
    """What needs attention first (the same lines as the job's printed summary)."""
    summary = _records(run.run_summary)
    lines = attention_lines(summary, _records(run.consume_offsets), run.output)
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return (
        f'<ul id="attention" data-items="{len(lines)}">{items}</ul>'
        f'<p class="note" id="settings">{esc(settings_line(summary))}</p>'
    )


def render_html(run: RunTables) -> str:
    """The whole page for one run."""
    summary = run.run_summary
    total = {
        name: int(summary[name].fillna(0).sum()) if name in summary else 0
        for name in (*CLASSES, "bad_records")
    }
    pending = len(run.pending)
    discards = len(run.discards)
    written = summary["written_at_ms"].max() if "written_at_ms" in summary else None
    duration = summary["duration_ms"].max() if "duration_ms" in summary else None
    brokers = sorted(summary["broker"].dropna().astype(str).unique())
    cards = [
        ("pending", pending, False),
        ("check requests", len(run.check_requests), False),
        ("discards", discards, discards > 0),
        ("immune", total[IMMUNE], False),
        ("too young / not reached", total[TOO_YOUNG] + total[NOT_REACHED], False),
        ("resolved", total[RESOLVED], False),
        ("bad records", total["bad_records"], total["bad_records"] > 0),
    ]
    card_html = "".join(
        f'<div class="card{" alert" if alert else ""}" data-card="{esc(label)}">{esc(label)}'
        f"<b>{num(value)}</b></div>"
        for label, value, alert in cards
    )
    lanes = offset_lanes(run)
    estimated = any(not lane.end_known for lane in lanes)
    sections = [
        ("Pending by status and age", pending_by_status_and_age(run), ""),
        (
            "Pending by producer group and real topic",
            pending_by_group_and_topic(run),
            f"Top {TOP_GROUP_TOPICS} pairs by count; the rest are summed in one row.",
        ),
        (
            "Check-count distribution",
            check_count_distribution(run),
            "TRANSACTION_CHECK_TIMES after this round; discards happen at the check_max setting.",
        ),
        (
            "Discards by reason over time",
            discards_over_time(run) + discards_over_runs(run),
            "Upper: this run's discards by the born time of the half message. "
            f"Lower: discards per run over the last {HISTORY_RUNS} runs (x: the run's as-of time).",
        ),
        (
            "Consume offsets per broker and queue",
            offsets_lanes("offsets-lag", "Consume offsets", lanes),
            "before: where the round starts (h0/p0); after: where the broker would move (h1/p1); "
            "safe: what can be installed without losing a check (h_safe/p_safe)."
            + (
                " The end is the largest offset the tables show (a lower bound, marked ≥)."
                if estimated
                else ""
            ),
        ),
    ]
    body = [
        f"<h1>RocketMQ transaction reconciliation: run <code>{esc(run.run_id)}</code></h1>",
        f'<div class="meta">as of <b>{esc(iso_ms(run.as_of_ms))}</b> ({num(run.as_of_ms)} ms) · '
        f"written {esc(iso_ms(written))} in {esc(human_ms(duration))} · "
        f"brokers: {esc(', '.join(brokers))} · output <code>{esc(run.output)}</code></div>",
        f'<div class="cards">{card_html}</div>',
        "<h2>Needs attention first</h2>",
        attention_section(run),
    ]
    for title, figure, note in sections:
        body.append(f"<h2>{esc(title)}</h2>")
        if note:
            body.append(f'<p class="note">{esc(note)}</p>')
        body.append(figure)
    body += [
        f"<h2>Oldest pending transactions (top {TOP_OLDEST})</h2>",
        oldest_pending_table(run),
        "<h2>Run summary per broker and queue</h2>",
        summary_table(run),
        "<h2>Consume offsets</h2>",
        offsets_table(run),
        "<h2>Bad records</h2>",
        bad_records_table(run),
        f'<p class="note">Generated by jobs.report at {esc(iso_ms(datetime.now(UTC).timestamp() * 1000))}.</p>',
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>rmq-txn-reconcile run {esc(run.run_id)}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<style>{_CSS}</style></head>\n<body data-run-id="{esc(run.run_id)}">\n'
        + "\n".join(body)
        + f"\n<script>{_SCRIPT}</script>\n</body></html>\n"
    )


def write_report(
    output: str | os.PathLike[str],
    run_id: str | None = None,
    html_path: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the page of one run and return its path (default OUT/reports/<run_id>.html)."""
    run = load_run(output, run_id)
    if html_path is None:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in run.run_id)
        html_path = Path(os.fspath(output)) / "reports" / f"{safe}.html"
    path = Path(html_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(run), encoding="utf-8")
    return path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.report",
        description="Write a self-contained HTML audit report of one reconciliation run.",
    )
    parser.add_argument("--output", required=True, help="output root of the reconcile job (OUT)")
    parser.add_argument("--run-id", help="run to report on (default: the newest by written_at_ms)")
    parser.add_argument("--html", help="page to write (default: OUT/reports/<run_id>.html)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        path = write_report(args.output, args.run_id, args.html)
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
