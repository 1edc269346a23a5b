"""``python -m jobs.offsets install``: merge a fragment into the broker's full
consumerOffset.json, everything else verbatim; refuse a target the broker moved on, a move
backwards, another broker's file, the ``after`` fragment and an empty fragment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from connectors.rocketmq.offsets_file import (
    HALF_KEY,
    OP_KEY,
    format_consumer_offsets,
    parse_consumer_offsets,
)
from jobs.offsets import (
    FRAGMENT_AFTER,
    FRAGMENT_COMMITTED,
    FRAGMENT_FACTS,
    FRAGMENT_SAFE,
    write_fragment_facts,
)
from tests.robustness.store import HALF, base_rows, half, write

ROOT = Path(__file__).resolve().parents[2]


def broker_file(half: int, op: int, groups: int = 300) -> str:
    """A 5.x broker's file as fastjson writes it: many groups (retry groups included),
    unquoted queue keys, dataVersion, and a key this job does not know."""
    lines = ["{", '\t"offsetTable":{']
    for g in range(groups):
        lines += [
            f'\t\t"Topic{g}@Group{g}":{{',
            f"\t\t\t0:{g * 7},",
            f"\t\t\t1:{g * 7 + 1}",
            "\t\t},",
        ]
        if g == groups // 2:
            lines += [f'\t\t"{HALF_KEY}":{{', f"\t\t\t0:{half}", "\t\t},"]
            lines += [f'\t\t"{OP_KEY}":{{', f"\t\t\t0:{op}", "\t\t},"]
    lines += ['\t\t"%RETRY%Group1@Group1":{', "\t\t\t0:0", "\t\t}", "\t},"]
    lines += ['\t"dataVersion":{', '\t\t"counter":4711,', '\t\t"stateVersion":0,']
    lines += ['\t\t"timestamp":1763900000000', "\t},", '\t"pullOffsetTable":{}', "}"]
    return "\n".join(lines)


def fragments(
    folder: Path, committed: tuple[int, int], safe: tuple[int, int], store: Path | None = None
) -> Path:
    """A run's fragments of broker ``b`` (with its ``store``'s marks when given)."""
    folder.mkdir(parents=True)
    tables = {}
    for name, (half_offset, op_offset) in ((FRAGMENT_COMMITTED, committed), (FRAGMENT_SAFE, safe)):
        tables[name] = {HALF_KEY: {0: half_offset}, OP_KEY: {0: op_offset}}
        (folder / name).write_text(format_consumer_offsets(tables[name]))
    (folder / FRAGMENT_AFTER).write_text(
        format_consumer_offsets({HALF_KEY: {0: 999}, OP_KEY: {0: 99}})
    )
    write_fragment_facts(folder, "b", "r1", store, tables[FRAGMENT_COMMITTED])
    return folder / FRAGMENT_SAFE


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs.offsets", "install", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_install_changes_only_the_transaction_queues_of_a_file_with_many_groups(
    tmp_path: Path,
) -> None:
    safe = fragments(tmp_path / "frag", committed=(26, 4), safe=(31, 6))
    target = tmp_path / "consumerOffset.json"
    before = broker_file(half=26, op=4)
    target.write_text(before)

    result = install(str(safe), "--into", str(target), "--broker", "b")

    assert result.returncode == 0, result.stderr
    after = target.read_text()
    changed = [
        (old, new)
        for old, new in zip(before.splitlines(), after.splitlines(), strict=True)
        if old != new
    ]
    # The two queue lines, nothing else: other groups, dataVersion, unknown keys and the
    # broker's formatting (tabs, unquoted integer keys) stay byte for byte.
    assert changed == [("\t\t\t0:26", "\t\t\t0:31"), ("\t\t\t0:4", "\t\t\t0:6")]
    parsed = parse_consumer_offsets(after)
    assert len(parsed) == 303
    assert parsed[HALF_KEY] == {0: 31} and parsed[OP_KEY] == {0: 6}
    assert f"{HALF_KEY} queue 0: 26 -> 31" in result.stdout


def test_install_refuses_a_target_the_broker_moved_on_unless_forced(tmp_path: Path) -> None:
    safe = fragments(tmp_path / "frag", committed=(26, 4), safe=(31, 6))
    target = tmp_path / "consumerOffset.json"
    moved_on = broker_file(half=28, op=4)
    target.write_text(moved_on)

    refused = install(str(safe), "--into", str(target), "--broker", "b")

    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "queue 0 is 28 there, the run started from 26" in lines[0] and "--force" in lines[0]
    assert target.read_text() == moved_on  # untouched

    forced = install(str(safe), "--into", str(target), "--broker", "b", "--force")

    assert forced.returncode == 0, forced.stderr
    assert parse_consumer_offsets(target.read_text())[HALF_KEY] == {0: 31}


def test_install_adds_missing_transaction_keys(tmp_path: Path) -> None:
    folder = tmp_path / "frag"
    safe = fragments(folder, committed=(0, 0), safe=(3, 1))
    # The run found no committed offsets: its committed fragment is empty.
    (folder / FRAGMENT_COMMITTED).write_text(format_consumer_offsets({}))
    target = tmp_path / "consumerOffset.json"
    target.write_text('{"offsetTable":{"T@G":{0:5}},"dataVersion":{"counter":1}}')

    result = install(str(safe), "--into", str(target), "--broker", "b")

    assert result.returncode == 0, result.stderr
    assert target.read_text() == (
        '{"offsetTable":{'
        f'"{HALF_KEY}":{{0:3}},"{OP_KEY}":{{0:1}},'
        '"T@G":{0:5}},"dataVersion":{"counter":1}}'
    )


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a refused install (exit 2)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result
    return lines[0]


def test_install_refuses_the_after_fragment_and_an_empty_one(tmp_path: Path) -> None:
    safe = fragments(tmp_path / "frag", committed=(26, 4), safe=(31, 6))
    target = tmp_path / "consumerOffset.json"
    before = broker_file(half=26, op=4, groups=2)
    target.write_text(before)

    after = refusal(install(str(safe.parent / FRAGMENT_AFTER), "--into", str(target)))
    safe.write_text(format_consumer_offsets({}))  # every queue of the run was held
    empty = refusal(install(str(safe), "--into", str(target), "--broker", "b"))

    assert f"install {FRAGMENT_SAFE}" in after and "loses every pending transaction" in after
    assert "holds no queue" in empty and "offset_hold" in empty
    assert target.read_text() == before


def test_install_refuses_a_move_backwards_unless_allowed(tmp_path: Path) -> None:
    # The target's broker ran on (half 26 -> 40) and the operator forces the stale fragment:
    # half 31 would be a rewind from 40.
    safe = fragments(tmp_path / "frag", committed=(26, 4), safe=(31, 6))
    target = tmp_path / "consumerOffset.json"
    moved_on = broker_file(half=40, op=4, groups=2)
    target.write_text(moved_on)

    refused = refusal(install(str(safe), "--into", str(target), "--broker", "b", "--force"))

    assert f"would move {HALF_KEY} queue 0 40 -> 31 backwards" in refused
    assert "--allow-rewind" in refused and target.read_text() == moved_on

    args = ("--into", str(target), "--broker", "b", "--force", "--allow-rewind")
    allowed = install(str(safe), *args)

    assert allowed.returncode == 0, allowed.stderr
    assert parse_consumer_offsets(target.read_text())[HALF_KEY] == {0: 31}
    assert f"warning: --allow-rewind: moved {HALF_KEY} queue 0 40 -> 31 backwards" in allowed.stderr


def test_install_refuses_another_brokers_file(tmp_path: Path) -> None:
    # Two brokers' stores whose committed offsets happen to match (1 and 0): only the
    # marks of the fragment's own store tell them apart.
    own, other = tmp_path / "broker-b", tmp_path / "broker-c"
    write(own, base_rows())
    write(other, [half(9, age_ms=90_000), *base_rows()])
    safe = fragments(tmp_path / "frag", committed=(1, 0), safe=(2, 1), store=own)
    for store in (own, other):
        (store / "config").mkdir(exist_ok=True)
        (store / "config" / "consumerOffset.json").write_text(broker_file(1, 0, groups=2))
    lone = tmp_path / "copy.json"
    lone.write_text(broker_file(1, 0, groups=2))

    foreign = refusal(install(str(safe), "--into", str(other / "config/consumerOffset.json")))
    named = refusal(install(str(safe), "--into", str(lone), "--broker", "c"))
    unknown = refusal(install(str(safe), "--into", str(lone)))
    own_file = install(str(safe), "--into", str(own / "config/consumerOffset.json"))
    confirmed = install(str(safe), "--into", str(lone), "--store", str(own))

    assert (
        f"is not the store the fragment was made from (broker b): its record at {HALF}" in foreign
    )
    assert "broker b's, not c's" in named
    assert "cannot tell whose file this is" in unknown and "--broker b" in unknown
    assert own_file.returncode == 0 and confirmed.returncode == 0, (own_file, confirmed)
    facts = (safe.parent / FRAGMENT_FACTS).read_text()
    assert '"broker": "b"' in facts and '"commitlog_offset"' in facts


def test_install_without_the_committed_fragment_is_exit_2(tmp_path: Path) -> None:
    safe = fragments(tmp_path / "frag", committed=(1, 1), safe=(2, 2))
    (safe.parent / FRAGMENT_COMMITTED).unlink()
    target = tmp_path / "consumerOffset.json"
    target.write_text(broker_file(1, 1, groups=2))

    result = install(str(safe), "--into", str(target))

    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and FRAGMENT_COMMITTED in result.stderr
