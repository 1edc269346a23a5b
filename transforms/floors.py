"""The round's floors: per queue, the first half and op offsets that resolution,
classification and the end offsets can read, so that they read the records from there on,
not every record the store retains.

Resolution reaches below h0 only through a transaction (spec section 4): rule 3 links each
record from h0 to every half record of its transaction
(``transforms.resolve.transaction_records``), and rules 1 and 2 ask which op records name
the queue offset, or the prepared offset, of one of those records. So, per queue:

- ``half_floor``: the smallest queue offset of a half record of a transaction with a
  record from h0 (h0 itself when smaller): every linked record lies at or above it;
- ``named_floor``: the smallest offset that resolves one of those records (its own or its
  prepared offset);
- ``op_floor``: the first op offset whose largest named item reaches ``named_floor``, or
  p0 when smaller: every op record naming a linked record lies at or above it, and so does
  every op record the end offsets and the broker's walk read (from p0).

Each floor is exact on any input: it assumes nothing about the order in which the broker
writes (an op record naming an old half record may lie anywhere in the op queue). The half
floors cost one scan of the half records' keys and offsets (a semi-join with the keys from
h0), the op floor one scan of the op records' offsets and bodies: each an aggregate to a
row per queue. Below the floors lie only records that no transaction from h0 reaches and
that no op record from p0 is: the bad records and the discard history read them, from
the unfloored records.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from transforms.merge import Facts, carried, merged
from transforms.messages import QUEUE_KEY
from transforms.ops import largest_item
from transforms.queue_values import Attach, joined_values
from transforms.resolve import TRANSACTION, transaction_records

HALF_FLOOR, NAMED_FLOOR, OP_FLOOR = "half_floor", "named_floor", "op_floor"


def linked_facts(half: DataFrame, from_h0: DataFrame, small: bool) -> Facts:
    """Per queue, over the half records of the transactions of ``from_h0`` (``half``: every
    half record, with ``transaction_key``): ``first_linked``, their smallest queue offset,
    and ``first_prepared``, their smallest prepared offset. Only the keys and offsets are
    read; ``small``: ``from_h0`` may be broadcast."""
    keys = half.select(*TRANSACTION, "queue_offset", "prepared_queue_offset")
    linked = transaction_records(keys, from_h0, small)
    rows = linked.select(
        *QUEUE_KEY,
        F.col("queue_offset").alias("_linked"),
        F.col("prepared_queue_offset").alias("_prepared"),
    )
    return Facts(
        rows, (F.min("_linked").alias("first_linked"), F.min("_prepared").alias("first_prepared"))
    )


def with_half_floors(starts: DataFrame, linked: Facts) -> DataFrame:
    """``broker, queue_id, p0, half_floor, named_floor`` of each queue of ``starts`` (which
    has ``h0, p0``), from ``linked_facts`` (``least`` skips a queue's missing facts)."""
    joined = merged(carried(starts.select(*QUEUE_KEY, "h0", "p0")), linked)
    half_floor = F.least(F.col("h0"), F.col("first_linked"))
    named_floor = F.least(half_floor, F.col("first_prepared"))
    return joined.select(
        *QUEUE_KEY, "p0", half_floor.alias(HALF_FLOOR), named_floor.alias(NAMED_FLOOR)
    )


def reaching_facts(ops: DataFrame, floors: DataFrame, attach: Attach = joined_values) -> Facts:
    """Per queue: ``first_reaching``, the first op offset whose largest named item reaches
    the queue's ``named_floor`` (``with_half_floors``). An op record naming several offsets
    names one at or above the floor exactly when its largest does."""
    named = attach(ops, floors, [NAMED_FLOOR])
    reaching = named.filter(largest_item() >= F.col(NAMED_FLOOR))
    rows = reaching.select(*QUEUE_KEY, F.col("queue_offset").alias("_reaching"))
    return Facts(rows, (F.min("_reaching").alias("first_reaching"),))


def with_op_floor(floors: DataFrame, reaching: Facts) -> DataFrame:
    """``floors`` (``with_half_floors``) with ``op_floor``: p0, or the first op record
    naming a linked record's offset when that is smaller (``reaching_facts``)."""
    joined = merged(carried(floors), reaching)
    op_floor = F.least(F.col("p0"), F.col("first_reaching"))
    return joined.select(*QUEUE_KEY, HALF_FLOOR, NAMED_FLOOR, op_floor.alias(OP_FLOOR))
