"""Collect the output tables of a round with a single Spark action.

Every output table of ``reconcile`` derives from the same joins; collecting them one by
one recomputes those joins six times. Here each table becomes ``(table, json)`` rows and the
tables are unioned, so one query runs, and Spark can reuse the shared shuffles
(``ReuseExchange``) across the union's branches. The tests only ever compare small outputs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from transforms.outputs import RoundOutputs

TABLES = ("check_requests", "discards", "pending", "consume_offsets", "run_summary", "bad_records")
# With the round's anomaly rules too (a heavier query): the worked cases' findings.
WITH_ANOMALIES = (*TABLES, "anomalies")


def collect_outputs(
    out: RoundOutputs, tables: tuple[str, ...] = TABLES
) -> dict[str, list[dict[str, Any]]]:
    """Table name -> rows as dicts (every column present, nulls as ``None``)."""
    frames = [
        getattr(out, table).select(
            F.lit(table).alias("table"),
            F.to_json(F.struct("*"), {"ignoreNullFields": "false"}).alias("row"),
        )
        for table in tables
    ]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    rows: dict[str, list[dict[str, Any]]] = {table: [] for table in tables}
    for row in union.collect():
        rows[row.table].append(json.loads(row.row))
    return rows


def _from_json(value: Any, data_type: T.DataType) -> Any:
    """JSON gives timestamps as ISO-8601 text with their offset: back to aware datetimes
    (Spark stores an aware datetime as its instant, whatever the local time zone)."""
    if value is not None and isinstance(data_type, T.TimestampType):
        return datetime.fromisoformat(value).astimezone(UTC)
    return value


def local_outputs(
    spark: SparkSession, out: RoundOutputs, tables: tuple[str, ...] = TABLES
) -> dict[str, DataFrame]:
    """The outputs, computed once, as small local DataFrames with the outputs' own schemas
    (binary columns, absent unless bodies are asked for, are not supported)."""
    collected = collect_outputs(out, tables)
    local = {}
    for table in tables:
        schema = getattr(out, table).schema
        rows = [
            tuple(_from_json(row[f.name], f.dataType) for f in schema.fields)
            for row in collected[table]
        ]
        local[table] = spark.createDataFrame(rows, schema)
    return local
