"""The broker simulator (simulator/simulation.py, simulator/__main__.py).

The vectorised engine is checked against a literal, record-at-a-time replay of the broker's
check (docs/broker-check.md sections 2, 3, 5, with the simulator's documented
simplifications) run over the simulator's own output; then the written store is checked for
determinism, counts, cross-references and, when the reader exists, a clean read-back.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, read_consumer_offsets
from schemas.messages import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC
from simulator.simulation import (
    SimConfig,
    iterate_records,
    java_hashmap_order,
)

REPO = Path(__file__).resolve().parents[2]

# Small, busy configurations: high late / never / immunity rates, a low check maximum so
# that discards happen within the short timeline, clock skew, IPv6 producers.
BUSY = dict(
    transactions=600,
    duration_s=900,
    producer_groups=4,
    topics=5,
    other_traffic=0.3,
    clock_skew_ms=8000,
    check_max=4,
    late_fraction=0.15,
    never_fraction=0.08,
    immunity_fraction=0.25,
    ipv6_fraction=0.3,
    body_bytes=120,
)


def _props(raw: bytes) -> dict[str, str]:
    """RocketMQ's string2messageProperties."""
    out = {}
    for segment in raw.decode("utf-8").split("\x02"):
        name, sep, value = segment.partition("\x01")
        if sep and name and value:
            out[name] = value
    return out


def _simulate(**overrides):
    config = SimConfig(**{**BUSY, **overrides})
    sim, windows = iterate_records(config)
    tables, offsets = [], []
    for window in windows:
        tables.append(window.table)
        offsets.append(window.commitlog_offsets)
    sim.finish()
    table = pa.concat_tables(tables)
    rows = table.to_pylist()
    clog = np.concatenate(offsets)
    for row, offset in zip(rows, clog, strict=True):
        row["commitlog_offset"] = int(offset)
        row["props"] = _props(row["properties_raw"])
    return sim, rows


def _replay(sim, rows):
    """Literal per-record replay of every check round; returns the committed offsets and,
    per round, the expected put-back copies and discards (in walk order)."""
    c = sim.config
    half = sorted((r for r in rows if r["topic"] == HALF_TOPIC), key=lambda r: r["queue_offset"])
    ops = sorted((r for r in rows if r["topic"] == OP_TOPIC), key=lambda r: r["queue_offset"])
    assert [r["queue_offset"] for r in half] == list(range(len(half)))
    assert [r["queue_offset"] for r in ops] == list(range(len(ops)))
    h0 = p0 = 0
    rounds = []
    for now, round_end in zip(sim.round_times, sim.round_ends, strict=True):
        remove_map: dict[int, int] = {}
        op_sets: dict[int, set[int]] = {}
        done: list[int] = []
        for op in ops[p0:]:
            if op["store_timestamp_ms"] >= now:
                break
            items = {int(x) for x in op["body"].decode().split(",") if x}
            pending = set()
            for item in items:
                if item >= h0:
                    remove_map[item] = op["queue_offset"]
                    pending.add(item)
            if pending:
                op_sets[op["queue_offset"]] = pending
            else:
                done.append(op["queue_offset"])
        copies, discards = [], []
        i = h0
        while True:
            if i in remove_map:
                op_offset = remove_map.pop(i)
                op_sets[op_offset].discard(i)
                if not op_sets[op_offset]:
                    done.append(op_offset)
                i += 1
                continue
            if i >= len(half):
                break
            rec = half[i]
            if rec["store_timestamp_ms"] >= now and rec["store_timestamp_ms"] > round_end:
                break  # not written yet when the walk gets there
            p = rec["props"]
            age = now - rec["born_timestamp_ms"]
            counter = p.get("TRANSACTION_CHECK_TIMES")
            if counter is not None and int(counter) >= c.check_max:
                discards.append((p["UNIQ_KEY"], int(counter)))
                i += 1
                continue
            bumped = 1 if counter is None else int(counter) + 1
            if age > c.file_reserved_hours * 3_600_000:
                discards.append((p["UNIQ_KEY"], bumped))
                i += 1
                continue
            if rec["store_timestamp_ms"] >= now:
                break  # fresh
            immunity = p.get("CHECK_IMMUNITY_TIME_IN_SECONDS")
            if immunity is not None and age < int(immunity) * 1000:
                prepared = p.get("TRAN_PREPARED_QUEUE_OFFSET", str(i))
                copies.append((p["UNIQ_KEY"], bumped, prepared, "immune"))
                i += 1
                continue
            if immunity is None and 0 <= age < c.transaction_timeout_ms:
                break  # too young: the round stops
            copies.append((p["UNIQ_KEY"], bumped, p.get("TRAN_PREPARED_QUEUE_OFFSET"), "check"))
            i += 1
        h0 = i
        for offset in sorted(done):  # calculateOpOffset
            if offset != p0:
                break
            p0 += 1
        rounds.append((now, copies, discards))
    return h0, p0, rounds


