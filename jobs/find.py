"""Find a transaction in an output root (spec section 9, ``find``):

    rmq-txn-reconcile find --output OUT KEY...
    python -m jobs.find --output OUT KEY...

A KEY is a business key (one of ``keys``), a transaction id (``transaction_id``) or a unique
key (``uniq_key``). Every row of the latest run of each broker (``run_summary``: the largest
``as_of_ms``, ties to the larger ``run_id``) in ``check_requests``, ``discards``, ``pending``
and ``anomalies`` (by the ``uniq_key`` of the key or of the rows found), and every
``discard_history`` row, that matches a key is printed, one line each.

The tables are read with deltalake on the driver, scanned batch by batch with the latest
runs pushed down (partition pruning on ``run_id``): a lookup needs no Spark. Spark starts
only for a key found in no table, to read the half records of the store the latest run read
(``run_summary.inputs``) and say whether the store shows it resolved, or holds no such
record (never seen, or beyond retention).

Exit codes (docs/decisions.md): 0 every key has a row, 1 some key has none, 2 bad input.
"""

from __future__ import annotations

import argparse
import functools
import operator
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from connectors.delta_commit import local_root
from connectors.delta_read import arrow_dataset
from connectors.errors import InputError
from jobs.find_store import NO_ANSWER, StoreAnswer, search_stores
from schemas.outputs import (
    ANOMALIES_TABLE,
    CHECK_REQUESTS_TABLE,
    DISCARD_HISTORY_TABLE,
    DISCARDS_TABLE,
    PENDING_TABLE,
    RUN_SUMMARY_TABLE,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXIT_FOUND, EXIT_NOT_FOUND, EXIT_BAD_INPUT = 0, 1, 2
# The tables of a run, in the order their rows are printed; discard_history is not per run.
RUN_TABLES = (CHECK_REQUESTS_TABLE, DISCARDS_TABLE, PENDING_TABLE)
STORE_INPUT = "store:"  # run_summary.inputs names a store as store:NAME=DIR

# What a row shows after its place: (label, column, how), ``iso`` for epoch ms.
_HALF_SHOWN = (
    ("status", "status", str),
    ("reason", "reason", str),
    ("check_times", "check_times", str),
    ("checks_left", "checks_left", str),
    ("born", "born_timestamp_ms", "iso"),
    ("stored", "store_timestamp_ms", "iso"),
    ("discard_at", "discard_at_ms", "iso"),
    ("pending_since", "pending_since_ms", "iso"),
    ("group", "producer_group", str),
    ("topic", "real_topic", str),
)
_HISTORY_SHOWN = (
    ("outcome", "outcome", str),
    ("reason", "reason", str),
    ("check_times", "check_times", str),
    ("born", "born_timestamp_ms", "iso"),
    ("discarded", "discarded_at_ms", "iso"),
    ("resume_futile", "resume_futile", str),
    ("group", "producer_group", str),
    ("topic", "real_topic", str),
)
_ANOMALY_SHOWN = (("kind", "kind", str), ("severity", "severity", str))
_LABEL_WIDTH = len(DISCARD_HISTORY_TABLE)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit code 2
        raise InputError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rmq-txn-reconcile find",
        description="Every row of the latest run of each broker that names a transaction,"
        " and for a key found in none, whether the store shows it resolved or never seen."
        " Exit codes: 0 every key found, 1 some key in no table, 2 bad input.",
        epilog="example: rmq-txn-reconcile find --output sample/output ORD100018142",
    )
    parser.add_argument(
        "--output", required=True, metavar="OUT", help="the job's output root (its --output)"
    )
    parser.add_argument(
        "keys", nargs="+", metavar="KEY", help="business key, transaction id or unique key"
    )
    return parser


def iso(ms: int | None) -> str:
    """Epoch ms as an ISO-8601 UTC instant, ``2025-06-15T15:06:39.662Z``."""
    if ms is None:
        return "-"
    try:  # whole milliseconds, no float: 1749999999662 is .662, never .661
        instant = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:  # a garbage time beyond the years 1-9999: the number as it is
        return str(ms)
    return instant.strftime("%Y-%m-%dT%H:%M:%S.") + f"{instant.microsecond // 1000:03d}Z"


