"""The report's sections for the anomalies table (by kind and severity, then the findings)
and for pending across runs (how long transactions have been pending in this output root,
from ``pending.pending_since_ms`` / ``first_seen_run_id``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from jobs.charts import esc, human_ms, ident, iso_ms, num, stacked_columns
from jobs.report_figures import AGE_BUCKETS, age_bucket
from jobs.report_html import html_table
from jobs.report_tables import RunTables
from schemas.outputs import ANOMALY_KINDS, CRITICAL, INFO, SEVERITIES, WARNING

SEVERITY_COLORS = {INFO: "#9e9e9e", WARNING: "#ff7f0e", CRITICAL: "#d62728"}
TOP_FINDINGS = 200  # rows of the findings table (the table holds them all)
TOP_LONGEST = 25


def _text(value: object) -> str:
    return "" if value is None or pd.isna(value) else esc(value)


def _in_order(frame: pd.DataFrame, column: str, preferred: tuple[str, ...]) -> list[str]:
    """The values present, known ones in the preferred order, then any others."""
    present = set(frame[column].dropna().astype(str)) if not frame.empty else set()
    return [v for v in preferred if v in present] + sorted(present - set(preferred))


def anomalies_by_kind(run: RunTables) -> str:
    """Stacked columns: findings per kind, coloured by severity."""
    found = run.anomalies
    kinds = _in_order(found, "kind", ANOMALY_KINDS)
    severities = _in_order(found, "severity", SEVERITIES)
    series: dict[str, list[float]] = {severity: [0] * len(kinds) for severity in severities}
    if not found.empty:
        counts = found.groupby(["kind", "severity"]).size()
        for (kind, severity), count in counts.items():
            series[str(severity)][kinds.index(str(kind))] = int(count)
    return stacked_columns(
        "anomalies-kind",
        "Anomalies by kind and severity",
        kinds,
        series,
        SEVERITY_COLORS,
        "findings",
        empty_message="no anomaly in this run",
    )


def anomalies_table(run: RunTables) -> str:
    """The findings, most severe first, with their evidence."""
    found = run.anomalies
    if not found.empty:
        rank = found["severity"].map({s: -i for i, s in enumerate(SEVERITIES)})
        found = (
            found.assign(_rank=rank)
            .sort_values(["_rank", "kind", "broker", "queue_id", "half_offset", "op_offset"])
            .head(TOP_FINDINGS)
        )
    columns: dict[str, Callable[[Any], str]] = {
        "severity": _text,
        "kind": _text,
        "broker": _text,
        "queue_id": ident,
        "uniq_key": _text,
        "producer_group": _text,
        "half_offset": ident,
        "op_offset": ident,
        "value": num,
        "threshold": num,
        "detail": _text,
    }
    return html_table("anomalies", found, columns, "no anomaly in this run", wrap=("detail",))


def _pending_for(run: RunTables) -> pd.DataFrame:
    """Pending rows with ``pending_for_ms`` (T - pending_since_ms): how long the output root
    has seen the transaction pending (0 for one first seen in this run)."""
    pending = run.pending
    if pending.empty or "pending_since_ms" not in pending:
        return pd.DataFrame()
    return pending.assign(pending_for_ms=run.as_of_ms - pending["pending_since_ms"])


def pending_across_runs(run: RunTables) -> str:
    """Stacked columns: pending transactions by how long earlier runs have seen them pending."""
    pending = _pending_for(run)
    categories = [label for label, _ in AGE_BUCKETS if label != "future"]
    series: dict[str, list[float]] = {
        "first seen in this run": [0] * len(categories),
        "seen by earlier runs": [0] * len(categories),
    }
    if not pending.empty:
        earlier = pending["first_seen_run_id"] != run.run_id
        for is_earlier, group in pending.groupby(earlier):
            name = "seen by earlier runs" if is_earlier else "first seen in this run"
            for bucket, count in group["pending_for_ms"].map(age_bucket).value_counts().items():
                if bucket in categories:
                    series[name][categories.index(str(bucket))] += int(count)
    return stacked_columns(
        "pending-across-runs",
        "Pending transactions by time pending across runs (as-of time minus pending_since_ms)",
        categories,
        series,
        {"first seen in this run": "#1f77b4", "seen by earlier runs": "#d62728"},
        "pending half messages",
        empty_message="nothing pending in this run",
    )


def longest_pending_table(run: RunTables) -> str:
    """The transactions pending the longest across runs (one row per transaction)."""
    pending = _pending_for(run)
    if not pending.empty:
        key = pending["uniq_key"].fillna(pending["half_offset"].astype(str))
        pending = (
            pending.assign(_key=key)
            .sort_values(["pending_for_ms", "half_offset"], ascending=[False, True])
            .drop_duplicates(["broker", "_key"])
            .head(TOP_LONGEST)
            .assign(
                pending_for=lambda f: f["pending_for_ms"].map(human_ms),
                pending_since=lambda f: f["pending_since_ms"].map(iso_ms),
            )
        )
    columns: dict[str, Callable[[Any], str]] = {
        "pending_for": _text,
        "pending_since": _text,
        "first_seen_run_id": _text,
        "status": _text,
        "broker": _text,
        "queue_id": ident,
        "half_offset": ident,
        "uniq_key": _text,
        "producer_group": _text,
        "check_times": num,
    }
    return html_table(
        "longest-pending",
        pending,
        columns,
        "nothing pending in this run",
        wrap=("first_seen_run_id",),
    )


def anomaly_sections(run: RunTables) -> list[str]:
    """The HTML of both sections, headings included, in page order."""
    return [
        '<h2 id="anomalies">Anomalies</h2>',
        '<p class="note">What the broker gets wrong or will waste (docs/anomalies.md):'
        " one row per finding in the anomalies table, with the number each rule measured.</p>",
        anomalies_by_kind(run),
        anomalies_table(run),
        '<h2 id="pending-across-runs">Pending across runs</h2>',
        '<p class="note">Since when each pending transaction has been pending in this output'
        " root (pending.pending_since_ms, first_seen_run_id): a transaction that earlier runs"
        " also had pending keeps its first sighting.</p>",
        pending_across_runs(run),
        f"<h3>Pending the longest across runs (top {TOP_LONGEST})</h3>",
        longest_pending_table(run),
    ]
