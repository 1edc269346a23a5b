"""Runs through the store's mirror (docs/spec/reconcile.md section 10) against the store
read whole: a store that grows between runs (commit-log files and consume-queue files
added, the queue head removed by retention, the mirror's maintenance) gives, at the last T,
the tables a ``--rebuild`` run and a run without the mirror give; a replaced store is
detected and read again."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from connectors.delta_read import arrow_dataset
from connectors.mirror import DISCARDS, MIRROR_TABLE, Mirror
from connectors.rocketmq.probe import CommitLogHeads, queue_bounds
from jobs.cli import main
from jobs.maintenance import main as maintenance
from schemas.messages import HALF_TOPIC, OP_TOPIC
from schemas.outputs import TABLE_SCHEMAS
from simulator.growth import copy_prefix, expire_head, record_ends
from simulator.simulation import SimConfig, write_store
from tests.robustness.store import comparable, rows_of

# Whole runs of the job: `make test-runs`, not `make test`.
pytestmark = pytest.mark.runs

ROOT = Path(__file__).resolve().parents[2]
MIRRORED = re.compile(r"mirror: (\d+) new half/op records decoded")
CARRIED = re.compile(r"mirror: (\d+) open discard row\(s\) decided against what arrived since")


def _simulate(root: Path, seed: int) -> None:
    """A small store over several commit-log and consume-queue files."""
    config = SimConfig(
        transactions=1500,
        seed=seed,
        commitlog_file_size=256 << 10,
        cq_file_entries=400,
        duration_s=1800,
    )
    write_store(config, root)


def _entries(store: Path) -> int:
    """The half and op entries that point at a readable record (what the mirror holds)."""
    log = CommitLogHeads.of(store)
    total = 0
    for topic in (HALF_TOPIC, OP_TOPIC):
        bounds = queue_bounds(store, log, topic, 0)
        if bounds is not None and bounds.readable is not None:
            total += bounds.readable[1] + 1 - bounds.readable[0]
    return total


def _run(spark: SparkSession, capsys, store: Path, out: Path, *flags: str) -> tuple[str, str]:
    """One command-line run at ``latest``: (its run id, what it printed on stderr)."""
    argv = ["--store", f"a={store}", "--output", str(out), "--as-of", "latest", *flags]
    assert main(argv, spark=spark) == 0
    printed = capsys.readouterr()
    run_id = re.search(r"^run (\S+)", printed.out, re.M)
    assert run_id is not None, printed.out
    return run_id.group(1), printed.err


def _tables(out: Path, run_id: str) -> dict[str, object]:
    return {table: comparable(rows_of(out, table, run_id)) for table in TABLE_SCHEMAS}


def _mirrored(printed: str) -> int:
    found = MIRRORED.search(printed)
    assert found is not None, printed
    return int(found.group(1))


def _mirror_rows(out: Path) -> int:
    """The rows of the half/op mirror as its Delta log lists them."""
    mirror = arrow_dataset(str(out / MIRROR_TABLE))
    assert mirror is not None
    return mirror.count_rows()


def test_a_growing_store_read_through_its_mirror_gives_the_tables_of_a_full_read(
    spark: SparkSession, capsys, tmp_path: Path
) -> None:
    full, store, out = tmp_path / "full", tmp_path / "a", tmp_path / "out"
    _simulate(full, seed=11)
    _grow_in_two_runs(spark, capsys, full, store, out)
    _the_history_is_a_first_looks(spark, capsys, store, out, tmp_path / "first-look")
    expire_head(store)  # retention removes the head the mirror holds
    # The maintenance drops the rows of the removed head and compacts both tables.
    assert maintenance(["mirror", "--output", str(out), "--store", f"a={store}"]) == 0
    upkept = capsys.readouterr().out
    for table in ("mirror_records", "mirror_discards", "mirror_commits"):
        assert f"{table}: dropped " in upkept, upkept
    assert not re.search(r"mirror_records: dropped 0 row", upkept), upkept
    run_id, printed = _run(spark, capsys, store, out, "--mirror")
    assert _mirrored(printed) == 0 and "rebuilt" not in printed
    # The real queues' commits were mirrored by the runs before: nothing new to decode.
    assert "mirror: 0 new committed messages decoded" in printed, printed
    incremental = _tables(out, run_id)
    assert incremental["check_requests"] and incremental["discard_history"]

    rebuilt_id, printed = _run(spark, capsys, store, out, "--rebuild")
    assert rebuilt_id == run_id
    for table in ("mirror_records", "mirror_discards", "mirror_commits"):
        assert f"warning: {table} of broker a rebuilt from its store: --rebuild" in printed
    assert _mirrored(printed) == _entries(store) == _mirror_rows(out)
    assert _tables(out, run_id) == incremental

    classic_id, _ = _run(spark, capsys, store, out)
    assert classic_id == run_id
    assert _tables(out, run_id) == incremental
    _the_readme_finds_a_transactions_records(out, capsys)

    # A T in the past reads the mirror too: the round filters its rows by T as always.
    past = ["--as-of", str(_newest_half_ms(store) - 10 * 60_000), "--run-id", "past"]
    argv = ["--store", f"a={store}", "--output", str(out), *past]
    assert main([*argv, "--mirror"], spark=spark) == 0
    through_mirror = _tables(out, "past")
    assert main(argv, spark=spark) == 0
    capsys.readouterr()
    assert _tables(out, "past") == through_mirror
    assert through_mirror["run_summary"]


def _grow_in_two_runs(spark: SparkSession, capsys, full: Path, store: Path, out: Path) -> None:
    """Two runs through the mirror, on the store's first half and then on all of it."""
    ends = record_ends(full, HALF_TOPIC)
    seen = 0
    outcomes: list[dict[int, str]] = []
    for cut in (ends[len(ends) // 2], ends[-1]):
        copy_prefix(full, store, int(cut))
        _, printed = _run(spark, capsys, store, out, "--mirror")
        # Each run decodes into the mirror what the store appended since the last.
        assert _mirrored(printed) == _entries(store) - seen
        seen = _entries(store)
        outcomes.append(
            {r["discard_offset"]: r["outcome"] for r in rows_of(out, "discard_history")}
        )
    # The second run decided the rows the first left unresolved against what arrived since
    # (a commit or an op after the discard ends some of them): see the first look below.
    carried = CARRIED.search(printed)
    assert carried is not None and int(carried.group(1)) > 0, printed
    first, second = outcomes
    ended = [at for at, outcome in first.items() if outcome == "unresolved" != second[at]]
    assert ended, (first, second)


def _the_history_is_a_first_looks(
    spark: SparkSession, capsys, store: Path, out: Path, first_look: Path
) -> None:
    """Every discard_history row of ``out`` (final rows kept from the first run, the others
    decided through the mirrored commits) is the row a run without the mirror on a new
    output root writes at the same T (nothing expired yet), but for who decided it."""
    first_id, _ = _run(spark, capsys, store, first_look)

    def decided(root: Path) -> dict[int, dict[str, object]]:
        who = ("run_id", "first_seen_run_id", "as_of_ms")
        rows = rows_of(root, "discard_history")
        return {r["discard_offset"]: {k: v for k, v in r.items() if k not in who} for r in rows}

    history = decided(out)
    assert history == decided(first_look)
    outcomes = {row["outcome"] for row in history.values()}
    assert {"committed", "unresolved"} <= outcomes, outcomes

    # An output root written without the mirror, as every root of the release before it
    # was, takes a --mirror run: its store is read into the mirror whole, once, and the
    # tables stay as they were.
    written = _tables(first_look, first_id)
    rerun_id, printed = _run(spark, capsys, store, first_look, "--mirror")
    assert rerun_id == first_id and "rebuilt" not in printed
    assert _mirrored(printed) == _entries(store) == _mirror_rows(first_look)
    assert _tables(first_look, first_id) == written


def _the_readme_finds_a_transactions_records(out: Path, capsys) -> None:
    """The README's mirror recipe, run as written: every half record of a transaction
    asked about again and again (a check request's) is found, its first and its copies."""
    text = (ROOT / "README.md").read_text()
    recipe = re.search(
        r"test_mirror_runs.py runs it with OUT and KEY set -->\n```python\n(.*?)```", text, re.S
    )
    assert recipe is not None
    checked = max(rows_of(out, "check_requests"), key=lambda row: row["check_times"])
    exec(recipe.group(1), {"OUT": str(out), "KEY": checked["uniq_key"]})
    shown = capsys.readouterr().out
    assert len(re.findall(r"^\d+ ", shown, re.M)) >= checked["check_times"], shown


def _newest_half_ms(store: Path) -> int:
    bounds = queue_bounds(store, CommitLogHeads.of(store), HALF_TOPIC, 0)
    assert bounds is not None and bounds.heads is not None
    return bounds.heads[1].store_timestamp_ms


def test_a_killed_run_repeats_cleanly_and_a_replaced_store_is_read_whole_again(
    spark: SparkSession, capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full, other, store, out = (tmp_path / name for name in ("full", "other", "a", "out"))
    _simulate(full, seed=21)
    ends = record_ends(full, HALF_TOPIC)
    copy_prefix(full, store, int(ends[len(ends) // 2]))
    _run(spark, capsys, store, out, "--mirror")
    copy_prefix(full, store, int(ends[-1]))
    committed = Mirror._commit

    def commit_then_die(self: Mirror, *args: object) -> None:
        committed(self, *args)
        raise KeyboardInterrupt  # killed right after the mirror's commit, before the round

    with monkeypatch.context() as patched:
        patched.setattr(Mirror, "_commit", commit_then_die)
        argv = ["--store", f"a={store}", "--output", str(out), "--mirror"]
        assert main(argv, spark=spark) == 130
    capsys.readouterr()
    _, printed = _run(spark, capsys, store, out, "--mirror")
    # The killed run's commit holds what the store appended, once.
    assert _mirrored(printed) == 0
    assert _mirror_rows(out) == _entries(store)

    _simulate(other, seed=22)
    shutil.rmtree(store)
    copy_prefix(other, store, int(record_ends(other, HALF_TOPIC)[-1]))
    _, printed = _run(spark, capsys, store, out, "--mirror")
    rebuilt = re.findall(r"warning: (\S+) of broker a rebuilt from its store: ", printed)
    assert rebuilt == ["mirror_records", "mirror_discards", "mirror_commits"], printed
    # The other store's rows replace the first's.
    assert _mirrored(printed) == _entries(store) == _mirror_rows(out)
    assert (out / DISCARDS.table / "_delta_log").is_dir()
