"""``config/consumerOffset.json`` loaded like the broker (spec section 1, 2026-11-23): the
``.bak`` when the file is missing, empty or unparsable; no offsets when neither is usable;
a damaged file without a usable ``.bak`` stops the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.errors import InputError
from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, load_store_offsets

GOOD = f'{{"offsetTable":{{"{HALF_KEY}":{{0:2}},"{OP_KEY}":{{0:1}}}}}}'
OTHER = f'{{"offsetTable":{{"{HALF_KEY}":{{0:7}}}}}}'
MAIN, BAK = "config/consumerOffset.json", "config/consumerOffset.json.bak"


def _store(tmp_path: Path, main: str | None, bak: str | None) -> Path:
    (tmp_path / "config").mkdir()
    if main is not None:
        (tmp_path / MAIN).write_text(main)
    if bak is not None:
        (tmp_path / BAK).write_text(bak)
    return tmp_path


def test_a_usable_file_wins_over_its_bak(tmp_path: Path) -> None:
    loaded = load_store_offsets(_store(tmp_path, GOOD, OTHER))
    assert (loaded.table, loaded.used, loaded.note) == (
        {HALF_KEY: {0: 2}, OP_KEY: {0: 1}},
        MAIN,
        None,
    )


@pytest.mark.parametrize(
    ("main", "problem"), [(None, "missing"), ("", "empty"), (" \n", "empty"), ("{no", "unparsable")]
)
def test_the_bak_is_used_when_the_file_is_missing_empty_or_unparsable(
    tmp_path: Path, main: str | None, problem: str
) -> None:
    loaded = load_store_offsets(_store(tmp_path, main, GOOD))
    assert loaded.table == {HALF_KEY: {0: 2}, OP_KEY: {0: 1}}
    assert loaded.used == BAK
    assert loaded.note == f"{MAIN} is {problem}: offsets read from {BAK}"


@pytest.mark.parametrize(
    ("main", "bak", "problems"),
    [
        (None, None, ("missing", "missing")),
        ("", None, ("empty", "missing")),
        (None, "", ("missing", "empty")),
        ("", "{no", ("empty", "unparsable")),
    ],
)
def test_no_usable_file_means_no_offsets_with_a_note(
    tmp_path: Path, main: str | None, bak: str | None, problems: tuple[str, str]
) -> None:
    root = tmp_path
    if main is None and bak is None:
        root.mkdir(exist_ok=True)  # no config/ at all
    else:
        root = _store(tmp_path, main, bak)
    loaded = load_store_offsets(root)
    assert loaded.table is None
    assert loaded.used.startswith("no offsets file")
    assert loaded.note == (
        f"{MAIN} is {problems[0]} and {BAK} is {problems[1]}: every queue starts at its"
        " smallest available offset"
    )


@pytest.mark.parametrize("bak", [None, "", "{no"])
def test_a_malformed_file_without_a_usable_bak_is_an_input_error(
    tmp_path: Path, bak: str | None
) -> None:
    root = _store(tmp_path, "{not json", bak)
    with pytest.raises(InputError) as raised:
        load_store_offsets(root)
    message = str(raised.value)
    assert message.startswith(f"{root / MAIN}: not a consumerOffset.json file")
    assert "consumerOffset.json.bak" in message and "\n" not in message
