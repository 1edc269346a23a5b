"""What every anomaly rule reads and ends in: ``RoundEvidence`` (the round's frames beyond
the pending records, each record with its queue's window once ``windowed``), the window
conditions, and ``finding``, the ``ANOMALY`` schema contract.

A closing ``select`` of Column casts costs about ten Py4J calls per column and cast (one
anomaly rule's contract was some 330 calls); the contracts here are SQL text built once
from the schema and handed to the JVM in one ``selectExpr`` call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.outputs import ANOMALY


@dataclass(frozen=True)
class RoundEvidence:
    """The round's frames the rules read beyond ``pending`` and the per-queue rows: readable
    half records and op records stored before T, the op items (``transforms.ops``), and
    ``linked``: the half records of the transactions with a record from h0 (what resolution
    read), among which are the records of every transaction the anomaly rules judge."""

    half: DataFrame
    ops: DataFrame
    op_items: DataFrame
    linked: DataFrame


# The per-queue values each evidence part carries (``transforms.anomalies.windowed``).
HALF_WINDOW = ("h0", "h1")
OP_WINDOW = ("p0", "p1", "h1", "p_safe")


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_array(values: Iterable[str]) -> Column:
    """An array of string literals: one parse, not one Py4J call per literal."""
    return F.expr("array(" + ", ".join(sql_string(value) for value in values) + ")")


def sql_map(pairs: Mapping[str, str]) -> Column:
    """A map of string literals: one parse, not one Py4J call per literal."""
    entries = (f"{sql_string(key)}, {sql_string(value)}" for key, value in pairs.items())
    return F.expr("map(" + ", ".join(entries) + ")")


def contract(schema: T.StructType, given: Iterable[str] | None = None) -> list[str]:
    """``selectExpr`` text of ``schema``'s columns in order, each cast to its type; a column
    not in ``given`` (when given) is a typed null."""
    known = None if given is None else set(given)
    return [
        f"CAST({'NULL' if known is not None and f.name not in known else f'`{f.name}`'}"
        f" AS {f.dataType.simpleString()}) AS `{f.name}`"
        for f in schema.fields
    ]


def finding(
    frame: DataFrame,
    kind: str,
    severity: Column,
    value: Column,
    threshold: Column,
    detail: Column,
    **keys: Column,
) -> DataFrame:
    """The ``ANOMALY`` contract; ``keys`` fills uniq_key, producer_group, half_offset and
    op_offset (null when not given: a queue- or group-level finding)."""
    columns = {
        "broker": F.col("broker"),
        "queue_id": F.col("queue_id"),
        "kind": F.lit(kind),
        "severity": severity,
        "value": value,
        "threshold": threshold,
        "detail": detail,
        **keys,
    }
    # Named by one ``toDF``, not an ``alias`` (a Py4J round trip) per column.
    named = frame.select(*columns.values()).toDF(*columns)
    return named.selectExpr(*contract(ANOMALY, columns))


def in_window() -> Column:
    """A half record of ``windowed`` evidence in [h0, h1) of its queue."""
    return (F.col("queue_offset") >= F.col("h0")) & (F.col("queue_offset") < F.col("h1"))


def from_p0(ops: DataFrame) -> DataFrame:
    """The op records of ``windowed`` evidence at offsets >= p0 (stored before T)."""
    return ops.filter(F.col("queue_offset") >= F.col("p0"))
