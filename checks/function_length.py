"""No function in shipped code is longer than ``MAX_LINES`` lines (``make lint``).

Shipped code is what ``make package`` puts in the cluster zip (``jobs.package.PACKAGES``); the
simulator and the tests are not shipped and are not checked. A function is measured from its
``def`` line (decorators excluded) to its last line, docstring and comments included: what a
reader has to hold to change it.

    python -m checks.function_length [ROOT]

prints one ``path:line: name is N lines (> 70)`` per offender and exits 1 when there is one.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from jobs.package import PACKAGES

MAX_LINES = 70

# Functions allowed to stay longer for now, each with the issue that removes it. Keep it short:
# a new entry needs a reason a reviewer accepts.
KEPT: dict[str, str] = {}


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function and method in a module, nested ones included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the ``def`` to the function's last line."""
    end = node.end_lineno if node.end_lineno is not None else node.lineno
    return end - node.lineno + 1


def is_kept(relative: str, name: str, kept: Mapping[str, str]) -> bool:
    """True when ``kept`` names the function or its whole file."""
    return f"{relative}:{name}" in kept or f"{relative}:*" in kept


def offenders(root: Path, kept: Mapping[str, str] = KEPT) -> Iterator[str]:
    """``path:line: name is N lines`` for each too-long function of the shipped packages, and
    each entry of ``KEPT`` that names a function no longer too long (or gone)."""
    used: set[str] = set()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
            for node in functions(tree):
                lines = length(node)
                if lines <= MAX_LINES:
                    continue
                if is_kept(relative, node.name, kept):
                    used.update({f"{relative}:{node.name}", f"{relative}:*"})
                    continue
                yield f"{relative}:{node.lineno}: {node.name} is {lines} lines (> {MAX_LINES})"
    for stale in sorted(set(kept) - used):
        yield f"{stale}: kept in checks/function_length.py but not over {MAX_LINES} lines: remove it"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    found = list(offenders(root))
    for line in found:
        print(line)
    if found:
        print(f"error: {len(found)} function(s) over {MAX_LINES} lines in shipped code")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