# -- the latest run of each broker ------------------------------------------------------------


@dataclass(frozen=True)
class LatestRun:
    broker: str
    run_id: str
    as_of_ms: int
    store: str | None  # the store directory the run read for the broker; None: exports


def store_of(broker: str, inputs: Sequence[str] | None) -> str | None:
    """The broker's store directory among a run's ``inputs`` (``store:NAME=DIR``)."""
    prefix = f"{STORE_INPUT}{broker}="
    return next((i[len(prefix) :] for i in inputs or () if i.startswith(prefix)), None)


def latest_runs(summary: pa.Table) -> list[LatestRun]:
    """The latest run of each broker in ``run_summary`` rows (at least ``broker, run_id,
    as_of_ms, inputs``): the largest ``as_of_ms``, ties to the larger ``run_id``."""
    keyed = summary.select(["broker", "run_id", "as_of_ms"])
    newest = keyed.group_by("broker").aggregate([("as_of_ms", "max")])
    at_newest = keyed.join(newest, "broker").filter(
        pc.field("as_of_ms") == pc.field("as_of_ms_max")
    )
    chosen = at_newest.group_by(["broker", "as_of_ms"]).aggregate([("run_id", "max")])
    runs = []
    for row in chosen.sort_by("broker").to_pylist():  # one row per broker
        same_run = (pc.field("broker") == row["broker"]) & (pc.field("run_id") == row["run_id_max"])
        inputs = summary.filter(same_run).column("inputs")[0].as_py()  # its first queue row
        store = store_of(row["broker"], inputs)
        runs.append(LatestRun(row["broker"], row["run_id_max"], row["as_of_ms"], store))
    return runs


def of_latest_runs(runs: Sequence[LatestRun]) -> ds.Expression:
    """Rows of the latest run of their broker; ``run_id`` alone prunes the partitions."""
    pairs = [(pc.field("broker") == r.broker) & (pc.field("run_id") == r.run_id) for r in runs]
    run_ids = pc.field("run_id").isin(sorted({r.run_id for r in runs}))
    return run_ids & functools.reduce(operator.or_, pairs)


# -- searching the tables ---------------------------------------------------------------------


def search_mask(batch: pa.RecordBatch, keys: pa.Array) -> pa.Array:
    """True for the rows whose ``uniq_key``, ``transaction_id`` or one of ``keys`` (those of
    the three columns the batch has) is one of ``keys``."""
    mask = np.zeros(batch.num_rows, dtype=bool)
    for name in ("uniq_key", "transaction_id"):
        if name in batch.schema.names:
            hit = pc.fill_null(pc.is_in(batch.column(name), value_set=keys), False)
            mask |= hit.to_numpy(zero_copy_only=False)
    if "keys" in batch.schema.names:
        lists = batch.column("keys")
        hit = pc.fill_null(pc.is_in(pc.list_flatten(lists), value_set=keys), False)
        mask[pc.list_parent_indices(lists).filter(hit).to_numpy()] = True
    return pa.array(mask)


def matching_rows(
    dataset: ds.Dataset, keys: Sequence[str], where: ds.Expression | None = None
) -> Iterator[dict[str, Any]]:
    """The rows of ``dataset`` (``where`` pushed down) that ``search_mask`` keeps, streamed
    batch by batch; ``body`` is never read."""
    columns = [name for name in dataset.schema.names if name != "body"]
    value_set = pa.array(sorted(set(keys)), pa.string())
    for batch in dataset.scanner(filter=where, columns=columns).to_batches():
        yield from batch.filter(search_mask(batch, value_set)).to_pylist()  # the keys' rows


