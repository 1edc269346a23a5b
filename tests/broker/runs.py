"""Run directories of the real-broker harness (format: harness/rocketmq/README.md), and a
simulated run directory in the same format for testing the comparisons themselves.

A run directory holds ``manifest.json``, ``rounds.jsonl`` and one store copy per round under
``snapshots/round-NNN/`` taken before that round's ``check()``, plus ``snapshots/live/``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from simulator.broker_round import BrokerSettings

RUN_ENV = "RMQ_BROKER_RUN"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real-broker"
CQ_ENTRY_SIZE = 20


@dataclass(frozen=True)
class RecordedRound:
    """One round as the real broker did it (``rounds.jsonl``), with the run it belongs to."""

    run: str  # run directory name (for test ids)
    version: str  # rocketmq_version of the manifest, e.g. 5.3.3
    number: int
    snapshot: Path
    as_of_ms: int
    settings: BrokerSettings
    checks: Counter
    immunity: Counter
    discards: Counter
    half_committed_before: int | None
    half_committed_after: int | None
    op_committed_before: int | None
    op_committed_after: int | None
    half_max_before: int | None
    half_max_after: int | None
    raw: dict

    @property
    def line(self) -> str:
        """Version line: 5.3.3 or 4.9.x."""
        return "4.9.x" if self.version.startswith("4.") else self.version

    @property
    def id(self) -> str:
        return f"{self.run}-{self.version}-r{self.number:03d}"


def _offset(value: object) -> int | None:
    """A committed offset as recorded; -1 / null: the broker has none (queue minimum)."""
    if value is None or int(value) < 0:
        return None
    return int(value)


def settings_of(manifest: dict) -> BrokerSettings:
    s = manifest["settings"]
    version = "4.9" if str(manifest["rocketmq_version"]).startswith("4.") else "5"
    return BrokerSettings(
        check_max=int(s["check_max"]),
        transaction_timeout_ms=int(s["transaction_timeout_ms"]),
        file_reserved_hours=int(s["file_reserved_hours"]),
        version=version,
        cq_file_entries=max(1, int(s["mapped_file_size_consume_queue"]) // CQ_ENTRY_SIZE),
    )


def load_run(run_dir: Path) -> list[RecordedRound]:
    """Every recorded round of a run directory (AssertionError with one line when it is not
    a complete run directory)."""
    manifest_path = run_dir / "manifest.json"
    rounds_path = run_dir / "rounds.jsonl"
    assert manifest_path.is_file(), f"{run_dir}: no manifest.json (not a harness run directory)"
    assert rounds_path.is_file(), f"{run_dir}: no rounds.jsonl"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    settings = settings_of(manifest)
    rounds = []
    for line in rounds_path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        appended = r.get("appended", [])
        snapshot = run_dir / r["snapshot"]
        assert snapshot.is_dir(), f"{run_dir}: round {r['round']}: snapshot {snapshot} missing"
        rounds.append(
            RecordedRound(
                run=run_dir.name,
                version=str(manifest["rocketmq_version"]),
                number=int(r["round"]),
                snapshot=snapshot,
                as_of_ms=int(r["as_of_ms"]),
                settings=settings,
                checks=Counter(
                    (a["uniq_key"], a["check_times"]) for a in appended if a["kind"] == "check"
                ),
                immunity=Counter(
                    (a["uniq_key"], a["check_times"]) for a in appended if a["kind"] == "immunity"
                ),
                discards=Counter((d["uniq_key"], d["check_times"]) for d in r.get("discards", [])),
                half_committed_before=_offset(r.get("half_committed_before")),
                half_committed_after=_offset(r.get("half_committed_after")),
                op_committed_before=_offset(r.get("op_committed_before")),
                op_committed_after=_offset(r.get("op_committed_after")),
                half_max_before=r.get("half_max_before"),
                half_max_after=r.get("half_max_after"),
                raw=r,
            )
        )
    assert rounds, f"{run_dir}: rounds.jsonl has no round"
    return rounds


def run_dirs_from_env() -> list[Path]:
    """``RMQ_BROKER_RUN``: one run directory, or a directory of run directories, or several
    separated by ``os.pathsep``. Unset: none. Set but missing or empty: AssertionError."""
    value = os.environ.get(RUN_ENV)
    if value is None:
        return []
    found: list[Path] = []
    for part in value.split(os.pathsep):
        path = Path(part)
        assert path.is_dir(), f"{RUN_ENV}={part}: no such directory"
        if (path / "manifest.json").is_file():
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.glob("*/manifest.json")))
    assert found, f"{RUN_ENV}={value}: no run directory (manifest.json) in it"
    return found


def fixture_dirs() -> list[Path]:
    """The checked-in real-broker runs, one per version line (``tests/fixtures/real-broker``)."""
    if not FIXTURES.is_dir():
        return []
    return sorted(p.parent for p in FIXTURES.glob("*/manifest.json"))


# -- a simulated run directory (the simulator plays the broker) --------------------------------


def _link_snapshot(snap: Path, store: Path, k: int, r: dict) -> None:
    """Round ``k``'s snapshot: the store's files, and the offsets committed before the round."""
    from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY, write_consumer_offsets

    (snap / "config").mkdir(parents=True)
    os.symlink(store / "commitlog", snap / "commitlog")
    os.symlink(store / "consumequeue", snap / "consumequeue")
    table = {}
    if k > 0 and r["h0"]:
        table[HALF_KEY] = {0: r["h0"]}
    if k > 0 and r["p0"]:
        table[OP_KEY] = {0: r["p0"]}
    write_consumer_offsets(snap / "config" / "consumerOffset.json", table)


def small_run_config(**extra):
    """A short simulated run that reaches every class of the round in a few rounds: three
    checks at most, a 5 s check interval, late and never-answering producers, immunity
    copies, small files (roll-overs) and other traffic; ``extra`` overrides any field."""
    import simulator.simulation as simulation

    base = dict(
        duration_s=120,
        check_interval_ms=5000,
        check_max=3,
        never_fraction=0.08,
        late_fraction=0.15,
        immunity_fraction=0.15,
        commitlog_file_size=1 << 16,
        cq_file_entries=64,
        other_traffic=0.2,
    )
    base.update(extra)
    return simulation.SimConfig(**base)


def write_simulated_run(out: Path, config, rounds: list[int] | None = None) -> Path:
    """A run directory in the harness's format whose "broker" is our simulator: the store is
    written once; each chosen round's snapshot links its commit log and consume queues and
    carries the offsets committed before it; ``rounds.jsonl`` holds what the simulator did.
    Used to test the comparisons before (and besides) real runs."""
    import simulator.simulation as simulation
    from simulator.broker_round import load_snapshot

    store = out / "store"
    sim = simulation.Simulation(config)
    holder: dict = {}

    def factory(cfg):
        holder["sim"] = sim
        return sim

    original = simulation.Simulation
    simulation.Simulation = factory  # write_store builds its own: hand it ours
    try:
        simulation.write_store(config, store)
    finally:
        simulation.Simulation = original
    full = load_snapshot(store)
    log = sim.round_log
    chosen = rounds if rounds is not None else list(range(len(log)))
    lines = []
    for k in chosen:
        r = log[k]
        _link_snapshot(out / "snapshots" / f"round-{k:03d}", store, k, r)
        appended, discards = [], []
        for src, counter, kind in r["actions"]:
            key = full.half[src].uniq_key
            if kind >= 3:
                appended.append(
                    {
                        "uniq_key": key,
                        "check_times": counter,
                        "kind": "immunity" if kind == 3 else "check",
                    }
                )
            else:
                discards.append({"uniq_key": key, "check_times": counter})
        lines.append(
            {
                "round": k,
                "snapshot": f"snapshots/round-{k:03d}",
                "as_of_ms": r["now"],
                "half_committed_before": r["h0"],
                "half_committed_after": r["h1"],
                "op_committed_before": r["p0"],
                "op_committed_after": r["p1"],
                "half_max_before": r["half_end"],
                "half_max_after": r["half_end"] + len(appended),
                "appended": appended,
                "discards": discards,
            }
        )
    manifest = {
        "rocketmq_version": "4.9.8" if config.op_style == "4.9" else "5.3.3",
        "broker_name": "simulated",
        "simulated": True,
        "settings": {
            "transaction_timeout_ms": config.transaction_timeout_ms,
            "check_max": config.check_max,
            "check_interval_ms": config.interval_ms,
            "file_reserved_hours": config.file_reserved_hours,
            "op_batch_interval_ms": config.op_batch_interval_ms,
            "mapped_file_size_commitlog": config.commitlog_file_size,
            "mapped_file_size_consume_queue": config.cq_file_entries * CQ_ENTRY_SIZE,
        },
        "rounds": len(lines),
        "transactions": config.transactions,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    (out / "rounds.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8"
    )
    return out


def replace_settings(recorded: RecordedRound, **changes) -> RecordedRound:
    return dataclasses.replace(recorded, settings=dataclasses.replace(recorded.settings, **changes))
