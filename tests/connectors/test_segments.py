"""Reading exported segments (connectors/segments.py) on small inline exports."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from connectors.segments import read_segments
from tests.jobs.segments import half_table, op_table


def test_an_exports_own_place_columns_give_way_to_the_file_and_row_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Records exported with the place the store reader gave them (``source``,
    ``position``) are read with the place that finds them in the export: the file read and
    the row in it, for readable and bad rows alike (it failed with an ambiguous column)."""
    half = half_table()
    rows = half.num_rows
    queue_offsets = half.column("queue_offset").to_pylist()
    queue_offsets[2] = None  # a bad row: no queue offset
    half = half.set_column(
        half.schema.get_field_index("queue_offset"), "queue_offset", pa.array(queue_offsets)
    )
    half = half.append_column("source", pa.array(["commitlog/00000000000000000000"] * rows))
    half = half.append_column("position", pa.array([777_000 + i for i in range(rows)]))
    half_path, op_path = tmp_path / "half.parquet", tmp_path / "op.parquet"
    pq.write_table(half, half_path)
    pq.write_table(op_table(), op_path)

    read = read_segments(spark, str(half_path), str(op_path), "parquet", "broker-a")

    readable = read.messages.filter("topic = 'RMQ_SYS_TRANS_HALF_TOPIC'")
    got = sorted((r["queue_offset"], r["source"], r["position"]) for r in readable.collect())
    assert got == [(offset, str(half_path), row) for row, offset in ((0, 0), (1, 1), (3, 3))]
    bad = [(r["source"], r["position"], r["reason"]) for r in read.bad_records.collect()]
    assert bad == [(str(half_path), 2, "missing queue_offset")]
