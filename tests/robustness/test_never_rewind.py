"""Offsets only move forward (spec section 5): a damaged store tail, an early T and an empty
offsets file give no installable offset and say why first; a sound store's safe fragment
installs into its own store's file and nowhere else. Each case is a reproduction of the
bad-input corpus (docs/bad-input.md): exit code, first attention line, what is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from connectors.rocketmq.offsets_file import read_consumer_offsets
from connectors.rocketmq.probe import entry_at, queue_span, transaction_times
from jobs.offsets import FRAGMENT_FACTS, FRAGMENT_SAFE
from jobs.offsets import main as offsets_main
from jobs.reconcile import main
from simulator.simulation import SimConfig, write_store
from tests.robustness.store import HALF, rows_of

pytestmark = pytest.mark.runs

RUN = "rewind"
HELD_BACKWARDS = "the round ends below the committed offsets"
HELD_BAD = "bad records at or after the committed offset"
HELD_MISSING = "no committed offset in the offsets file"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("never-rewind") / "broker-a"
    config = SimConfig(transactions=400, seed=5, commitlog_file_size=256 * 1024)
    write_store(config, root)
    return root


def _copy(store: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "broker-a"
    shutil.copytree(store, copy)
    return copy


def _cut_tail(store: Path, records: int) -> None:
    """A half-copied store: the commit log ends where the ``records``-th last half record
    starts (its file cut there, the later files gone); the consume queues still name them."""
    span = queue_span(store, HALF, 0)
    assert span is not None and span[1] - span[0] > records
    entry = entry_at(store, HALF, 0, span[1] - records)
    assert entry is not None
    for log in sorted((store / "commitlog").iterdir()):
        start = int(log.name)
        if start > entry[0]:
            log.unlink()
        elif start + log.stat().st_size > entry[0]:
            with log.open("r+b") as file:
                file.truncate(entry[0] - start)


def _run(spark, capsys, store: Path, output: Path, as_of: str) -> tuple[int, list[str]]:
    argv = ["--store", f"broker-a={store}", "--output", str(output), "--as-of", as_of]
    code = main([*argv, "--run-id", RUN], spark=spark)
    return code, capsys.readouterr().out.splitlines()


def _attention(lines: list[str]) -> list[str]:
    """The printed lines of what needs attention first, in order."""
    begin = lines.index("needs attention first:") + 1
    end = next(i for i in range(begin, len(lines)) if not lines[i].startswith("  "))
    return [line.strip() for line in lines[begin:end]]


def _offsets(output: Path) -> list[dict]:
    return rows_of(output, "consume_offsets", RUN)


def _safe_fragment(output: Path) -> Path:
    return output / "offset_fragments" / "broker-a" / FRAGMENT_SAFE


def _assert_held(output: Path, reason: str) -> None:
    rows = _offsets(output)
    assert len(rows) == 2
    for row in rows:
        assert row["offset_safe"] is None and row["offset_after"] is None
        assert reason in row["offset_hold"]
    assert read_consumer_offsets(_safe_fragment(output)) == {}


def test_a_damaged_tail_holds_the_offsets_and_says_so_first(spark, capsys, store, tmp_path):
    copy = _copy(store, tmp_path)
    _cut_tail(copy, records=20)
    output = tmp_path / "out"

    code, lines = _run(spark, capsys, copy, output, "latest")

    assert code == 0
    first, second = _attention(lines)[:2]
    assert first.startswith("broker-a queue 0: offsets held, nothing to install:")
    assert HELD_BACKWARDS in first and HELD_BAD in first
    assert "bad half/op record(s) took no part in the round" in second
    tail = "consume-queue entries point at no readable record (a damaged or half-copied tail)"
    assert any(tail in line for line in _attention(lines))
    _assert_held(output, HELD_BAD)
    summary = rows_of(output, "run_summary", RUN)[0]
    assert summary["h_safe"] is None and summary["p_safe"] is None
    assert summary["anomalies_critical"] >= 1
    assert (
        offsets_main(["install", str(_safe_fragment(output)), "--into", str(tmp_path / "x")]) == 2
    )


def test_a_t_before_what_the_broker_passed_holds_the_offsets(spark, capsys, store, tmp_path):
    oldest = transaction_times(store).oldest_ms
    assert oldest is not None
    output = tmp_path / "out"

    code, lines = _run(spark, capsys, store, output, str(oldest + 1))

    assert code == 0
    assert HELD_BACKWARDS in _attention(lines)[0]
    _assert_held(output, HELD_BACKWARDS)
    kinds = {row["kind"] for row in rows_of(output, "anomalies", RUN)}
    assert {"offsets_held", "picture_warning"} <= kinds


def test_an_empty_offsets_file_holds_the_offsets_and_is_warned_first(
    spark, capsys, store, tmp_path
):
    copy = _copy(store, tmp_path)
    (copy / "config" / "consumerOffset.json").write_text("")
    output = tmp_path / "out"

    code, lines = _run(spark, capsys, copy, output, "latest")

    assert code == 0
    attention = _attention(lines)
    assert HELD_MISSING in attention[0]
    assert "consumerOffset.json is empty" in attention[1]
    _assert_held(output, HELD_MISSING)


def test_a_sound_stores_fragment_installs_into_its_own_store_only(spark, capsys, store, tmp_path):
    own, other = _copy(store, tmp_path / "own"), tmp_path / "other" / "broker-a"
    # Another broker with the same committed offsets in its file: only its records differ.
    write_store(SimConfig(transactions=400, seed=6, commitlog_file_size=256 * 1024), other)
    shutil.copy(own / "config" / "consumerOffset.json", other / "config" / "consumerOffset.json")
    output = tmp_path / "out"

    code, _ = _run(spark, capsys, own, output, "latest")

    assert code == 0 and all(row["offset_hold"] is None for row in _offsets(output))
    facts = json.loads((output / "offset_fragments" / "broker-a" / FRAGMENT_FACTS).read_text())
    assert facts["broker"] == "broker-a" and len(facts["marks"]) == 2
    install = ["install", str(_safe_fragment(output)), "--into"]
    foreign = offsets_main([*install, str(other / "config" / "consumerOffset.json")])
    refused = capsys.readouterr().err
    installed = offsets_main([*install, str(own / "config" / "consumerOffset.json")])
    assert (foreign, installed) == (2, 0)
    assert "is not the store the fragment was made from (broker broker-a)" in refused
