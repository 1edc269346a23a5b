"""Small hand-made broker stores for the robustness tests (written with ``StoreWriter``),
and helpers to read the job's output tables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa

from connectors.delta_read import arrow_dataset
from simulator.writer import StoreWriter
from tests.connectors.reference import messages_table

HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TABLES = ("bad_records", "check_requests", "discards", "pending", "run_summary", "consume_offsets")
T = 1_700_000_100_000  # the as-of time of every hand-made store
LOG0 = "commitlog/00000000000000000000"
HALF_CQ0 = f"consumequeue/{HALF}/0/00000000000000000000"
OP_CQ0 = f"consumequeue/{OP}/0/00000000000000000000"
RUN_TIME_COLUMNS = ("written_at_ms", "duration_ms")


def half(
    i: int,
    *,
    age_ms: int = 60_000,
    queue_offset: int | None = None,
    drop: tuple[str, ...] = (),
    **props: str,
) -> dict:
    """A half record, born ``age_ms`` before T; ``props`` override/add properties."""
    properties = {
        "UNIQ_KEY": f"KEY{i:04d}",
        "PGROUP": "group-a",
        "REAL_TOPIC": "TopicOrder",
        "REAL_QID": "1",
        "TRAN_MSG": "true",
        **props,
    }
    for name in drop:
        properties.pop(name)
    return {
        "topic": HALF,
        "queue_id": 0,
        "queue_offset": queue_offset,
        "born_timestamp_ms": T - age_ms,
        "store_timestamp_ms": T - age_ms + 1,
        "born_host": "10.0.0.1:50000",
        "store_host": "10.0.0.7:10911",
        "properties": properties,
        "body": f"half {i}".encode(),
    }


def op(body: bytes, *, tag: str = "d") -> dict:
    return {
        "topic": OP,
        "queue_id": 0,
        "born_timestamp_ms": T - 50_000,
        "store_timestamp_ms": T - 50_000,
        "born_host": "10.0.0.7:10911",
        "store_host": "10.0.0.7:10911",
        "properties": {"TAGS": tag},
        "body": body,
    }


def base_rows() -> list[dict]:
    """Op 0 names half 0; halves 0..3 born 60 s before T: 0 resolved, 1..3 check. The op
    comes first so that half 3 is the last record of the commit log."""
    return [op(b"0,"), *(half(i) for i in range(4))]


def write(root: Path, rows: list[dict], *, commitlog_file_size: int = 4096) -> list[dict]:
    """Write a store; return the rows with their commitlog_offset/queue_offset/stored_size."""
    with StoreWriter(root, commitlog_file_size=commitlog_file_size, cq_file_entries=64) as writer:
        assigned = writer.append(messages_table(rows)).to_pylist()
    return [{**row, **got} for row, got in zip(rows, assigned, strict=True)]


def halves(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["topic"] == HALF]


def patch(path: Path, position: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[position : position + len(data)] = data
    path.write_bytes(bytes(raw))


def read_table(root: Path, table: str) -> pa.Table:
    dataset = arrow_dataset(str(root / table))
    assert dataset is not None, f"no {table} table under {root}"
    return dataset.to_table()


def rows_of(root: Path, table: str, run_id: str | None = None) -> list[dict]:
    rows = read_table(root, table).to_pylist()
    return [r for r in rows if run_id is None or r["run_id"] == run_id]


def comparable(rows: list[dict]) -> Counter:
    """A multiset of rows without the run id, the run-time columns and the writer that
    wrote them (runs through delta-rs and delta-spark must agree on everything else). A
    pending row first seen in its own run says so instead of naming the run."""

    def value(row: dict, k: str) -> object:
        if k == "first_seen_run_id" and row[k] == row.get("run_id"):
            return "(its own run)"
        return row[k]

    def key(row: dict) -> tuple:
        return tuple(
            sorted(
                (k, repr(value(row, k)))
                for k in row
                if k not in ("run_id", "writer", *RUN_TIME_COLUMNS)
            )
        )

    return Counter(key(r) for r in rows)


def mirrored_places(root: Path, table: str = "mirror_records") -> list[tuple]:
    """(topic, queue id, queue offset) of every row of a mirror table under the output root
    ``root``, as its Delta log lists them: a place twice is a record decoded twice."""
    columns = ["topic", "queue_id", "queue_offset"]
    mirrored = read_table(root, table).select(columns)
    return list(zip(*(mirrored.column(name).to_pylist() for name in columns), strict=True))
