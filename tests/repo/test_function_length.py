"""The function-length check of ``make lint`` (checks/function_length.py) on small trees."""

from __future__ import annotations

from pathlib import Path

from checks import function_length


def _tree(root: Path, body_lines: int) -> Path:
    """A checkout with one shipped module holding one function of ``1 + body_lines`` lines."""
    for package in function_length.PACKAGES:
        (root / package).mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    (root / "transforms" / "long.py").write_text(f"def f():\n{body}", encoding="utf-8")
    return root


def test_a_function_at_the_limit_passes(tmp_path):
    root = _tree(tmp_path, function_length.MAX_LINES - 1)
    assert list(function_length.offenders(root, kept={})) == []


def test_a_function_over_the_limit_is_named_with_its_length(tmp_path, capsys):
    root = _tree(tmp_path, function_length.MAX_LINES)
    found = list(function_length.offenders(root, kept={}))
    assert found == ["transforms/long.py:1: f is 71 lines (> 70)"]


def test_a_kept_function_passes_and_a_stale_entry_is_reported(tmp_path):
    root = _tree(tmp_path, function_length.MAX_LINES)
    kept = {"transforms/long.py:f": "issue 1", "transforms/gone.py:*": "issue 2"}
    found = list(function_length.offenders(root, kept=kept))
    assert found == [
        "transforms/gone.py:*: kept in checks/function_length.py but not over 70 lines: remove it"
    ]


def test_the_command_fails_naming_the_count(tmp_path, capsys):
    root = _tree(tmp_path, function_length.MAX_LINES)
    assert function_length.main([str(root)]) == 1
    assert "error: " in capsys.readouterr().out


def test_code_outside_the_shipped_packages_is_not_measured(tmp_path):
    root = _tree(tmp_path, 1)
    (root / "simulator").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(200))
    (root / "simulator" / "sim.py").write_text(f"def g():\n{body}", encoding="utf-8")
    assert list(function_length.offenders(root, kept={})) == []
