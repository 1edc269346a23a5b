"""The HTML audit report: built from Delta tables of a small synthetic run, rendered in Chromium.

The tables are written with deltalake from Arrow schemas derived from schemas/outputs.py,
so no Spark session is needed. The browser checks use Debian's ``chromium`` headless:
``--dump-dom`` (the DOM after scripts ran) and ``--screenshot`` (PNGs that must not be blank:
the top of the page, and the page from its ``#anomalies`` heading on, the issue-15 sections).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from connectors.arrow import to_arrow_schema
from jobs import report
from jobs.attention import attention_lines
from schemas.outputs import (
    ANOMALIES,
    BAD_RECORDS,
    CHECK,
    CHECK_REQUESTS,
    CONSUME_OFFSETS,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    DISCARD_HISTORY,
    DISCARDS,
    IMMUNE,
    NOT_REACHED,
    PENDING,
    RUN_SUMMARY,
    TABLE_SCHEMAS,
    TOO_YOUNG,
)

REPO = Path(__file__).resolve().parents[2]
HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
GROUP = "CID_RMQ_SYS_TRANS"
OLD_RUN, NEW_RUN = "run-2026-01-01T00-00", "run-2026-01-01T00-15"
OLD_AS_OF, NEW_AS_OF = 1_767_225_600_000, 1_767_226_500_000
HOUR = 3_600_000
SCREENSHOT = Path(
    os.environ.get("RMQ_REPORT_SCREENSHOT", Path(tempfile.gettempdir()) / "rmq-report.png")
)
# The page from its Anomalies heading on: the issue-15 sections, below the first screenshot.
SECTIONS_SCREENSHOT = Path(
    os.environ.get(
        "RMQ_REPORT_SCREENSHOT_SECTIONS", Path(tempfile.gettempdir()) / "rmq-report-sections.png"
    )
)


def _write(out: Path, table: str, schema, rows: list[dict]) -> None:
    arrow_schema = to_arrow_schema(schema)
    data = pa.Table.from_pylist(rows, schema=arrow_schema)
    write_deltalake(str(out / table), data, partition_by=["run_id"], mode="append")


def _half_row(
    rng: random.Random, broker: str, offset: int, as_of: int, age_ms: int, counter
) -> dict:
    group = rng.choice(["PG_orders", "PG_payments", "PG_inventory", "PG_shipping"])
    topic = {"PG_orders": "orders", "PG_payments": "payments"}.get(
        group, rng.choice(["stock", "parcels"])
    )
    born = as_of - age_ms
    return {
        "broker": broker,
        "queue_id": 0,
        "half_offset": offset,
        "commitlog_offset": 1000 * offset,
        "offset_msg_id": f"7F00000100002A9F{1000 * offset:016X}",
        "uniq_key": f"{broker}-{offset:06d}",
        "producer_group": group,
        "real_topic": topic,
        "real_queue_id": rng.randrange(4),
        "born_timestamp_ms": born,
        "store_timestamp_ms": born + 3,
        "age_ms": age_ms,
        "check_times": counter,
        "immunity_ms": 6000,
        # The check interval is 30 s, check_max 15.
        "discard_at_ms": as_of + 30_000 * max(1, 15 - (counter or 0)),
    }


def _age_for(rng: random.Random, status: str) -> int:
    """A message age that puts a pending half of ``status`` in its place on the charts."""
    if status == DISCARD_EXPIRED:
        return 72 * HOUR + rng.randrange(1, 5 * HOUR)
    if status == IMMUNE:
        return rng.randrange(1000, 50_000)
    return rng.choice(
        [
            rng.randrange(6_000, 60_000),
            rng.randrange(60_000, 3 * HOUR),
            rng.randrange(3 * HOUR, 60 * HOUR),
        ]
    )


def _since(rng: random.Random, run_id: str, as_of: int) -> dict:
    """Pending across runs: in the newer run, about half the transactions were already
    pending in the older one."""
    earlier = run_id == NEW_RUN and rng.random() < 0.5
    return {
        "first_seen_run_id": OLD_RUN if earlier else run_id,
        "pending_since_ms": OLD_AS_OF if earlier else as_of,
        "run_id": run_id,
        "as_of_ms": as_of,
    }


def _anomalies(broker: str, run_id: str, as_of: int) -> list[dict]:
    common = {"broker": broker, "queue_id": 0, "run_id": run_id, "as_of_ms": as_of}
    return [
        {**common, "kind": "recheck_of_resolved", "severity": "critical", "uniq_key": f"{broker}-000101",
         "producer_group": "PG_orders", "half_offset": 101, "value": 15.0, "threshold": 15.0,
         "detail": "half offset 101 is resolved through another record of its transaction"},
        {**common, "kind": "op_queue_gap", "severity": "critical", "op_offset": 55, "value": 3.0,
         "threshold": 0.0, "detail": "op offsets 55 to 57 (3) are missing inside [p0, end)"},
        {**common, "kind": "system_topic_or_delay", "severity": "warning", "uniq_key": f"{broker}-000102",
         "half_offset": 102, "detail": "half offset 102: it carries DELAY=3"},
    ]  # fmt: skip


def _run(out: Path, run_id: str, as_of: int, written_at: int, seed: int) -> dict[str, int]:
    """One run over two brokers; returns how many rows of each kind were written."""
    rng = random.Random(seed)
    pending, checks, discards, summary, offsets, anomalies = [], [], [], [], [], []
    for broker in ("broker-a", "broker-b"):
        h0, offset = 100, 100
        anomalies += _anomalies(broker, run_id, as_of)
        counts = dict.fromkeys(
            ("resolved", CHECK, IMMUNE, DISCARD_CHECK_MAX, DISCARD_EXPIRED, TOO_YOUNG, NOT_REACHED),
            0,
        )
        statuses = (
            [DISCARD_EXPIRED] * 2
            + [DISCARD_CHECK_MAX] * 3
            + [CHECK] * 40
            + [IMMUNE] * 5
            + ["resolved"] * 30
        )
        rng.shuffle(statuses)
        for status in statuses:
            if status == "resolved":
                counts["resolved"] += 1
                offset += 1
                continue
            age = _age_for(rng, status)
            counter = 15 if status == DISCARD_CHECK_MAX else rng.choice([None, 1, 2, 3, 5, 8, 14])
            if status != DISCARD_CHECK_MAX:
                counter = (counter or 0) + 1
            row = _half_row(rng, broker, offset, as_of, age, counter)
            pending.append({**row, "status": status, **_since(rng, run_id, as_of)})
            if status == CHECK:
                checks.append({**row, "run_id": run_id, "as_of_ms": as_of})
            if status in (DISCARD_CHECK_MAX, DISCARD_EXPIRED):
                reason = "check_max" if status == DISCARD_CHECK_MAX else "expired"
                discards.append({**row, "reason": reason, "run_id": run_id, "as_of_ms": as_of})
            counts[status] += 1
            offset += 1
        h1 = offset
        pending.append(
            {
                **_half_row(rng, broker, offset, as_of, 2_000, None),
                "status": TOO_YOUNG,
                **_since(rng, run_id, as_of),
            }
        )
        counts[TOO_YOUNG] += 1
        for extra in range(1, 4):  # behind the stop: put-back copies keep their old born time
            pending.append(
                {
                    **_half_row(rng, broker, offset + extra, as_of, 90_000, 1),
                    "status": NOT_REACHED,
                    **_since(rng, run_id, as_of),
                }
            )
            counts[NOT_REACHED] += 1
        h_safe = min(
            r["half_offset"]
            for r in pending
            if r["broker"] == broker and r["status"] in (CHECK, IMMUNE)
        )
        p0, p1, p_safe = 40, 70, 52
        summary.append({
            "broker": broker, "queue_id": 0, "h0": h0, "h1": h1, "h_safe": h_safe,
            "p0": p0, "p1": p1, "p_safe": p_safe, **{k: int(v) for k, v in counts.items()},
            "bad_records": 2 if broker == "broker-b" else 0,
            "discard_next_round": 3 if broker == "broker-a" else 0, "past_last_check": 1,
            "check_max": 15, "check_interval_ms": 30_000, "writer": "delta-rs",
            "warnings": ["committed half offset 90 below the smallest available 100: started at 100"]
            if broker == "broker-a" else [],
            "written_at_ms": written_at, "duration_ms": 41_250, "run_id": run_id, "as_of_ms": as_of,
        })  # fmt: skip
        for topic, committed, before, after, safe in (
            (HALF, 90, h0, h1, h_safe),
            (OP, p0, p0, p1, p_safe),
        ):
            offsets.append({
                "broker": broker, "topic": topic, "queue_id": 0, "group": GROUP,
                "offset_committed": committed, "offset_before": before, "offset_after": after,
                "offset_safe": safe, "run_id": run_id, "as_of_ms": as_of,
            })  # fmt: skip
    bad = [
        {"broker": "broker-b", "source": "commitlog/00000000000000000000", "position": 4096 * i,
         "topic": HALF if i else None, "queue_id": 0 if i else None, "queue_offset": 150 if i else None,
         "reason": "unparsable TRANSACTION_CHECK_TIMES" if i else "bad magic code",
         "raw_hex": "deadbeef", "run_id": run_id, "as_of_ms": as_of}
        for i in range(2)
    ]  # fmt: skip
    for table, schema, rows in (
        ("pending", PENDING, pending),
        ("check_requests", CHECK_REQUESTS, checks),
        ("discards", DISCARDS, discards),
        ("run_summary", RUN_SUMMARY, summary),
        ("consume_offsets", CONSUME_OFFSETS, offsets),
        ("bad_records", BAD_RECORDS, bad),
        ("anomalies", ANOMALIES, anomalies),
    ):
        _write(out, table, schema, rows)
    return {"pending": len(pending), "discards": len(discards), "checks": len(checks)}


# (discard offset, uniq key, reason, outcome, resume_futile, hours before NEW_AS_OF)
DISCARD_ROWS = (
    (0, "K0", "check_max", "unresolved", False, 30),
    (1, "K1", "expired", "unresolved", True, 20),
    (2, "K2", "check_max", "committed", None, 10),
    (3, None, "check_max", "unknown", None, 5),
)


def _write_discard_history(out: Path) -> None:
    """The merged table (not partitioned by run), as the writers leave it."""
    rows = []
    for offset, key, reason, outcome, futile, hours in DISCARD_ROWS:
        msg_id = f"7F00000100002A9F{9000 + offset:016X}"
        resumable = futile is False
        rows.append({
            "broker": "broker-a", "discard_offset": offset, "offset_msg_id": msg_id,
            "uniq_key": key, "producer_group": "PG_orders", "real_topic": "orders",
            "real_queue_id": 1, "check_times": 15, "born_timestamp_ms": NEW_AS_OF - 80 * HOUR,
            "discarded_at_ms": NEW_AS_OF - hours * HOUR, "reason": reason, "outcome": outcome,
            "ended_before_discard": outcome == "committed" or None, "resume_futile": futile,
            "resume_topic": "TRANS_CHECK_MAX_TIME_TOPIC" if resumable else None,
            "resume_offset_msg_id": msg_id if resumable else None,
            "first_seen_run_id": OLD_RUN, "run_id": NEW_RUN, "as_of_ms": NEW_AS_OF,
        })  # fmt: skip
    data = pa.Table.from_pylist(rows, schema=to_arrow_schema(DISCARD_HISTORY))
    write_deltalake(str(out / "discard_history"), data)


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    out = tmp_path_factory.mktemp("out")
    _run(out, OLD_RUN, OLD_AS_OF, OLD_AS_OF + 60_000, seed=1)
    counts = _run(out, NEW_RUN, NEW_AS_OF, NEW_AS_OF + 60_000, seed=2)
    _write_discard_history(out)
    assert set(TABLE_SCHEMAS) == {p.name for p in out.iterdir()}
    return out, counts


def test_default_run_is_the_newest_and_the_path_is_printed(output, tmp_path, capsys) -> None:
    out, counts = output
    page = tmp_path / "report.html"

    assert report.main(["--output", str(out), "--html", str(page)]) == 0

    assert capsys.readouterr().out.strip() == str(page)
    text = page.read_text()
    assert f'data-run-id="{NEW_RUN}"' in text
    assert (
        f'id="plot-pending-status-age" data-plot="pending-status-age" data-rows="{counts["pending"]}"'
        in text
    )


def test_the_page_says_what_needs_attention_first(output, tmp_path) -> None:
    out, _ = output
    page = tmp_path / "report.html"
    assert report.main(["--output", str(out), "--html", str(page)]) == 0
    text = page.read_text()
    section = text[
        text.index('<ul id="attention"') : text.index("</ul>", text.index('id="attention"'))
    ]

    assert "3 pending transaction(s) are discarded by the next round" in section
    assert "broker-a queue 0: 3" in section
    assert "2 check request(s) are the last before a discard" in section
    assert "discarded this round" in section
    # Both brokers committed 90 on the half queue; their safe offsets differ from it.
    assert (
        "offsets to install into stopped broker broker-a: RMQ_SYS_TRANS_HALF_TOPIC queue 0 90 -&gt;"
        in section
    )
    assert "python -m jobs.offsets install" in section
    assert "check_max=15" in text and "writer=delta-rs" in text


def test_run_id_selects_an_older_run_and_default_path_is_under_output(output) -> None:
    out, _ = output

    path = report.write_report(out, OLD_RUN)

    assert path == out / "reports" / f"{OLD_RUN}.html"
    assert f'data-run-id="{OLD_RUN}"' in path.read_text()


def test_unknown_run_or_output_is_a_clean_error(output, tmp_path, capsys) -> None:
    out, _ = output

    assert report.main(["--output", str(out), "--run-id", "nope"]) == 2
    assert report.main(["--output", str(tmp_path / "missing")]) == 2

    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all(line.startswith("error: ") for line in errors)


def test_discard_history_section_with_the_resume_arguments(output, tmp_path) -> None:
    out, _ = output
    text = report.write_report(out, html_path=tmp_path / "r.html").read_text()
    section = text[text.index('id="discard-history"') :]

    assert 'id="plot-discard-history-time"' in section
    assert re.search(
        r'id="table-discard-history-reasons" data-table="[^"]+" data-rows="2"', section
    )
    unresolved = section[section.index('id="table-discard-history-unresolved"') :]
    assert 'data-rows="2"' in unresolved[:200]
    assert f"7F00000100002A9F{9000:016X}" in unresolved  # resumable: its offset message id
    assert f"7F00000100002A9F{9001:016X}" not in unresolved  # futile: no resume arguments
    assert "4 message(s) the broker discarded" in section
    assert "2 unresolved, of which 1 would be discarded again" in section


def test_the_issue_15_sections_have_anchors_in_page_order(output, tmp_path) -> None:
    out, _ = output
    text = report.write_report(out, html_path=tmp_path / "r.html").read_text()

    headings = [
        text.find(f'<h2 id="{name}">')
        for name in ("anomalies", "pending-across-runs", "discard-history")
    ]
    assert -1 not in headings, headings
    assert headings == sorted(headings)


def test_a_run_with_nothing_pending_still_has_every_plot(tmp_path) -> None:
    out = tmp_path / "out"
    for table, schema in TABLE_SCHEMAS.items():
        _write(out, table, schema, [])
    _write(out, "run_summary", RUN_SUMMARY, [{
        "broker": "b", "queue_id": 0, "h0": 0, "h1": 0, "h_safe": 0, "p0": 0, "p1": 0, "p_safe": 0,
        "resolved": 0, "check": 0, "immune": 0, "discard_check_max": 0, "discard_expired": 0,
        "too_young": 0, "not_reached": 0, "bad_records": 0, "warnings": [], "written_at_ms": 1,
        "duration_ms": 1, "run_id": "empty", "as_of_ms": 0,
    }])  # fmt: skip

    text = report.write_report(out).read_text()

    assert all(f'id="plot-{name}"' in text for name in report.PLOTS)


# --- how the page reads ----------------------------------------------------------------------


class Page(HTMLParser):
    """The page as a reader sees it: the text of every table cell under its header, the
    attention items, and the order of the elements that carry an id or a class."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, str]]] = {}
        self.headers: dict[str, list[str]] = {}
        self.attention: list[str] = []
        self.order: list[tuple[str, dict[str, str]]] = []
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._row: list[str] = []
        self._in_attention = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        self.order.append((tag, attr))
        if tag == "table":
            self._table = attr["id"].removeprefix("table-")
            self.tables[self._table], self.headers[self._table] = [], []
        elif tag == "ul" and attr.get("id") == "attention":
            self._in_attention = True
        elif tag in ("td", "th", "li"):
            self._cell = []
        elif tag == "tr":
            self._row = []

    def handle_endtag(self, tag: str) -> None:
        text = "".join(self._cell or []).strip()
        if tag == "th" and self._table:
            self.headers[self._table].append(text)
        elif tag == "td" and self._table:
            self._row.append(text)
        elif tag == "tr" and self._table and self._row:
            self.tables[self._table].append(
                dict(zip(self.headers[self._table], self._row, strict=True))
            )
        elif tag == "li" and self._in_attention:
            self.attention.append(text)
        elif tag == "ul":
            self._in_attention = False
        elif tag == "table":
            self._table = None
        if tag in ("td", "th", "li"):
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def first(self, tag: str, **attrs: str) -> int:
        """Position of the first element with this tag (and these attribute values)."""
        return next(
            i
            for i, (t, a) in enumerate(self.order)
            if t == tag and all(value in a.get(key, "").split() for key, value in attrs.items())
        )

    def column(self, table: str, header: str) -> list[str]:
        return [row[header] for row in self.tables[table]]


