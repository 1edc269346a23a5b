"""The mirror's upkeep (``connectors.mirror_upkeep``, ``python -m jobs.maintenance mirror``):
the rows of entries retention removed are dropped, the files compacted, and the next read
through the mirror gives the rows of a whole read without decoding or rebuilding anything;
a vacuum in between leaves the marks readable; a store that is not the mirror's is left
alone."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from connectors.mirror import MIRROR_TABLE, RECORDS, load_state
from connectors.mirror_upkeep import prune_predicate, upkeep
from connectors.rocketmq.probe import CommitLogHeads, queue_bounds
from connectors.rocketmq.reader import read_stores
from connectors.rocketmq.store_files import StoreSpec
from jobs.maintenance import main, vacuum_tables
from schemas.messages import HALF_TOPIC, OP_TOPIC
from simulator.growth import copy_prefix, expire_head, record_ends
from simulator.simulation import SimConfig, write_store
from tests.connectors.test_mirror import _read
from tests.robustness.store import read_table

ORDER = ["topic", "queue_id", "queue_offset"]


def test_the_prune_predicate_names_each_queue_below_its_cut() -> None:
    cuts = {("b'1", HALF_TOPIC, 0): 7, ("a", OP_TOPIC, 2): 3}
    assert prune_predicate(cuts) == (
        f"(broker = 'a' AND topic = '{OP_TOPIC}' AND queue_id = 2 AND queue_offset < 3) OR"
        f" (broker = 'b''1' AND topic = '{HALF_TOPIC}' AND queue_id = 0 AND queue_offset < 7)"
    )


def _stale_rows(out: Path, store: Path) -> int:
    """The mirror's rows of entries before the first its store holds readable now."""
    log = CommitLogHeads.of(store)
    table = read_table(out, MIRROR_TABLE).select(ORDER)
    stale = 0
    for topic in (HALF_TOPIC, OP_TOPIC):
        bounds = queue_bounds(store, log, topic, 0)
        assert bounds is not None and bounds.readable is not None
        below = pc.and_(
            pc.equal(table["topic"], topic), pc.less(table["queue_offset"], bounds.readable[0])
        )
        stale += pc.sum(below.cast("int64")).as_py() or 0
    return stale


def test_stale_rows_are_dropped_files_compacted_and_the_next_read_decodes_nothing(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full, store, out = tmp_path / "full", tmp_path / "a", tmp_path / "out"
    write_store(SimConfig(transactions=400, seed=9, commitlog_file_size=128 << 10), full)
    ends = record_ends(full, HALF_TOPIC)
    for cut in (ends[len(ends) // 3], ends[2 * len(ends) // 3], ends[-1]):
        copy_prefix(full, store, int(cut))
        read, _ = _read(spark, store, out)
        read.unpersist()
    expire_head(store)
    stale = _stale_rows(out, store)
    assert stale > 0
    files = len(DeltaTable(str(out / MIRROR_TABLE)).file_uris())

    assert main(["mirror", "--output", str(out), "--store", f"a={store}"]) == 0
    printed = capsys.readouterr().out
    assert f"{MIRROR_TABLE}: dropped {stale} row(s) the stores no longer hold" in printed
    assert _stale_rows(out, store) == 0
    assert len(DeltaTable(str(out / MIRROR_TABLE)).file_uris()) < files
    # A vacuum of the files replaced: its commits change no row, and the marks stay read.
    state, version = load_state(out / MIRROR_TABLE), DeltaTable(str(out / MIRROR_TABLE)).version()
    assert vacuum_tables(out, retention_hours=0)[MIRROR_TABLE]
    assert DeltaTable(str(out / MIRROR_TABLE)).version() > version
    assert load_state(out / MIRROR_TABLE) == state

    through, extension = _read(spark, store, out)
    whole = read_stores(spark, [StoreSpec("a", store)], lean=True)
    try:
        assert extension.committed and extension.records == 0 and extension.plan.rebuilt == {}
        assert_df_equality(
            through.messages.orderBy(*ORDER), whole.messages.orderBy(*ORDER), ignore_nullable=True
        )
    finally:
        through.unpersist()
        whole.unpersist()


def test_a_store_that_is_not_the_mirrors_is_left_alone(spark: SparkSession, tmp_path: Path) -> None:
    store, other, out = tmp_path / "a", tmp_path / "other", tmp_path / "out"
    write_store(SimConfig(transactions=200, seed=3, commitlog_file_size=128 << 10), store)
    write_store(SimConfig(transactions=200, seed=4, commitlog_file_size=128 << 10), other)
    read, _ = _read(spark, store, out)
    read.unpersist()
    rows = read_table(out, MIRROR_TABLE).num_rows
    done = upkeep(out, RECORDS, {"a": other}, compact=False)
    assert done.pruned_rows == 0 and len(done.skipped) == 1
    assert done.skipped[0].startswith("a: ") and "reads it whole again" in done.skipped[0]
    assert read_table(out, MIRROR_TABLE).num_rows == rows


def test_an_output_root_without_a_mirror_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mirror", "--output", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}: no mirror here")