@pytest.mark.parametrize("op_style", ["4.9", "5.x"])
def test_vectorised_rounds_match_a_literal_replay_of_the_broker(op_style):
    sim, rows = _simulate(op_style=op_style, seed=11)
    h0, p0, rounds = _replay(sim, rows)
    assert (sim.half_committed, sim.op_committed) == (h0, p0)
    starts = [*sim.round_times, sim.config.end_ms]
    for k, (now, copies, discards) in enumerate(rounds):
        window = [r for r in rows if now <= r["store_timestamp_ms"] < starts[k + 1]]
        got_copies = [
            (
                r["props"]["UNIQ_KEY"],
                int(r["props"]["TRANSACTION_CHECK_TIMES"]),
                r["props"].get("TRAN_PREPARED_QUEUE_OFFSET"),
            )
            for r in window
            if r["topic"] == HALF_TOPIC and "TRANSACTION_CHECK_TIMES" in r["props"]
        ]
        assert got_copies == [(u, n, p) for u, n, p, _ in copies], f"round {k} at {now}"
        got_discards = [
            (r["props"]["UNIQ_KEY"], int(r["props"]["TRANSACTION_CHECK_TIMES"]))
            for r in window
            if r["topic"] == DISCARD_TOPIC
        ]
        assert got_discards == discards, f"round {k} at {now}"
    # the busy configuration exercises every path
    s = sim.summary
    assert s.checks and s.immunity_putbacks and s.discards_check_max and s.commits and s.rollbacks
    assert sum(len(c) for _, c, _ in rounds) == s.checks + s.immunity_putbacks
    assert sum(len(d) for _, _, d in rounds) == s.discards_check_max + s.discards_expired


def test_expired_messages_are_discarded_with_the_incremented_counter():
    # producers whose clock is 2 h behind, and a 1 h file reserved time: needSkip fires
    sim, rows = _simulate(
        seed=5, clock_skew_ms=2 * 3_600_000, file_reserved_hours=1, transactions=300
    )
    h0, p0, _ = _replay(sim, rows)
    assert (sim.half_committed, sim.op_committed) == (h0, p0)
    assert sim.summary.discards_expired > 0
    expired = [
        r
        for r in rows
        if r["topic"] == DISCARD_TOPIC and int(r["props"]["TRANSACTION_CHECK_TIMES"]) < 4
    ]
    assert len(expired) == sim.summary.discards_expired


