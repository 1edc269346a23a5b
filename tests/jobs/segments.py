"""Small exported segments (Parquet / JSON lines) for command-line tests."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

AS_OF = 1_700_000_000_000
NEWEST_STORE_MS = AS_OF - 1_000

HALF_ROWS = [
    # offset, age at AS_OF, properties
    (0, 60_000, {"UNIQ_KEY": "K0", "PGROUP": "pg", "REAL_TOPIC": "orders", "REAL_QID": "1"}),
    (1, 60_000, {"UNIQ_KEY": "K1", "PGROUP": "pg", "REAL_TOPIC": "orders", "REAL_QID": "1"}),
    (
        2,
        60_000,
        {
            "UNIQ_KEY": "K2",
            "PGROUP": "pg",
            "REAL_TOPIC": "orders",
            "REAL_QID": "2",
            "TRANSACTION_CHECK_TIMES": "15",
        },
    ),
    (3, 2_000, {"UNIQ_KEY": "K3", "PGROUP": "pg", "REAL_TOPIC": "pay", "REAL_QID": "0"}),
]
OP_ROWS = [(0, b"1"), (1, b"0,")]


def half_table() -> pa.Table:
    return pa.table(
        {
            "queue_id": pa.array([0] * len(HALF_ROWS), pa.int32()),
            "queue_offset": [row[0] for row in HALF_ROWS],
            "commitlog_offset": [1_000 + 100 * row[0] for row in HALF_ROWS],
            "born_timestamp_ms": [AS_OF - row[1] for row in HALF_ROWS],
            "store_timestamp_ms": [AS_OF - row[1] + 5 for row in HALF_ROWS],
            "store_host": ["10.0.0.2:10911"] * len(HALF_ROWS),
            "properties": pa.array(
                [list(row[2].items()) for row in HALF_ROWS], pa.map_(pa.string(), pa.string())
            ),
        }
    )


def op_table() -> pa.Table:
    return pa.table(
        {
            "queue_id": pa.array([0] * len(OP_ROWS), pa.int32()),
            "queue_offset": [row[0] for row in OP_ROWS],
            "commitlog_offset": [9_000 + 100 * row[0] for row in OP_ROWS],
            "born_timestamp_ms": [NEWEST_STORE_MS] * len(OP_ROWS),
            "store_timestamp_ms": [NEWEST_STORE_MS] * len(OP_ROWS),
            "tags": ["d"] * len(OP_ROWS),
            "body": [row[1] for row in OP_ROWS],
        }
    )


def write_parquet_segments(folder: Path) -> tuple[Path, Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    half, op, offsets = (
        folder / "half.parquet",
        folder / "op.parquet",
        folder / "consumerOffset.json",
    )
    pq.write_table(half_table(), half)
    pq.write_table(op_table(), op)
    offsets.write_text(
        '{"offsetTable":{"RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:0},'
        '"RMQ_SYS_TRANS_OP_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:0}}}'
    )
    return half, op, offsets


def write_json_segments(folder: Path, *, base64_bodies: bool = False) -> tuple[Path, Path]:
    """The same records as JSON lines: op bodies as text in ``body``, or base64 in
    ``body_base64`` (docs/segments.md)."""
    import base64

    folder.mkdir(parents=True, exist_ok=True)
    half, op = folder / "half.json", folder / "op.json"
    with open(half, "w") as out:
        for row in half_table().to_pylist():
            row["properties"] = dict(row["properties"])
            out.write(json.dumps(row) + "\n")
    with open(op, "w") as out:
        for row in op_table().to_pylist():
            body = row.pop("body")
            if base64_bodies:
                row["body_base64"] = base64.b64encode(body).decode()
            else:
                row["body"] = body.decode()
            out.write(json.dumps(row) + "\n")
    return half, op


def segment_argv(
    half: Path,
    op: Path,
    output: Path,
    offsets: Path | None = None,
    fmt: str = "parquet",
    broker: str = "b",
) -> list[str]:
    """The command-line arguments of a segments run (``--half ... --output ...``)."""
    argv = ["--half", str(half), "--op", str(op)]
    if offsets is not None:
        argv += ["--offsets", str(offsets)]
    return [*argv, "--format", fmt, "--broker", broker, "--output", str(output)]