def _iso(ms: int) -> str:
    instant = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return instant.replace("+00:00", "Z")


ISO_INSTANT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
DAMAGED_RUN, DAMAGED_AS_OF = "run-damaged", 1_749_999_641_174
HOLD = "the round ends below the committed offsets (half 4229 -> 3389; op 583 -> 473)"


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> Path:
    """A run over a store whose commit log lost its tail: the committed offsets are beyond
    the readable end (4229 -> 3389, 583 -> 473), so they are held; 1 379 bad records (1 100
    of the half queue, 279 without a known queue), nothing resolved, two pending and two
    findings of one kind."""
    out = tmp_path_factory.mktemp("damaged")
    run = {"run_id": DAMAGED_RUN, "as_of_ms": DAMAGED_AS_OF}
    warnings = [
        f"{HALF} queue 0: committed offset 4229 is beyond the queue's end 3389 at the as-of"
        " time; starting at 3389",
        f"{OP} queue 0: committed offset 583 is beyond the queue's end 473 at the as-of time;"
        " starting at 473",
    ]
    _write(out, "run_summary", RUN_SUMMARY, [{
        "broker": "store", "queue_id": 0, "h0": 3389, "h1": 3389, "h_safe": None, "p0": 473,
        "p1": 473, "p_safe": None, "resolved": 0, "check": 2, "immune": 0, "discard_check_max": 0,
        "discard_expired": 0, "too_young": 0, "not_reached": 0, "bad_records": 1100,
        "warnings": warnings, "check_max": 15, "written_at_ms": DAMAGED_AS_OF + 50_000,
        "duration_ms": 51_410, "offset_hold": HOLD, **run,
    }])  # fmt: skip
    _write(out, "consume_offsets", CONSUME_OFFSETS, [
        {"broker": "store", "topic": topic, "queue_id": 0, "group": GROUP, "offset_committed": c,
         "offset_before": b, "offset_after": None, "offset_safe": None, "offset_hold": HOLD, **run}
        for topic, c, b in ((HALF, 4229, 3389), (OP, 583, 473))
    ])  # fmt: skip
    _write(out, "bad_records", BAD_RECORDS, [
        {"broker": "store", "source": "commitlog/00000000000000000000", "position": 3_999_710 + i,
         "topic": HALF if i < 1100 else None, "queue_id": 0 if i < 1100 else None,
         "reason": f"commit-log offset {4_000_465 + i} is past the end of the commit log (4000000)",
         "raw_hex": "", **run}
        for i in range(1379)
    ])  # fmt: skip
    rng = random.Random(3)
    pending = [
        {**_half_row(rng, "store", offset, DAMAGED_AS_OF, 300_000 + offset, counter),
         "discard_at_ms": DAMAGED_AS_OF + 30_000, "status": CHECK,
         "first_seen_run_id": DAMAGED_RUN, "pending_since_ms": DAMAGED_AS_OF, **run}
        for offset, counter in ((3387, 14), (3388, 15))
    ]  # fmt: skip
    _write(out, "pending", PENDING, pending)
    _write(out, "check_requests", CHECK_REQUESTS, [
        {k: v for k, v in row.items() if k not in ("status", "first_seen_run_id", "pending_since_ms")}
        for row in pending
    ])  # fmt: skip
    _write(out, "anomalies", ANOMALIES, [
        {"broker": "store", "queue_id": 0, "kind": "immunity_exhausts_checks", "severity": "warning",
         "half_offset": offset, "value": 15.0, "threshold": 0.0, "detail": f"half offset {offset}", **run}
        for offset in (1064, 2169)
    ])  # fmt: skip
    for table, schema in (("discards", DISCARDS), ("discard_history", DISCARD_HISTORY)):
        _write(out, table, schema, [])
    return report.write_report(out, html_path=out / "report.html")


