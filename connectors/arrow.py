"""Spark StructType -> Arrow schema, for the tables delta-rs creates from ``schemas/``."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import types as T

_PRIMITIVES: dict[type[T.DataType], pa.DataType] = {
    T.StringType: pa.string(),
    T.IntegerType: pa.int32(),
    T.LongType: pa.int64(),
    T.BinaryType: pa.binary(),
    T.BooleanType: pa.bool_(),
    T.DoubleType: pa.float64(),
    # An instant: Delta's `timestamp` (microseconds, adjusted to UTC).
    T.TimestampType: pa.timestamp("us", tz="UTC"),
}


def to_arrow_type(data_type: T.DataType) -> pa.DataType:
    if isinstance(data_type, T.ArrayType):
        return pa.list_(pa.field("element", to_arrow_type(data_type.elementType), nullable=True))
    if isinstance(data_type, T.MapType):
        return pa.map_(to_arrow_type(data_type.keyType), to_arrow_type(data_type.valueType))
    if isinstance(data_type, T.StructType):
        return pa.struct([to_arrow_field(field) for field in data_type.fields])
    try:
        return _PRIMITIVES[type(data_type)]
    except KeyError:
        raise TypeError(f"no Arrow type for {data_type.simpleString()}") from None


def to_arrow_field(field: T.StructField) -> pa.Field:
    return pa.field(field.name, to_arrow_type(field.dataType), nullable=field.nullable)


def to_arrow_schema(schema: T.StructType) -> pa.Schema:
    return pa.schema([to_arrow_field(field) for field in schema.fields])
