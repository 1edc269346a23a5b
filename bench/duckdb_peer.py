"""The single-node peer an auditor would pick: DuckDB computing the round in SQL.

It computes, from Parquet exports of the decoded records, what the Spark job computes
(spec ``docs/spec/reconcile.md`` sections 1, 3, 4, 5 and the row contents of 6),
so that the job's results can be checked equal to an independent implementation and its
run time put next to a single-node engine's.

Three steps, each usable on its own (``bench/run.py`` calls them):

- :func:`prepare` decodes each store once with the project's own reader (no Spark) and
  exports the readable half and op records in the canonical message schema of spec
  section 2 (``schemas.messages.SOURCED_MESSAGE``, ``properties`` as a map) to Parquet,
  plus the committed offsets. The export is cached per store and reused.
- :func:`run_peer` runs the round in an in-memory DuckDB database over those files
  (:func:`run_round` is the SQL part alone; :func:`round_statements` lists the SQL):
  deduplication, the as-of cut, named offsets from op bodies, resolution rules 1-3, h0/p0,
  the round's classes and stop rule, h1/h_safe/p1/p_safe and per-queue counts.
  :func:`write_records` makes an export folder from records decoded elsewhere (tests).
- :func:`compare` reads the job's Delta output tables and lists every difference.

Out of scope: bad-record accounting. The peer reads only readable records (the reader's
bad records are left out of the export), and it neither reports duplicates, unparsable op
items or unparsable properties as bad records nor counts them (``run_summary.bad_records``)
nor reproduces ``run_summary.warnings``; it treats such values exactly as the round does
(an unparsable value counts as absent, a duplicate loser takes part in nothing), so the
classification and offsets must still be equal. ``offset_msg_id`` and bodies are not
compared either (presentation, not the round); half bodies are not exported (the
reader decodes only op bodies unless asked, as in the job's default run).

Manual use::

    python -m bench.duckdb_peer --store broker-a=DIR --store broker-b=DIR --cache DIR \\
        --as-of 1750000000000 [--compare OUTPUT_DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.messages import (
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_IMMUNITY_SECONDS,
    PROP_PREPARED_QUEUE_OFFSET,
    PROP_PRODUCER_GROUP,
    PROP_REAL_QUEUE_ID,
    PROP_REAL_TOPIC,
    PROP_UNIQ_KEY,
    REMOVE_TAG,
    SOURCED_MESSAGE,
    TRANS_GROUP,
)
from schemas.outputs import (
    CHECK,
    CLASSES,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    NOT_REACHED,
    REASON_CHECK_MAX,
    REASON_EXPIRED,
    TOO_YOUNG,
)

# Bump when the export's layout or content changes: older caches are then rebuilt.
EXPORT_FORMAT = 1
MANIFEST = "manifest.json"
HALF_FILE = "half.parquet"
OP_FILE = "op.parquet"
COMMITTED_FILE = "committed.parquet"
ROW_GROUP_ROWS = 256 * 1024  # rows buffered per Parquet row group

MS_PER_HOUR = 3_600_000
MAX_IMMUNITY_SECONDS = (2**63 - 1) // 1000  # the largest |seconds| whose ms fit in a long
NO_IMMUNITY = -1  # the broker's "not set" value

# Per-record columns the peer returns (the pending table's, less offset_msg_id and body),
# with `status` and `check_times` = the counter after this round's effect.
PENDING_COLUMNS = (
    "broker",
    "queue_id",
    "half_offset",
    "status",
    "check_times",
    "commitlog_offset",
    "uniq_key",
    "producer_group",
    "real_topic",
    "real_queue_id",
    "born_timestamp_ms",
    "store_timestamp_ms",
    "age_ms",
    "immunity_ms",
)
SUMMARY_COLUMNS = ("broker", "queue_id", "h0", "h1", "h_safe", "p0", "p1", "p_safe", *CLASSES)
OFFSET_COLUMNS = ("offset_committed", "offset_before", "offset_after", "offset_safe")


# --- export ----------------------------------------------------------------------------------------


def _arrow_type(spark_type: Any) -> pa.DataType:
    """The Arrow type of a Spark type of the canonical message schema."""
    from pyspark.sql import types as T

    simple = {
        T.StringType: pa.string(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.BinaryType: pa.binary(),
    }
    if isinstance(spark_type, T.MapType):
        return pa.map_(_arrow_type(spark_type.keyType), _arrow_type(spark_type.valueType))
    return simple[type(spark_type)]


# The export's schema: exactly spec section 2's columns plus source/position.
EXPORT_SCHEMA = pa.schema([(f.name, _arrow_type(f.dataType)) for f in SOURCED_MESSAGE.fields])
COMMITTED_SCHEMA = pa.schema(
    [
        ("broker", pa.string()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("offset", pa.int64()),
    ]
)


def _store_fingerprint(root: Path) -> list[list[Any]]:
    """(relative path, size, mtime_ns) of every file the export depends on: the commit log,
    the consume queues of the two topics and the offsets file. A changed store invalidates
    its cached export."""
    found: list[list[Any]] = []
    candidates = [root / "commitlog", root / "config"]
    candidates += [root / "consumequeue" / topic for topic in (HALF_TOPIC, OP_TOPIC)]
    for top in candidates:
        if not top.is_dir():
            continue
        for directory, _, files in os.walk(top):
            for name in files:
                path = Path(directory) / name
                stat = path.stat()
                found.append([str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns])
    return sorted(found)


def _export_dir(cache_dir: Path, broker: str, root: Path) -> Path:
    """One folder per (broker name, store path): the 1m and 4m stores of broker-a differ."""
    digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:10]
    return cache_dir / f"{broker}-{digest}"


def _manifest_identity(broker: str, root: Path) -> dict[str, Any]:
    return {
        "format": EXPORT_FORMAT,
        "broker": broker,
        "store": str(root.resolve()),
        "fingerprint": _store_fingerprint(root),
    }


def _cached_manifest(folder: Path, identity: Mapping[str, Any]) -> dict[str, Any] | None:
    """The manifest of a complete export of the same store as it is now, else None."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if any(manifest.get(key) != value for key, value in identity.items()):
        return None
    if not all((folder / name).is_file() for name in (HALF_FILE, OP_FILE, COMMITTED_FILE)):
        return None
    return manifest