def test_attention_comes_first_with_every_warning_of_the_run(damaged) -> None:
    text = damaged.read_text()
    page = Page(text)
    out = damaged.parent
    rows = report.load_run(out)

    # The heading, then what needs attention, then the counts, then every chart and table.
    attention = page.first("ul", id="attention")
    assert page.first("h1") < page.first("h2", id="needs-attention") < attention
    blocks = [(t, a) for t, a in page.order[:attention] if t in ("div", "p", "svg", "table")]
    assert blocks == [("div", {"class": "meta"})]  # the line of facts under the title
    assert attention < page.first("div", **{"class": "cards"})
    assert attention < page.first("svg") and attention < page.first("table")
    # What the job prints first (attention_lines), then every run_summary warning.
    expected = attention_lines(
        report._records(rows.run_summary), report._records(rows.consume_offsets), str(out)
    )
    assert page.attention[: len(expected)] == expected
    for warning in rows.run_summary["warnings"].iloc[0]:
        assert sum(warning in item for item in page.attention) == 1, warning
    assert "warnings" not in page.headers["run-summary"]  # not repeated lower down


def test_every_summary_warning_is_in_the_attention_list(output, tmp_path) -> None:
    out, _ = output
    page = Page(report.write_report(out, html_path=tmp_path / "r.html").read_text())

    warning = "committed half offset 90 below the smallest available 100: started at 100"
    items = [item for item in page.attention if warning in item]
    assert len(items) == 1 and "broker-a queue 0" in items[0], page.attention


