"""discard_history end to end on a hand-built store (simulator.discard_cases): the command
line reads TRANS_CHECK_MAX_TIME_TOPIC and the real queues its records name, and merges the
table on (broker, discard_offset): a rerun is idempotent, a later run updates outcomes and
keeps first_seen_run_id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets
from jobs.cli import main
from schemas.messages import DISCARD_TOPIC
from schemas.outputs import FINAL_OUTCOMES
from simulator.discard_cases import commit_of, delete_queue, discard_of, op_naming, resumed_copy
from simulator.writer import StoreWriter
from tests.connectors.reference import messages_table
from tests.jobs.segments import AS_OF as SEGMENTS_AS_OF
from tests.jobs.segments import HALF_ROWS, segment_argv, write_parquet_segments
from tests.robustness.store import T, half, rows_of

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

S = 1_000
HOUR = 3_600_000
BROKER_HOST = "10.0.0.7:10911"


def _append(writer: StoreWriter, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assigned = writer.append(messages_table(rows)).to_pylist()
    return [{**row, **got} for row, got in zip(rows, assigned, strict=True)]


def _at(row: dict[str, Any], store_ms: int) -> dict[str, Any]:
    return {**row, "store_timestamp_ms": store_ms}


def build_store(root: Path) -> dict[str, dict[str, Any]]:
    """Half records of eight transactions, their discards, ends and one resume; returns the
    discard rows by case name (with their assigned offsets)."""
    with StoreWriter(root, commitlog_file_size=1 << 20, cq_file_entries=64) as writer:
        h = {
            name: _at(
                half(i, age_ms=age, **{"TRANSACTION_CHECK_TIMES": "15", **props}), T - 200 * S
            )
            for i, (name, age, props) in enumerate(
                [
                    ("open", 300 * S, {"KEYS": "ORD-7 ORD-8", "TAGS": "TagA"}),
                    ("committed_early", 300 * S, {}),
                    ("committed_late", 300 * S, {}),
                    ("gone_queue", 300 * S, {"REAL_TOPIC": "TopicGone"}),
                    ("rolled_back", 300 * S, {}),
                    ("resumed", 300 * S, {}),
                    ("expired", 73 * HOUR, {"TRANSACTION_CHECK_TIMES": "2"}),
                    # An immunity copy and no check copy: discarded without a check.
                    ("unchecked", 300 * S, {"TRAN_PREPARED_QUEUE_OFFSET": "0"}),
                ]
            )
        }
        h = dict(zip(h, _append(writer, list(h.values())), strict=True))
        gone = discard_of(half(99, age_ms=300 * S), T - 190 * S, counter=16)  # evidence gone
        d = {"gone_evidence": gone}
        d |= {
            name: discard_of(row, T - 100 * S, 16) for name, row in h.items() if name != "expired"
        }
        d["expired"] = discard_of(h["expired"], T - 100 * S, 3)
        # Ends: committed_early before its discard (#8311), the others after it.
        ends = [
            op_naming([h["committed_early"]], T - 150 * S, BROKER_HOST),
            commit_of(h["committed_early"], T - 150 * S),
            op_naming(
                [h["committed_late"], h["gone_queue"], h["rolled_back"]], T - 50 * S, BROKER_HOST
            ),
            commit_of(h["committed_late"], T - 50 * S),
            commit_of(h["gone_queue"], T - 50 * S),
        ]
        order = ["gone_evidence", *[n for n in d if n != "gone_evidence"]]
        d = dict(zip(order, _append(writer, [d[n] for n in order]), strict=True))
        _append(writer, ends[:2])
        _append(writer, ends[2:])
        resumed = _append(writer, [resumed_copy(d["resumed"], T - 40 * S)])[0]
        d["resumed_again"] = _append(writer, [discard_of(resumed, T - 30 * S, 16)])[0]
    delete_queue(root, "TopicGone", 1)
    # The broker has moved past everything but the resumed copy.
    write_consumer_offsets(
        root / "config" / "consumerOffset.json",
        {HALF_KEY: {0: resumed["queue_offset"]}, OP_KEY: {0: 2}},
    )
    return d


def _outcomes(out: Path) -> dict[int, tuple]:
    return {
        row["discard_offset"]: (
            row["reason"],
            row["outcome"],
            row["ended_before_discard"],
            row["resume_futile"],
            row["resume_topic"],
        )
        for row in rows_of(out, "discard_history")
    }


def test_each_outcome_from_a_store_a_later_run_merges_and_a_rerun_is_idempotent(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, out = tmp_path / "broker-a", tmp_path / "out"
    d = build_store(store)
    base = ["--store", f"a={store}", "--output", str(out)]
    at = {name: row["queue_offset"] for name, row in d.items()}
    # At T - 60 s the late commit, the later ops and the resume do not exist yet.
    assert main([*base, "--as-of", str(T - 60 * S), "--run-id", "early"], spark=spark) == 0
    early = {r["discard_offset"]: r for r in rows_of(out, "discard_history")}
    assert early[at["committed_late"]]["outcome"] == "unresolved"
    assert early[at["resumed"]]["outcome"] == "unresolved"
    assert at["resumed_again"] not in early  # stored after T - 60 s

    late_args = [*base, "--as-of", str(T), "--run-id", "late"]
    assert main(late_args, spark=spark) == 0
    got = _outcomes(out)
    resumable = (False, DISCARD_TOPIC)
    assert got == {
        at["gone_evidence"]: ("check_max", "unknown", None, None, None),
        at["open"]: ("check_max", "unresolved", False, *resumable),
        at["committed_early"]: ("check_max", "committed", True, None, None),
        at["committed_late"]: ("check_max", "committed", False, None, None),
        at["gone_queue"]: ("check_max", "ended", False, None, None),
        at["rolled_back"]: ("check_max", "rolled_back", False, None, None),
        at["resumed"]: ("check_max", "pending_again", False, None, None),
        at["expired"]: ("expired", "unresolved", False, True, None),
        at["unchecked"]: ("check_max", "unresolved", False, *resumable),
        # The resumed copy pending now was stored before this discard: it is the copy
        # discarded (the hand-built offsets did not move past it), not a resume.
        at["resumed_again"]: ("check_max", "unresolved", False, *resumable),
    }
    late = {r["discard_offset"]: r for r in rows_of(out, "discard_history")}
    assert len(late) == len(d)  # merged: one row per discard record, not per run
    first_seen = {offset: row["first_seen_run_id"] for offset, row in late.items()}
    assert first_seen == {offset: "early" if offset in early else "late" for offset in late}
    # A row final at T - 60 s (committed before it) is kept as that run wrote it.
    final_early = {o for o, row in early.items() if row["outcome"] in FINAL_OUTCOMES}
    assert final_early == {at["committed_early"]}
    run_ids = {offset: row["run_id"] for offset, row in late.items()}
    assert run_ids == {offset: "early" if offset in final_early else "late" for offset in late}
    open_row = late[at["open"]]
    assert open_row["resume_offset_msg_id"] == open_row["offset_msg_id"] is not None
    # Searchable by what the half record carried (no __transactionId__: null).
    searched = (open_row["keys"], open_row["tags"], open_row["transaction_id"])
    assert searched == (["ORD-7", "ORD-8"], "TagA", None)
    summary = rows_of(out, "run_summary", "late")
    assert {r["discard_history_rows"] for r in summary} == {len(d)}
    # Every other transaction has a check copy (a counter without TRAN_PREPARED_QUEUE_OFFSET)
    # or no half record left: the one finding of a discard without a check.
    unchecked = [
        (r["uniq_key"], r["half_offset"], r["value"])
        for r in rows_of(out, "anomalies", "late")
        if r["kind"] == "immunity_exhausts_checks"
    ]
    assert unchecked == [("KEY0007", 7, 1.0)]  # the eighth half record: half offset 7
    assert sum(r["anomalies_warning"] for r in summary) >= 1

    # A rerun of the same run changes nothing.
    assert main(late_args, spark=spark) == 0
    assert {r["discard_offset"]: r for r in rows_of(out, "discard_history")} == late

    _a_later_run_keeps_the_final_rows(spark, capsys, store, out, tmp_path / "fresh", late)


def _a_later_run_keeps_the_final_rows(
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
    store: Path,
    out: Path,
    fresh: Path,
    late: dict[int, dict[str, Any]],
) -> None:
    """The real queue is deleted after the run ``late`` into ``out``: a later run keeps the
    final rows as they were; a run on a new output root (``fresh``) says ``ended`` of each."""
    base = ["--store", f"a={store}", "--output", str(out)]
    # The real queue is deleted since: its commits cannot be read any more, and a first
    # look would say `ended`. The final rows stay as they were; the others are decided.
    delete_queue(store, "TopicOrder", 1)
    capsys.readouterr()
    assert main([*base, "--as-of", str(T + S), "--run-id", "after"], spark=spark) == 0
    # The run's own picture (its summary, report and counts) holds the kept rows too.
    assert "committed=2  rolled_back=1  ended=1" in capsys.readouterr().out
    after = {r["discard_offset"]: r for r in rows_of(out, "discard_history")}
    final = {o for o, row in late.items() if row["outcome"] in FINAL_OUTCOMES}
    assert {after[o]["outcome"] for o in final} == {"committed", "rolled_back", "ended"}
    assert {o: after[o] for o in final} == {o: late[o] for o in final}
    assert {o: after[o]["run_id"] for o in after if o not in final} == dict.fromkeys(
        set(after) - final, "after"
    )
    fresh_args = ["--store", f"a={store}", "--output", str(fresh), "--as-of", str(T + S)]
    assert main(fresh_args, spark=spark) == 0
    first_look = {r["discard_offset"]: r["outcome"] for r in rows_of(fresh, "discard_history")}
    assert {first_look[o] for o in final} == {"ended"}


def test_exported_discards_end_as_ended_and_bad_ones_are_bad_records(
    spark: SparkSession, tmp_path: Path
) -> None:
    """--discards: an export has no real topic, so a transaction an op ended is `ended`;
    an unparsable counter and a record of queue 1 are bad records of the discard topic."""
    half, op, offsets = write_parquet_segments(tmp_path / "in")
    discards = tmp_path / "in" / "discards.parquet"
    copied = dict(HALF_ROWS[0][2])  # K0, ended by op 1 ("0,")
    rows = [
        (0, 0, {**copied, "TRANSACTION_CHECK_TIMES": "16"}),
        (0, 1, {"UNIQ_KEY": "K9", "TRANSACTION_CHECK_TIMES": "x"}),  # no half: evidence gone
        (1, 0, {"UNIQ_KEY": "K8", "TRANSACTION_CHECK_TIMES": "16"}),  # queue 1: not used
    ]
    pq.write_table(
        pa.table(
            {
                "queue_id": pa.array([r[0] for r in rows], pa.int32()),
                "queue_offset": [r[1] for r in rows],
                "commitlog_offset": [50_000 + i for i in range(len(rows))],
                "born_timestamp_ms": [SEGMENTS_AS_OF - 90_000] * len(rows),
                "store_timestamp_ms": [SEGMENTS_AS_OF - 30_000] * len(rows),
                "store_host": ["10.0.0.2:10911"] * len(rows),
                "properties": pa.array(
                    [list(r[2].items()) for r in rows], pa.map_(pa.string(), pa.string())
                ),
            }
        ),
        discards,
    )
    out = tmp_path / "out"
    argv = [*segment_argv(half, op, out, offsets), "--discards", str(discards)]
    assert main([*argv, "--as-of", str(SEGMENTS_AS_OF), "--run-id", "x"], spark=spark) == 0

    got = {
        (r["discard_offset"], r["reason"], r["outcome"]) for r in rows_of(out, "discard_history")
    }
    assert got == {(0, "check_max", "ended"), (1, "undetermined", "unknown")}
    bad = [r for r in rows_of(out, "bad_records", "x") if r["topic"] == DISCARD_TOPIC]
    reasons = sorted(r["reason"] for r in bad)
    assert len(reasons) == 2
    assert reasons[0].startswith("TRANS_CHECK_MAX_TIME_TOPIC has one queue (0)")
    assert reasons[1].startswith("unparsable TRANSACTION_CHECK_TIMES 'x'")
    (summary,) = rows_of(out, "run_summary", "x")
    assert summary["discard_history_rows"] == 2
    assert any(i.startswith("discards:parquet:b:") for i in summary["inputs"])


# A 5.x real topic longer than the 127 characters a v1 record carries, and a name that
# cannot be a path (a REAL_TOPIC property is any text).
LONG_TOPIC = "Orders_" + "x" * 188 + "_eu-1"
UNSAFE_TOPIC = "../etc"


def test_a_long_real_topic_is_read_and_a_name_unsafe_as_a_path_is_one_note(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A discarded transaction committed into a 200-character topic is `committed` (its
    queue is read through its consume queue); two discarded transactions whose real topic
    is `../etc` (queues 1 and 2), ended by an op, are `ended`, and the summary says so in
    one note line."""
    store, out = tmp_path / "broker-a", tmp_path / "out"
    with StoreWriter(store, commitlog_file_size=1 << 20, cq_file_entries=64) as writer:
        props = [(LONG_TOPIC, "1"), (UNSAFE_TOPIC, "1"), (UNSAFE_TOPIC, "2")]
        h = _append(
            writer,
            [
                _at(
                    half(
                        i,
                        age_ms=300 * S,
                        TRANSACTION_CHECK_TIMES="15",
                        REAL_TOPIC=topic,
                        REAL_QID=qid,
                    ),
                    T - 200 * S,
                )
                for i, (topic, qid) in enumerate(props)
            ],
        )
        d = _append(writer, [discard_of(row, T - 100 * S, 16) for row in h])
        _append(writer, [op_naming(h, T - 50 * S, BROKER_HOST), commit_of(h[0], T - 50 * S)])
    write_consumer_offsets(
        store / "config" / "consumerOffset.json", {HALF_KEY: {0: len(h)}, OP_KEY: {0: 1}}
    )
    argv = ["--store", f"a={store}", "--output", str(out), "--as-of", str(T), "--run-id", "r"]
    assert main(argv, spark=spark) == 0

    got = {row["discard_offset"]: row["outcome"] for row in rows_of(out, "discard_history")}
    assert got == {d[0]["queue_offset"]: "committed", **{r["queue_offset"]: "ended" for r in d[1:]}}
    notes = [line for line in capsys.readouterr().out.splitlines() if "note:" in line]
    assert notes == [
        "  note: a: real topic '../etc' is not read: its name holds a path separator, so it is"
        " never made a path; the ended transactions of its queue(s) 1, 2 show as ended"
    ]
