"""The anomaly kinds found in stores written to disk and read by the job (issue 15): the
kinds tests/transforms/test_anomalies.py checks on hand-built frames only, here through the
store reader, the command line and its configuration.

One store is a 4.9 broker's: the simulator's timeline (``simulator.simulation``, fast
producers only, so that the background itself is no finding) and, written after it with the
same ``StoreWriter``, a tail of hand-built records whose findings are known exactly: an op
record tagged ``x`` at the committed op offset (the 4.9 stall, with every later op record
left for the broker to read again), a transaction immune for an hour, ten fast transactions
and a producer group whose transactions mostly wait for a check. A copy of it has one
consume-queue file of the op topic deleted (a gap). Two runs of the job: the cases (small
thresholds, ``broker_version`` 4.9), then the nearest non-cases (every threshold at the
measured value, ``broker_version`` 5). The discard store of test_discard_history_store
rides along: its ``discard_history`` must not change when the discard topic's consume queue
is gone and the reader scans the commit log instead.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from connectors.rocketmq.layout import CQ_ENTRY_SIZE, offset_file_name
from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets
from jobs.cli import main
from schemas.messages import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC
from simulator.discard_cases import delete_queue
from simulator.simulation import BROKER_STORE_HOST, SimConfig, iterate_records
from simulator.writer import StoreWriter
from tests.connectors.reference import messages_table
from tests.jobs.test_discard_history_store import build_store as build_discard_store
from tests.robustness.store import RUN_TIME_COLUMNS, T, rows_of

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

S = 1_000
CQ_ENTRIES = 4  # consume-queue entries per file: the op queue's tail spans several files
PRODUCER_HOST = "10.0.1.5:51000"
IMMUNITY_S = 3_600
IMMUNE_AGE_MS = 90 * S  # immunity left: 3 600 000 - 90 000 = 3 510 000 ms = 15 x 234 000
FAST = 10  # fast transactions after the stall
# The slow group: born T - 80 s + i s; S0-S2 are checked at T - 70 s and answered at
# T - 65 s, - 60 s, - 55 s (15, 19, 23 s after birth); S3 commits 2 s after birth.
SLOW_ANSWERS_MS = (65 * S, 60 * S, 55 * S)
SLOW_AFTER_CHECK, SLOW_TRANSACTIONS = 3, 4

CASES_CONF = """
[broker]
check_interval_ms = 60000  # the simulator's 4.9 interval
broker_version = "4.9"
[anomalies]
slow_producer_percent = 10
slow_producer_min_transactions = 4
op_backlog_records = 1
"""
# Each threshold at the value measured in CASES_CONF's run: the rules compare with `>`.
NON_CASES_CONF = """
[broker]
check_interval_ms = 234000  # 15 put-backs x 234 000 ms = the immunity left
broker_version = "5"
[anomalies]
slow_producer_percent = 75
slow_producer_min_transactions = 4
op_backlog_records = 14
"""


@dataclass(frozen=True)
class Tail:
    """Offsets of the hand-built tail: ``stall`` (the ``x`` op record, the committed op
    offset p0), ``op_end``, ``half_end`` (h1: nothing is too young at T) and ``immune``
    (the immune half record's offset)."""

    stall: int
    op_end: int
    half_end: int
    immune: int


def _half(key: str, group: str, born_ms: int, store_ms: int, **props: str) -> dict[str, Any]:
    """A half record as a 4.9 client sends it (a copy: the same with a new store time and
    TRANSACTION_CHECK_TIMES)."""
    properties = {
        "UNIQ_KEY": key,
        "CLUSTER": "DefaultCluster",
        "PGROUP": group,
        "TRAN_MSG": "true",
        "WAIT": "true",
        "REAL_TOPIC": "TopicOrder",
        "REAL_QID": "0",
        **props,
    }
    return {
        "topic": HALF_TOPIC,
        "queue_id": 0,
        "born_timestamp_ms": born_ms,
        "store_timestamp_ms": store_ms,
        "born_host": PRODUCER_HOST,
        "store_host": BROKER_STORE_HOST,
        "properties": properties,
        "body": f'{{"txId":"{key}"}}'.encode(),
    }


def _op(half_offset: int, store_ms: int, tag: str = "d") -> dict[str, Any]:
    """A 4.9 op record: the named half offset as its decimal body."""
    return {
        "topic": OP_TOPIC,
        "queue_id": 0,
        "born_timestamp_ms": store_ms,
        "store_timestamp_ms": store_ms,
        "born_host": BROKER_STORE_HOST,
        "store_host": BROKER_STORE_HOST,
        "properties": {"WAIT": "true", "TAGS": tag},
        "body": str(half_offset).encode(),
    }


def _write_tail(put: Callable[[dict[str, Any]], int], half_end: int) -> int:
    """The hand-built records after the timeline, in store-time order; returns the ``x`` op
    record's offset. ``put`` appends one row and returns its queue offset."""
    # Tagged x, its body names the immune record (written next): a tag other than d names
    # nothing, so that record stays pending.
    stall = put(_op(half_end, T - 119 * S, tag="x"))
    born = T - IMMUNE_AGE_MS
    put(_half("IMM0", "PG_IMMUNE", born, born + 1, CHECK_IMMUNITY_TIME_IN_SECONDS=str(IMMUNITY_S)))
    for i in range(FAST):
        born = T - 85 * S + i * 200
        offset = put(_half(f"FAST{i}", "PG_FAST", born, born + 1))
        put(_op(offset, born + 50))
    slow_born = [T - 80 * S + i * S for i in range(SLOW_TRANSACTIONS)]
    originals = [put(_half(f"SLOW{i}", "PG_SLOW", b, b + 1)) for i, b in enumerate(slow_born)]
    put(_op(originals[3], slow_born[3] + 2 * S))  # S3 commits by itself, before any check
    copies = [
        put(_half(f"SLOW{i}", "PG_SLOW", slow_born[i], T - 70 * S + i, TRANSACTION_CHECK_TIMES="1"))
        for i in range(SLOW_AFTER_CHECK)
    ]
    for copy, answer_ms in zip(copies, SLOW_ANSWERS_MS, strict=True):
        put(_op(copy, T - answer_ms))  # the check's answer names the copy
    return stall


def build_stalled_store(root: Path) -> Tail:
    """The simulator's 4.9 timeline (600 fast transactions over 10 minutes, ending 120 s
    before T) and the tail; ``consumerOffset.json`` holds the simulated half offset and, as
    a 4.9 broker stuck at the ``x`` record commits it, the op offset of that record."""
    config = SimConfig(
        transactions=600,
        seed=15,
        op_style="4.9",
        duration_s=600,
        end_ms=T - 120 * S,
        late_fraction=0.0,
        never_fraction=0.0,
        lost_end_fraction=0.0,
        immunity_fraction=0.0,
        cq_file_entries=CQ_ENTRIES,
        commitlog_file_size=256 << 10,
    )
    sim, windows = iterate_records(config)
    with StoreWriter(
        root,
        commitlog_file_size=config.commitlog_file_size,
        cq_file_entries=CQ_ENTRIES,
        properties_trailing_separator=False,  # 4.9 brokers write none
    ) as writer:
        for window in windows:
            writer.append(window.table)
        half_end = writer.next_queue_offsets[(HALF_TOPIC, 0)]

        def put(row: dict[str, Any]) -> int:
            return writer.append(messages_table([row])).column("queue_offset")[0].as_py()

        stall = _write_tail(put, half_end)
        ends = writer.next_queue_offsets
    sim.finish()
    offsets = {HALF_KEY: sim.committed_offsets[HALF_KEY], OP_KEY: {0: stall}}
    write_consumer_offsets(root / "config" / "consumerOffset.json", offsets)
    return Tail(stall, ends[(OP_TOPIC, 0)], ends[(HALF_TOPIC, 0)], half_end)


def delete_gap_file(root: Path, tail: Tail) -> int:
    """Delete the op topic's first consume-queue file that starts after p0 (named by its
    first entry's byte position) and return its first offset. The file holds only fast
    transactions' op records (op offsets p0 + 1 to p0 + 10)."""
    start = (tail.stall // CQ_ENTRIES + 1) * CQ_ENTRIES
    assert tail.stall < start and start + CQ_ENTRIES <= tail.stall + FAST
    (root / "consumequeue" / OP_TOPIC / "0" / offset_file_name(start * CQ_ENTRY_SIZE)).unlink()
    return start


@dataclass(frozen=True)
class Runs:
    tail: Tail
    gap: int  # the first missing op offset of the gap store
    discard_records: int  # in the discard store
    cases: Path  # output root of the run with CASES_CONF
    non_cases: Path  # output root of the run with NON_CASES_CONF
    printed: tuple[str, str]  # what each run printed


def _run(spark: SparkSession, stores: list[str], out: Path, conf: str, run_id: str) -> str:
    (out.parent / f"{run_id}.toml").write_text(conf)
    argv = [f"--store={store}" for store in stores]
    argv += ["--output", str(out), "--as-of", str(T), "--run-id", run_id]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([*argv, "--conf", str(out.parent / f"{run_id}.toml")], spark=spark)
    assert code == 0, printed.getvalue()
    return printed.getvalue()


@pytest.fixture(scope="module")
def runs(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Run 1 (cases): the stalled store, its copy with a gap, the discard store. Run 2
    (non-cases): the stalled store, and the discard store without the discard topic's
    consume queue."""
    tmp = tmp_path_factory.mktemp("anomalies_store")
    stalled, gapped, discards = tmp / "stalled", tmp / "gapped", tmp / "discards"
    tail = build_stalled_store(stalled)
    shutil.copytree(stalled, gapped)
    gap = delete_gap_file(gapped, tail)
    discard_records = len(build_discard_store(discards))

    cases, non_cases = tmp / "cases", tmp / "non_cases"
    stores = [f"stalled={stalled}", f"gapped={gapped}", f"discards={discards}"]
    printed_cases = _run(spark, stores, cases, CASES_CONF, "cases")
    delete_queue(discards, DISCARD_TOPIC, 0)
    stores = [f"stalled={stalled}", f"discards={discards}"]
    printed_non_cases = _run(spark, stores, non_cases, NON_CASES_CONF, "non_cases")
    return Runs(tail, gap, discard_records, cases, non_cases, (printed_cases, printed_non_cases))


def found(out: Path, broker: str, kind: str) -> list[tuple]:
    """The broker's anomalies of ``kind`` as (severity, queue_id, uniq_key, producer_group,
    half_offset, op_offset, value, threshold, detail), sorted."""
    return sorted(
        (
            (
                r["severity"],
                r["queue_id"],
                r["uniq_key"],
                r["producer_group"],
                r["half_offset"],
                r["op_offset"],
                r["value"],
                r["threshold"],
                r["detail"],
            )
            for r in rows_of(out, "anomalies")
            if r["broker"] == broker and r["kind"] == kind
        ),
        key=repr,
    )


def op_offsets(out: Path, broker: str) -> tuple[int, int, int]:
    """(p0, p1, p_safe) of the broker's queue 0 in run_summary."""
    (row,) = [r for r in rows_of(out, "run_summary") if r["broker"] == broker]
    return row["p0"], row["p1"], row["p_safe"]


def test_op_stall_4_9_at_the_committed_op_offset(runs: Runs) -> None:
    """The x record is at p0: p1 stays there on a 4.9 broker; p_safe passes it (p0 + 1,
    the first op record naming a record after the pending immune one). With the gap, p1
    still stops at the x record first. A 5.x broker marks it done: no finding."""
    p0 = runs.tail.stall
    detail = (
        f"op record at op offset {p0} has tag x, not d: a 4.9 broker never marks it done, so"
        f" its op offset stays at {p0} for good; installing p_safe {p0 + 1} passes it"
    )
    expected = [("critical", 0, None, None, None, p0, float(p0), None, detail)]
    assert found(runs.cases, "stalled", "op_stall_4_9") == expected
    assert found(runs.cases, "gapped", "op_stall_4_9") == expected
    assert found(runs.non_cases, "stalled", "op_stall_4_9") == []
    # The offsets say the same: p1 stays at the x record on 4.9 and reaches the end on 5.
    assert op_offsets(runs.cases, "stalled") == (p0, p0, p0 + 1)
    assert op_offsets(runs.cases, "gapped") == (p0, p0, p0 + 1)
    assert op_offsets(runs.non_cases, "stalled") == (p0, runs.tail.op_end, p0 + 1)


def test_op_backlog_critical_warning_and_none(runs: Runs) -> None:
    """From p0 the op queue holds 14 d records, all naming records below h1 (the x record
    names nothing): over 10 x 1, critical. The gap takes 4 of them: 10, not over 10 x 1,
    a warning. With the threshold at 14: none."""
    tail, p0 = runs.tail, runs.tail.stall
    assert tail.op_end - p0 == 1 + FAST + SLOW_TRANSACTIONS  # the x record and 14 d records

    def row(severity: str, backlog: int) -> tuple:
        detail = (
            f"{backlog} op records between op offset {p0} and the op queue's end"
            f" {tail.op_end} name only half offsets below h1 {tail.half_end}: the broker reads"
            " them again every round, 1 pulls of 32 (threshold 1)"
        )
        return (severity, 0, None, None, None, p0, float(backlog), 1.0, detail)

    assert found(runs.cases, "stalled", "op_backlog") == [row("critical", 14)]
    assert found(runs.cases, "gapped", "op_backlog") == [row("warning", 14 - CQ_ENTRIES)]
    assert found(runs.non_cases, "stalled", "op_backlog") == []


def test_op_queue_gap_of_a_deleted_consume_queue_file(runs: Runs) -> None:
    """The deleted file held op offsets gap .. gap + 3, inside [p0, end): one row. The same
    store with the file (and every simulated file below p0) has none."""
    gap = runs.gap
    detail = (
        f"op offsets {gap} to {gap + CQ_ENTRIES - 1} ({CQ_ENTRIES}) are missing inside"
        " [p0, end): what they named is unknown, so half records they resolved look pending"
        " (deleted consume-queue files, #2133)"
    )
    expected = [("critical", 0, None, None, None, gap, float(CQ_ENTRIES), 0.0, detail)]
    assert found(runs.cases, "gapped", "op_queue_gap") == expected
    assert found(runs.cases, "stalled", "op_queue_gap") == []
    assert found(runs.non_cases, "stalled", "op_queue_gap") == []


def test_slow_producer_of_a_group_answering_checks(runs: Runs) -> None:
    """PG_SLOW: 3 of its 4 transactions were answered only after their check copy, 75 % >
    10 %. The simulated groups (about 70 transactions in the window) and PG_FAST answered
    within 5 s, before any check: 0 %. With the threshold at 75 %: none."""
    detail = (
        "producer group PG_SLOW: 3 of 4 transactions (75.0 %) were resolved only after a check"
        " copy existed (threshold 10 %); op store time - born time p50 15000 ms, p99 23000 ms"
        " (5.x op times include up to transactionOpBatchInterval, 3000 ms by default)"
    )
    expected = [("warning", 0, None, "PG_SLOW", None, None, 75.0, 10.0, detail)]
    assert found(runs.cases, "stalled", "slow_producer") == expected
    # The gap deleted fast transactions' op records only: PG_SLOW is measured alike.
    assert found(runs.cases, "gapped", "slow_producer") == expected
    assert found(runs.non_cases, "stalled", "slow_producer") == []


def test_immunity_forecast_of_an_hour_long_immunity(runs: Runs) -> None:
    """IMM0, immune for 3600 s and 90 s old: 3 510 000 ms left > 15 put-backs x 60 000 ms.
    With a 234 000 ms interval the put-backs last exactly as long: none. The x record's body
    names IMM0's offset, and names nothing: IMM0 is pending in both runs."""
    immune = runs.tail.immune
    detail = (
        f"half offset {immune} stays immune 3510000 ms more, but 15 put-back(s) every 60000 ms"
        " bring its counter (0) to check_max 15 first: it is discarded without a check"
    )
    expected = [("warning", 0, "IMM0", "PG_IMMUNE", immune, None, 3_510_000.0, 900_000.0, detail)]
    assert found(runs.cases, "stalled", "immunity_exhausts_checks") == expected
    assert found(runs.non_cases, "stalled", "immunity_exhausts_checks") == []
    pending = {
        (r["run_id"], r["half_offset"], r["status"])
        for out in (runs.cases, runs.non_cases)
        for r in rows_of(out, "pending")
        if r["broker"] == "stalled" and r["uniq_key"] == "IMM0"
    }
    assert pending == {("cases", immune, "immune"), ("non_cases", immune, "immune")}


def _history(out: Path) -> list[dict]:
    ignored = {"run_id", "first_seen_run_id", *RUN_TIME_COLUMNS}
    rows = [r for r in rows_of(out, "discard_history") if r["broker"] == "discards"]
    return sorted(
        ({k: v for k, v in r.items() if k not in ignored} for r in rows),
        key=lambda r: r["discard_offset"],
    )


def test_discard_history_alike_when_the_discard_consume_queue_is_gone(runs: Runs) -> None:
    """The second run read TRANS_CHECK_MAX_TIME_TOPIC by scanning the commit log (its note
    says so) and wrote the same rows as the first, which read the consume queue. The runs'
    settings differ only in what discard_history does not read (the anomaly thresholds,
    check_interval_ms, broker_version: it reads check_max, the retention and T)."""
    scanned = f"note: discards: no consume queue for {DISCARD_TOPIC}: queues rebuilt"
    assert [scanned in printed for printed in runs.printed] == [False, True]
    first = _history(runs.cases)
    assert len(first) == runs.discard_records
    assert _history(runs.non_cases) == first