def test_copies_keep_the_message_and_increment_the_counter():
    _, rows = _simulate(seed=3)
    half = sorted((r for r in rows if r["topic"] == HALF_TOPIC), key=lambda r: r["queue_offset"])
    latest: dict[str, dict] = {}
    originals: dict[str, dict] = {}
    for rec in half:
        key = rec["props"]["UNIQ_KEY"]
        if "TRANSACTION_CHECK_TIMES" not in rec["props"]:
            assert key not in originals
            originals[key] = latest[key] = rec
            continue
        before = latest[key]
        orig = originals[key]
        assert rec["props"]["TRANSACTION_CHECK_TIMES"] == str(
            int(before["props"].get("TRANSACTION_CHECK_TIMES", 0)) + 1
        )
        assert rec["born_timestamp_ms"] == orig["born_timestamp_ms"]
        assert rec["born_host"] == orig["born_host"]
        assert rec["body"] == orig["body"]
        assert rec["sys_flag"] == orig["sys_flag"]
        assert rec["store_timestamp_ms"] > before["store_timestamp_ms"]
        assert (rec["flag"], rec["reconsume_times"]) == (0, 0)
        assert rec["props"]["TRAN_MSG"] == "true"
        if "TRAN_PREPARED_QUEUE_OFFSET" in rec["props"]:
            assert rec["props"]["TRAN_PREPARED_QUEUE_OFFSET"] == str(orig["queue_offset"])
        same = {
            k: v
            for k, v in rec["props"].items()
            # WAIT turns false with the immunity re-put (test_wait_is_false_...)
            if k not in ("TRANSACTION_CHECK_TIMES", "TRAN_PREPARED_QUEUE_OFFSET", "WAIT")
        }
        assert same == {k: v for k, v in orig["props"].items() if k != "WAIT"}
        latest[key] = rec
    assert any(r["flag"] for r in originals.values())  # the flag reset is observable


def test_discards_carry_the_counter_and_the_message():
    sim, rows = _simulate(seed=4)
    by_key = defaultdict(list)
    for rec in rows:
        if rec["topic"] == HALF_TOPIC:
            by_key[rec["props"]["UNIQ_KEY"]].append(rec)
    discards = [r for r in rows if r["topic"] == DISCARD_TOPIC]
    assert len(discards) == sim.summary.discards_check_max + sim.summary.discards_expired > 0
    for rec in discards:
        key = rec["props"]["UNIQ_KEY"]
        assert int(rec["props"]["TRANSACTION_CHECK_TIMES"]) >= sim.config.check_max
        source = [
            h
            for h in by_key[key]
            if h["props"].get("TRANSACTION_CHECK_TIMES") == rec["props"]["TRANSACTION_CHECK_TIMES"]
        ]
        assert source and source[0]["props"] == rec["props"]
        assert (rec["born_timestamp_ms"], rec["body"], rec["queue_id"]) == (
            source[0]["born_timestamp_ms"],
            source[0]["body"],
            0,
        )


@pytest.mark.parametrize("op_style", ["4.9", "5.x"])
def test_client_properties_wait_msg_region_trace_on(op_style):
    """As on real brokers (tests/broker/test_real_bytes.py): the immunity re-put sets
    WAIT=false and later copies keep it; other half records carry the client's WAIT=true."""
    _, rows = _simulate(op_style=op_style, seed=6)
    half = [r for r in rows if r["topic"] == HALF_TOPIC]
    assert any("TRAN_PREPARED_QUEUE_OFFSET" in r["props"] for r in half)
    for r in half:
        expected = "false" if "TRAN_PREPARED_QUEUE_OFFSET" in r["props"] else "true"
        assert r["props"]["WAIT"] == expected, r["queue_offset"]
        client_5x = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}  # as a 5.3.3 client
        present = {k: r["props"].get(k) for k in client_5x}
        assert present == (client_5x if op_style == "5.x" else dict.fromkeys(client_5x))


