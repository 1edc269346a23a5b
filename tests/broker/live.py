"""A live (torn) store copy: the job must read it; unreadable bytes only at file tails."""

from __future__ import annotations

from pathlib import Path

from connectors.rocketmq.reader import StoreSpec, read_batches


def reconcile_live(spark, store: Path) -> list[dict]:
    """The job's round on the copy (as-of: latest); returns its run_summary rows."""
    from jobs.reconcile import reconcile_stores

    out = reconcile_stores(spark, [f"live={store}"], as_of="latest")
    rows = [r.asDict() for r in out.run_summary.collect()]
    assert rows, f"{store}: the job produced no run_summary row"
    return rows


def assert_torn_tail_only(store: Path) -> None:
    """Every bad record lies after every readable record of its source file (a torn tail:
    the copy caught a write in progress), and there are at most a few per file."""
    readable: dict[str, int] = {}
    bad: dict[str, list[tuple[int, str]]] = {}
    for batch in read_batches([StoreSpec("live", store)]):
        for row in batch.select(["source", "position", "reason"]).to_pylist():
            if row["reason"] is None:
                readable[row["source"]] = max(readable.get(row["source"], -1), row["position"])
            else:
                bad.setdefault(row["source"], []).append((row["position"], row["reason"]))
    for source, items in bad.items():
        last_good = readable.get(source, -1)
        inside = [(p, r) for p, r in items if p is None or p < last_good]
        assert not inside, f"{source}: unreadable records before readable ones: {inside[:3]}"
