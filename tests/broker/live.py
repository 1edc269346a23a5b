"""A live (torn) store copy: the job must read it; unreadable bytes only at file tails."""

from __future__ import annotations

from pathlib import Path

from connectors.rocketmq.reader import StoreSpec, read_batches


def reconcile_live(spark, store: Path) -> list[dict]:
    """The job's round on the copy (as-of: latest); returns its run_summary rows."""
    from jobs.reconcile import reconcile_stores

    out = reconcile_stores(spark, [f"live={store}"], as_of="latest")
    rows = [r.asDict() for r in out.run_summary.collect()]
    out.release()
    assert rows, f"{store}: the job produced no run_summary row"
    return rows


def assert_torn_tail_only(store: Path) -> int:
    """Every bad record lies after every readable record of its file and of its queue (a
    torn tail: the copy caught writes in progress), never in the middle. Returns how many."""
    readable: dict[str, int] = {}
    newest: dict[tuple[str, int], int] = {}
    bad: list[dict] = []
    columns = ["source", "position", "reason", "topic", "queue_id", "queue_offset"]
    for batch in read_batches([StoreSpec("live", store)]):
        for row in batch.select(columns).to_pylist():
            if row["reason"] is None:
                readable[row["source"]] = max(readable.get(row["source"], -1), row["position"])
                queue = (row["topic"], row["queue_id"])
                newest[queue] = max(newest.get(queue, -1), row["queue_offset"])
            else:
                bad.append(row)
    for row in bad:
        where = f"{row['source']}@{row['position']} ({row['reason']})"
        assert row["position"] is not None, where
        assert row["position"] > readable.get(row["source"], -1), f"not at the tail: {where}"
        if row["queue_offset"] is not None:
            later = newest.get((row["topic"], row["queue_id"]), -1)
            assert row["queue_offset"] > later, f"readable entries after {where}"
    return len(bad)