def test_offsets_are_identifiers_and_counts_have_separators(damaged) -> None:
    text = damaged.read_text()
    page = Page(text)

    offsets = {row["topic"]: row for row in page.tables["offsets"]}
    assert offsets[HALF]["offset_committed"] == "4229"
    assert offsets[HALF]["offset_before"] == "3389" and offsets[HALF]["offset_safe"] == ""
    assert offsets[HALF]["offset_hold"] == HOLD
    assert offsets[OP]["offset_committed"] == "583"
    assert page.tables["run-summary"][0]["h0"] == "3389"
    assert page.column("oldest-pending", "half_offset") == ["3388", "3387"]
    assert page.column("anomalies", "half_offset") == ["1064", "2169"]
    assert page.column("bad-records", "example_position") == ["3999710", "4000810"]
    # The offsets lane: where the broker is, where the round starts, and that it is held.
    assert "committed 4229; from 3389 of ≥ 3389: held, nothing to install" in text
    assert f"as_of_ms {DAMAGED_AS_OF})" in text
    for number in ("4,229", "3,389", "3,999,710", f"{DAMAGED_AS_OF:,}"):
        assert number not in text, number
    # Counts keep their thousands separators: 1 379 rows, 1 100 of the half queue.
    cards = re.search(r'data-card="bad records">bad records<b>([^<]+)</b>', text)
    assert cards and cards.group(1) == "1,379"
    assert page.tables["run-summary"][0]["bad_records"] == "1,100"
    assert page.column("bad-records", "count") == ["1,100", "279"]


