"""The mirror's writes in its decode tasks (``connectors.mirror_write``): the files hold
every decoded row once, in the table's columns with the derived ones, and a range that
could not be read at all keeps the whole extension out of the mirror."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from connectors import mirror as mirror_module
from connectors.arrow import to_arrow_schema
from connectors.delta import RowsNotCommittedError
from connectors.mirror import MIRROR_TABLE, Derived, Mirror, MirrorRequest, read_through_mirror
from connectors.mirror_write import StagedWrite, write_units
from connectors.rocketmq.read_plan import QueueUnit
from connectors.rocketmq.reader import decode_units, plan_stores, read_options
from connectors.rocketmq.store_files import StoreSpec
from schemas.messages import HALF_TOPIC, MAY_BE_BAD, MAY_BE_BAD_FIELDS, OP_TOPIC
from simulator.simulation import SimConfig, write_store
from transforms.bad_records import may_be_bad_columns, with_may_be_bad

OPTIONS = read_options(lean=True)
FLAGGED = Derived(MAY_BE_BAD_FIELDS, with_may_be_bad, may_be_bad_columns)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mirror-write") / "a"
    write_store(SimConfig(transactions=300, seed=3, commitlog_file_size=64 << 10), root)
    return root


def test_the_tasks_write_every_decoded_row_once_with_its_derived_columns(
    spark: SparkSession, store: Path, tmp_path: Path
) -> None:
    units = [u for u in plan_stores([StoreSpec("a", store)]).units if isinstance(u, QueueUnit)]
    mirror = Mirror(spark, tmp_path, derived=FLAGGED)
    write = StagedWrite(str(tmp_path), to_arrow_schema(mirror.file_schema), may_be_bad_columns)
    staged = write_units(spark, units, OPTIONS, write)
    decoded = with_may_be_bad(decode_units(spark, units, OPTIONS))
    # What the test rests on: files of both topics, a flagged record in neither here.
    assert {file.topic for file in staged} == {HALF_TOPIC, OP_TOPIC}
    for topic in (HALF_TOPIC, OP_TOPIC):
        files = [file for file in staged if file.topic == topic]
        table = pq.read_table([file.path for file in files])
        assert table.schema == write.schema
        assert sum(file.rows for file in files) == table.num_rows
        expected = decoded.where(decoded.topic == topic).drop("broker", "topic").toArrow()
        order = [("queue_id", "ascending"), ("queue_offset", "ascending")]
        assert table.sort_by(order).to_pylist() == expected.sort_by(order).to_pylist()
    assert all(file.broker == "a" and file.unplaced == 0 for file in staged)
    # Offsets delta-encoded, unique keys plain, repeated names in a dictionary.
    chunks = pq.read_metadata(staged[0].path).row_group(0)
    encodings = {
        chunks.column(i).path_in_schema: chunks.column(i).encodings
        for i in range(chunks.num_columns)
    }
    assert "DELTA_BINARY_PACKED" in encodings["queue_offset"]
    assert "RLE_DICTIONARY" not in encodings["uniq_key"]
    assert "RLE_DICTIONARY" in encodings["producer_group"]


def test_a_file_the_driver_cannot_see_fails_the_extension_and_commits_nothing(
    spark: SparkSession, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output root the executors do not share: the driver finds fewer rows than the
    tasks wrote, and the mirror keeps its marks (no commit)."""
    written = mirror_module.write_units

    def one_file_unseen(*args, **kwargs):
        staged = written(*args, **kwargs)
        Path(staged[0].path).unlink()  # what a driver without shared storage sees
        return staged

    monkeypatch.setattr(mirror_module, "write_units", one_file_unseen)
    plan = plan_stores([StoreSpec("a", store)])
    with pytest.raises(RowsNotCommittedError, match=r"mirror_records: executors wrote \d+ rows"):
        read_through_mirror(
            spark, plan, {"a": store}, OPTIONS, MirrorRequest(tmp_path), derived=FLAGGED
        )
    table = DeltaTable(str(tmp_path / MIRROR_TABLE))
    assert table.version() == 0 and table.file_uris() == []
    assert not list((tmp_path / MIRROR_TABLE / "_staging").glob("*/*"))


def test_a_range_that_cannot_be_read_keeps_the_extension_out_of_the_mirror(
    spark: SparkSession, store: Path, tmp_path: Path
) -> None:
    """A consume-queue range that could not be read at all is a bad record without a queue
    offset: nothing is committed, and the run reads its stores whole."""
    plan = plan_stores([StoreSpec("a", store)])
    broken = next(unit for unit in plan.units if isinstance(unit, QueueUnit))
    units = [*plan.units, replace(broken, cq_name="consumequeue/missing/0/00000000000000000000")]
    read, extension = read_through_mirror(
        spark,
        replace(plan, units=units),
        {"a": store},
        OPTIONS,
        MirrorRequest(tmp_path),
        derived=FLAGGED,
    )
    try:
        assert not extension.committed and extension.plan.live == units
        assert read.bad_records.where(read.bad_records.queue_offset.isNull()).count() == 1
        assert MAY_BE_BAD in read.messages.columns
    finally:
        read.unpersist()
    table = DeltaTable(str(tmp_path / MIRROR_TABLE))
    assert table.version() == 0 and table.file_uris() == []  # the table made empty, no commit
    assert not list((tmp_path / MIRROR_TABLE / "_staging").glob("*/*"))
