"""The one closing line of the real-broker comparisons.

Tests record each compared round in a JSON-lines file (``RMQ_BROKER_RESULTS``, default
``.pytest_cache/broker-results.jsonl`` under the working directory, truncated at the start
of every session); ``python -m tests.broker.summary [FILE]`` prints the line, and the
suite's terminal summary prints it too.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RESULTS_ENV = "RMQ_BROKER_RESULTS"
LINES = ("5.3.3", "4.9.x")
COMPARISONS = {"simulator", "job"}


def results_path() -> Path:
    return Path(os.environ.get(RESULTS_ENV, ".pytest_cache/broker-results.jsonl"))


def reset() -> None:
    path = results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")


def record(round_id: str, line: str, source: str, comparison: str, agrees: bool, **extra) -> None:
    """One comparison of one round (``comparison``: simulator | job)."""
    entry = {
        "round": round_id,
        "line": line,
        "source": source,
        "comparison": comparison,
        "agrees": agrees,
        **extra,
    }
    with results_path().open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def summary_line(entries: list[dict]) -> str | None:
    """``real broker: N/M rounds agree (5.3.3 a/b, 4.9.x c/d); tables: D differences (E
    rounds exact, C cut by dispatch); the really-pending picture: K differences, all by
    design``. Counts the rounds of real runs (an ``RMQ_BROKER_RUN`` run when one was
    compared, else the checked-in fixtures); a round agrees when both comparisons of the
    job's picture ran and agree on it. "tables": check_requests, discards and the
    put-backs against the broker's recorded round (``tables`` entries)."""
    real = [e for e in entries if e["source"] == "run"] or [
        e for e in entries if e["source"] == "fixture"
    ]
    if not real:
        return None
    tables = [e for e in real if e["comparison"] == "tables"]
    real = [e for e in real if e["comparison"] in COMPARISONS]
    rounds: dict[str, dict] = {}
    for e in real:
        slot = rounds.setdefault(
            e["round"], {"line": e["line"], "agrees": True, "diffs": 0, "seen": set()}
        )
        slot["agrees"] &= bool(e["agrees"])
        slot["seen"].add(e["comparison"])
        slot["diffs"] += int(e.get("differences", 0))
        slot["unexplained"] = slot.get("unexplained", 0) + int(e.get("unexplained", 0))
    for r in rounds.values():  # a round agrees only when both comparisons ran and agreed
        r["agrees"] &= r["seen"] >= COMPARISONS
    agree = sum(r["agrees"] for r in rounds.values())
    parts = []
    for line in LINES:
        mine = [r for r in rounds.values() if r["line"] == line]
        parts.append(f"{line} {sum(r['agrees'] for r in mine)}/{len(mine)}")
    k = sum(r["diffs"] for r in rounds.values())
    unexplained = sum(r["unexplained"] for r in rounds.values())
    tail = "all by design" if unexplained == 0 else f"{unexplained} NOT by design"
    cut = sum(bool(e.get("dispatch_cut")) for e in tables)
    exact = sum(bool(e["agrees"]) and not e.get("dispatch_cut") for e in tables)
    off = sum(int(e.get("differences", 0)) for e in tables)
    table_part = f"tables: {off} differences ({exact} rounds exact, {cut} cut by dispatch)"
    if not rounds:  # only the tables were compared (make test: test_real_tables)
        return f"real broker: {table_part}"
    picture = f"{k} differences, {tail}"
    if not tables:  # the job's picture only (make test-runs: test_real_rounds)
        return f"real broker: {agree}/{len(rounds)} rounds agree ({', '.join(parts)}); {picture}"
    return (
        f"real broker: {agree}/{len(rounds)} rounds agree ({', '.join(parts)}); "
        f"{table_part}; the really-pending picture: {picture}"
    )


def all_agree(entries: list[dict]) -> bool:
    return bool(entries) and all(e["agrees"] for e in entries)


def read(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else results_path()
    line = summary_line(read(path))
    if line is None:
        print(f"real broker: no compared round recorded in {path}", file=sys.stderr)
        return 1
    print(line)
    return 0 if all_agree(read(path)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