def test_booleans_read_true_or_false(output, tmp_path) -> None:
    out, _ = output
    text = report.write_report(out, html_path=tmp_path / "r.html").read_text()
    page = Page(text)

    futile = page.column("discard-history-unresolved", "resume_futile")
    assert futile == ["true", "false"]  # newest first: K1 (20 h ago, futile), K0 (resumable)
    assert not re.search(r">\s*(True|False)\s*<", text)


def test_instants_are_named_for_what_they_hold_in_iso_utc(output, tmp_path) -> None:
    out, _ = output
    page = Page(report.write_report(out, html_path=tmp_path / "r.html").read_text())

    instants = {
        "oldest-pending": ("born_at", "discard_at"),
        "longest-pending": ("pending_since",),
        "discard-history-unresolved": ("discarded_at",),
    }
    for table, columns in instants.items():
        for column in columns:
            values = page.column(table, column)
            assert values and all(ISO_INSTANT.match(v) for v in values), (table, column, values)
    assert page.column("discard-history-unresolved", "discarded_at") == [
        _iso(NEW_AS_OF - 20 * HOUR),
        _iso(NEW_AS_OF - 30 * HOUR),
    ]
    for table, headers in page.headers.items():
        vague = [
            h for h in headers if h in ("time", "ms", "born", "since", "at") or h.endswith("_ms")
        ]
        assert not vague, (table, vague)


