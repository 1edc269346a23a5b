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
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from jobs.attention import attention_lines, settings_line
from jobs.charts import esc, human_ms, ident, iso_ms, num, offsets_lanes
from jobs.report_anomalies import anomaly_sections
from jobs.report_discards import discard_history_section
from jobs.report_figures import (
    TOP_GROUP_TOPICS,
    check_count_distribution,
    discards_over_runs,
    discards_over_time,
    offset_lanes,
    pending_by_group_and_topic,
    pending_by_status_and_age,
)
from jobs.report_html import (
    TOP_OLDEST,
    bad_records_table,
    offsets_table,
    oldest_pending_table,
    summary_table,
)
from jobs.report_tables import HISTORY_RUNS, ReportError, RunTables, load_run
from schemas.outputs import (
    CLASSES,
    IMMUNE,
    NOT_REACHED,
    RESOLVED,
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
    "discard-history-time",
    "discard-history-reasons-time",
    "anomalies-kind",
    "pending-across-runs",
)
TABLES = (
    "run-summary",
    "oldest-pending",
    "offsets",
    "bad-records",
    "discard-history-reasons",
    "discard-history-unresolved",
    "anomalies",
    "longest-pending",
)


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
svg .single{font-size:16px;fill:#222}
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
    """What needs attention first: the lines of the job's printed summary (every warning
    of the run's summary rows among them, ``jobs.attention.picture_lines``)."""
    summary = _records(run.run_summary)
    lines = attention_lines(summary, _records(run.consume_offsets), run.output)
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return (
        f'<ul id="attention" data-items="{len(lines)}">{items}</ul>'
        f'<p class="note" id="settings">{esc(settings_line(summary))}</p>'
    )


def _cards(run: RunTables) -> str:
    """The headline counts of the run, discards and bad records marked when not zero."""
    summary = run.run_summary
    total = {
        name: int(summary[name].fillna(0).sum()) if name in summary else 0
        for name in (*CLASSES, "bad_records")
    }
    discards = len(run.discards)
    settled = (
        int(summary["settled_discards"].fillna(0).sum()) if "settled_discards" in summary else 0
    )
    # The table's rows: run_summary counts only the bad records of a known queue.
    total["bad_records"] = max(total["bad_records"], len(run.bad_records))
    cards = [
        ("pending", len(run.pending), False),
        ("check requests", len(run.check_requests), False),
        ("discards", discards, discards > settled),
        ("re-discards of settled", settled, False),
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
    return f'<div class="cards">{card_html}</div>'


def _figures(run: RunTables) -> list[tuple[str, str, str]]:
    """(title, figure, note) of every plot section, in page order."""
    lanes = offset_lanes(run)
    estimated = any(not lane.end_known for lane in lanes)
    return [
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


def _heading(run: RunTables) -> list[str]:
    """Title and the line of facts about the run."""
    summary = run.run_summary
    written = summary["written_at_ms"].max() if "written_at_ms" in summary else None
    duration = summary["duration_ms"].max() if "duration_ms" in summary else None
    brokers = sorted(summary["broker"].dropna().astype(str).unique())
    return [
        f"<h1>RocketMQ transaction reconciliation: run <code>{esc(run.run_id)}</code></h1>",
        f'<div class="meta">as of <b>{esc(iso_ms(run.as_of_ms))}</b> (as_of_ms {ident(run.as_of_ms)}) · '
        f"written {esc(iso_ms(written))} in {esc(human_ms(duration))} · "
        f"brokers: {esc(', '.join(brokers))} · output <code>{esc(run.output)}</code></div>",
    ]


def render_html(run: RunTables) -> str:
    """The whole page for one run."""
    # What needs attention comes first, above every count and chart.
    body = [
        *_heading(run),
        '<h2 id="needs-attention">Needs attention first</h2>',
        attention_section(run),
        _cards(run),
    ]
    for title, figure, note in _figures(run):
        body.append(f"<h2>{esc(title)}</h2>")
        if note:
            body.append(f'<p class="note">{esc(note)}</p>')
        body.append(figure)
    body += [
        f"<h2>Oldest pending transactions (top {TOP_OLDEST})</h2>",
        oldest_pending_table(run),
        "<h2>Run summary per broker and queue</h2>",
        summary_table(run),
        *anomaly_sections(run),
        "<h2>Consume offsets</h2>",
        offsets_table(run),
        discard_history_section(run.output),
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
