"""The DuckDB peer (``bench.duckdb_peer``) against the spec's worked cases and the pure-Python
reference, without Spark: each round is one in-memory DuckDB run over Parquet files written
from the tests' record builders, every case as its own broker. Fast (seconds)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

duckdb = pytest.importorskip("duckdb")

from bench import duckdb_peer  # noqa: E402
from schemas.outputs import CLASSES  # noqa: E402
from tests import reference  # noqa: E402
from tests.transforms.builders import BROKER, T, half, op, params  # noqa: E402
from tests.transforms.generators import generate, with_broker  # noqa: E402
from tests.transforms.worked_cases import CASES, S  # noqa: E402
from transforms.params import RoundParams  # noqa: E402

PEER_COLUMNS = tuple(c for c in duckdb_peer.PENDING_COLUMNS if c != "broker")
OFFSETS = ("h0", "h1", "h_safe", "p0", "p1", "p_safe")


def run(tmp_path: Path, records: list[dict], committed: list[tuple], p: RoundParams) -> dict:
    folder = tmp_path / "export"
    duckdb_peer.write_records(
        folder, pa.Table.from_pylist(records, schema=duckdb_peer.EXPORT_SCHEMA), committed
    )
    return duckdb_peer.run_round(
        [folder],
        p.as_of_ms,
        1,
        check_max=p.check_max,
        transaction_timeout_ms=p.transaction_timeout_ms,
        file_reserved_hours=p.file_reserved_hours,
        memory_limit="1GB",
    )


def by_broker(table: pa.Table) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in table.to_pylist():
        grouped.setdefault(row["broker"], []).append(row)
    return grouped


def renamed(records: list[dict], committed: list[tuple], broker: str) -> tuple[list, list]:
    return (
        [{**record, "broker": broker} for record in records],
        [(broker, *row[1:]) for row in committed],
    )


def test_worked_cases(tmp_path: Path) -> None:
    records: list[dict] = []
    committed: list[tuple] = []
    for name, case in CASES.items():
        case_records, case_committed = renamed(case.records, case.committed_rows, name)
        records += case_records
        committed += case_committed
    result = run(tmp_path, records, committed, params())

    pending = by_broker(result["pending"])
    summary = {row["broker"]: row for row in result["summary"].to_pylist()}
    for name, case in CASES.items():
        row = summary[name]
        assert tuple(row[c] for c in OFFSETS) == case.offsets, name
        got = [
            (r["half_offset"], r["status"], r["check_times"], r["immunity_ms"])
            for r in pending.get(name, [])
        ]
        assert sorted(got) == sorted(case.pending), name
        assert {c: row[c] for c in CLASSES if row[c]} == case.counts, name


def test_bodies_that_are_not_utf8_spoil_only_their_item(tmp_path: Path) -> None:
    records = [half(0, 60 * S), half(1, 60 * S), half(2, 60 * S), op(0, b"\xff0,1,\xc3(,")]
    result = run(tmp_path, records, [], params())

    # "\xff0" names nothing (so 0 stays pending), "1" resolves 1, "\xc3(" names nothing.
    assert [(r["half_offset"], r["status"]) for r in result["pending"].to_pylist()] == [
        (0, "check"),
        (2, "check"),
    ]


def test_consume_offsets_cover_both_topics_of_every_queue(tmp_path: Path) -> None:
    records = [half(3, 60 * S), op(0, "3")]
    committed = [(BROKER, "RMQ_SYS_TRANS_HALF_TOPIC", 7, 12)]
    result = run(tmp_path, records, committed, params())

    rows = {(r["queue_id"], r["topic"]): r for r in result["consume_offsets"].to_pylist()}
    assert len(rows) == 4
    assert rows[(7, "RMQ_SYS_TRANS_HALF_TOPIC")]["offset_before"] == 12  # nothing to correct it
    assert rows[(7, "RMQ_SYS_TRANS_OP_HALF_TOPIC")]["offset_committed"] is None
    assert rows[(0, "RMQ_SYS_TRANS_OP_HALF_TOPIC")]["offset_after"] == 1


@pytest.mark.parametrize(
    "round_params",
    [params(), params(check_max=3, transaction_timeout_ms=10_000, file_reserved_hours=1)],
    ids=["defaults", "tight"],
)
def test_agrees_with_the_reference_on_generated_cases(
    tmp_path: Path, round_params: RoundParams
) -> None:
    records: list[dict] = []
    committed: list[tuple] = []
    for index, case in enumerate(generate(round_params, 150)):
        named = with_broker(case, f"case-{index:03d}")
        records += named.records
        committed += named.committed
    result = run(tmp_path, records, committed, round_params)
    # The peer models the round's offsets, not the job's holds on what it proposes.
    expected = reference.reconcile(records, committed, round_params, hold=False)

    def pending_rows(rows: list[dict]) -> Counter:
        return Counter(tuple(r[c] for c in ("broker", *PEER_COLUMNS)) for r in rows)

    assert pending_rows(result["pending"].to_pylist()) == pending_rows(expected.pending)
    got_summary = {
        (r["broker"], r["queue_id"]): (*(r[c] for c in OFFSETS), *(r[c] for c in CLASSES))
        for r in result["summary"].to_pylist()
    }
    want_summary = {
        key: (*(getattr(s, c) for c in OFFSETS), *(s.counts[c] for c in CLASSES))
        for key, s in expected.summaries.items()
    }
    assert got_summary == want_summary
    columns = ("broker", "topic", "queue_id", "group", *duckdb_peer.OFFSET_COLUMNS)
    assert Counter(
        tuple(r[c] for c in columns) for r in result["consume_offsets"].to_pylist()
    ) == Counter(tuple(r[c] for c in columns) for r in expected.consume_offsets)


def test_compare_reports_differences_with_delta_output(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    records = [
        half(0, 60 * S),
        half(1, 60 * S, counter=15),
        half(2, 2 * S),
        half(3, 60 * S),
        op(0, "0"),
    ]
    result = run(tmp_path, records, [], params())
    out = tmp_path / "out"
    run_columns = {"run_id": "r1", "as_of_ms": T}

    def write(table: str, rows: pa.Table) -> None:
        for name, value in {**run_columns, "written_at_ms": 1}.items():
            rows = rows.append_column(
                name,
                pa.array([value] * rows.num_rows, pa.int64() if name != "run_id" else pa.string()),
            )
        deltalake.write_deltalake(str(out / table), rows)

    pending = result["pending"].to_pylist()
    status = result["pending"].column("status")
    write("pending", result["pending"])
    write("check_requests", result["pending"].filter(pc.equal(status, "check")))
    discards = result["pending"].filter(pc.equal(status, "discard_check_max"))
    write(
        "discards",
        discards.append_column("reason", pa.array(["check_max"] * discards.num_rows, pa.string())),
    )
    write("consume_offsets", result["consume_offsets"])
    write("run_summary", result["summary"])

    assert duckdb_peer.compare(result, out) == []

    changed = dict(result)
    changed["pending"] = result["pending"].set_column(
        result["pending"].schema.get_field_index("status"),
        "status",
        pa.array(["immune" if r["half_offset"] == 1 else r["status"] for r in pending]),
    )
    differences = duckdb_peer.compare(changed, out)
    assert any(
        "pending [b 0 1]" in line and "status ours='discard_check_max' peer='immune'" in line
        for line in differences
    )