def keys_of(row: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """The given keys a row matches."""
    values = {row.get("uniq_key"), row.get("transaction_id"), *(row.get("keys") or ())}
    return [key for key in keys if key in values]


@dataclass(frozen=True)
class Found:
    """Per key, the (table, row) pairs found, in print order; ``notes`` on missing tables."""

    rows: dict[str, list[tuple[str, dict[str, Any]]]]
    notes: list[str]


def _dataset(root: str, table: str, notes: list[str]) -> ds.Dataset | None:
    dataset = arrow_dataset(f"{root}/{table}")
    if dataset is None:
        notes.append(f"note: {root} has no {table} table")
    return dataset


def search_tables(root: str, runs: Sequence[LatestRun], keys: Sequence[str]) -> Found:
    """Every row naming a key: the latest runs' rows of ``RUN_TABLES``, every
    ``discard_history`` row, then the latest runs' ``anomalies`` of the keys and of the
    ``uniq_key`` of every row found."""
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {key: [] for key in keys}
    notes: list[str] = []
    latest = of_latest_runs(runs)
    for table, where in [*[(t, latest) for t in RUN_TABLES], (DISCARD_HISTORY_TABLE, None)]:
        dataset = _dataset(root, table, notes)
        for row in matching_rows(dataset, keys, where) if dataset is not None else ():
            for key in keys_of(row, keys):
                found[key].append((table, row))
    # anomalies have no keys or transaction id: a key reaches them through its rows' uniq_key
    via = {
        key: {key} | {row["uniq_key"] for _, row in found[key] if row["uniq_key"]} for key in keys
    }
    dataset = _dataset(root, ANOMALIES_TABLE, notes)
    wanted = sorted(set().union(*via.values()))
    for row in matching_rows(dataset, wanted, latest) if dataset is not None else ():
        for key in keys:
            if row["uniq_key"] in via[key]:
                found[key].append((ANOMALIES_TABLE, row))
    return Found(found, notes)


# -- printing ---------------------------------------------------------------------------------


def _values(row: dict[str, Any], shown: Sequence[tuple[str, str, Any]]) -> list[str]:
    parts = []
    for label, column, how in shown:
        value = row.get(column)
        if value is not None:
            parts.append(f"{label}={iso(value) if how == 'iso' else how(value)}")
    return parts


def _identity(row: dict[str, Any]) -> list[str]:
    """What the transaction is searched by; the transaction id only when it is not the
    unique key (a producer usually sets the one to the other)."""
    parts = [f"uniq_key={row['uniq_key']}"] if row.get("uniq_key") else []
    if row.get("transaction_id") and row.get("transaction_id") != row.get("uniq_key"):
        parts.append(f"transaction_id={row['transaction_id']}")
    if row.get("keys"):
        parts.append(f"keys={','.join(row['keys'])}")
    if row.get("tags"):
        parts.append(f"tags={row['tags']}")
    return parts


def format_row(table: str, row: dict[str, Any]) -> str:
    """One compact line: table, broker, place, then what the row says."""
    if table == DISCARD_HISTORY_TABLE:
        place = f"discard_offset {row['discard_offset']}"
        parts = _values(row, _HISTORY_SHOWN) + _identity(row)
    elif table == ANOMALIES_TABLE:
        place = f"queue {row['queue_id']} half_offset {row['half_offset']}"
        parts = [*_values(row, _ANOMALY_SHOWN), *_identity(row), f"detail: {row['detail']}"]
    else:
        place = f"queue {row['queue_id']} half_offset {row['half_offset']}"
        parts = _values(row, _HALF_SHOWN) + _identity(row)
    return f"{table:<{_LABEL_WIDTH}}  {row['broker']}  {place}  " + "  ".join(parts)


def header_lines(runs: Sequence[LatestRun]) -> list[str]:
    return [
        f"latest run of {r.broker}: {r.run_id} as of {iso(r.as_of_ms)}"
        f" ({'store ' + r.store if r.store else 'exports'})"
        for r in runs
    ]


def _order(item: tuple[str, dict[str, Any]]) -> tuple:
    table, row = item
    tables = (*RUN_TABLES, DISCARD_HISTORY_TABLE, ANOMALIES_TABLE)
    place = row.get("discard_offset", row.get("half_offset"))
    return tables.index(table), row["broker"], row.get("queue_id") or 0, place or 0


def key_lines(
    key: str, rows: Sequence[tuple[str, dict[str, Any]]], answer: str | None
) -> list[str]:
    """A key's block: how many rows, then one line each; or why it is in no table."""
    if not rows:
        return [f"{key}: in no table: {answer}"]
    return [f"{key}: {len(rows)} row(s)"] + [
        f"  {format_row(table, row)}" for table, row in sorted(rows, key=_order)
    ]


# -- a key in no table: what the store shows ----------------------------------------------


def store_answer(key: str, runs: Sequence[LatestRun], answer: StoreAnswer) -> str:
    """Why a key is in no table: resolved, not reconciled yet, or not in the store."""
    as_of = {r.broker: r.as_of_ms for r in runs}
    for record in answer.records.get(key, []):  # the oldest half record of the key
        place = (
            f"uniq_key {record['uniq_key']} in the store of {record['broker']} at queue"
            f" {record['queue_id']} half offset {record['queue_offset']}, stored at"
            f" {iso(record['store_timestamp_ms'])}"
        )
        if record["store_timestamp_ms"] >= as_of[record["broker"]]:
            return f"not reconciled yet ({place}, after the latest run's T)"
        return f"resolved ({place}, not pending in the latest run)"
    parts = []
    if answer.oldest_ms:
        oldest = ", ".join(f"{b} {iso(ms)}" for b, ms in sorted(answer.oldest_ms.items()))
        parts.append(
            f"not in the store's retained half records (oldest retained: {oldest}):"
            " never seen, or beyond retention"
        )
    parts += [f"the store of {b} cannot be read ({why})" for b, why in answer.unreadable.items()]
    exports = [r.broker for r in runs if r.store is None]
    if exports:
        parts.append(
            f"the store cannot be checked (the latest run of {', '.join(exports)} read exports)"
        )
    return "; ".join(parts)


# -- the command --------------------------------------------------------------------------


def read_summary(root: str) -> pa.Table:
    """The columns of ``run_summary`` that say which runs there are; InputError when the
    output root holds no run."""
    folder = local_root(root)
    if folder is not None and not folder.is_dir():
        raise InputError(f"--output {root}: output root not found")
    dataset = arrow_dataset(f"{root}/{RUN_SUMMARY_TABLE}")
    if dataset is None:
        raise InputError(
            f"--output {root}: no {RUN_SUMMARY_TABLE} table (not an output root of this job)"
        )
    summary = dataset.to_table(columns=["broker", "run_id", "as_of_ms", "inputs"])
    if summary.num_rows == 0:
        raise InputError(f"--output {root}: no run written yet")
    return summary


def find(output: str, keys: Sequence[str], spark: SparkSession | None = None) -> int:
    """Print what the output root (and, for a key in no table, the store) holds of each key;
    the exit code (0 every key found in a table, 1 some key in none)."""
    root = output.rstrip("/") or "/"
    keys = list(dict.fromkeys(keys))
    if any(not key.strip() for key in keys):
        raise InputError("a KEY must not be empty")
    runs = latest_runs(read_summary(root))
    found = search_tables(root, runs, keys)
    missing = [key for key in keys if not found.rows[key]]
    stores = {r.broker: r.store for r in runs if r.store is not None}
    answer = NO_ANSWER
    if missing and stores:  # Spark only for a key in no table
        if spark is None:
            from jobs.session import build_session

            spark = build_session(app_name="rmq-txn-reconcile-find", master="local[*]")
        answer = search_stores(spark, stores, missing)
    lines = header_lines(runs) + found.notes
    for key in keys:
        lines += key_lines(key, found.rows[key], store_answer(key, runs, answer))
    print("\n".join(lines))
    return EXIT_NOT_FOUND if missing else EXIT_FOUND


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """``rmq-txn-reconcile find``: the exit code (0 found, 1 some key in no table, 2 bad
    input with one ``error:`` line; a failure while reading is one ``error:`` line and 1)."""
    try:
        args = build_parser().parse_args(argv)
        return find(args.output, args.keys, spark)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # a broken table or store, no Java for the store's read
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        print(f"error: {lines[0]}", file=sys.stderr)
        return EXIT_NOT_FOUND


if __name__ == "__main__":
    sys.exit(main())
