"""Extract: what one run reads (broker stores or exported segments) and who the run is
(the instant T it reconciles at and its run id)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.errors import InputError
from connectors.rocketmq.offsets_file import committed_rows, read_consumer_offsets
from connectors.rocketmq.reader import parse_store_arg, read_stores
from connectors.segments import read_segments
from jobs.config import JobConfig
from schemas.messages import COMMITTED_OFFSET
from transforms.messages import as_lean
from transforms.round import NOTE

# The settings that change a round's result, hence its default run id.
RUN_ID_SETTINGS = (
    "check_max",
    "transaction_timeout_ms",
    "file_reserved_hours",
    "include_body",
    "verify_crc",
    "broker_version",
)


# -- time and identity -------------------------------------------------------------------


def parse_as_of(text: str) -> int | str:
    """``now`` and ``latest`` stay symbolic; an ISO-8601 instant or epoch ms becomes epoch ms."""
    if text in ("now", "latest"):
        return text
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"--as-of must be now, latest, an ISO-8601 instant or epoch ms: {text}"
        ) from None
    if instant.tzinfo is None:
        raise InputError(f"--as-of needs a time zone (e.g. {text}Z): {text}")
    return int(instant.timestamp() * 1000)


def resolve_as_of(as_of: int | str, messages: DataFrame) -> int:
    """``latest``: 1 ms after the newest record read (all brokers and queues); ``now`` when
    there is none."""
    if isinstance(as_of, int):
        return as_of
    if as_of == "latest":
        row = messages.agg(F.max("store_timestamp_ms")).first()  # one row
        newest = row[0] if row is not None else None
        if newest is not None:
            return int(newest) + 1
    return int(time.time() * 1000)


def derive_run_id(inputs: Sequence[str], as_of_ms: int, config: JobConfig) -> str:
    """Same inputs, T and settings -> same id, so a rerun replaces its own rows."""
    settings = {k: v for k, v in asdict(config).items() if k in RUN_ID_SETTINGS}
    digest = hashlib.sha256(json.dumps([sorted(inputs), as_of_ms, settings]).encode()).hexdigest()
    return f"r{as_of_ms}-{digest[:12]}"


# -- what was read ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """What was read: records, reader bad records, committed offsets, reader notes."""

    messages: DataFrame
    bad_records: DataFrame
    committed_offsets: DataFrame
    notes: DataFrame
    identity: list[str]  # for the default run id
    release: Callable[[], None] | None = None  # set when the reader already caches its output
    # (broker, offsets file used, why the usual file was not used or None), for warnings
    offsets_files: tuple[tuple[str, str, str | None], ...] = ()

    def persist(self) -> Inputs:
        """Cache the records once; the store reader's output is cached already."""
        if self.release is not None:
            return self
        messages, bad_records = self.messages.persist(), self.bad_records.persist()

        def release() -> None:
            messages.unpersist()
            bad_records.unpersist()

        return Inputs(
            messages,
            bad_records,
            self.committed_offsets,
            self.notes,
            self.identity,
            release,
            self.offsets_files,
        )

    def unpersist(self) -> None:
        if self.release is not None:
            self.release()


def read_store_inputs(spark: SparkSession, stores: Sequence[str], config: JobConfig) -> Inputs:
    """The records of broker stores (``[NAME=]DIR`` each), the job's lean columns."""
    specs = [parse_store_arg(arg) for arg in stores]
    read = read_stores(
        spark, specs, verify_crc=config.verify_crc, include_half_body=config.include_body, lean=True
    )
    notes = spark.createDataFrame(list(read.notes), NOTE)
    identity = [f"store:{spec.broker}={spec.root.resolve()}" for spec in specs]
    return Inputs(
        read.messages,
        read.bad_records,
        read.committed_offsets,
        notes,
        identity,
        read.unpersist,
        read.offsets_files,
    )


def read_segment_inputs(
    spark: SparkSession, half: str, op: str, fmt: str, broker: str, offsets: str | None
) -> Inputs:
    """The records of exported half and op segments in the round's contract (``as_lean``),
    with an optional consumerOffset.json."""
    table = None
    if offsets is not None:
        table = read_consumer_offsets(offsets)
        if table is None:
            raise InputError(f"{offsets}: offsets file not found")
    read = read_segments(spark, half, op, fmt, broker)
    committed = spark.createDataFrame(committed_rows(broker, table), COMMITTED_OFFSET)
    identity = [f"{fmt}:{broker}:{Path(p).resolve()}" for p in (half, op)] + [f"offsets:{offsets}"]
    used = offsets if offsets is not None else "no --offsets given"
    return Inputs(
        as_lean(read.messages),
        read.bad_records,
        committed,
        spark.createDataFrame([], NOTE),
        identity,
        offsets_files=((broker, used, None),),
    )
