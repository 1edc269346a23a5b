"""Bad input (spec section 7): a corpus of damaged stores generated here, each with its
documented outcome (docs/bad-input.md). The completing cases run as brokers of one job run
(several --store arguments), and are then checked broker by broker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jobs.reconcile import main
from tests.robustness.corpus import (
    BAD_OFFSETS_FILES,
    COMPLETING,
    LONG_REAL_TOPIC,
    OP_BODIES,
    OUT_OF_RANGE_OFFSETS_FILES,
    UNSAFE_REAL_TOPIC,
)
from tests.robustness.store import (
    HALF,
    HALF_CQ0,
    LOG0,
    OP,
    OP_CQ0,
    TABLES,
    T,
    base_rows,
    halves,
    rows_of,
    write,
)

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

RUN = "corpus"
HELD_MISSING = "no committed offset in the offsets file"
HELD_BAD = "bad records at or after the committed offset"
CHECKED = "check"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    rows = {name: build(base / name) for name, build in COMPLETING.items()}
    return base, rows


def _store_args(base: Path) -> list[str]:
    return [arg for name in COMPLETING for arg in ("--store", f"{name}={base / name}")]


@pytest.fixture(scope="module")
def outcome(spark, corpus):
    base, rows = corpus
    output = base / "out"
    code = main(
        [*_store_args(base), "--output", str(output), "--as-of", str(T), "--run-id", RUN],
        spark=spark,
    )
    tables = {table: rows_of(output, table, RUN) for table in TABLES}
    return code, tables, rows


def _of(tables, table: str, broker: str) -> list[dict]:
    return [r for r in tables[table] if r["broker"] == broker]


def _bad(tables, broker: str) -> list[tuple]:
    return sorted(
        (r["source"], r["position"], r["topic"], r["queue_offset"], r["reason"])
        for r in _of(tables, "bad_records", broker)
    )


def _pending(tables, broker: str) -> list[tuple]:
    return sorted((r["half_offset"], r["status"]) for r in _of(tables, "pending", broker))


def _summary(tables, broker: str, queue_id: int | None = 0) -> dict:
    (row,) = [r for r in _of(tables, "run_summary", broker) if r["queue_id"] == queue_id]
    return row


def _offsets(tables, broker: str) -> dict[str, tuple]:
    return {
        r["topic"]: (r["offset_committed"], r["offset_before"], r["offset_after"], r["offset_safe"])
        for r in _of(tables, "consume_offsets", broker)
    }


def _positions(rows: list[dict], *offsets: int) -> list[int]:
    return [halves(rows)[i]["commitlog_offset"] for i in offsets]


def test_the_run_completes_and_every_table_is_written(outcome):
    code, tables, _ = outcome
    assert code == 0
    assert {r["as_of_ms"] for table in TABLES for r in tables[table]} == {T}


# (broker, index of the damaged half record, reason fragment, at the consume-queue entry?)
RECORD_DAMAGE = [
    ("truncated", 3, "record size 200 out of bounds (100 bytes left in the file", False),
    ("garbage", 2, "inconsistent record lengths: total size 200", False),
    (
        "magic",
        1,
        "consume-queue entry points at no record in commitlog/00000000000000000000 at position {pos}: bad magic code 0x12345678",
        True,
    ),
    ("oversize", 2, "record size 1000000 out of bounds", False),
    (
        "cq-past-end",
        2,
        "commit-log offset 1000000000 is past the end of the commit log (4096)",
        True,
    ),
]


@pytest.mark.parametrize(
    ("broker", "index", "reason", "at_entry"), RECORD_DAMAGE, ids=[c[0] for c in RECORD_DAMAGE]
)
def test_damaged_record_is_one_bad_record_and_the_round_skips_it(
    outcome, broker, index, reason, at_entry
):
    _, tables, rows = outcome
    pos = halves(rows[broker])[index]["commitlog_offset"]
    (bad,) = _of(tables, "bad_records", broker)
    source, position = (HALF_CQ0, index * 20) if at_entry else (LOG0, pos)
    assert (bad["source"], bad["position"], bad["topic"], bad["queue_id"], bad["queue_offset"]) == (
        source,
        position,
        HALF,
        0,
        index,
    )
    assert bad["reason"].startswith(reason.format(pos=pos)), bad["reason"]
    assert 0 < len(bad["raw_hex"]) <= 128
    # half 0 is resolved by op 0; the other readable halves are checked; the damaged one has no class
    expected = [(i, CHECKED) for i in range(1, 4) if i != index]
    assert _pending(tables, broker) == expected
    summary = _summary(tables, broker)
    assert (summary["resolved"], summary["check"], summary["bad_records"]) == (1, len(expected), 1)
    h1 = 3 if index == 3 else 4  # the end of the queue is 1 + the largest readable offset
    # No committed offsets, and a bad record from the start on: the queue is held.
    assert (summary["h0"], summary["h1"], summary["h_safe"]) == (0, h1, None)
    assert HELD_BAD in summary["offset_hold"] and HELD_MISSING in summary["offset_hold"]
    assert (summary["p0"], summary["p1"]) == (0, 1)


def test_truncated_record_met_by_a_commit_log_walk(outcome):
    _, tables, rows = outcome
    pos = halves(rows["truncated-walk"])[3]["commitlog_offset"]
    assert _bad(tables, "truncated-walk") == [
        (
            LOG0,
            pos,
            None,
            None,
            "record size 200 out of bounds (100 bytes left in the file); rest of the file skipped",
        )
    ]
    unknown = [r for r in _of(tables, "run_summary", "truncated-walk") if r["queue_id"] is None]
    assert sum(r["bad_records"] for r in unknown) == 1  # counted in the row of the unknown queue
    assert _pending(tables, "truncated-walk") == [(1, CHECKED), (2, CHECKED)]
    assert (
        _summary(tables, "truncated-walk")["h1"],
        _summary(tables, "truncated-walk")["bad_records"],
    ) == (3, 0)


def test_entries_into_an_expired_commit_log_file(outcome):
    _, tables, rows = outcome
    rows = rows["cq-expired"]
    expired = [r for r in rows if r["commitlog_offset"] < 1000]
    assert [r["queue_offset"] for r in halves(expired)] == [0, 1, 2, 3]
    assert _bad(tables, "cq-expired") == sorted(
        [
            (
                HALF_CQ0,
                r["queue_offset"] * 20,
                HALF,
                r["queue_offset"],
                f"commit-log offset {r['commitlog_offset']} is below the first commit-log file (1000): expired",
            )
            for r in halves(expired)
        ]
        + [
            (
                OP_CQ0,
                0,
                OP,
                0,
                "commit-log offset 0 is below the first commit-log file (1000): expired",
            )
        ]
    )
    # committed 0 is below the smallest available half offset 4: corrected with a warning;
    # the op queue has no readable record and keeps its committed offset.
    summary = _summary(tables, "cq-expired")
    assert (summary["h0"], summary["h1"], summary["p0"], summary["p1"], summary["bad_records"]) == (
        4,
        6,
        0,
        0,
        5,
    )
    assert summary["warnings"] == [
        "RMQ_SYS_TRANS_HALF_TOPIC queue 0: committed offset 0 is below the smallest available offset 4; starting at 4"
    ]
    assert _pending(tables, "cq-expired") == [
        (4, CHECKED),
        (5, CHECKED),
    ]  # op 0 expired: nothing resolves them


@pytest.mark.parametrize(
    ("broker", "note"),
    [
        (
            "no-half-cq",
            (
                0,
                "consume queue consumequeue/RMQ_SYS_TRANS_HALF_TOPIC/0 missing: queue rebuilt from the commit log",
            ),
        ),
        (
            "no-cq",
            (
                None,
                "no consume queue for RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC: queues rebuilt by scanning the commit log",
            ),
        ),
    ],
)
def test_missing_consume_queue_is_rebuilt_with_a_warning(outcome, broker, note):
    _, tables, _ = outcome
    assert _bad(tables, broker) == []
    assert _pending(tables, broker) == [(1, CHECKED), (2, CHECKED), (3, CHECKED)]
    queue_id, warning = note
    # These stores have no consumerOffset.json: queue 0 also says where each topic started.
    no_file = [
        "queue 0: config/consumerOffset.json is missing and config/consumerOffset.json.bak"
        " is missing: every queue starts at its smallest available offset",
        *(
            f"{topic} queue 0: no committed offset (key {topic}@CID_RMQ_SYS_TRANS) in no offsets"
            " file (config/consumerOffset.json missing, consumerOffset.json.bak missing);"
            " starting at the queue's smallest available offset 0"
            for topic in (HALF, OP)
        ),
    ]
    if queue_id is None:
        assert _summary(tables, broker, None)["warnings"] == [warning]
        assert _summary(tables, broker, 0)["warnings"] == no_file
    else:
        assert _summary(tables, broker, queue_id)["warnings"] == [warning, *no_file]
    # Without committed offsets the queue is held: no offset is proposed.
    assert _offsets(tables, broker) == {HALF: (None, 0, None, None), OP: (None, 0, None, None)}
    assert _summary(tables, broker, 0)["offset_hold"].startswith(HELD_MISSING)


def test_empty_store_adds_no_row_anywhere(outcome):
    _, tables, _ = outcome
    assert all(_of(tables, table, "empty") == [] for table in TABLES)


def test_offsets_beyond_the_queue_end_are_corrected_with_warnings(outcome):
    _, tables, _ = outcome
    summary = _summary(tables, "offset-beyond")
    assert summary["warnings"] == [
        "RMQ_SYS_TRANS_HALF_TOPIC queue 0: committed offset 100 is beyond the queue's end 4 at the as-of time; starting at 4",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0: committed offset 50 is beyond the queue's end 1 at the as-of time; starting at 1",
    ]
    # The round ends below the committed offsets: held, nothing proposed.
    assert _offsets(tables, "offset-beyond") == {
        HALF: (100, 4, None, None),
        OP: (50, 1, None, None),
    }
    assert summary["offset_hold"].startswith(
        "the round ends below the committed offsets (half 100 -> 4, safe 4; op 50 -> 1, safe 1)"
    )
    assert _pending(tables, "offset-beyond") == [] and _bad(tables, "offset-beyond") == []


def test_op_bodies_empty_non_numeric_negative_huge(outcome):
    _, tables, rows = outcome
    ops = {r["queue_offset"]: r for r in rows["op-bodies"] if r["topic"] == OP}
    assert [ops[i]["body"] for i in range(len(OP_BODIES))] == OP_BODIES
    # "", "-1" and "9223372036854775807" parse (or name nothing): no bad record;
    # "abc", a number beyond 64 bits and the "x" of "1,x," are one bad record each, at the op record.
    assert _bad(tables, "op-bodies") == [
        (LOG0, ops[1]["commitlog_offset"], OP, 1, "unparsable op body item 'abc'"),
        (LOG0, ops[3]["commitlog_offset"], OP, 3, "unparsable op body item '99999999999999999999'"),
        (LOG0, ops[5]["commitlog_offset"], OP, 5, "unparsable op body item 'x'"),
    ]
    # "1,x," still names 1 and "0," names 0; op 4 names 2^63-1 >= h1: not done, so p1 = 4.
    assert _pending(tables, "op-bodies") == [(2, CHECKED), (3, CHECKED)]
    summary = _summary(tables, "op-bodies")
    assert (
        summary["resolved"],
        summary["h1"],
        summary["p0"],
        summary["p1"],
        summary["p_safe"],
    ) == (2, 4, 0, 4, None)
    assert HELD_BAD in summary["offset_hold"]  # unparsable items from op 0 on


def test_duplicate_queue_offset_keeps_the_first_record(outcome):
    _, tables, rows = outcome
    first, second = [
        r["commitlog_offset"] for r in halves(rows["duplicates"]) if r["queue_offset"] == 1
    ]
    assert _bad(tables, "duplicates") == [
        (
            LOG0,
            second,
            HALF,
            1,
            f"duplicate queue offset: the record at commit-log offset {first} is used instead",
        )
    ]
    pending = {r["half_offset"]: r for r in _of(tables, "pending", "duplicates")}
    assert sorted(pending) == [1, 2]
    assert (pending[1]["commitlog_offset"], pending[1]["uniq_key"]) == (first, "KEY0001")


def test_half_records_without_uniq_key_or_pgroup_are_not_bad(outcome):
    _, tables, _ = outcome
    assert _bad(tables, "no-keys") == []
    keys = sorted(
        (r["half_offset"], r["uniq_key"], r["producer_group"], r["status"])
        for r in _of(tables, "pending", "no-keys")
    )
    assert keys == [
        (1, None, "group-a", CHECKED),
        (2, "KEY0002", None, CHECKED),
        (3, None, None, CHECKED),
    ]


def test_unparsable_counter_is_a_bad_record_and_unparsable_immunity_a_finding(corpus, outcome):
    base, _ = corpus
    _, tables, rows = outcome
    at = {r["queue_offset"]: r["commitlog_offset"] for r in halves(rows["bad-props"])}
    assert _bad(tables, "bad-props") == sorted(
        [
            (LOG0, at[1], HALF, 1, "unparsable TRANSACTION_CHECK_TIMES 'abc'"),
            (LOG0, at[4], HALF, 4, "unparsable TRANSACTION_CHECK_TIMES '99999999999'"),
        ]
    )
    pending = {
        r["half_offset"]: (r["status"], r["check_times"], r["immunity_ms"])
        for r in _of(tables, "pending", "bad-props")
    }
    # an unparsable counter counts as absent (counter 1 after the check); an unparsable immunity
    # means transaction_timeout_ms, and a record 2 s old with one is immune, not too young.
    assert pending == {
        1: (CHECKED, 1, 6000),
        2: (CHECKED, 1, 6000),
        3: ("immune", 1, 6000),
        4: (CHECKED, 1, 6000),
    }
    assert _summary(tables, "bad-props")["bad_records"] == 2
    # The broker reads such an immunity as the timeout too: a finding, not a bad record.
    findings = sorted(
        (r["half_offset"], r["severity"])
        for r in rows_of(base / "out", "anomalies", RUN)
        if r["broker"] == "bad-props" and r["kind"] == "unparsable_immunity"
    )
    assert findings == [(2, "warning"), (3, "warning")]


def test_a_run_through_the_mirror_finds_the_same_bad_records(spark, corpus, outcome):
    """The mirror flags the records that hold an unparsable property or op item once, when
    it mirrors them (``may_be_bad``), and a run through it looks only in those: it finds
    every bad record a run of the stores finds, the flagged ones among them."""
    base, _ = corpus
    _, tables, _ = outcome
    brokers = ("bad-props", "op-bodies")
    output = base / "out-mirror"
    stores = [arg for name in brokers for arg in ("--store", f"{name}={base / name}")]
    argv = [*stores, "--output", str(output), "--as-of", str(T), "--run-id", RUN, "--mirror"]
    assert main(argv, spark=spark) == 0
    mirrored = rows_of(output, "bad_records", RUN)
    assert sorted(_bad({"bad_records": mirrored}, b) for b in brokers) == sorted(
        _bad(tables, b) for b in brokers
    )
    assert all(_bad(tables, b) for b in brokers)  # something the flags could have lost


def test_a_long_real_topic_is_read_and_one_unsafe_as_a_path_is_not(corpus, outcome):
    """A discarded transaction committed into a 200-character topic is `committed`; one
    whose real topic is `../etc` is `ended` (that name is never made a path)."""
    base, _ = corpus
    _, tables, _ = outcome
    history = rows_of(base / "out", "discard_history", RUN)
    got = sorted(
        (r["real_topic"], r["outcome"], r["ended_before_discard"])
        for r in history
        if r["broker"] == "real-topics"
    )
    assert got == [(UNSAFE_REAL_TOPIC, "ended", False), (LONG_REAL_TOPIC, "committed", False)]
    assert _bad(tables, "real-topics") == []
    assert _pending(tables, "real-topics") == [(1, CHECKED), (2, CHECKED), (3, CHECKED)]


def test_every_bad_record_is_counted_in_run_summary(outcome):
    _, tables, _ = outcome
    for broker in COMPLETING:
        counted = sum(r["bad_records"] for r in _of(tables, "run_summary", broker))
        assert counted == len(_of(tables, "bad_records", broker)), broker


def test_one_run_summary_row_per_broker_and_queue(outcome):
    _, tables, _ = outcome
    keys = [(r["broker"], r["queue_id"]) for r in tables["run_summary"]]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_strict_fails_on_the_corpus_with_exit_1_and_writes_nothing(spark, corpus, capsys):
    base, _ = corpus
    output = base / "strict-out"
    code = main(
        [*_store_args(base), "--output", str(output), "--as-of", str(T), "--strict"], spark=spark
    )
    assert code == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: ") and "--strict" in line and "bad record(s)" in line
    assert not output.exists()


# --- inputs that stop the run before anything is written (exit code 2) ------------------------------------


def _assert_one_error_line(capsys, *needles: str) -> None:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("name", sorted(BAD_OFFSETS_FILES))
def test_bad_offsets_file_is_exit_2_with_one_line_and_no_output(spark, tmp_path, capsys, name):
    store = tmp_path / "store"
    write(store, base_rows())
    offsets = store / "config" / "consumerOffset.json"
    offsets.parent.mkdir()
    text, message = BAD_OFFSETS_FILES[name]
    offsets.write_text(text)
    output = tmp_path / "out"
    assert (
        main(["--store", str(store), "--output", str(output), "--as-of", str(T)], spark=spark) == 2
    )
    _assert_one_error_line(capsys, f"error: {offsets}: {message}")
    assert not output.exists()


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE_OFFSETS_FILES))
def test_out_of_range_offsets_file_is_exit_2(spark, tmp_path, capsys, name):
    store = tmp_path / "store"
    write(store, base_rows())
    offsets = store / "config" / "consumerOffset.json"
    offsets.parent.mkdir()
    offsets.write_text(OUT_OF_RANGE_OFFSETS_FILES[name])
    output = tmp_path / "out"
    code = main(["--store", str(store), "--output", str(output), "--as-of", str(T)], spark=spark)
    assert not output.exists()
    assert code == 2
    _assert_one_error_line(capsys, str(offsets))


@pytest.mark.parametrize("case", ["missing", "not-a-store", "a-file"])
def test_not_a_store_is_exit_2(spark, tmp_path, capsys, case):
    store = tmp_path / "store"
    if case == "not-a-store":
        (store / "config").mkdir(parents=True)
    elif case == "a-file":
        store.write_text("x")
    output = tmp_path / "out"
    assert main(["--store", str(store), "--output", str(output)], spark=spark) == 2
    _assert_one_error_line(capsys, str(store))
    assert not output.exists()


@pytest.mark.parametrize("case", ["immutable", "under-a-file"])
def test_an_output_root_that_cannot_be_written_is_exit_2(spark, tmp_path, capsys, case):
    store = tmp_path / "store"
    write(store, base_rows())
    if case == "immutable":  # chattr missing fails the test (check=True), never skips it
        output = tmp_path / "out"
        output.mkdir()
        subprocess.run(["chattr", "+i", str(output)], check=True, capture_output=True)
    else:
        (tmp_path / "file").write_text("x")
        output = tmp_path / "file" / "out"
    try:
        code = main(["--store", str(store), "--output", str(output)], spark=spark)
        if case == "immutable":
            assert list(output.iterdir()) == []
    finally:
        if case == "immutable":
            subprocess.run(["chattr", "-i", str(output)], check=True, capture_output=True)
    assert code == 2
    _assert_one_error_line(capsys, f"error: --output {output}: cannot ")


def test_one_bad_store_among_good_ones_stops_everything(spark, tmp_path, capsys):
    good = tmp_path / "good"
    write(good, base_rows())
    bad = tmp_path / "bad"
    write(bad, base_rows())
    (bad / "config").mkdir()
    # Malformed, no .bak (an empty file is not an error: like the broker, the job then
    # starts at the queues' heads with a warning).
    (bad / "config" / "consumerOffset.json").write_text("{not json")
    output = tmp_path / "out"
    assert (
        main(["--store", str(good), "--store", str(bad), "--output", str(output)], spark=spark) == 2
    )
    _assert_one_error_line(capsys, str(bad / "config" / "consumerOffset.json"))
    assert not output.exists()
