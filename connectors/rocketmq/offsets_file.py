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


# --- merging a fragment into the broker's full file ---------------------------------------------
#
# The broker's file holds every consumer group's offsets, a dataVersion and, depending on
# the version, more keys. Installing the job's offsets must change exactly the two
# transaction keys and leave every other byte as the broker wrote it, so the merge edits
# the text in place instead of re-serialising a parsed document.


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _string_end(text: str, i: int, source: str) -> int:
    """End of the string literal starting at ``i``."""
    literal = _STRING_LITERAL.match(text, i)
    if literal is None:
        raise InputError(f"{source}: unterminated string in the offsets file")
    return literal.end()


def _container_end(text: str, i: int, source: str) -> int:
    """End of the object or array starting at ``i`` (strings may hold braces)."""
    depth, j = 0, i
    while j < len(text):
        if text[j] == '"':
            j = _string_end(text, j, source)
            continue
        if text[j] in "{[":
            depth += 1
        elif text[j] in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise InputError(f"{source}: unbalanced braces in the offsets file")


def _value_end(text: str, i: int, source: str) -> int:
    """End of the JSON/fastjson value starting at ``i``."""
    if i >= len(text):
        raise InputError(f"{source}: unexpected end of the offsets file")
    if text[i] == '"':
        return _string_end(text, i, source)
    if text[i] in "{[":
        return _container_end(text, i, source)
    j = i
    while j < len(text) and text[j] not in ",}] \t\r\n":
        j += 1
    return j


@dataclass(frozen=True)
class _Member:
    key: str  # decoded: "offsetTable", "TOPIC@GROUP", "0"
    key_start: int
    key_end: int
    value_start: int
    value_end: int


def _members(text: str, open_index: int, source: str) -> list[_Member]:
    """The members of the object whose ``{`` is at ``open_index``, in file order."""
    members: list[_Member] = []
    i = _skip_space(text, open_index + 1)
    while i < len(text) and text[i] != "}":
        if text[i] == '"':
            key_end = _value_end(text, i, source)
        else:  # fastjson's bare integer key
            key_end = i
            while key_end < len(text) and text[key_end] not in ": \t\r\n,}":
                key_end += 1
        raw = text[i:key_end]
        key = json.loads(raw) if raw.startswith('"') else raw
        colon = _skip_space(text, key_end)
        if colon >= len(text) or text[colon] != ":":
            raise InputError(f"{source}: expected ':' after key {raw} in the offsets file")
        value_start = _skip_space(text, colon + 1)
        value_end = _value_end(text, value_start, source)
        members.append(_Member(str(key), i, key_end, value_start, value_end))
        i = _skip_space(text, value_end)
        if i < len(text) and text[i] == ",":
            i = _skip_space(text, i + 1)
    return members


def _queue_edits(
    text: str, member: _Member, offsets: Mapping[int, int], source: str
) -> list[tuple[int, int, str]]:
    """Edits that set ``offsets`` in one topic@group object, in the object's own style."""
    entries = _members(text, member.value_start, source)
    by_queue = {int(entry.key): entry for entry in entries}
    edits = [
        (by_queue[q].value_start, by_queue[q].value_end, str(int(offset)))
        for q, offset in offsets.items()
        if q in by_queue
    ]
    added = [(q, offset) for q, offset in sorted(offsets.items()) if q not in by_queue]
    if not added:
        return edits
    quoted = bool(entries) and text[entries[0].key_start] == '"'

    def entry(q: int, offset: int) -> str:
        return f'"{q}":{int(offset)}' if quoted else f"{q}:{int(offset)}"

    if not entries:  # "{}" (or "{ }"): write the broker's compact form
        body = ",".join(entry(q, o) for q, o in added)
        return [*edits, (member.value_start, member.value_end, "{" + body + "}")]
    if len(entries) > 1:
        separator = text[entries[-2].value_end : entries[-1].key_start]
    else:
        separator = "," + text[member.value_start + 1 : entries[0].key_start]
    tail = "".join(separator + entry(q, o) for q, o in added)
    return [*edits, (entries[-1].value_end, entries[-1].value_end, tail)]


def merge_offsets_text(text: str, fragment: Mapping[str, Mapping[int, int]], source: str) -> str:
    """``text`` (a full consumerOffset.json) with the queues of ``fragment`` set; every other
    byte unchanged (other groups, ``dataVersion``, unknown keys, formatting).

    Raises:
        InputError: ``text`` is not an offsets file, or the result does not read back as
            exactly the old offsets with ``fragment`` applied.
    """
    before = parse_consumer_offsets(text, source)
    start = _skip_space(text, 0)
    top = (
        {m.key: m for m in _members(text, start, source)} if text[start : start + 1] == "{" else {}
    )
    table_member = top.get("offsetTable")
    if table_member is None or text[table_member.value_start] != "{":
        raise InputError(f"{source}: no 'offsetTable' object in the offsets file")
    groups = _members(text, table_member.value_start, source)
    by_key = {group.key: group for group in groups}
    edits: list[tuple[int, int, str]] = []
    new_members = []
    for key, offsets in fragment.items():
        if key in by_key:
            edits += _queue_edits(text, by_key[key], offsets, source)
        else:
            body = ",".join(f"{q}:{int(o)}" for q, o in sorted(offsets.items()))
            new_members.append(f"{json.dumps(key)}:{{{body}}}")
    if new_members and groups:  # before the first group, with its indentation
        space = text[table_member.value_start + 1 : groups[0].key_start]
        added = "".join(member + "," + space for member in new_members)
        edits.append((groups[0].key_start, groups[0].key_start, added))
    elif new_members:
        span = (table_member.value_start, table_member.value_end)
        edits.append((*span, "{" + ",".join(new_members) + "}"))
    merged = text
    for begin, end, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        merged = merged[:begin] + replacement + merged[end:]
    expected = {key: dict(queues) for key, queues in before.items()}
    for key, offsets in fragment.items():
        expected.setdefault(key, {}).update(offsets)
    if parse_consumer_offsets(merged, source) != expected:  # never write a file we cannot trust
        raise InputError(f"{source}: merging the fragment did not give the expected offsets")
    return merged