@pytest.mark.parametrize("op_style", ["4.9", "5.x"])
def test_op_bodies_name_existing_half_offsets(op_style):
    sim, rows = _simulate(op_style=op_style, seed=6)
    half = {r["queue_offset"]: r for r in rows if r["topic"] == HALF_TOPIC}
    ops = [r for r in rows if r["topic"] == OP_TOPIC]
    assert ops
    items = 0
    for op in ops:
        body = op["body"].decode()
        assert op["props"] == {"WAIT": "true", "TAGS": "d"} and op["tags"] == "d"
        assert op["born_timestamp_ms"] == op["store_timestamp_ms"]
        if op_style == "4.9":
            assert body.isdigit()
            names = [int(body)]
        else:
            assert body.endswith(",") and len(body) <= sim.config.op_msg_max_size + 21
            names = [int(x) for x in body.split(",") if x]
        for name in names:
            assert name in half and half[name]["store_timestamp_ms"] < op["store_timestamp_ms"]
        items += len(names)
    assert items == sim.summary.op_items


def test_real_messages_point_at_the_committed_half_record():
    sim, rows = _simulate(seed=8)
    half_by_clog = {r["commitlog_offset"]: r for r in rows if r["topic"] == HALF_TOPIC}
    real = [r for r in rows if r["sys_flag"] & 0xC == 0x8]
    assert len(real) == sim.summary.commits > 0
    for rec in real:
        source = half_by_clog[rec["prepared_transaction_offset"]]
        assert rec["topic"] == source["props"]["REAL_TOPIC"]
        assert rec["queue_id"] == int(source["props"]["REAL_QID"])
        assert rec["props"] == source["props"] and rec["body"] == source["body"]
        assert rec["born_timestamp_ms"] == source["born_timestamp_ms"]
        assert rec["store_timestamp_ms"] > source["store_timestamp_ms"]


def test_commit_log_order_and_layout():
    _, rows = _simulate(seed=9, commitlog_file_size=64 * 1024)
    stores = [r["store_timestamp_ms"] for r in rows]
    assert stores == sorted(stores)
    clog = [r["commitlog_offset"] for r in rows]
    assert clog == sorted(clog) and len(set(clog)) == len(clog)
    assert clog[-1] // (64 * 1024) > 3  # several files


def test_java_hashmap_order():
    keys = ["UNIQ_KEY", "CLUSTER", "PGROUP", "TRAN_MSG", "REAL_QID"]
    assert java_hashmap_order(keys, 128) == [
        "UNIQ_KEY",
        "CLUSTER",
        "PGROUP",
        "TRAN_MSG",
        "REAL_QID",
    ]
    assert java_hashmap_order(["TAGS", "WAIT"], 16) == ["WAIT", "TAGS"]


def test_same_seed_same_records_other_seed_other_records():
    _, a = _simulate(seed=21, transactions=200)
    _, b = _simulate(seed=21, transactions=200)
    _, c = _simulate(seed=22, transactions=200)
    assert a == b
    assert a != c


# --------------------------------------------------------------------------- written stores


def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _cq_entries(root: Path) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for path in (root / "consumequeue").glob("*/*/*"):
        data = path.read_bytes()
        for k in range(0, len(data) - 19, 20):
            offset, size, _tag = struct.unpack_from(">qiq", data, k)
            if size > 0 and not (offset == 0 and size == 0x7FFFFFFF):
                counts[path.parent.parent.name] += 1
    return dict(counts)


SMALL = [
    "--transactions",
    "400",
    "--duration-s",
    "900",
    "--other-traffic",
    "0.3",
    "--commitlog-file-size",
    str(256 * 1024),
    "--cq-file-entries",
    "100",
]


def _run_cli(out: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "--out", str(out), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=True,
    )
    return done.stdout


