"""The one-pass output of the store reader's tasks: readable records and bad records in
batches of one combined schema (message columns plus ``reason``/``raw_hex``, null for a
readable record), the options a read runs with, and the collector that builds the batches.
No Spark here (``reader`` holds the Spark twins of the schemas)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.rocketmq import codec
from connectors.rocketmq.offset_filter import OffsetFilter
from schemas.messages import (
    OP_TOPIC,
    PROP_TRANSACTION_ID,
    PROP_UNIQ_KEY,
    PROPERTY_COLUMNS,
    UNUSED_BY_COMMITS,
    UNUSED_BY_ROUND,
)


def _combined_arrow(record_schema: pa.Schema, property_columns: Sequence[str] = ()) -> pa.Schema:
    """The Arrow twin of COMBINED / LEAN_COMBINED (``reader``): same columns, same order."""
    tail = {"position", *property_columns}
    return pa.schema(
        [
            ("broker", pa.string()),
            *[(f.name, f.type) for f in record_schema if f.name not in tail],
            ("source", pa.string()),
            ("position", pa.int64()),
            *[(name, pa.string()) for name in property_columns],
            ("reason", pa.string()),
            ("raw_hex", pa.string()),
        ]
    )


COMBINED_ARROW = _combined_arrow(codec.RECORD_SCHEMA)
LEAN_COMBINED_ARROW = _combined_arrow(
    codec.lean_record_schema(PROPERTY_COLUMNS, UNUSED_BY_ROUND), tuple(PROPERTY_COLUMNS.values())
)

COMMITS_COMBINED_ARROW = _combined_arrow(codec.lean_record_schema({}, UNUSED_BY_COMMITS))

# In the lean batches (what the job caches), a transaction id equal to the record's UNIQ_KEY
# travels as this value (a property value is never empty: ``fields._split_entries``); the
# reader puts UNIQ_KEY back (``reader.restored_transaction_id``). A producer sets the one to
# the other, so the cache holds one unique string per record instead of two.
SAME_AS_UNIQ_KEY = ""
TRANSACTION_ID, UNIQ_KEY = PROPERTY_COLUMNS[PROP_TRANSACTION_ID], PROPERTY_COLUMNS[PROP_UNIQ_KEY]


def shared_transaction_ids(table: pa.Table) -> pa.Array:
    """The table's transaction ids, ``SAME_AS_UNIQ_KEY`` where equal to its UNIQ_KEY."""
    ids = table.column(TRANSACTION_ID)
    same = pc.fill_null(pc.equal(ids, table.column(UNIQ_KEY)), False)
    return pc.if_else(same, SAME_AS_UNIQ_KEY, ids)


@dataclass(frozen=True)
class ReadOptions:
    verify_crc: bool = False
    body_topics: tuple[str, ...] | None = (OP_TOPIC,)  # None: every body
    lean: bool = False  # PROPERTY_COLUMNS instead of the properties map
    # Through consume queues, decode only committed transactional messages (and report
    # broken records), into COMMIT_MESSAGE's columns (no property, body or host: ``lean``
    # does not apply); the discard history reads real queues for their commits alone.
    commits_only: bool = False
    # With ``commits_only``, per broker: only the commits whose prepared-transaction offset
    # the broker's filter may hold are decoded (None: every commit). A broker without a
    # filter has no commit wanted.
    commit_filters: tuple[tuple[str, OffsetFilter], ...] | None = None

    def wanted_commits(self, broker: str, prepared: np.ndarray) -> np.ndarray:
        """A boolean per commit of ``broker``: its prepared-transaction offset may be
        wanted (``commit_filters``)."""
        if self.commit_filters is None:
            return np.ones(len(prepared), dtype=bool)
        found = dict(self.commit_filters).get(broker)
        if found is None:
            return np.zeros(len(prepared), dtype=bool)
        return found.might_contain(prepared)

    @property
    def property_columns(self) -> dict[str, str] | None:
        if self.commits_only:
            return {}
        return PROPERTY_COLUMNS if self.lean else None

    @property
    def drop_columns(self) -> tuple[str, ...]:
        # stored_size is decoded even so: the consume-queue entry check compares it.
        unused = UNUSED_BY_COMMITS if self.commits_only else UNUSED_BY_ROUND if self.lean else ()
        return tuple(c for c in unused if c != "stored_size")

    @property
    def arrow_schema(self) -> pa.Schema:
        if self.commits_only:
            return COMMITS_COMBINED_ARROW
        return LEAN_COMBINED_ARROW if self.lean else COMBINED_ARROW


def _repeat(value: str, n: int) -> pa.Array:
    return pa.array([value], pa.string()).take(pa.array(np.zeros(n, dtype=np.int64)))


class Out:
    """Collects bad rows of a unit and turns decoded record tables into combined batches."""

    def __init__(self, broker: str, schema: pa.Schema = COMBINED_ARROW) -> None:
        self.broker = broker
        self.schema = schema
        self.bad: list[dict] = []

    def add_bad(
        self,
        source: str,
        position: int,
        reason: str,
        raw: str,
        topic: str | None = None,
        queue_id: int | None = None,
        queue_offset: int | None = None,
    ) -> None:
        self.bad.append(
            {
                "broker": self.broker,
                "source": source,
                "position": int(position),
                "topic": topic,
                "queue_id": None if queue_id is None else int(queue_id),
                "queue_offset": None if queue_offset is None else int(queue_offset),
                "reason": reason,
                "raw_hex": raw,
            }
        )

    def records(self, table: pa.Table, source: str) -> Iterator[pa.RecordBatch]:
        if table.num_rows == 0:
            return
        n = table.num_rows
        columns = []
        for f in self.schema:
            if f.name == "broker":
                columns.append(_repeat(self.broker, n))
            elif f.name == "source":
                columns.append(_repeat(source, n))
            elif f.name in ("reason", "raw_hex"):
                columns.append(pa.nulls(n, pa.string()))
            elif f.name == TRANSACTION_ID:
                columns.append(shared_transaction_ids(table))
            else:
                columns.append(table.column(f.name))
        yield from pa.Table.from_arrays(columns, schema=self.schema).to_batches()

    def flush_bad(self) -> Iterator[pa.RecordBatch]:
        if not self.bad:
            return
        rows = self.bad
        self.bad = []
        table = pa.Table.from_pylist(
            rows, schema=pa.schema([self.schema.field(k) for k in rows[0]])
        )
        n = table.num_rows
        columns = [
            table.column(f.name) if f.name in table.column_names else pa.nulls(n, f.type)
            for f in self.schema
        ]
        yield from pa.Table.from_arrays(columns, schema=self.schema).to_batches()
