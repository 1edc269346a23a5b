"""What a run decided its open ``discard_history`` rows against (spec section 6, "Decided
against what arrived since"): its run id and T, and per queue read through the store's
mirror the first queue offset it had not read. The run writes it in the metadata of its
``discard_history`` commit; the next run decides the rows that run left ``unresolved``
only against the op records and commits outside it.

The text form is the one both Delta writers put in the commit (JSON, sorted keys).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from schemas.messages import QueueKey

# The commit metadata key (delta-rs' custom metadata; inside delta-spark's userMetadata).
VIEW_KEY = "rmq_txn_reconcile_decided_view"
VIEW_FORMAT = 1


@dataclass(frozen=True)
class DecidedView:
    """One run's view: ``ends`` holds, per queue it read through the mirror, the first
    queue offset it had not read (every record below it, stored before ``as_of_ms``, was
    evidence of that run's decisions)."""

    run_id: str
    as_of_ms: int
    ends: Mapping[QueueKey, int] = field(default_factory=dict)

    def without(self, brokers: frozenset[str]) -> DecidedView:
        """The view less the queues of ``brokers`` (their stores were read again from
        scratch: the old offsets say nothing about the new files)."""
        ends = {key: end for key, end in self.ends.items() if key[0] not in brokers}
        return DecidedView(self.run_id, self.as_of_ms, ends)


def view_text(view: DecidedView) -> str:
    """``view`` as a commit's metadata holds it."""
    ends = [[*key, end] for key, end in sorted(view.ends.items())]
    body = {"format": VIEW_FORMAT, "run_id": view.run_id, "as_of_ms": view.as_of_ms, "ends": ends}
    return json.dumps(body, sort_keys=True)


def parse_view(text: str | None) -> DecidedView | None:
    """The view of ``view_text``; None for anything else (no view, another format)."""
    try:
        body = json.loads(text) if text else None
        if not isinstance(body, dict) or body.get("format") != VIEW_FORMAT:
            return None
        ends = {(str(b), str(t), int(q)): int(end) for b, t, q, end in body["ends"]}
        return DecidedView(str(body["run_id"]), int(body["as_of_ms"]), ends)
    except (ValueError, TypeError, KeyError):
        return None