class _TopicWriter:
    """Buffers readable records of one topic into row groups of about ROW_GROUP_ROWS."""

    def __init__(self, path: Path) -> None:
        self.writer = pq.ParquetWriter(path, EXPORT_SCHEMA, compression="zstd")
        self.buffer: list[pa.RecordBatch] = []
        self.buffered = 0
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.buffer.append(batch)
        self.buffered += batch.num_rows
        if self.buffered >= ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.writer.write_table(
                pa.Table.from_batches(self.buffer, EXPORT_SCHEMA), ROW_GROUP_ROWS
            )
            self.rows += self.buffered
            self.buffer, self.buffered = [], 0

    def close(self) -> None:
        self.flush()
        self.writer.close()


def _canonical(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The reader's combined batch reduced to the canonical columns, in their order.

    The reader's combined schema may change (it is being tuned for speed); the export keeps
    spec section 2's. A batch without one of those columns, ``properties`` above all, is
    not worked around: the peer must see the same message the job's round sees."""
    missing = [name for name in EXPORT_SCHEMA.names if name not in batch.schema.names]
    if missing:
        raise RuntimeError(
            "connectors.rocketmq.reader.read_batches no longer yields the canonical message "
            f"columns {missing} (spec section 2, schemas.messages.SOURCED_MESSAGE); the DuckDB "
            "peer exports that schema and needs the reader (or a helper) to provide it"
        )
    columns = [batch.column(f.name).cast(f.type) for f in EXPORT_SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=EXPORT_SCHEMA)


def export_store(broker: str, root: str | Path, cache_dir: str | Path) -> dict[str, Any]:
    """Decode one store with the project's reader and write its export (or reuse it).

    Returns the store's manifest: files, row counts, bytes, export seconds and whether the
    cache was reused."""
    from connectors.rocketmq.offsets_file import committed_rows, load_store_offsets
    from connectors.rocketmq.reader import StoreSpec, read_batches

    root, cache_dir = Path(root), Path(cache_dir)
    folder = _export_dir(cache_dir, broker, root)
    identity = _manifest_identity(broker, root)
    cached = _cached_manifest(folder, identity)
    if cached is not None:
        return {**cached, "reused": True}

    started = time.perf_counter()
    cache_dir.mkdir(parents=True, exist_ok=True)
    temporary = cache_dir / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        writers = {
            HALF_TOPIC: _TopicWriter(temporary / HALF_FILE),
            OP_TOPIC: _TopicWriter(temporary / OP_FILE),
        }
        bad_records = 0
        for batch in read_batches([StoreSpec(broker, root)]):
            readable = pc.is_null(batch.column("reason"))
            bad_records += batch.num_rows - pc.sum(readable.cast(pa.int64())).as_py()
            batch = _canonical(batch.filter(readable))
            for topic, writer in writers.items():
                writer.add(batch.filter(pc.equal(batch.column("topic"), topic)))
        for writer in writers.values():
            writer.close()
        offsets = load_store_offsets(root).table  # .bak fallback like the job
        committed = pa.Table.from_pylist(
            [
                dict(zip(COMMITTED_SCHEMA.names, row, strict=True))
                for row in committed_rows(broker, offsets)
            ],
            schema=COMMITTED_SCHEMA,
        )
        pq.write_table(committed, temporary / COMMITTED_FILE)
        manifest = {
            **identity,
            "half_rows": writers[HALF_TOPIC].rows,
            "op_rows": writers[OP_TOPIC].rows,
            "committed_rows": committed.num_rows,
            "reader_bad_records": bad_records,
            "bytes": sum(
                (temporary / name).stat().st_size for name in (HALF_FILE, OP_FILE, COMMITTED_FILE)
            ),
            "export_seconds": round(time.perf_counter() - started, 3),
        }
        (temporary / MANIFEST).write_text(json.dumps(manifest, indent=1))
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete or outdated export
        temporary.rename(folder)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return {**manifest, "reused": False}


def write_records(
    folder: Path, records: pa.Table, committed: list[tuple[str, str, int, int]]
) -> None:
    """An export folder from records already decoded (``EXPORT_SCHEMA`` columns, any
    topics) and committed-offset tuples ``(broker, topic, queue_id, offset)``: for tests and
    for sources other than a broker store. No manifest: :func:`run_round` reads it as is."""
    folder.mkdir(parents=True, exist_ok=True)
    records = records.select(EXPORT_SCHEMA.names).cast(EXPORT_SCHEMA)
    for topic, name in ((HALF_TOPIC, HALF_FILE), (OP_TOPIC, OP_FILE)):
        pq.write_table(records.filter(pc.equal(records.column("topic"), topic)), folder / name)
    rows = [dict(zip(COMMITTED_SCHEMA.names, row, strict=True)) for row in committed]
    pq.write_table(pa.Table.from_pylist(rows, schema=COMMITTED_SCHEMA), folder / COMMITTED_FILE)


def prepare(stores: Mapping[str, Path], cache_dir: Path, workers: int = 2) -> dict[str, Any]:
    """Export the readable half/op records and committed offsets of each store to Parquet.

    Args:
        stores: broker name -> store directory.
        cache_dir: where exports live, one folder per store; a complete export of an
            unchanged store is reused (a new one is written under a temporary name and
            renamed when complete).
        workers: stores decoded in parallel (processes; the reader is single-threaded).

    Returns:
        ``{"seconds": wall seconds of the whole call, "export_seconds": sum of the stores'
        export times (0 when all were reused), "rows", "bytes", "reused": all reused,
        "stores": {broker: manifest with "folder"}}``.
    """
    started = time.perf_counter()
    cache_dir = Path(cache_dir)
    items = [(broker, Path(root)) for broker, root in stores.items()]
    if workers > 1 and len(items) > 1:
        # spawn, not fork: the caller may hold a JVM or threads.
        with ProcessPoolExecutor(min(workers, len(items)), mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(export_store, broker, root, cache_dir) for broker, root in items]
            manifests = [future.result() for future in futures]
    else:
        manifests = [export_store(broker, root, cache_dir) for broker, root in items]
    per_store = {}
    for (broker, root), manifest in zip(items, manifests, strict=True):
        manifest.pop("fingerprint", None)
        per_store[broker] = {**manifest, "folder": str(_export_dir(cache_dir, broker, root))}
    return {
        "seconds": round(time.perf_counter() - started, 3),
        "export_seconds": round(sum(m["export_seconds"] for m in manifests if not m["reused"]), 3),
        "rows": sum(m["half_rows"] + m["op_rows"] for m in manifests),
        "bytes": sum(m["bytes"] for m in manifests),
        "reused": all(m["reused"] for m in manifests),
        "stores": per_store,
    }


# --- the round in SQL --------------------------------------------------------------------------------


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _files(folders: list[Path], name: str) -> str:
    return "[" + ", ".join(_literal(str(folder / name)) for folder in folders) + "]"


def round_statements(
    folders: list[Path],
    as_of_ms: int,
    check_max: int,
    transaction_timeout_ms: int,
    file_reserved_hours: int,
) -> list[tuple[str, str]]:
    """(name, SQL) of the round, in order. Each statement creates one view, macro or table.

    Parameters are formatted in as integer literals (they are validated as ints) and file
    names as quoted string literals.
    """
    T = int(as_of_ms)
    check_max = int(check_max)
    timeout = int(transaction_timeout_ms)
    reserved_ms = int(file_reserved_hours) * MS_PER_HOUR
    HALF, OP = _literal(HALF_TOPIC), _literal(OP_TOPIC)
    return [
        (
            "inputs",
            f"""
-- The exports: readable records only, spec section 2's columns (bad records are the
-- reader's business and out of the peer's scope).
CREATE VIEW half_export AS SELECT * FROM read_parquet({_files(folders, HALF_FILE)});
CREATE VIEW op_export AS SELECT * FROM read_parquet({_files(folders, OP_FILE)});
CREATE VIEW committed AS
    SELECT * FROM read_parquet({_files(folders, COMMITTED_FILE)}) WHERE topic IN ({HALF}, {OP});
""",
        ),
        (
            "macros",
            f"""
-- Numbers in bodies and properties are parsed like Java's Long.parseLong / Integer.parseInt
-- (spec section 4): optional sign, ASCII digits only, in range. DuckDB's cast alone is more
-- lenient (' 5', '1e3', '0x10' and '1_000' all cast), so the pattern guards it; TRY_CAST
-- then gives NULL for values out of range. regexp_full_match anchors the whole string.
CREATE MACRO java_long(text) AS
    CASE WHEN regexp_full_match(text, '[+-]?[0-9]+') THEN TRY_CAST(text AS BIGINT) END;
CREATE MACRO java_int(text) AS
    CASE WHEN regexp_full_match(text, '[+-]?[0-9]+') THEN TRY_CAST(text AS INTEGER) END;
-- A property with an empty value does not exist (spec section 2). map_extract_value gives
-- the value or NULL for a missing key (map_extract, and m[k] in older DuckDB versions, give
-- a list instead).
CREATE MACRO prop(properties, name) AS NULLIF(map_extract_value(properties, name), '');
-- The effective immunity (section 5): the property x 1000 when it parses, is not -1 and
-- the product fits in 64 bits; otherwise the transaction timeout (also when absent).
CREATE MACRO effective_immunity_ms(raw) AS
    CASE WHEN java_long(raw) <> {NO_IMMUNITY}
          AND java_long(raw) BETWEEN -{MAX_IMMUNITY_SECONDS} AND {MAX_IMMUNITY_SECONDS}
         THEN java_long(raw) * 1000
         ELSE CAST({timeout} AS BIGINT) END;
""",
        ),
        (
            "half_records",
            f"""
-- Half records with the fields derived from their properties (section 2). Of several
-- records at one queue offset the one with the smallest commitlog_offset is used (section
-- 7; the job breaks ties by source, then position, and keeps one of byte-identical
-- copies). Settled among all readable records, before the as-of cut: every winner counts
-- for the queue's bounds, only those stored before T for the round.
CREATE TABLE half_records AS
SELECT broker, queue_id, queue_offset, commitlog_offset, born_timestamp_ms, store_timestamp_ms,
       prop(properties, {_literal(PROP_UNIQ_KEY)}) AS uniq_key,
       prop(properties, {_literal(PROP_PRODUCER_GROUP)}) AS producer_group,
       prop(properties, {_literal(PROP_REAL_TOPIC)}) AS real_topic,
       java_int(prop(properties, {_literal(PROP_REAL_QUEUE_ID)})) AS real_queue_id,
       -- An unparsable counter counts as absent (section 5).
       java_int(prop(properties, {_literal(PROP_CHECK_TIMES)})) AS check_times,
       prop(properties, {_literal(PROP_IMMUNITY_SECONDS)}) AS immunity_raw,
       java_long(prop(properties, {_literal(PROP_PREPARED_QUEUE_OFFSET)})) AS prepared_queue_offset
FROM half_export
QUALIFY row_number() OVER (
    PARTITION BY broker, queue_id, queue_offset ORDER BY commitlog_offset, source, position) = 1;
""",
        ),
        (
            "op_records",
            """
-- Op records, deduplicated the same way.
CREATE TABLE op_records AS
SELECT broker, queue_id, queue_offset, store_timestamp_ms, tags, body
FROM op_export
QUALIFY row_number() OVER (
    PARTITION BY broker, queue_id, queue_offset ORDER BY commitlog_offset, source, position) = 1;
""",
        ),
        (
            "queues",
            f"""
-- Section 1, per queue of each topic: the smallest available offset (any store time) and
-- the end at T (1 + the largest offset stored before T, else the smallest available).
CREATE TABLE queue_bounds AS
SELECT broker, topic, queue_id,
       min(queue_offset) AS smallest,
       coalesce(max(queue_offset) FILTER (WHERE store_timestamp_ms < {T}) + 1,
                min(queue_offset)) AS queue_end
FROM (SELECT broker, {HALF} AS topic, queue_id, queue_offset, store_timestamp_ms FROM half_records
      UNION ALL
      SELECT broker, {OP} AS topic, queue_id, queue_offset, store_timestamp_ms FROM op_records)
GROUP BY ALL;

-- Where each queue's round starts: the committed offset, corrected by what the queue holds.
-- The domain is every (broker, queue_id) with records or a committed offset of either topic;
-- a queue with no readable record keeps its committed offset (0 when missing) and its end
-- is its start (nothing is left to read).
CREATE TABLE queues AS
WITH domain AS (
    SELECT broker, queue_id FROM queue_bounds
    UNION
    SELECT broker, queue_id FROM committed
),
per_topic AS (
    SELECT d.broker, t.topic, d.queue_id, c."offset" AS committed, b.smallest, b.queue_end
    FROM domain d
    CROSS JOIN (VALUES ({HALF}), ({OP})) t(topic)
    LEFT JOIN queue_bounds b USING (broker, topic, queue_id)
    LEFT JOIN committed c USING (broker, topic, queue_id)
),
started AS (
    SELECT *,
           CASE WHEN smallest IS NULL THEN coalesce(committed, 0)
                WHEN committed IS NULL THEN smallest
                WHEN committed < smallest THEN smallest
                WHEN committed > queue_end THEN queue_end
                ELSE committed END AS start
    FROM per_topic
)
SELECT broker, queue_id,
       max(committed) FILTER (WHERE topic = {HALF}) AS h_committed,
       max(start) FILTER (WHERE topic = {HALF}) AS h0,
       max(coalesce(queue_end, start)) FILTER (WHERE topic = {HALF}) AS half_end,
       max(committed) FILTER (WHERE topic = {OP}) AS p_committed,
       max(start) FILTER (WHERE topic = {OP}) AS p0,
       max(coalesce(queue_end, start)) FILTER (WHERE topic = {OP}) AS op_end
FROM started
GROUP BY ALL;
""",
        ),
        (
            "op_items",
            f"""
-- Section 3: the items of every 'd' op record stored before T (all of them, not only those
-- at or after p0). The body is split on ',' as bytes: CAST(BLOB AS VARCHAR) keeps printable
-- ASCII as it is and writes every other byte as a \\xNN escape, so an item with a non-ASCII
-- or invalid UTF-8 byte is unparsable - as in the job, which decodes invalid bytes to
-- U+FFFD - and a non-UTF-8 body cannot fail the run. Empty items are dropped; an
-- unparsable item (half_offset NULL) names nothing.
CREATE TABLE op_items AS
SELECT broker, queue_id, op_offset, java_long(item) AS half_offset
FROM (SELECT broker, queue_id, queue_offset AS op_offset,
             unnest(string_split(CAST(body AS VARCHAR), ',')) AS item
      FROM op_records
      WHERE store_timestamp_ms < {T} AND tags = {_literal(REMOVE_TAG)} AND body IS NOT NULL)
WHERE item <> '';
""",
        ),
        (
            "resolution",
            f"""
-- Only records stored before T exist for the round.
CREATE VIEW half_now AS SELECT * FROM half_records WHERE store_timestamp_ms < {T};
CREATE TABLE named AS
    SELECT DISTINCT broker, queue_id, half_offset FROM op_items WHERE half_offset IS NOT NULL;

-- Section 4, rules 1 and 2: the record's own offset, or the offset of the original it is an
-- immunity copy of (TRAN_PREPARED_QUEUE_OFFSET), is named.
CREATE TABLE resolved_directly AS
SELECT h.broker, h.queue_id, h.queue_offset, h.uniq_key
FROM half_now h
SEMI JOIN named n
    ON n.broker = h.broker AND n.queue_id = h.queue_id AND n.half_offset = h.queue_offset
UNION
SELECT h.broker, h.queue_id, h.queue_offset, h.uniq_key
FROM half_now h
SEMI JOIN named n
    ON n.broker = h.broker AND n.queue_id = h.queue_id AND n.half_offset = h.prepared_queue_offset;

-- Rule 3: a record sharing its UNIQ_KEY with one resolved by rule 1 or 2 in the same half
-- queue, at any offset (below h0 included). A record without UNIQ_KEY is its own
-- transaction: a NULL key matches nothing.
CREATE TABLE unresolved AS
SELECT h.*
FROM half_now h
ANTI JOIN resolved_directly r
    ON r.broker = h.broker AND r.queue_id = h.queue_id AND r.queue_offset = h.queue_offset
ANTI JOIN (SELECT DISTINCT broker, queue_id, uniq_key FROM resolved_directly) k
    ON k.broker = h.broker AND k.queue_id = h.queue_id AND k.uniq_key = h.uniq_key;
""",
        ),
        (
            "classes",
            f"""
-- Section 5: the first class of the table that applies, for every unresolved record from
-- h0 on. Ages are computed as HUGEINT: T - born can overflow a BIGINT for garbage born times
-- (the job compares in DECIMAL(21,0) for the same reason); age_ms is NULL when it does not
-- fit a long. NULL check_times never reaches check_max.
CREATE TABLE candidates AS
WITH aged AS (
    SELECT u.*,
           CAST({T} AS HUGEINT) - u.born_timestamp_ms AS age,
           effective_immunity_ms(u.immunity_raw) AS immunity_ms
    FROM unresolved u JOIN queues q USING (broker, queue_id)
    WHERE u.queue_offset >= q.h0
)
SELECT *,
       TRY_CAST(age AS BIGINT) AS age_ms,
       CASE WHEN check_times >= {check_max} THEN {_literal(DISCARD_CHECK_MAX)}
            WHEN age > {reserved_ms} THEN {_literal(DISCARD_EXPIRED)}
            WHEN immunity_raw IS NOT NULL AND age < immunity_ms THEN {_literal(IMMUNE)}
            -- born in the future (negative age) without immunity: checked, not too young
            WHEN immunity_raw IS NULL AND age >= 0 AND age < {timeout} THEN {_literal(TOO_YOUNG)}
            ELSE {_literal(CHECK)} END AS round_class
FROM aged;
""",
        ),
        (
            "pending",
            f"""
-- The stop rule: the walk from h0 stops at the first too_young record, so h1 is the
-- smallest too_young offset (else the end of the half queue at T); missing offsets are
-- simply absent. Before h1 a record keeps its class; after the stop it is not reached.
CREATE TABLE half_progress AS
SELECT q.*, s.stop_offset, coalesce(s.stop_offset, q.half_end) AS h1
FROM queues q
LEFT JOIN (SELECT broker, queue_id, min(queue_offset) AS stop_offset
           FROM candidates WHERE round_class = {_literal(TOO_YOUNG)}
           GROUP BY ALL) s USING (broker, queue_id);

-- Every unresolved record at offsets >= h0 with its status and the counter after this
-- round: check, immune and the expiry discard carry check_times + 1 (1 when absent); a
-- check-max discard, too_young and not_reached keep the stored value.
CREATE TABLE pending AS
WITH statused AS (
    SELECT c.*,
           CASE WHEN c.queue_offset < p.h1 THEN c.round_class
                WHEN c.queue_offset = p.stop_offset THEN {_literal(TOO_YOUNG)}
                ELSE {_literal(NOT_REACHED)} END AS status
    FROM candidates c JOIN half_progress p USING (broker, queue_id)
)
SELECT broker, queue_id, queue_offset AS half_offset, status,
       CASE WHEN status IN ({_literal(CHECK)}, {_literal(IMMUNE)}, {_literal(DISCARD_EXPIRED)})
            THEN TRY_CAST(coalesce(check_times, 0)::BIGINT + 1 AS INTEGER)
            ELSE check_times END AS check_times,
       commitlog_offset, uniq_key, producer_group, real_topic, real_queue_id,
       born_timestamp_ms, store_timestamp_ms, age_ms, immunity_ms
FROM statused;
""",
        ),
        (
            "half_offsets",
            f"""
-- h_safe: min(h1, the smallest unresolved offset in [h0, h1), whatever its class: discards
-- bound it too, spec 2026-11-23). resolved = the records stored before T in [h0, h1) that are not unresolved there.
CREATE TABLE half_summary AS
WITH per_status AS (
    SELECT broker, queue_id,
           {", ".join(f'count(*) FILTER (WHERE status = {_literal(name)}) AS "{name}"' for name in CLASSES[1:])},
           min(half_offset) FILTER (WHERE status IN ({_literal(CHECK)}, {_literal(IMMUNE)}, {_literal(DISCARD_CHECK_MAX)}, {_literal(DISCARD_EXPIRED)})) AS first_unresolved
    FROM pending
    GROUP BY ALL
),
in_window AS (
    SELECT h.broker, h.queue_id, count(*) AS records
    FROM half_now h JOIN half_progress p USING (broker, queue_id)
    WHERE h.queue_offset >= p.h0 AND h.queue_offset < p.h1
    GROUP BY ALL
)
SELECT p.*, least(p.h1, s.first_unresolved) AS h_safe,
       coalesce(w.records, 0) - coalesce(s."check" + s.immune + s.discard_check_max + s.discard_expired, 0) AS resolved,
       {", ".join(f'coalesce(s."{name}", 0) AS "{name}"' for name in CLASSES[1:])}
FROM half_progress p
LEFT JOIN per_status s USING (broker, queue_id)
LEFT JOIN in_window w USING (broker, queue_id);
""",
        ),
        (
            "op_offsets",
            f"""
-- p1: the first op offset >= p0 that is missing or not done, else the end of the op queue.
-- An op record is done when every item >= h0 it names is < h1; as h1 >= h0 that is exactly
-- "its largest item < h1" (a record naming nothing is done). p_safe: the same with h_safe.
CREATE TABLE op_progress AS
WITH ops_ahead AS (
    SELECT o.broker, o.queue_id, o.queue_offset
    FROM op_records o JOIN half_summary q USING (broker, queue_id)
    WHERE o.store_timestamp_ms < {T} AND o.queue_offset >= q.p0
),
largest_named AS (
    SELECT broker, queue_id, op_offset AS queue_offset, max(half_offset) AS max_named
    FROM op_items WHERE half_offset IS NOT NULL
    GROUP BY ALL
),
not_done AS (
    SELECT a.broker, a.queue_id,
           min(a.queue_offset) FILTER (WHERE l.max_named >= q.h1) AS first_not_done,
           min(a.queue_offset) FILTER (WHERE l.max_named >= q.h_safe) AS first_not_done_safe
    FROM ops_ahead a
    JOIN largest_named l USING (broker, queue_id, queue_offset)
    JOIN half_summary q USING (broker, queue_id)
    GROUP BY ALL
),
-- The first offset in [p0, op_end) without a record: p0 itself or the successor of a
-- present record.
gap_candidates AS (
    SELECT broker, queue_id, p0 AS queue_offset FROM half_summary
    UNION
    SELECT broker, queue_id, queue_offset + 1 FROM ops_ahead
),
first_missing AS (
    SELECT g.broker, g.queue_id, min(g.queue_offset) AS first_missing
    FROM gap_candidates g
    JOIN half_summary q ON q.broker = g.broker AND q.queue_id = g.queue_id
    ANTI JOIN ops_ahead a
        ON a.broker = g.broker AND a.queue_id = g.queue_id AND a.queue_offset = g.queue_offset
    WHERE g.queue_offset < q.op_end
    GROUP BY ALL
)
SELECT q.broker, q.queue_id,
       least(m.first_missing, d.first_not_done, q.op_end) AS p1,
       least(m.first_missing, d.first_not_done_safe, q.op_end) AS p_safe
FROM half_summary q
LEFT JOIN not_done d USING (broker, queue_id)
LEFT JOIN first_missing m USING (broker, queue_id);
""",
        ),
        (
            "summary",
            f"""
-- One row per queue of the domain: run_summary's round columns.
CREATE TABLE summary AS
SELECT q.broker, q.queue_id, q.h_committed, q.h0, q.h1, q.h_safe,
       q.p_committed, q.p0, o.p1, o.p_safe,
       {", ".join(f'q."{name}"' for name in CLASSES)}
FROM half_summary q JOIN op_progress o USING (broker, queue_id);

-- consume_offsets: one row per topic of every queue of the domain.
CREATE TABLE consume_offsets AS
SELECT broker, {HALF} AS topic, queue_id, {_literal(TRANS_GROUP)} AS "group",
       h_committed AS offset_committed, h0 AS offset_before, h1 AS offset_after, h_safe AS offset_safe
FROM summary
UNION ALL
SELECT broker, {OP} AS topic, queue_id, {_literal(TRANS_GROUP)} AS "group",
       p_committed, p0, p1, p_safe
FROM summary;
""",
        ),
    ]


def run_round(
    folders: list[Path],
    as_of_ms: int,
    threads: int = 2,
    *,
    check_max: int = 15,
    transaction_timeout_ms: int = 6000,
    file_reserved_hours: int = 72,
    memory_limit: str = "4GB",
    temp_directory: Path | None = None,
) -> dict[str, Any]:
    """The round in an in-memory DuckDB database over export folders (the SQL part only).

    Returns ``seconds`` (wall: connect, every statement, fetching the results),
    ``statements`` (seconds per named statement), ``pending``, ``summary`` and
    ``consume_offsets`` (Arrow tables; see :func:`run_peer`), ``as_of_ms``, ``params`` and
    ``duckdb_version``.
    """
    import duckdb

    statements = round_statements(
        folders, as_of_ms, check_max, transaction_timeout_ms, file_reserved_hours
    )
    timings: dict[str, float] = {}
    started = time.perf_counter()
    connection = duckdb.connect(":memory:")
    try:
        connection.execute(f"SET threads = {int(threads)}")
        connection.execute(f"SET memory_limit = {_literal(memory_limit)}")
        if temp_directory is not None:
            connection.execute(f"SET temp_directory = {_literal(str(temp_directory))}")
        # Results are sorted explicitly; intermediate tables need no order.
        connection.execute("SET preserve_insertion_order = false")
        for name, sql in statements:
            step = time.perf_counter()
            connection.execute(sql)
            timings[name] = round(time.perf_counter() - step, 3)
        step = time.perf_counter()
        pending = connection.sql(
            f"SELECT {', '.join(PENDING_COLUMNS)} FROM pending ORDER BY broker, queue_id, half_offset"
        ).to_arrow_table()
        summary = connection.sql("SELECT * FROM summary ORDER BY broker, queue_id").to_arrow_table()
        offsets = connection.sql(
            "SELECT * FROM consume_offsets ORDER BY broker, queue_id, topic"
        ).to_arrow_table()
        timings["fetch"] = round(time.perf_counter() - step, 3)
    finally:
        connection.close()
    return {
        "seconds": round(time.perf_counter() - started, 3),
        "statements": timings,
        "pending": pending,
        "summary": summary,
        "consume_offsets": offsets,
        "as_of_ms": int(as_of_ms),
        "params": {
            "check_max": check_max,
            "transaction_timeout_ms": transaction_timeout_ms,
            "file_reserved_hours": file_reserved_hours,
            "threads": threads,
        },
        "duckdb_version": duckdb.__version__,
    }


def run_peer(
    stores: Mapping[str, Path],
    cache_dir: Path,
    as_of_ms: int,
    threads: int = 2,
    *,
    check_max: int = 15,
    transaction_timeout_ms: int = 6000,
    file_reserved_hours: int = 72,
    memory_limit: str = "4GB",
) -> dict[str, Any]:
    """Run the round in DuckDB over the exports of :func:`prepare` (called here too; it
    reuses the cache, and its time is never part of the SQL timing).

    Args:
        stores: broker name -> store directory (as for :func:`prepare`).
        cache_dir: the exports' folder.
        as_of_ms: T.
        threads: DuckDB threads (``SET threads``).
        check_max, transaction_timeout_ms, file_reserved_hours: as in conf/default.toml.
        memory_limit: DuckDB's memory limit (other processes share the machine); beyond it
            DuckDB spills to ``cache_dir/duckdb-tmp``.

    Returns:
        ``seconds``: wall seconds of the SQL part (connect, every statement, fetching the
        results); ``statements``: seconds per named statement; ``pending`` (Arrow table,
        ``PENDING_COLUMNS``, one row per unresolved half record at offsets >= h0, sorted);
        ``summary`` (Arrow: broker, queue_id, h_committed, h0, h1, h_safe, p_committed, p0,
        p1, p_safe and one count per class); ``consume_offsets`` (Arrow, the job's columns
        less run_id/as_of_ms); ``as_of_ms``; ``params``; ``duckdb_version``; ``export``
        (the result of :func:`prepare`).
    """
    export = prepare(stores, cache_dir)
    folders = [Path(store["folder"]) for store in export["stores"].values()]
    result = run_round(
        folders,
        as_of_ms,
        threads,
        check_max=check_max,
        transaction_timeout_ms=transaction_timeout_ms,
        file_reserved_hours=file_reserved_hours,
        memory_limit=memory_limit,
        temp_directory=Path(cache_dir) / "duckdb-tmp",
    )
    return {**result, "export": export}


# --- comparison with the job's output ------------------------------------------------------------------


def _read_delta(path: Path, run_id: str | None = None) -> pa.Table:
    import pyarrow.fs
    from deltalake import DeltaTable

    # The explicit filesystem avoids deltalake's abort-at-exit with its own object store.
    filesystem = pyarrow.fs.SubTreeFileSystem(str(path), pyarrow.fs.LocalFileSystem())
    filters = [("run_id", "=", run_id)] if run_id is not None else None
    return DeltaTable(str(path)).to_pyarrow_table(filters=filters, filesystem=filesystem)


def newest_run(output_dir: Path) -> tuple[str, int]:
    """(run_id, as_of_ms) of the run_summary row written last."""
    summary = _read_delta(Path(output_dir) / "run_summary").select(
        ["run_id", "as_of_ms", "written_at_ms"]
    )
    if summary.num_rows == 0:
        raise ValueError(f"{output_dir}/run_summary has no row")
    newest = summary.sort_by([("written_at_ms", "descending")]).slice(0, 1).to_pylist()[0]
    return newest["run_id"], newest["as_of_ms"]


def _differences(
    connection: Any,
    table: str,
    ours: pa.Table,
    peer: pa.Table,
    keys: tuple[str, ...],
    columns: tuple[str, ...],
    limit: int,
) -> list[str]:
    """Rows present on one side only and rows whose columns differ (NULL-safe), as text.
    Runs in DuckDB: the tables can hold millions of rows."""
    connection.register("ours", ours.select([*keys, *columns]))
    connection.register("peer", peer.select([*keys, *columns]))

    def q(name: str) -> str:  # quoted: "group" and "check" are SQL keywords
        return '"' + name + '"'

    first = q(keys[0])
    on = " AND ".join(f"o.{q(k)} IS NOT DISTINCT FROM p.{q(k)}" for k in keys)
    differs = " OR ".join(f"o.{q(c)} IS DISTINCT FROM p.{q(c)}" for c in columns) or "FALSE"
    key_text = " || ' ' || ".join(
        f"coalesce(CAST(coalesce(o.{q(k)}, p.{q(k)}) AS VARCHAR), 'NULL')" for k in keys
    )
    values = ", ".join(f"o.{q(c)}, p.{q(c)}" for c in columns) or "NULL"
    query = f"""
        SELECT {key_text} AS key, o.{first} IS NULL AS only_peer, p.{first} IS NULL AS only_ours,
               {values}
        FROM ours o FULL OUTER JOIN peer p ON {on}
        WHERE o.{first} IS NULL OR p.{first} IS NULL OR {differs}
        ORDER BY key
    """
    rows = connection.execute(query).fetchall()
    connection.unregister("ours")
    connection.unregister("peer")
    found: list[str] = []
    for row in rows[:limit]:
        key, only_peer, only_ours, *values = row
        if only_ours:
            found.append(f"{table} [{key}]: in our output only")
        elif only_peer:
            found.append(f"{table} [{key}]: in the peer's result only")
        else:
            pairs = [
                f"{c} ours={values[2 * i]!r} peer={values[2 * i + 1]!r}"
                for i, c in enumerate(columns)
                if values[2 * i] != values[2 * i + 1]
            ]
            found.append(f"{table} [{key}]: " + ", ".join(pairs))
    if len(rows) > limit:
        found.append(
            f"{table}: {len(rows) - limit} more difference(s) not shown ({len(rows)} in all)"
        )
    return found


def compare(
    peer_result: Mapping[str, Any],
    output_dir: Path,
    run_id: str | None = None,
    limit: int = 20,
) -> list[str]:
    """Differences between the peer's round and the job's Delta output (empty: equal).

    Compares one run: ``run_id``, else the newest run_summary row's. Checked: ``pending``
    (every column but offset_msg_id and body), ``check_requests`` and ``discards`` (keys,
    counter, reason), ``consume_offsets`` (all offsets) and ``run_summary`` (h0 ... p_safe
    and the class counts; rows with h0 NULL are bad-record-only rows and out of scope, as
    are bad_records and warnings). At most ``limit`` examples per table are listed.
    """
    import duckdb

    output_dir = Path(output_dir)
    found: list[str] = []
    if run_id is None:
        run_id, as_of_ms = newest_run(output_dir)
    else:
        summary = _read_delta(output_dir / "run_summary", run_id)
        if summary.num_rows == 0:
            return [f"run_summary has no row of run {run_id!r}"]
        as_of_ms = summary.column("as_of_ms")[0].as_py()
    if as_of_ms != peer_result["as_of_ms"]:
        found.append(
            f"as_of_ms: our run {run_id} is as of {as_of_ms}, the peer's {peer_result['as_of_ms']}"
        )

    ours = {
        name: _read_delta(output_dir / name, run_id)
        for name in ("pending", "check_requests", "discards", "consume_offsets", "run_summary")
    }
    peer_pending: pa.Table = peer_result["pending"]
    connection = duckdb.connect(":memory:")
    try:
        half_key = ("broker", "queue_id", "half_offset")
        found += _differences(
            connection,
            "pending",
            ours["pending"],
            peer_pending,
            half_key,
            tuple(c for c in PENDING_COLUMNS if c not in half_key),
            limit,
        )
        peer_checks = peer_pending.filter(pc.equal(peer_pending.column("status"), CHECK))
        found += _differences(
            connection,
            "check_requests",
            ours["check_requests"],
            peer_checks,
            half_key,
            ("check_times",),
            limit,
        )
        discarded = pc.is_in(
            peer_pending.column("status"), pa.array([DISCARD_CHECK_MAX, DISCARD_EXPIRED])
        )
        peer_discards = peer_pending.filter(discarded)
        reason = pc.if_else(
            pc.equal(peer_discards.column("status"), DISCARD_CHECK_MAX),
            REASON_CHECK_MAX,
            REASON_EXPIRED,
        )
        found += _differences(
            connection,
            "discards",
            ours["discards"],
            peer_discards.append_column("reason", reason),
            half_key,
            ("check_times", "reason"),
            limit,
        )
        found += _differences(
            connection,
            "consume_offsets",
            ours["consume_offsets"],
            peer_result["consume_offsets"],
            ("broker", "topic", "queue_id"),
            ("group", *OFFSET_COLUMNS),
            limit,
        )
        summary = ours["run_summary"]
        summary = summary.filter(pc.is_valid(summary.column("h0")))
        found += _differences(
            connection,
            "run_summary",
            summary,
            peer_result["summary"],
            ("broker", "queue_id"),
            SUMMARY_COLUMNS[2:],
            limit,
        )
    finally:
        connection.close()
    return found


# --- command line ----------------------------------------------------------------------------------


def _store_arg(text: str) -> tuple[str, Path]:
    name, sep, directory = text.partition("=")
    if not sep or not name or not directory:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIR")
    return name, Path(directory).expanduser()


def _describe(result: Mapping[str, Any]) -> Iterator[str]:
    export = result["export"]
    state = "reused" if export["reused"] else f"{export['export_seconds']:.1f} s of export"
    yield (
        f"export: {export['rows']} records, {export['bytes'] / 2**20:.1f} MiB of Parquet ({state}; "
        f"prepare took {export['seconds']:.1f} s)"
    )
    for broker, store in export["stores"].items():
        yield (
            f"  {broker}: {store['half_rows']} half, {store['op_rows']} op records, "
            f"{store['reader_bad_records']} bad records left out; {store['folder']}"
        )
    yield f"duckdb {result['duckdb_version']}: round in {result['seconds']:.2f} s"
    for name, seconds in result["statements"].items():
        yield f"  {name:<14} {seconds:8.3f} s"
    for row in result["summary"].to_pylist():
        counts = ", ".join(f"{name} {row[name]}" for name in CLASSES)
        yield (
            f"{row['broker']} queue {row['queue_id']}: h0 {row['h0']} h1 {row['h1']} h_safe {row['h_safe']}"
            f" | p0 {row['p0']} p1 {row['p1']} p_safe {row['p_safe']} | {counts}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.duckdb_peer", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--store", action="append", type=_store_arg, required=True, metavar="NAME=DIR"
    )
    parser.add_argument("--cache", type=Path, required=True, help="folder of the Parquet exports")
    parser.add_argument("--as-of", type=int, required=True, help="T, epoch ms")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-limit", default="4GB")
    parser.add_argument("--check-max", type=int, default=15)
    parser.add_argument("--transaction-timeout-ms", type=int, default=6000)
    parser.add_argument("--file-reserved-hours", type=int, default=72)
    parser.add_argument("--compare", type=Path, metavar="OUTPUT_DIR", help="the job's output root")
    parser.add_argument("--run-id", help="the run to compare with (default: the newest)")
    args = parser.parse_args(argv)
    stores = dict(args.store)
    if len(stores) != len(args.store):
        parser.error("a broker name is given twice")
    result = run_peer(
        stores,
        args.cache,
        args.as_of,
        args.threads,
        check_max=args.check_max,
        transaction_timeout_ms=args.transaction_timeout_ms,
        file_reserved_hours=args.file_reserved_hours,
        memory_limit=args.memory_limit,
    )
    for line in _describe(result):
        print(line)
    if args.compare is None:
        return 0
    differences = compare(result, args.compare, args.run_id)
    if not differences:
        print(f"compare: equal to the job's output in {args.compare}")
        return 0
    print(f"compare: {len(differences)} difference line(s) with {args.compare}:")
    for line in differences:
        print(f"  {line}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
