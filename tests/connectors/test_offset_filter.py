"""The Bloom filter of commit-log offsets the discard history's commits read is cut by: no
offset it was built from is ever ruled out, few others get through, and the one-task
builder gives each broker its own filter."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.rocketmq.offset_filter import FILTER_SCHEMA, OffsetFilter, filter_batches

offsets = st.lists(st.integers(min_value=0, max_value=2**62), max_size=300)


@settings(max_examples=200, deadline=None)
@given(offsets, offsets)
def test_no_offset_it_was_built_from_is_ruled_out(built: list[int], others: list[int]) -> None:
    found = OffsetFilter.of(np.array(built, dtype=np.int64))
    assert found.might_contain(np.array(built, dtype=np.int64)).all()
    # Membership is per offset, whatever else is asked at the same time.
    asked = np.array(others + built, dtype=np.int64)
    alone = [bool(found.might_contain(np.array([x], dtype=np.int64))[0]) for x in asked]
    assert found.might_contain(asked).tolist() == alone


def test_few_other_offsets_get_through() -> None:
    """Commit-log offsets of 20 000 half records among 2 M others, as in a store: consecutive
    records a few hundred bytes apart."""
    rng = np.random.default_rng(7)
    places = np.cumsum(rng.integers(200, 400, size=2_020_000, dtype=np.int64))
    wanted = rng.choice(len(places), size=20_000, replace=False)
    others = np.delete(places, wanted)

    found = OffsetFilter.of(places[wanted])

    assert found.might_contain(places[wanted]).all()
    assert found.might_contain(others).mean() < 0.01
    assert len(found.bits) * 8 <= 20_000 * 24  # at most 24 bits per offset


def test_an_empty_filter_holds_nothing() -> None:
    found = OffsetFilter.of(np.array([], dtype=np.int64))
    assert not found.might_contain(np.arange(0, 10_000, 7, dtype=np.int64)).any()


def test_one_filter_per_broker_from_every_batch() -> None:
    rows = [
        ("a", np.arange(0, 3_000, 3)),
        ("b", np.arange(1, 3_000, 3)),
        ("a", np.arange(90_000, 93_000, 3)),
    ]
    batches = [
        pa.RecordBatch.from_pydict(
            {"broker": [broker] * len(values), "offset": values.astype(np.int64)}
        )
        for broker, values in rows
    ]

    out = pa.Table.from_batches(list(filter_batches(iter(batches))), schema=FILTER_SCHEMA)

    assert out.column("broker").to_pylist() == ["a", "b"]
    a, b = (OffsetFilter(bits) for bits in out.column("bits").to_pylist())
    a_offsets = np.concatenate([rows[0][1], rows[2][1]])
    assert a.might_contain(a_offsets).all() and b.might_contain(rows[1][1]).all()
    assert b.might_contain(a_offsets).mean() < 0.05
    assert a.might_contain(rows[1][1]).mean() < 0.05


def test_no_batch_gives_no_filter() -> None:
    out = list(filter_batches(iter([])))
    assert sum(batch.num_rows for batch in out) == 0