def test_cli_is_deterministic_and_counts_match_the_summary(tmp_path):
    from simulator.simulation import write_store

    out_a, out_b = tmp_path / "a", tmp_path / "b"
    line = _run_cli(out_a, *SMALL, "--seed", "7", "--op-style", "4.9")
    assert "transactions" in line and line.count("\n") == 1
    _run_cli(out_b, *SMALL, "--seed", "7", "--op-style", "4.9")
    assert _tree_hash(out_a) == _tree_hash(out_b)
    assert len(list((out_a / "commitlog").iterdir())) > 1
    config = SimConfig(
        transactions=400,
        duration_s=900,
        other_traffic=0.3,
        seed=7,
        op_style="4.9",
        commitlog_file_size=256 * 1024,
        cq_file_entries=100,
    )
    summary = write_store(config, tmp_path / "c")
    assert _tree_hash(tmp_path / "c") == _tree_hash(out_a)
    assert _cq_entries(out_a) == summary.records_by_topic
    table = read_consumer_offsets(out_a / "config" / "consumerOffset.json")
    assert table == {HALF_KEY: {0: summary.half_offset}, OP_KEY: {0: summary.op_offset}}
    assert 0 < summary.half_offset <= summary.half_queue_end
    assert 0 < summary.op_offset <= summary.op_queue_end


@pytest.mark.parametrize("op_style", ["4.9", "5.x"])
def test_every_record_reads_back_as_simulated(tmp_path, op_style):
    """Writer -> reader round trip of every topic (consume queues, CRCs checked) against the
    engine's in-memory records, field by field."""
    from connectors.rocketmq.reader import StoreSpec, read_batches
    from simulator.simulation import write_store

    overrides = dict(
        op_style=op_style,
        seed=12,
        transactions=250,
        commitlog_file_size=96 * 1024,
        cq_file_entries=50,
    )
    _, rows = _simulate(**overrides)
    write_store(SimConfig(**{**BUSY, **overrides}), tmp_path / "s")
    topics = sorted({r["topic"] for r in rows})
    read = pa.Table.from_batches(
        list(
            read_batches(
                [StoreSpec("s", tmp_path / "s")],
                verify_crc=True,
                include_half_body=True,
                topics=topics,
            )
        )
    )
    assert read.filter(pa.compute.is_valid(read.column("reason"))).num_rows == 0
    got = sorted(read.to_pylist(), key=lambda r: r["commitlog_offset"])
    assert len(got) == len(rows)
    for want, have in zip(rows, got, strict=True):
        for name in (
            "topic",
            "queue_id",
            "commitlog_offset",
            "sys_flag",
            "flag",
            "born_timestamp_ms",
            "born_host",
            "store_timestamp_ms",
            "store_host",
            "reconsume_times",
            "prepared_transaction_offset",
            "tags",
            "body",
        ):
            assert have[name] == want[name], (name, want["topic"], want["commitlog_offset"])
        if want["queue_offset"] is not None:
            assert have["queue_offset"] == want["queue_offset"]
        assert dict(have["properties"]) == want["props"]


def test_store_reads_back_on_spark_without_bad_records(spark, tmp_path):
    from connectors.rocketmq.reader import StoreSpec, read_stores
    from simulator.simulation import write_store

    config = SimConfig(
        **{
            **BUSY,
            "transactions": 300,
            "seed": 2,
            "commitlog_file_size": 128 * 1024,
            "cq_file_entries": 64,
        }
    )
    summary = write_store(config, tmp_path / "broker-a")
    result = read_stores(spark, [StoreSpec("broker-a", tmp_path / "broker-a")])
    assert result.bad_records.count() == 0
    counts = {
        row["topic"]: row["count"] for row in result.messages.groupBy("topic").count().collect()
    }
    assert counts == {
        HALF_TOPIC: summary.records_by_topic[HALF_TOPIC],
        OP_TOPIC: summary.records_by_topic[OP_TOPIC],
    }
    committed = {row["topic"]: row["offset"] for row in result.committed_offsets.collect()}
    assert committed == {HALF_TOPIC: summary.half_offset, OP_TOPIC: summary.op_offset}
    result.unpersist()


def test_cli_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "--out", str(tmp_path), "--transactions", "10"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and done.stderr.count("\n") == 1
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulator",
            "--out",
            str(tmp_path),
            "--transactions",
            "10",
            "--force",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 2 and "not a store" in done.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulator",
            "--out",
            str(tmp_path / "x"),
            "--transactions",
            "-1",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 2 and done.stderr.startswith("error:")
