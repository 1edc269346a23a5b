"""Read and write ``config/consumerOffset.json`` in the broker's own (fastjson) format.

fastjson writes queue-id keys as unquoted integers (``{0:26}``), which strict JSON parsers
reject. Reading quotes those keys first; writing reproduces the broker's shape (pretty
printed with tabs, unquoted integer keys) so an operator can drop a fragment in place.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from connectors.errors import InputError
from schemas.messages import HALF_TOPIC, OP_TOPIC, TRANS_GROUP

OFFSETS_RELATIVE_PATH = Path("config") / "consumerOffset.json"
OFFSETS_BACKUP_RELATIVE_PATH = Path("config") / "consumerOffset.json.bak"
HALF_KEY = f"{HALF_TOPIC}@{TRANS_GROUP}"
OP_KEY = f"{OP_TOPIC}@{TRANS_GROUP}"

# An unquoted integer key: after `{` or `,` (and white space), digits (optionally signed),
# then white space and a colon. String contents cannot match because JSON strings are
# quoted and topic@group keys never start with a digit right after a brace or comma
# outside of quotes; we only rewrite outside string literals to be safe.
_UNQUOTED_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")
_STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')

OffsetTable = dict[str, dict[int, int]]


def _quote_integer_keys(text: str) -> str:
    """Quote fastjson's bare integer keys, leaving string literals untouched."""
    pieces: list[str] = []
    last = 0
    for literal in _STRING_LITERAL.finditer(text):
        pieces.append(_UNQUOTED_KEY.sub(r'\1"\2"\3', text[last : literal.start()]))
        pieces.append(literal.group(0))
        last = literal.end()
    pieces.append(_UNQUOTED_KEY.sub(r'\1"\2"\3', text[last:]))
    return "".join(pieces)


def parse_consumer_offsets(text: str, source: str = "consumerOffset.json") -> OffsetTable:
    """Parse the file's text into ``{"TOPIC@GROUP": {queue_id: offset}}``.

    Only ``offsetTable`` is read (5.x files also hold ``dataVersion`` and more).

    Raises:
        InputError: the text is not fastjson/JSON, ``offsetTable`` is missing or not an
            object, or a queue id or offset is not a non-negative integer.
    """
    try:
        document = json.loads(_quote_integer_keys(text))
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{source}: not a consumerOffset.json file ({exc.msg} at line {exc.lineno})"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("offsetTable"), dict):
        raise InputError(f"{source}: no 'offsetTable' object in the offsets file")
    table: OffsetTable = {}
    for topic_group, queues in document["offsetTable"].items():
        if not isinstance(queues, dict):
            raise InputError(f"{source}: offsets of '{topic_group}' are not an object")
        parsed: dict[int, int] = {}
        for queue_key, offset in queues.items():
            try:
                queue_id = int(queue_key)
            except ValueError:
                raise InputError(
                    f"{source}: queue id '{queue_key}' of '{topic_group}' is not an integer"
                ) from None
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise InputError(
                    f"{source}: offset of '{topic_group}' queue {queue_id} is not an integer: {offset!r}"
                )
            if not (0 <= offset < 2**63 and 0 <= queue_id < 2**31):
                raise InputError(
                    f"{source}: offset or queue id out of range in '{topic_group}' queue {queue_id}: {offset}"
                    " (offsets are 0 .. 2^63-1, queue ids 0 .. 2^31-1)"
                )
            parsed[queue_id] = offset
        table[topic_group] = parsed
    return table


def read_consumer_offsets(path: str | os.PathLike[str]) -> OffsetTable | None:
    """Read an offsets file; ``None`` when it does not exist (offsets then start at the
    queue's smallest available offset). The file is opened read-only."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the offsets file ({exc})") from None
    return parse_consumer_offsets(text, source=str(path))


@dataclass(frozen=True)
class StoreOffsets:
    """The committed offsets of a store, as the broker would load them.

    Attributes:
        table: the offsets (``None``: no usable file, every queue starts at its smallest
            available offset).
        used: the file the offsets come from, relative to the store root, or a phrase
            saying there is none (for warnings).
        note: why the usual file was not used (``None`` when it was).
    """

    table: OffsetTable | None
    used: str
    note: str | None = None


def _load(path: Path) -> tuple[OffsetTable | None, str | None, str | None]:
    """``(table, None, None)`` for a usable file, else ``(None, what is wrong, the error
    line when the file is there but damaged)``."""
    if not path.exists():
        return None, "missing", None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, "unreadable", f"{path}: cannot read the offsets file ({exc})"
    if not text.strip():
        return None, "empty", None
    try:
        return parse_consumer_offsets(text, source=str(path)), None, None
    except InputError as exc:
        return None, "unparsable", str(exc)


def load_store_offsets(root: str | os.PathLike[str]) -> StoreOffsets:
    """``config/consumerOffset.json`` of a store, falling back like the broker
    (``ConfigManager.load``): when the file is missing, empty or unparsable, the ``.bak``
    beside it is used if it is usable; when neither is, no offsets (every queue starts at
    its smallest available offset). Files are opened read-only.

    Raises:
        InputError: the file is there, not empty, and unparsable, and no usable ``.bak``
            is beside it (a damaged file an operator must look at).
    """
    root = Path(root)
    main, backup = OFFSETS_RELATIVE_PATH, OFFSETS_BACKUP_RELATIVE_PATH
    table, problem, damage = _load(root / main)
    if problem is None:
        return StoreOffsets(table, str(main))
    backup_table, backup_problem, _ = _load(root / backup)
    if backup_problem is None:
        return StoreOffsets(
            backup_table, str(backup), f"{main} is {problem}: offsets read from {backup}"
        )
    if damage is not None:
        raise InputError(f"{damage}; no usable {backup.name} beside it ({backup_problem})")
    return StoreOffsets(
        None,
        f"no offsets file ({main} {problem}, {backup.name} {backup_problem})",
        f"{main} is {problem} and {backup} is {backup_problem}: every queue starts at its"
        " smallest available offset",
    )


def committed_rows(broker: str, table: OffsetTable | None) -> list[tuple[str, str, int, int]]:
    """Rows ``(broker, topic, queue_id, offset)`` of the two transaction keys, for
    ``schemas.messages.COMMITTED_OFFSET``."""
    rows: list[tuple[str, str, int, int]] = []
    for key, topic in ((HALF_KEY, HALF_TOPIC), (OP_KEY, OP_TOPIC)):
        for queue_id, offset in sorted((table or {}).get(key, {}).items()):
            rows.append((broker, topic, queue_id, offset))
    return rows


def format_consumer_offsets(table: Mapping[str, Mapping[int, int]]) -> str:
    """Render ``{"TOPIC@GROUP": {queue_id: offset}}`` the way the broker persists it:
    fastjson pretty printing with tabs and unquoted integer queue keys."""
    lines = ["{", '\t"offsetTable":{']
    groups = list(table.items())
    for index, (topic_group, queues) in enumerate(groups):
        lines.append(f"\t\t{json.dumps(topic_group)}:{{")
        entries = sorted(queues.items())
        for position, (queue_id, offset) in enumerate(entries):
            comma = "," if position < len(entries) - 1 else ""
            lines.append(f"\t\t\t{int(queue_id)}:{int(offset)}{comma}")
        lines.append("\t\t}" + ("," if index < len(groups) - 1 else ""))
    lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_consumer_offsets(
    path: str | os.PathLike[str], table: Mapping[str, Mapping[int, int]]
) -> None:
    """Write an offsets file atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(format_consumer_offsets(table))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
