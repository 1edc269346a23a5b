"""Read exported half and op segments (Parquet, JSON lines or Delta) as canonical records.

An export holds the columns of ``schemas.messages.MESSAGE`` (any subset that includes
the required ones below). ``broker`` and ``topic`` may be omitted: they come from
``--broker`` and from the side (``--half`` / ``--op``). ``source`` is the input file and
``position`` the row number in it (0-based), so a bad row can be found again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.errors import InputError
from schemas.messages import DISCARD_TOPIC, HALF_TOPIC, MESSAGE, OP_TOPIC, SOURCED_MESSAGE
from schemas.outputs import BAD_RECORD

FORMATS = ("parquet", "json", "delta")
# Without these a row cannot take part in the round.
REQUIRED = ("queue_id", "queue_offset", "born_timestamp_ms", "store_timestamp_ms")
_LINE = "_line"


@dataclass(frozen=True)
class SegmentRead:
    messages: DataFrame
    bad_records: DataFrame


def validate_segment_path(path: str, fmt: str) -> None:
    """Fail before Spark starts when an input is missing (exit code 2)."""
    if fmt not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)}: {fmt}")
    target = Path(path)
    if not target.exists():
        raise InputError(f"{path}: input not found")
    if fmt == "delta" and not (target / "_delta_log").is_dir():
        raise InputError(f"{path}: not a Delta table (no _delta_log/)")


def _read_parquet_files(spark: SparkSession, paths: list[str]) -> DataFrame:
    # An export of records that already carry a place (the store reader's own columns, a
    # re-export of earlier output) has ``source`` and ``position`` of its own: the place
    # that finds a row again is in the file read now, so those columns give way.
    frame = spark.read.parquet(*paths).drop("source", "position")
    return frame.select(
        "*",
        F.col("_metadata.file_path").alias("source"),
        F.col("_metadata.row_index").cast("long").alias("position"),
    )


# JSON has no binary type: ``body`` is text (UTF-8, what op bodies and most message
# bodies are), a binary body goes in ``body_base64``. Never guessed: ``"1234"`` is valid
# base64 too.
BODY_BASE64 = "body_base64"
JSON_MESSAGE = T.StructType(
    [T.StructField(f.name, T.StringType()) if f.name == "body" else f for f in MESSAGE.fields]
    + [T.StructField(BODY_BASE64, T.StringType())]
)
_BAD_BODY = "_bad_body"


def _json_keys(lines: DataFrame) -> set[str]:
    """The keys that appear in at least one line: a column no line has is missing, as it
    would be from a Parquet file (a key absent from some lines is a null there)."""
    keys = lines.select(F.explode(F.json_object_keys(F.col(_LINE))).alias("key")).distinct()
    return {row["key"] for row in keys.collect()}  # at most one row per distinct key


def _json_body(keys: set[str]) -> list[Column]:
    """``body`` (binary) from ``body`` text or ``body_base64``, and why it is unusable."""
    text = F.encode(F.col("body"), "UTF-8") if "body" in keys else None
    decoded = F.try_to_binary(F.col(BODY_BASE64), F.lit("base64"))
    both = F.col("body").isNotNull() & F.col(BODY_BASE64).isNotNull()
    if BODY_BASE64 not in keys:
        return [
            (text if text is not None else F.lit(None)).alias("body"),
            F.lit(None).alias(_BAD_BODY),
        ]
    body = F.coalesce(text, decoded) if text is not None else decoded
    bad = F.when(
        both if "body" in keys else F.lit(False), F.lit("both body and body_base64 given")
    ).when(F.col(BODY_BASE64).isNotNull() & decoded.isNull(), F.lit("body_base64 is not base64"))
    return [body.alias("body"), bad.alias(_BAD_BODY)]


def _read_json(spark: SparkSession, path: str) -> DataFrame:
    """JSON lines. Each file is read whole so that every line keeps its exact line number
    (Spark's JSON reader has no row index); export files are part files of modest size.
    Only the columns some line has are kept, so a missing column is found like Parquet's."""
    # wholetext as text()'s keyword: its default (False) overrides .option("wholetext"),
    # which left one row per line and every position 0.
    files = spark.read.text(path, wholetext=True).select(
        F.col("value"), F.col("_metadata.file_path").alias("source")
    )
    lines = files.select(
        "source", F.posexplode(F.split("value", "\n")).alias("position", _LINE)
    ).filter(F.trim(F.col(_LINE)) != "")
    keys = _json_keys(lines)
    parsed = F.from_json(F.col(_LINE), JSON_MESSAGE, {"mode": "PERMISSIVE"})
    rows = lines.select(
        parsed.alias("row"), "source", F.col("position").cast("long"), _LINE
    ).select("row.*", "source", "position", _LINE)
    return rows.select(
        *[name for name in MESSAGE.fieldNames() if name in keys and name != "body"],
        *_json_body(keys),
        "source",
        "position",
        _LINE,
    )


def _read_side(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    if fmt == "parquet":
        return _read_parquet_files(spark, [path])
    if fmt == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(path)
        if table.metadata().partition_columns:
            raise InputError(
                f"{path}: partitioned Delta exports are not supported; export unpartitioned"
            )
        uris = table.file_uris()
        if not uris:
            return spark.createDataFrame([], SOURCED_MESSAGE)
        return _read_parquet_files(spark, uris)
    return _read_json(spark, path)


def _canonical(frame: DataFrame, topic: str, broker: str, path: str) -> tuple[DataFrame, Column]:
    present = set(frame.columns)
    missing = [name for name in REQUIRED if name not in present]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    columns = []
    for field in MESSAGE.fields:
        if field.name == "broker":
            value = (
                F.coalesce(F.col("broker").cast("string"), F.lit(broker))
                if "broker" in present
                else F.lit(broker)
            )
        elif field.name == "topic":
            value = (
                F.coalesce(F.col("topic").cast("string"), F.lit(topic))
                if "topic" in present
                else F.lit(topic)
            )
        elif field.name in present:
            value = F.col(field.name)
        else:
            value = F.lit(None)
        columns.append(value.cast(field.dataType).alias(field.name))
    extra = [F.col(_LINE)] if _LINE in present else [F.lit(None).cast("string").alias(_LINE)]
    if _BAD_BODY in present:
        extra.append(F.col(_BAD_BODY))
    else:
        extra.append(F.lit(None).cast("string").alias(_BAD_BODY))
    shaped = frame.select(
        *columns, F.regexp_replace("source", "^file:", "").alias("source"), "position", *extra
    )
    reasons = [F.when(F.col(name).isNull(), F.lit(f"missing {name}")) for name in REQUIRED]
    reasons.append(F.col(_BAD_BODY))
    reasons.append(
        F.when(
            F.col("topic") != topic,
            F.concat(F.lit("topic "), F.col("topic"), F.lit(f" in the {topic} segments")),
        )
    )
    if _LINE in present:
        reasons.insert(
            0,
            F.when(
                F.col("queue_offset").isNull() & F.col("queue_id").isNull(),
                F.lit("unparsable JSON row"),
            ),
        )
    return shaped, F.coalesce(*reasons)


def _read_one_side(
    spark: SparkSession, path: str, topic: str, fmt: str, broker: str
) -> tuple[DataFrame, DataFrame]:
    """(readable records, bad records) of one export holding the records of ``topic``."""
    shaped, reason = _canonical(_read_side(spark, path, fmt), topic, broker, path)
    flagged = shaped.withColumn("_reason", reason)
    good = flagged.filter(F.col("_reason").isNull()).select(*SOURCED_MESSAGE.fieldNames())
    raw = F.upper(F.hex(F.substring(F.encode(F.col(_LINE), "UTF-8").cast("binary"), 1, 64)))
    values = [
        F.lit(broker),
        F.col("source"),
        F.col("position"),
        F.lit(topic),
        F.col("queue_id"),
        F.col("queue_offset"),
        F.col("_reason"),
        raw,
    ]
    bad = flagged.filter(F.col("_reason").isNotNull()).select(
        *[
            value.cast(field.dataType).alias(field.name)
            for value, field in zip(values, BAD_RECORD.fields, strict=True)
        ]
    )
    return good, bad


def read_segments(spark: SparkSession, half: str, op: str, fmt: str, broker: str) -> SegmentRead:
    """Read the half and op exports of one broker (see module docstring)."""
    half_good, half_bad = _read_one_side(spark, half, HALF_TOPIC, fmt, broker)
    op_good, op_bad = _read_one_side(spark, op, OP_TOPIC, fmt, broker)
    return SegmentRead(
        messages=half_good.unionByName(op_good), bad_records=half_bad.unionByName(op_bad)
    )


def read_discard_segments(spark: SparkSession, path: str, fmt: str, broker: str) -> SegmentRead:
    """Read an export of ``TRANS_CHECK_MAX_TIME_TOPIC`` records (``--discards``): the same
    formats and columns as the half export (``properties`` carries the copied half
    properties)."""
    good, bad = _read_one_side(spark, path, DISCARD_TOPIC, fmt, broker)
    return SegmentRead(messages=good, bad_records=bad)
