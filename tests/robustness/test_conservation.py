"""Conservation on simulated stores: every half record at offsets >= h0 appears exactly once
among the resolved ones and `pending` (with its class), and `run_summary` counts add up,
for two brokers in one run. The expected resolution is computed here from the decoded
records (no Spark), independently of the job's transforms.

Size: RMQ_CONSERVATION_TRANSACTIONS (default 100 000 transactions for the first broker, a
quarter of that for the second). On the shared 2-core machine the whole module took 100 s
at load average 4-5 and about 5 minutes at load 15 (measured); a smaller value (e.g. 20000,
about 60 s) keeps the same checks for quick local runs.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from connectors.rocketmq.reader import COMBINED_ARROW, StoreSpec, read_batches
from jobs.reconcile import main
from schemas.messages import DISCARD_TOPIC
from simulator.simulation import SimConfig, write_store
from tests.robustness.store import HALF, OP, TABLES, rows_of

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

TRANSACTIONS = int(os.environ.get("RMQ_CONSERVATION_TRANSACTIONS", "100000"))
BROKERS = {
    "broker-a": SimConfig(transactions=TRANSACTIONS, seed=11, commitlog_file_size=16 << 20),
    "broker-b": SimConfig(
        transactions=max(TRANSACTIONS // 4, 100),
        seed=12,
        op_style="4.9",
        commitlog_file_size=8 << 20,
        producer_groups=2,
    ),
}
JAVA_LONG = re.compile(r"\A[+-]?[0-9]+\Z")
DECIDED = ("check", "immune", "discard_check_max", "discard_expired")
STOPPED = ("too_young", "not_reached")


def java_long(text: str | None) -> int | None:
    if text is None or not JAVA_LONG.match(text):
        return None
    value = int(text)
    return value if -(1 << 63) <= value < (1 << 63) else None


def expected_resolution(root: Path, broker: str, as_of: int) -> dict[int, dict[int, bool]]:
    """queue id -> {half offset: resolved} for the half records stored before ``as_of``
    (spec sections 3 and 4), from the reader's records without Spark."""
    table = pa.Table.from_batches(
        list(read_batches([StoreSpec(broker, root)])), schema=COMBINED_ARROW
    )
    rows = table.select(
        [
            "topic",
            "queue_id",
            "queue_offset",
            "store_timestamp_ms",
            "tags",
            "properties",
            "body",
            "reason",
        ]
    ).to_pylist()
    assert [r for r in rows if r["reason"] is not None] == [], "a simulated store has no bad record"
    rows = [r for r in rows if r["store_timestamp_ms"] < as_of]
    named: dict[int, set[int]] = {}
    for r in rows:
        if r["topic"] == OP and r["tags"] == "d" and r["body"] is not None:
            items = [
                java_long(item) for item in r["body"].decode("utf-8", "replace").split(",") if item
            ]
            named.setdefault(r["queue_id"], set()).update(i for i in items if i is not None)
    result: dict[int, dict[int, bool]] = {}
    halves = [r for r in rows if r["topic"] == HALF]
    assert len({(r["queue_id"], r["queue_offset"]) for r in halves}) == len(halves), (
        "no duplicate offsets"
    )
    for queue_id in sorted({r["queue_id"] for r in halves}):
        queue = [r for r in halves if r["queue_id"] == queue_id]
        names = named.get(queue_id, set())
        props = [dict(r["properties"] or []) for r in queue]
        direct = [
            r["queue_offset"] in names or java_long(p.get("TRAN_PREPARED_QUEUE_OFFSET")) in names
            for r, p in zip(queue, props, strict=True)
        ]
        keys = {
            p["UNIQ_KEY"] for p, d in zip(props, direct, strict=True) if d and p.get("UNIQ_KEY")
        }
        result[queue_id] = {
            r["queue_offset"]: d or (p.get("UNIQ_KEY") is not None and p["UNIQ_KEY"] in keys)
            for r, p, d in zip(queue, props, direct, strict=True)
        }
    return result


