"""Record-level transforms: duplicates, the as-of cut, derived half fields, message ids."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.messages import HALF_TOPIC, LEAN_MESSAGE, OP_TOPIC, PROPERTY_COLUMNS
from transforms.parsing import nonempty, parse_java_int, parse_java_long

RECORD_KEY = ["broker", "topic", "queue_id", "queue_offset"]
QUEUE_KEY = ["broker", "queue_id"]

_WINNER = "_winner"
_COPIES = "_copies"
_ROW_ID = "_row_id"


def _precedence() -> Column:
    """Which of several records with the same queue offset is used: the smallest commit-log
    offset (spec section 7); source and position break ties, and a row id breaks the tie
    between byte-identical copies (the same input read twice)."""
    return F.struct("commitlog_offset", "source", "position", _ROW_ID)


def mark_duplicates(messages: DataFrame, unique: Column | None = None) -> DataFrame:
    """Add ``duplicate_of`` (long): null for the record that is used, else the commit-log
    offset of the record kept instead. Settled among all readable records, before the
    as-of cut.

    ``unique``: a condition true for records whose queue offset is unique by construction
    (a store reader knows this of records reached through a consume queue); those skip the
    check, which otherwise costs a shuffle of every record. Only keys that occur more than
    once are joined back; that side is normally empty or tiny, so adaptive execution
    broadcasts it instead of shuffling every record.
    """
    if unique is not None:
        unique = F.coalesce(unique, F.lit(False))  # a null must not drop a record from both sides
        trusted = messages.filter(unique).withColumn("duplicate_of", F.lit(None).cast(T.LongType()))
        return trusted.unionByName(mark_duplicates(messages.filter(~unique)))
    # The row id is evaluated per partition; inputs are cached or deterministic scans, so
    # both uses of `numbered` below see the same ids.
    numbered = messages.withColumn(_ROW_ID, F.monotonically_increasing_id())
    contested = (
        numbered.groupBy(*RECORD_KEY)
        .agg(F.min(_precedence()).alias(_WINNER), F.count(F.lit(1)).alias(_COPIES))
        .filter(F.col(_COPIES) > 1)
        .drop(_COPIES)
    )
    is_loser = F.col(_WINNER).isNotNull() & ~F.col(_WINNER).eqNullSafe(_precedence())
    return (
        numbered.join(contested, RECORD_KEY, how="left")
        .withColumn("duplicate_of", F.when(is_loser, F.col(f"{_WINNER}.commitlog_offset")))
        .drop(_WINNER, _ROW_ID)
    )


def stored_before(as_of_ms: int) -> Column:
    """The snapshot cut: only records stored before T exist for the round."""
    return F.col("store_timestamp_ms") < F.lit(as_of_ms)


def is_half() -> Column:
    return F.col("topic") == HALF_TOPIC


def is_op() -> Column:
    return F.col("topic") == OP_TOPIC


def with_property_columns(records: DataFrame) -> DataFrame:
    """The properties the round reads as the columns of ``PROPERTY_COLUMNS`` (raw text, null
    when absent or empty), in place of the ``properties`` map. Records from the store
    reader's lean path carry these columns already and pass unchanged."""
    if "properties" not in records.columns:
        return records
    prop = F.col("properties")
    extracted = [nonempty(prop[name]).alias(column) for name, column in PROPERTY_COLUMNS.items()]
    return records.select("*", *extracted).drop("properties")


def as_lean(records: DataFrame) -> DataFrame:
    """Sourced records in the round's input contract (``LEAN_MESSAGE``): the properties the
    round reads as columns, and none of the columns it never reads."""
    return with_property_columns(records).select(*LEAN_MESSAGE.fieldNames())


def with_half_fields(half: DataFrame) -> DataFrame:
    """Derive the transaction fields of half records from their properties (spec section 2).

    Raw texts are kept (``*_raw``) so that unparsable values can be reported as bad
    records; the parsed columns are null when absent or unparsable. Accepts records with
    the ``properties`` map or with the property columns already extracted.
    """
    return with_property_columns(half).select(
        "*",
        parse_java_int(F.col("real_queue_id_raw")).alias("real_queue_id"),
        parse_java_int(F.col("check_times_raw")).alias("check_times"),
        parse_java_long(F.col("prepared_queue_offset_raw")).alias("prepared_queue_offset"),
    )


def _hex(value: Column, width: int) -> Column:
    return F.lpad(F.upper(F.hex(value)), width, "0")


def _ipv4_hex(address: Column) -> Column:
    octets = F.split(address, r"\.")
    as_hex = F.array_join(F.transform(octets, lambda o: _hex(o.try_cast(T.IntegerType()), 2)), "")
    valid = (F.size(octets) == 4) & F.forall(
        octets, lambda o: o.rlike(r"\A[0-9]{1,3}\z") & (o.try_cast(T.IntegerType()) <= 255)
    )
    return F.when(valid, as_hex)


def _ipv6_hex(address: Column) -> Column:
    """Expand a (possibly ``::``-compressed) IPv6 address to 32 hex digits."""
    plain = F.regexp_replace(address, "%.*$", "")  # drop a zone id
    has_gap = plain.contains("::")
    halves = F.split(plain, "::", 2)
    left = F.when(has_gap, halves.getItem(0)).otherwise(plain)
    right = F.when(has_gap, halves.getItem(1)).otherwise(F.lit(""))

    def groups(text: Column) -> Column:
        return F.when(text == "", F.array().cast("array<string>")).otherwise(F.split(text, ":"))

    missing = F.lit(8) - F.size(groups(left)) - F.size(groups(right))
    filler = F.when(has_gap, F.array_repeat(F.lit("0"), F.greatest(missing, F.lit(0))))
    expanded = F.concat(
        groups(left), F.coalesce(filler, F.array().cast("array<string>")), groups(right)
    )
    valid = (F.size(expanded) == 8) & F.forall(expanded, lambda g: g.rlike(r"\A[0-9A-Fa-f]{1,4}\z"))
    return F.when(
        valid, F.array_join(F.transform(expanded, lambda g: F.lpad(F.upper(g), 4, "0")), "")
    )


def offset_msg_id(store_host: Column, commitlog_offset: Column) -> Column:
    """RocketMQ's offset message id: upper-case hex of the store host's address bytes (4 or
    16), its port (int32) and the commit-log offset (int64). Null when the host is not
    ``ip:port`` / ``[ipv6]:port``."""
    host = F.regexp_extract(store_host, r"^(.*):([0-9]+)$", 1)
    port = F.regexp_extract(store_host, r"^(.*):([0-9]+)$", 2).try_cast(T.LongType())
    is_v6 = host.startswith("[") & host.endswith("]")
    address_hex = F.when(is_v6, _ipv6_hex(F.regexp_extract(host, r"^\[(.*)\]$", 1))).otherwise(
        _ipv4_hex(host)
    )
    valid_port = port.between(0, 0x7FFFFFFF)
    return F.when(
        address_hex.isNotNull() & valid_port & commitlog_offset.isNotNull(),
        F.concat(address_hex, _hex(port.cast(T.IntegerType()), 8), _hex(commitlog_offset, 16)),
    )