def test_a_single_value_is_said_in_words_not_charted(damaged, output, tmp_path) -> None:
    text = damaged.read_text()

    anomalies = re.search(r'<svg id="plot-anomalies-kind"[^>]*>.*?</svg>', text).group(0)
    assert 'data-single="true"' in anomalies and 'class="bar"' not in anomalies
    assert ">immunity_exhausts_checks: 2 findings, all warning</text>" in anomalies
    age = re.search(r'<svg id="plot-pending-status-age"[^>]*>.*?</svg>', text).group(0)
    assert ">1 - 10 min: 2 pending half messages, all check</text>" in age
    # No chart on either page has fewer than two bars.
    busy = report.write_report(output[0], html_path=tmp_path / "r.html").read_text()
    for page in (text, busy):
        for plot in re.findall(r"<svg id=\"plot-[^\"]+\".*?</svg>", page):
            bars = set(re.findall(r'class="bar"[^>]*data-category="([^"]*)"', plot))
            assert len(bars) != 1, plot[:120]


# --- in a real browser ------------------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.geteuid() == 0 and shutil.which("apt-get"):  # the project's machines are Debian, as root
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.run(["apt-get", "update", "-qq"], check=False, timeout=300, **quiet)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"], check=False, timeout=600, **quiet
        )
        return shutil.which("chromium")
    return None


