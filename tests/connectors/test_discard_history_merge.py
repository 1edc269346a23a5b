"""The merged discard_history table through the delta-rs writer: not partitioned, merged on
(broker, discard_offset), first_seen_run_id kept, an older T never overwrites a newer row,
a rerun changes nothing, the commit keeps the run's decided view. ``check_merge`` and
``check_decided_view`` are shared with the delta-spark case
(tests/delta/test_discard_history_delta.py)."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from connectors.delta import DeltaRsOutput, OutputWriter
from jobs.history import decided_view
from schemas.decided_view import DecidedView, view_text
from schemas.messages import OP_TOPIC
from schemas.outputs import DISCARD_HISTORY, DISCARD_HISTORY_TABLE
from tests.robustness.store import rows_of

# What a discard_history table was written with before it had the search columns.
SEARCH_COLUMNS = ("keys", "tags", "transaction_id")
WITHOUT_SEARCH = T.StructType([f for f in DISCARD_HISTORY.fields if f.name not in SEARCH_COLUMNS])


def _rows(
    spark: SparkSession,
    run_id: str,
    as_of: int,
    rows: list[tuple[str, int, str]],
    schema: T.StructType = DISCARD_HISTORY,
    offset_msg_id: str | None = None,
):  # -> DataFrame
    """discard_history rows of one run: (broker, discard_offset, outcome), first seen now,
    of discard records with ``offset_msg_id``; with the search columns, ``keys`` =
    [``KEY-<offset>``]."""
    values = []
    for broker, offset, outcome in rows:
        row = dict.fromkeys(schema.fieldNames())
        if "keys" in row:
            row.update(keys=[f"KEY-{offset}"], transaction_id=f"TX-{offset}")
        row.update(
            broker=broker,
            discard_offset=offset,
            outcome=outcome,
            offset_msg_id=offset_msg_id,
            reason="check_max",
            first_seen_run_id=run_id,
            run_id=run_id,
            as_of_ms=as_of,
        )
        values.append(tuple(row.values()))
    return spark.createDataFrame(values, schema)


def _table(root: Path) -> dict[tuple[str, int], tuple[str, str, str]]:
    return {
        (r["broker"], r["discard_offset"]): (r["outcome"], r["first_seen_run_id"], r["run_id"])
        for r in rows_of(root, DISCARD_HISTORY_TABLE)
    }


def check_merge(spark: SparkSession, writer: OutputWriter, root: Path) -> None:
    writer.ensure_table(DISCARD_HISTORY_TABLE, DISCARD_HISTORY)
    assert DeltaTable(str(root / DISCARD_HISTORY_TABLE)).metadata().partition_columns == []

    def merge(run_id: str, as_of: int, rows: list[tuple[str, int, str]]) -> int:
        frame = _rows(spark, run_id, as_of, rows)
        return writer.merge_rows(DISCARD_HISTORY_TABLE, frame, DISCARD_HISTORY)

    first = [("a", 0, "unresolved"), ("a", 1, "unresolved"), ("b", 0, "unresolved")]
    assert merge("r1", 100, first) == 3
    second = [("a", 0, "committed"), ("a", 2, "unresolved")]  # broker a only, later T
    assert merge("r2", 200, second) == 2
    expected = {
        ("a", 0): ("committed", "r1", "r2"),  # updated, first sighting kept
        ("a", 1): ("unresolved", "r1", "r1"),  # not in r2 (e.g. retention removed it): stays
        ("b", 0): ("unresolved", "r1", "r1"),
        ("a", 2): ("unresolved", "r2", "r2"),
    }
    assert _table(root) == expected
    # A backfill of an older T inserts what is new but does not overwrite a newer row.
    assert merge("r0", 50, [("a", 0, "unknown"), ("a", 3, "unresolved")]) == 2
    expected[("a", 3)] = ("unresolved", "r0", "r0")
    assert _table(root) == expected
    # A rerun of r2: the same rows.
    assert merge("r2", 200, second) == 2
    assert _table(root) == expected
    # A final outcome is kept by later runs (the evidence may be gone), unresolved is not.
    assert merge("r3", 300, [("a", 0, "unknown"), ("a", 2, "committed")]) == 2
    expected[("a", 2)] = ("committed", "r2", "r3")
    assert _table(root) == expected
    assert merge("r4", 400, [("a", 2, "unknown")]) == 1
    assert _table(root) == expected
    # Another discard record at the same offset (a replaced store) is decided again.
    other = _rows(spark, "r5", 500, [("a", 0, "unresolved")], offset_msg_id="0A000001000000FF")
    assert writer.merge_rows(DISCARD_HISTORY_TABLE, other, DISCARD_HISTORY) == 1
    expected[("a", 0)] = ("unresolved", "r1", "r5")
    assert _table(root) == expected


def check_old_root_gains_search_columns(
    spark: SparkSession, writer: OutputWriter, root: Path
) -> None:
    """An output root whose discard_history was written without ``keys``, ``tags`` and
    ``transaction_id`` accepts the merge: the columns are added, its rows keep null there
    until a run updates them."""
    writer.ensure_table(DISCARD_HISTORY_TABLE, WITHOUT_SEARCH)
    old = _rows(spark, "r1", 100, [("a", 0, "unresolved"), ("a", 1, "unresolved")], WITHOUT_SEARCH)
    assert writer.merge_rows(DISCARD_HISTORY_TABLE, old, WITHOUT_SEARCH) == 2

    writer.ensure_table(DISCARD_HISTORY_TABLE, DISCARD_HISTORY)
    new = _rows(spark, "r2", 200, [("a", 1, "committed"), ("a", 2, "unresolved")])
    assert writer.merge_rows(DISCARD_HISTORY_TABLE, new, DISCARD_HISTORY) == 2

    assert set(DISCARD_HISTORY.fieldNames()) <= set(
        DeltaTable(str(root / DISCARD_HISTORY_TABLE)).schema().to_arrow().names
    )
    got = {
        r["discard_offset"]: (r["outcome"], r["first_seen_run_id"], r["keys"], r["transaction_id"])
        for r in rows_of(root, DISCARD_HISTORY_TABLE)
    }
    assert got == {
        0: ("unresolved", "r1", None, None),  # not read since: as it was
        1: ("committed", "r1", ["KEY-1"], "TX-1"),
        2: ("unresolved", "r2", ["KEY-2"], "TX-2"),
    }


def check_decided_view(spark: SparkSession, writer: OutputWriter, root: Path) -> None:
    """The view a merge carries (``schemas.decided_view``) is read back from the table's
    newest commit that changed rows: a compaction does not hide it, a merge without one
    leaves none."""
    writer.ensure_table(DISCARD_HISTORY_TABLE, DISCARD_HISTORY)
    view = DecidedView("r1", 100, {("a", OP_TOPIC, 0): 7, ("a", "ORDERS", 3): 12})

    def merge(run_id: str, as_of: int, carried: DecidedView | None) -> None:
        frame = _rows(spark, run_id, as_of, [("a", 0, "unresolved")])
        text = view_text(carried) if carried is not None else None
        assert writer.merge_rows(DISCARD_HISTORY_TABLE, frame, DISCARD_HISTORY, text) == 1

    assert decided_view(str(root)) is None  # created, nothing merged yet
    merge("r1", 100, view)
    assert decided_view(str(root)) == view
    DeltaTable(str(root / DISCARD_HISTORY_TABLE)).optimize.compact()
    assert decided_view(str(root)) == view
    merge("r2", 200, None)  # a run without the mirror
    assert decided_view(str(root)) is None


def test_delta_rs_merges_discard_history(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "out"
    check_merge(spark, DeltaRsOutput(spark, root), root)
    leftovers = [
        p.name for p in (root / DISCARD_HISTORY_TABLE).iterdir() if p.name.startswith("_merge")
    ]
    assert leftovers == []  # the scratch folder is gone


def test_delta_rs_merges_into_a_discard_history_without_the_search_columns(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "out"
    check_old_root_gains_search_columns(spark, DeltaRsOutput(spark, root), root)


def test_delta_rs_keeps_the_decided_view_in_the_commit(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "out"
    check_decided_view(spark, DeltaRsOutput(spark, root), root)
