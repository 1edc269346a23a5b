"""The report's SVG chart kit: stacked columns, stacked rows and offset lanes as inline SVG,
and the number and time formatting they and the report's tables share. No data reading, no
knowledge of the job's tables: a figure is built from plain sequences and mappings.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WIDTH = 1160
OTHER_COLOR = "#9467bd"  # a series without a colour of its own


# --- formatting ------------------------------------------------------------------------------


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def iso_ms(ms: Any) -> str:
    """Epoch milliseconds as an ISO-8601 UTC instant: ``2025-06-15T15:06:39.662Z``."""
    if ms is None or (isinstance(ms, float) and math.isnan(ms)) or pd.isna(ms):
        return ""
    instant = datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
    return instant.strftime("%Y-%m-%dT%H:%M:%S.") + f"{instant.microsecond // 1000:03d}Z"


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
    """A count or a measure, with thousands separators: ``1,379``."""
    if value is None or pd.isna(value):
        return ""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def ident(value: Any) -> str:
    """A number that names something (an offset, a file position, a queue id, epoch
    milliseconds): digits only, as the broker, its files and the fragments write it, so it
    can be searched for and pasted (``4229``, not ``4,229``)."""
    if value is None or pd.isna(value):
        return ""
    return str(int(value))


def flag(value: Any) -> str:
    """A boolean as ``true``/``false`` (the spelling of the tables' readers and of JSON)."""
    if value is None or (not isinstance(value, bool) and pd.isna(value)):
        return ""
    return "true" if bool(value) else "false"


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


def empty_figure(name: str, title: str, message: str, height: int = 90) -> str:
    return (
        f'<svg id="plot-{name}" data-plot="{name}" data-rows="0" class="plot" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>'
        f'<text x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
        f"{esc(message)}</text></svg>"
    )


def single_value_figure(name: str, title: str, text: str, rows: int, height: int = 90) -> str:
    """A chart whose data is one bar, said in words: a lone bar compares nothing, and its
    value is easier to read as text. ``data-single="true"`` tells it from a chart."""
    return (
        f'<svg id="plot-{name}" data-plot="{name}" data-rows="{rows}" data-single="true" '
        f'class="plot" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        f'role="img" xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>'
        f'<text x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle" class="single">'
        f"{esc(text)}</text></svg>"
    )


def _single_bar(
    name: str,
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    unit: str,
) -> str | None:
    """The figure in words when only one category has a value (None otherwise): the
    category, its total and, when it holds several series, the share of each."""
    filled = [i for i in range(len(categories)) if any(v[i] for v in series.values())]
    if len(filled) != 1:
        return None
    at = filled[0]
    parts = [(s, values[at]) for s, values in series.items() if values[at]]
    total = sum(value for _, value in parts)
    text = f"{categories[at]}: {num(total)}" + (f" {unit}" if unit else "")
    if len(parts) == 1:
        text += f", all {parts[0][0]}"
    else:
        text += " (" + ", ".join(f"{s} {num(v)}" for s, v in parts) + ")"
    return single_value_figure(name, title, text, int(total))


def _y_axis(
    box: tuple[float, float, float, float], step: float, y_max: float, label: str
) -> list[str]:
    """Grid lines with their tick values every ``step`` up to ``y_max``, and the axis label;
    ``box`` is (left, right, top, plot height)."""
    left, right, top, plot_h = box
    parts = []
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
        f'transform="rotate(-90 16 {top + plot_h / 2})" text-anchor="middle">{esc(label)}</text>'
    )
    return parts


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
        return empty_figure(name, title, empty_message)
    single = _single_bar(name, title, categories, series, y_label)
    if single is not None:
        return single
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
    parts += _y_axis((left, right, top, plot_h), step, y_max, y_label)
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
                f'data-series="{esc(series_name)}" data-value="{ident(value)}">'
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
    unit: str = "",
) -> str:
    """Horizontal stacked bars: one row per label (long labels read better sideways)."""
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    if not labels or not any(totals):
        return empty_figure(name, title, empty_message)
    single = _single_bar(name, title, labels, series, unit)
    if single is not None:
        return single
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
                f'data-series="{esc(series_name)}" data-value="{ident(value)}">'
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
    held: bool = False  # the queue's offsets must not be installed (no after, no safe)


def _lane_text(lane: OffsetLane) -> str:
    """The lane's numbers in words: offsets name positions (digits only), lags count
    messages (separators); the committed offset when the round starts elsewhere."""
    end_text = ("" if lane.end_known else "≥ ") + ident(lane.end)
    committed = (
        f"committed {ident(lane.committed)}; "
        if lane.committed is not None and lane.committed != lane.before
        else ""
    )
    if lane.held:
        return f"{committed}from {ident(lane.before)} of {end_text}: held, nothing to install"
    return (
        f"{committed}{ident(lane.before)} → {ident(lane.after)} of {end_text}:"
        f" lag {num(lane.end - lane.after)} / {num(lane.end - lane.safe)}"
    )


def offsets_lanes(name: str, title: str, lanes: Sequence[OffsetLane]) -> str:
    """One lane per (broker, queue, topic): where the round starts, stops, may safely go, the end."""
    if not lanes:
        return empty_figure(name, title, "no consume offsets in this run")
    left, right, top, lane_h = 330, 300, 44, 34
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
            text = f"{mark}: {ident(value)}" + (
                "" if mark != "end" or lane.end_known else " (estimate)"
            )
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y + 5}" y2="{y + 27}" stroke="{color}" '
                f'stroke-width="3" data-mark="{mark}" data-value="{int(value)}"><title>{esc(text)}</title></line>'
            )
        parts.append(
            f'<text x="{WIDTH - right + 10}" y="{y + 20}" class="value">'
            f"{esc(_lane_text(lane))}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)