# The window of every browser call: the first screenshot is the top of the page in it.
TOP_WINDOW = (1280, 2400)


def _browse(
    browser: str, page: Path, *mode: str, window: tuple[int, int] = TOP_WINDOW
) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
             f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}", *mode,
             page.as_uri()],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG into rows of pixel bytes (zlib only)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat = 8, b""
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        chunk = data[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        position += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = previous[x]
            c = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa_, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (
                    line[x] + (a if pa_ <= pb and pa_ <= pc else b if pb <= pc else c)
                ) & 0xFF
        rows.append(
            bytes(line) if channels == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3)
        )
        previous = line
    return width, height, rows


@pytest.fixture(scope="module")
def browser() -> str:
    found = _chromium()
    if not found:
        pytest.skip("chromium is not installed and cannot be (apt-get install chromium failed)")
    return found


@pytest.fixture(scope="module")
def page(output, tmp_path_factory) -> Path:
    out, _ = output
    return report.write_report(out, html_path=tmp_path_factory.mktemp("page") / "report.html")


def test_page_loads_in_chromium_with_every_plot(browser, page) -> None:
    done = _browse(browser, page, "--dump-dom")

    dom = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'data-report-ok="true"' in dom, "the inline script did not finish: a script error?"
    assert f'data-plots-rendered="{len(report.PLOTS)}"' in dom
    for name in report.PLOTS:
        match = re.search(rf'<svg id="plot-{name}" data-plot="{name}" data-rows="(\d+)"', dom)
        assert match, f"plot {name} missing"
        assert int(match.group(1)) > 0, f"plot {name} is empty"
    for name in report.TABLES:
        assert re.search(rf'id="table-{name}" data-table="{name}" data-rows="[1-9]', dom), name
    assert "http://" not in dom.replace("http://www.w3.org/2000/svg", ""), (
        "the page fetches something"
    )