@pytest.fixture(scope="module")
def outcome(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("conservation")
    for broker, config in BROKERS.items():
        write_store(config, base / broker)
    # broker-a without its offsets file: the round starts at the smallest available offset,
    # so every half record of the store is in it; broker-b keeps the simulated offsets.
    (base / "broker-a" / "config" / "consumerOffset.json").unlink()
    output = base / "out"
    args = [arg for broker in BROKERS for arg in ("--store", f"{broker}={base / broker}")]
    code = main(
        [*args, "--output", str(output), "--as-of", "latest", "--run-id", "cons"], spark=spark
    )
    tables = {table: rows_of(output, table, "cons") for table in TABLES}
    tables["discard_history"] = rows_of(output, "discard_history", "cons")
    return code, base, tables


def _really_pending_actions(tables, broker, queue_id, from_h0, resolved) -> dict[str, list]:
    """Per table (check_requests, discards), the half offsets of the broker's actions on
    really pending stored records; every other row must be a settled transaction's (the op
    that settled it named) or a copy of this round."""
    of_queue = {}
    for table in ("check_requests", "discards"):
        rows = [r for r in tables[table] if r["broker"] == broker and r["queue_id"] == queue_id]
        for r in rows:
            assert r["really_pending"] == (r["settled_by_op_offset"] is None), r
            if not r["own_copy"]:
                assert r["half_offset"] in from_h0, r
                assert r["really_pending"] == (r["half_offset"] not in resolved), r
        of_queue[table] = sorted(
            r["half_offset"] for r in rows if r["really_pending"] and not r["own_copy"]
        )
    return of_queue


@pytest.mark.slow
@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_every_half_record_from_h0_is_resolved_or_pending_exactly_once(outcome, broker):
    code, base, tables = outcome
    assert code == 0
    (as_of,) = {r["as_of_ms"] for r in tables["run_summary"]}
    expected = expected_resolution(base / broker, broker, as_of)
    summaries = {r["queue_id"]: r for r in tables["run_summary"] if r["broker"] == broker}
    assert set(summaries) == set(expected)
    assert [r for r in tables["bad_records"] if r["broker"] == broker] == []
    for queue_id, resolution in expected.items():
        s = summaries[queue_id]
        h0, h1 = s["h0"], s["h1"]
        pending = [
            r for r in tables["pending"] if r["broker"] == broker and r["queue_id"] == queue_id
        ]
        offsets = [r["half_offset"] for r in pending]
        assert len(offsets) == len(set(offsets)), "a half record is pending twice"
        from_h0 = {o: res for o, res in resolution.items() if o >= h0}
        if broker == "broker-a":
            assert h0 == min(resolution) and len(from_h0) == len(resolution) >= TRANSACTIONS
        resolved = {o for o, res in from_h0.items() if res}
        # exactly once: resolved and pending are disjoint and together hold every record >= h0
        assert set(offsets) == set(from_h0) - resolved
        assert not resolved & set(offsets)
        status = {r["half_offset"]: r["status"] for r in pending}
        assert all(status[o] in DECIDED for o in offsets if o < h1)
        assert all(status[o] in STOPPED for o in offsets if o >= h1)
        assert [o for o in offsets if status[o] == "too_young"] == ([h1] if h1 in status else [])
        # run_summary adds up
        counts = Counter(status.values())
        for name in (*DECIDED, *STOPPED):
            assert s[name] == counts.get(name, 0), name
        in_round = [o for o in from_h0 if o < h1]
        assert s["resolved"] == len(resolved & set(in_round))
        assert s["resolved"] + sum(s[name] for name in DECIDED) == len(in_round)
        assert s["too_young"] + s["not_reached"] == len(
            [o for o in from_h0 if o >= h1 and not from_h0[o]]
        )
        assert (
            s["resolved"] + sum(s[name] for name in (*DECIDED, *STOPPED))
            == len(in_round) + s["too_young"] + s["not_reached"]
        )
        assert s["bad_records"] == 0
        # check_requests and discards are the broker's round: its actions on really pending
        # stored records are the pending rows of those classes.
        of_queue = _really_pending_actions(tables, broker, queue_id, from_h0, resolved)
        assert of_queue["check_requests"] == sorted(o for o in offsets if status[o] == "check")
        assert of_queue["discards"] == sorted(
            o for o in offsets if status[o].startswith("discard_")
        )
        offsets_rows = {
            r["topic"]: r
            for r in tables["consume_offsets"]
            if r["broker"] == broker and r["queue_id"] == queue_id
        }
        # broker-a has no offsets file: held, so no offset_after is proposed (spec 5).
        held = broker == "broker-a"
        assert (s["offset_hold"] is not None) == held
        after = (None, None) if held else (h1, s["p1"])
        assert (offsets_rows[HALF]["offset_before"], offsets_rows[HALF]["offset_after"]) == (
            h0,
            after[0],
        )
        assert (offsets_rows[OP]["offset_before"], offsets_rows[OP]["offset_after"]) == (
            s["p0"],
            after[1],
        )


def discard_offsets(root: Path, broker: str, as_of: int) -> list[int]:
    """Queue offsets of the TRANS_CHECK_MAX_TIME_TOPIC records stored before ``as_of``,
    decoded without Spark."""
    batches = read_batches([StoreSpec(broker, root)], topics=(DISCARD_TOPIC,))
    table = pa.Table.from_batches(list(batches), schema=COMBINED_ARROW)
    rows = table.select(["queue_offset", "store_timestamp_ms", "reason"]).to_pylist()
    assert [r for r in rows if r["reason"] is not None] == []
    return [r["queue_offset"] for r in rows if r["store_timestamp_ms"] < as_of]


@pytest.mark.slow
@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_every_discard_record_is_exactly_one_discard_history_row(outcome, broker):
    code, base, tables = outcome
    assert code == 0
    (as_of,) = {r["as_of_ms"] for r in tables["run_summary"]}
    expected = discard_offsets(base / broker, broker, as_of)
    assert expected, "the simulated store has discard records"
    rows = [r for r in tables["discard_history"] if r["broker"] == broker]
    assert sorted(r["discard_offset"] for r in rows) == sorted(expected)  # once each
    assert {r["discard_history_rows"] for r in tables["run_summary"] if r["broker"] == broker} == {
        len(expected)
    }
    # The simulator never resumes nor loses evidence: every row has a reason and an outcome
    # of the spec's sets, and resume arguments exactly on resumable unresolved rows.
    for r in rows:
        assert r["reason"] in ("check_max", "expired", "undetermined")
        assert r["outcome"] in (
            "committed",
            "rolled_back",
            "ended",
            "unresolved",
            "unknown",
            "pending_again",
        )
        resumable = r["outcome"] == "unresolved" and r["resume_futile"] is False
        assert (r["resume_offset_msg_id"] == r["offset_msg_id"]) == resumable
