"""The mirror's table (``connectors.mirror``): its state in the commit metadata, and a read
through it giving the rows a read of the whole store gives, also at drawn cut points."""

from __future__ import annotations

from pathlib import Path

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from connectors.mirror import (
    MIRROR_TABLE,
    BrokerMirror,
    Derived,
    MirrorRequest,
    load_state,
    parse_state,
    read_through_mirror,
    state_text,
)
from connectors.rocketmq.mirror_plan import QueueMark
from connectors.rocketmq.reader import plan_stores, read_options, read_stores
from connectors.rocketmq.store_files import StoreSpec
from schemas.messages import HALF_TOPIC, MAY_BE_BAD, MAY_BE_BAD_FIELDS
from simulator.growth import copy_prefix, expire_head, record_ends
from simulator.simulation import SimConfig, write_store
from tests.robustness.store import mirrored_places
from transforms.bad_records import may_be_bad_columns, with_may_be_bad

OPTIONS = read_options(lean=True)


def test_the_state_reads_back_as_written() -> None:
    state = {
        "b": BrokerMirror(
            {"verify_crc": False, "half_body": False}, {(HALF_TOPIC, 0): QueueMark(9, 800, 210, 17)}
        ),
        "a": BrokerMirror({"verify_crc": True, "half_body": False}),
    }
    assert parse_state(state_text(state)) == state
    assert parse_state('{"format": 99, "brokers": {}}') is None


def _read(spark: SparkSession, store: Path, out: Path, rebuild: bool = False):
    spec = StoreSpec("a", store)
    plan = plan_stores([spec])
    return read_through_mirror(spark, plan, {"a": store}, OPTIONS, MirrorRequest(out, rebuild))


def test_a_read_through_the_mirror_gives_the_rows_of_a_whole_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    full, store, out = tmp_path / "full", tmp_path / "a", tmp_path / "out"
    write_store(SimConfig(transactions=400, seed=9, commitlog_file_size=128 << 10), full)
    ends = record_ends(full, HALF_TOPIC)
    copy_prefix(full, store, int(ends[len(ends) // 2]))
    first, extension = _read(spark, store, out)
    first.unpersist()
    copy_prefix(full, store, int(ends[-1]))
    through, extension = _read(spark, store, out)
    whole = read_stores(spark, [StoreSpec("a", store)], lean=True)
    try:
        assert extension.committed and extension.records > 0 and extension.plan.live == []
        order = ["topic", "queue_id", "queue_offset"]
        assert_df_equality(
            through.messages.orderBy(*order), whole.messages.orderBy(*order), ignore_nullable=True
        )
        assert through.bad_records.isEmpty() and whole.bad_records.isEmpty()
    finally:
        through.unpersist()
        whole.unpersist()
    state = load_state(out / MIRROR_TABLE)
    assert state is not None and set(state) == {"a"}
    assert state["a"].marks == {
        (key[1], key[2]): mark for key, mark in extension.plan.marks.items()
    }
    # Nothing new: no commit.
    version = DeltaTable(str(out / MIRROR_TABLE)).version()
    again, extension = _read(spark, store, out)
    again.unpersist()
    assert extension.records == 0
    assert DeltaTable(str(out / MIRROR_TABLE)).version() == version


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.floats(0.05, 0.95), min_size=1, max_size=3, unique=True),
    st.booleans(),
)
def test_reads_at_drawn_cut_points_give_the_rows_of_a_whole_read(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, cuts: list[float], expire: bool
) -> None:
    """The store grows to each drawn cut (commit-log and consume-queue files added), read
    through the mirror after each, then to its end (its head removed by retention first
    when ``expire``): the last read is the whole read's rows, and the mirror decoded each
    entry once."""
    tmp = tmp_path_factory.mktemp("cuts")
    full, store, out = tmp / "full", tmp / "a", tmp / "out"
    write_store(SimConfig(transactions=300, seed=5, commitlog_file_size=64 << 10), full)
    ends = record_ends(full, HALF_TOPIC)
    decoded = 0
    for fraction in [*sorted(cuts), 1.0]:
        copy_prefix(full, store, int(ends[min(len(ends) - 1, int(fraction * len(ends)))]))
        if fraction == 1.0 and expire:
            expire_head(store)
        through, extension = _read(spark, store, out)
        decoded += extension.records
        if fraction < 1.0:
            through.unpersist()
    whole = read_stores(spark, [StoreSpec("a", store)], lean=True)
    try:
        assert extension.committed and extension.plan.rebuilt == {}
        order = ["topic", "queue_id", "queue_offset"]
        assert_df_equality(
            through.messages.orderBy(*order), whole.messages.orderBy(*order), ignore_nullable=True
        )
    finally:
        through.unpersist()
        whole.unpersist()
    places = mirrored_places(out, MIRROR_TABLE)
    assert decoded == len(places) == len(set(places))  # each entry decoded once


def test_derived_columns_are_kept_and_added_to_a_table_made_before_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A mirror made without the derived flag gains it in a commit that carries its marks
    (nothing read again); the rows mirrored before read it as null, the rows mirrored after
    carry it, and a read's records carry it."""
    full, store, out = tmp_path / "full", tmp_path / "a", tmp_path / "out"
    write_store(SimConfig(transactions=200, seed=4, commitlog_file_size=128 << 10), full)
    ends = record_ends(full, HALF_TOPIC)
    middle = int(ends[len(ends) // 2])
    copy_prefix(full, store, middle)
    first, _ = _read(spark, store, out)
    first.unpersist()
    state = load_state(out / MIRROR_TABLE)
    copy_prefix(full, store, int(ends[-1]))
    derived = Derived(MAY_BE_BAD_FIELDS, with_may_be_bad, may_be_bad_columns)
    plan = plan_stores([StoreSpec("a", store)])
    through, extension = read_through_mirror(
        spark, plan, {"a": store}, OPTIONS, MirrorRequest(out), derived=derived
    )
    try:
        # The column's commit carried the marks: no broker was read whole again.
        assert extension.plan.rebuilt == {} and extension.records > 0
        table = DeltaTable(str(out / MIRROR_TABLE))
        assert MAY_BE_BAD in [field.name for field in table.schema().fields]
        assert state is not None and set(state) == {"a"}  # the marks before the column
        flags = through.messages.groupBy(
            (F.col("commitlog_offset") < middle).alias("before"), MAY_BE_BAD
        ).count()
        expected = spark.createDataFrame(
            [(True, None), (False, False)], "before BOOLEAN, may_be_bad BOOLEAN"
        )
        assert_df_equality(
            flags.drop("count"), expected, ignore_row_order=True, ignore_nullable=True
        )
    finally:
        through.unpersist()