def _screenshot(
    browser: str, page: Path, path: Path, window: tuple[int, int] = TOP_WINDOW
) -> list[bytes]:
    """Take a screenshot of the window into ``path`` and return its rows of RGB pixels, after
    checking its size and that it is not blank; prints where it is and what it holds."""
    path.unlink(missing_ok=True)

    done = _browse(browser, page, f"--screenshot={path}", window=window)

    assert done.returncode == 0 and path.exists(), done.stderr[-2000:]
    width, height, rows = png_pixels(path.read_bytes())
    assert (width, height) == window
    sample = [row[x : x + 3] for row in rows[::8] for x in range(0, len(row), 3 * 8)]
    colours = set(sample)
    inked = sum(pixel != b"\xff\xff\xff" for pixel in sample) / len(sample)
    assert len(colours) > 8, f"only {len(colours)} colours: a blank page?"
    assert inked > 0.02, f"only {inked:.1%} of the page is not white"
    print(f"\nscreenshot: {path} ({len(colours)} colours, {inked:.1%} inked)", file=sys.stderr)
    return rows


@pytest.fixture(scope="module")
def top_rows(browser, page) -> list[bytes]:
    return _screenshot(browser, page, SCREENSHOT)


def test_screenshot_is_not_blank(top_rows) -> None:
    assert len(top_rows) == 2400  # _screenshot checked the size, the colours and the ink


# Chromium's --screenshot captures the window at the top of the page (opened at #anomalies it
# captures a blank window), so the sections below 2400 px are shown by hiding what precedes
# the Anomalies heading: the same page with one more style rule.
ONLY_FROM_ANOMALIES = "<style>body > :has(~ #anomalies) { display: none }</style></head>"
SECTIONS_WINDOW = (1280, 3600)


def test_screenshot_of_the_sections_below(browser, page, top_rows) -> None:
    """Anomalies, pending across runs, consume offsets, discard history and bad records: the
    rest of the page from the Anomalies heading, all of it in the window."""
    variant = page.with_name("from-anomalies.html")
    variant.write_text(page.read_text().replace("</head>", ONLY_FROM_ANOMALIES, 1))

    rows = _screenshot(browser, variant, SECTIONS_SCREENSHOT, window=SECTIONS_WINDOW)

    moved = sum(row != top for row, top in zip(rows[:600], top_rows[:600], strict=True))
    assert moved > 400, f"only {moved} of the first 600 rows differ: nothing was hidden"
    white = b"\xff" * len(rows[0])
    assert all(row == white for row in rows[-100:]), (
        f"the page goes on below {SECTIONS_WINDOW[1] - 100} px: make SECTIONS_WINDOW taller"
    )
