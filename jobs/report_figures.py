"""The report's figures, each built from one run's tables (``RunTables``) with the chart kit
(``jobs.charts``): pending messages by status and age, by group and topic, by check count;
discards over time and over runs; the offset lanes. Also the vocabulary they share with the
other report sections (status and reason colours, age buckets) and the counting helpers
(``category_counts``, ``ordered_values``, ``time_step``). The HTML tables are
``jobs.report_html``'s."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import pandas as pd

from jobs.charts import (
    DAY,
    HOUR,
    MINUTE,
    SECOND,
    OffsetLane,
    empty_figure,
    iso_ms,
    stacked_columns,
    stacked_rows,
)
from jobs.report_tables import HISTORY_RUNS, RunTables
from schemas.messages import HALF_TOPIC
from schemas.outputs import (
    CHECK,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    NOT_REACHED,
    REASON_CHECK_MAX,
    REASON_EXPIRED,
    RESOLVED,
    TOO_YOUNG,
)

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


def age_bucket(age_ms: float) -> str:
    if pd.isna(age_ms):
        return "unknown"
    for label, upper in AGE_BUCKETS:
        if age_ms < upper:
            return label
    return AGE_BUCKETS[-1][0]


# --- figures from tables -----------------------------------------------------------------------


def category_counts(
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
    statuses = ordered_values(pending, "status", PENDING_STATUSES)
    series = category_counts(
        pending, "status", lambda f: f["age_ms"].map(age_bucket), categories, statuses
    )
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
        return empty_figure(
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
    statuses = ordered_values(pending, "status", PENDING_STATUSES)
    series = category_counts(frame, "status", lambda f: f["_key"], labels, statuses)
    return stacked_rows(
        "pending-group-topic",
        "Pending transactions by producer group / real topic",
        labels,
        series,
        STATUS_COLORS,
        unit="pending half messages",
    )


def check_count_distribution(run: RunTables) -> str:
    pending = run.pending
    if pending.empty:
        return empty_figure(
            "check-count", "Check-count distribution", "nothing pending in this run"
        )
    counters = pending["check_times"]
    known = counters.dropna().astype("int64")
    high = int(known.max()) if not known.empty else 0
    categories = ["none"] + [str(n) for n in range(0, high + 1)]
    statuses = ordered_values(pending, "status", PENDING_STATUSES)
    series = category_counts(
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


def time_step(span_ms: float) -> tuple[int, str]:
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
        return empty_figure("discards-time", title, "no discards in this run")
    born = discards["born_timestamp_ms"].fillna(run.as_of_ms).astype("int64")
    step, fmt = time_step(float(born.max() - born.min()))
    first = int(born.min()) // step * step
    slots = (born - first) // step
    count = int(slots.max()) + 1
    categories = [
        datetime.fromtimestamp((first + i * step) / 1000, tz=UTC).strftime(fmt)
        for i in range(count)
    ]
    reasons = ordered_values(discards, "reason", (REASON_CHECK_MAX, REASON_EXPIRED))
    series = category_counts(
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
        return empty_figure("discards-runs", title, "no runs")
    categories = [iso_ms(ms)[:16].replace("T", " ") for ms in runs["as_of_ms"]]
    history = run.discard_history
    reasons = ordered_values(history, "reason", (REASON_CHECK_MAX, REASON_EXPIRED))
    series = {reason: [0] * len(categories) for reason in reasons}
    position = {rid: i for i, rid in enumerate(runs["run_id"])}
    for row in history.itertuples(index=False):
        if row.run_id in position:
            series[row.reason][position[row.run_id]] += int(row.count)
    if not any(any(v) for v in series.values()):
        return empty_figure("discards-runs", title, f"no discards in the last {len(runs)} run(s)")
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
                held=isinstance(getattr(row, "offset_hold", None), str),
            )
        )
    return lanes


def ordered_values(frame: pd.DataFrame, column: str, preferred: Sequence[str]) -> list[str]:
    """Known values in the preferred order, then any others (sorted), so none is dropped."""
    present = (
        set(frame[column].dropna().astype(str)) if not frame.empty and column in frame else set()
    )
    return [v for v in preferred if v in present] + sorted(present - set(preferred))
