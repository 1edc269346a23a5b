"""``find``'s answer for a key found in no table (``jobs.find``): the store the latest run
read, searched for the key's half records with the project's reader in a Spark session.
Only this case starts Spark; a lookup in the tables needs none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from connectors.errors import InputError
from connectors.rocketmq.reader import parse_store_arg, read_stores, validate_store
from schemas.messages import HALF_TOPIC
from transforms.operator_fields import message_keys


@dataclass(frozen=True)
class StoreAnswer:
    """What the stores show of the keys in no table: per key, its half records (``broker,
    queue_id, queue_offset, store_timestamp_ms, uniq_key``, oldest first); per broker, the
    store time of its oldest retained half record, or why its store could not be read."""

    records: Mapping[str, Sequence[Mapping[str, Any]]]
    oldest_ms: Mapping[str, int | None]
    unreadable: Mapping[str, str]


NO_ANSWER = StoreAnswer({}, {}, {})


def named_keys(keys: Sequence[str]) -> Column:
    """The keys among ``keys`` a lean half record is searched by: its ``uniq_key``, its
    ``transaction_id`` or one of its KEYS (as the tables' ``keys`` column splits them)."""
    own_keys = message_keys(F.col("keys_raw"))
    return F.filter(
        F.array(*[F.lit(key) for key in keys]),
        lambda key: (
            (key == F.col("uniq_key"))
            | (key == F.col("transaction_id"))
            | F.array_contains(own_keys, key)
        ),
    )


def search_stores(
    spark: SparkSession, stores: Mapping[str, str], keys: Sequence[str]
) -> StoreAnswer:
    """The half records of ``keys`` in the stores (broker -> directory) and the oldest half
    record each store retains: one aggregate over the store reader's lean records."""
    specs, unreadable = [], {}
    for broker, folder in sorted(stores.items()):
        spec = parse_store_arg(f"{broker}={folder}")
        try:
            validate_store(spec)
            specs.append(spec)
        except InputError as exc:  # moved or deleted since the run
            unreadable[broker] = str(exc)
    if not specs:
        return StoreAnswer({}, {}, unreadable)
    read = read_stores(spark, specs, topics=(HALF_TOPIC,), lean=True)
    try:
        named = read.messages.withColumn("_named", named_keys(keys))
        record = F.struct("store_timestamp_ms", "queue_id", "queue_offset", "uniq_key", "_named")
        rows = (
            named.groupBy("broker")
            .agg(
                F.min("store_timestamp_ms").alias("oldest_ms"),
                F.collect_list(F.when(F.size("_named") > 0, record)).alias("records"),
            )
            .collect()  # one row per broker, holding only the keys' half records
        )
    finally:
        read.unpersist()
    records: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        for found in row["records"]:
            for key in found["_named"]:
                records.setdefault(key, []).append({"broker": row["broker"], **found.asDict()})
    for found_records in records.values():
        found_records.sort(key=lambda r: (r["store_timestamp_ms"], r["broker"], r["queue_offset"]))
    oldest = {row["broker"]: row["oldest_ms"] for row in rows}
    return StoreAnswer(records, oldest, unreadable)
