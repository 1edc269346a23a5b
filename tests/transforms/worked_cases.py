"""The worked cases of spec section 8, as data: inputs and the expected round.

One broker ``b``, queue 0, ``T`` fixed, defaults (check_max 15, timeout 6000 ms, 72 h).
Both ``test_worked_cases`` (through Spark and ``transforms.round.reconcile``) and
``test_reference`` (through the pure-Python ``tests.reference``) check these, so the two
can never drift apart. Where the spec's table leaves a value implicit (h_safe, p_safe,
counters of untouched records), the expectation is derived from sections 5 and 6 and a
comment says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.outputs import (
    CHECK,
    DISCARD_CHECK_MAX,
    DISCARD_EXPIRED,
    IMMUNE,
    NOT_REACHED,
    REASON_CHECK_MAX,
    REASON_EXPIRED,
    TOO_YOUNG,
)
from tests.transforms.builders import committed_rows, half, op

S = 1_000  # one second in ms
H = 3_600_000  # one hour in ms
TIMEOUT = 6_000  # default transaction_timeout_ms = default immunity


@dataclass(frozen=True)
class WorkedCase:
    """A section 8 row.

    ``pending`` rows are ``(half_offset, status, check_times, immunity_ms)``; check requests
    and discards follow from them (section 6: one row per ``check`` / ``discard_*`` record).
    ``offsets`` is ``(h0, h1, h_safe, p0, p1, p_safe)``; ``counts`` lists the non-zero class
    counts; ``bad`` lists ``(topic, queue_offset, reason kind)``; ``held``: the queue is
    held (section 5 *Offsets only move forward*), so h_safe, p_safe and the offsets it
    proposes are null in the tables. ``broker_only`` lists the broker's checks and discards
    of no really pending record: ``(action, half_offset, check_times, settled_by_op_offset,
    own_copy)`` (a settled transaction checked again, a copy of this round discarded).
    """

    records: list[dict[str, Any]]
    committed: tuple[int | None, int | None]
    offsets: tuple[int, int, int, int, int, int]
    pending: list[tuple[int, str, int | None, int]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    bad: list[tuple[str, int, str]] = field(default_factory=list)
    warns: bool = False
    held: bool = False
    broker_only: list[tuple[str, int, int | None, int | None, bool]] = field(default_factory=list)

    @property
    def committed_rows(self) -> list[tuple[str, str, int, int]]:
        return committed_rows(*self.committed)

    @property
    def check_requests(self) -> list[tuple[int, int | None, int | None, bool]]:
        """``(half_offset, check_times, settled_by_op_offset, own_copy)``."""
        return [
            (offset, counter, settled, own)
            for status, offset, counter, settled, own in self._broker_actions()
            if status == CHECK
        ]

    @property
    def discards(self) -> list[tuple[int, str, int | None, int | None, bool]]:
        """``(half_offset, reason, check_times, settled_by_op_offset, own_copy)``."""
        reasons = {DISCARD_CHECK_MAX: REASON_CHECK_MAX, DISCARD_EXPIRED: REASON_EXPIRED}
        return [
            (offset, reasons[status], counter, settled, own)
            for status, offset, counter, settled, own in self._broker_actions()
            if status in reasons
        ]

    def _broker_actions(self) -> list[tuple[str, int, int | None, int | None, bool]]:
        really_pending = [
            (status, offset, counter, None, False) for offset, status, counter, _ in self.pending
        ]
        return really_pending + self.broker_only


CASES: dict[str, WorkedCase] = {
    # 0,1 resolved; 2 check (counter 1); h1=3, p1=2. h_safe = the check at 2.
    "C01": WorkedCase(
        records=[half(0, 60 * S), half(1, 60 * S), half(2, 60 * S), op(0, "1"), op(1, "0")],
        committed=(0, 0),
        offsets=(0, 3, 2, 0, 2, 2),
        pending=[(2, CHECK, 1, TIMEOUT)],
        counts={"resolved": 2, CHECK: 1},
    ),
    # 0 too_young; h1=0, p1=0.
    "C02": WorkedCase(
        records=[half(0, 3 * S)],
        committed=(0, 0),
        offsets=(0, 0, 0, 0, 0, 0),
        pending=[(0, TOO_YOUNG, None, TIMEOUT)],
        counts={TOO_YOUNG: 1},
    ),
    # discard check_max (counter 15); h1=1, h_safe=0: discards bound h_safe (2026-11-23).
    "C03": WorkedCase(
        records=[half(0, 60 * S, counter=15)],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, DISCARD_CHECK_MAX, 15, TIMEOUT)],
        counts={DISCARD_CHECK_MAX: 1},
    ),
    # check, counter 15; h1=1.
    "C04": WorkedCase(
        records=[half(0, 60 * S, counter=14)],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, CHECK, 15, TIMEOUT)],
        counts={CHECK: 1},
        # The broker reaches the check's copy (offset 1) in the same round: at the maximum.
        broker_only=[(DISCARD_CHECK_MAX, 1, 15, None, True)],
    ),
    # 72 h + 1 ms: discard expired, counter 1; the discard bounds h_safe.
    "C05": WorkedCase(
        records=[half(0, 72 * H + 1)],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, DISCARD_EXPIRED, 1, TIMEOUT)],
        counts={DISCARD_EXPIRED: 1},
    ),
    # At exactly 72 h: check.
    "C05_exactly_72h": WorkedCase(
        records=[half(0, 72 * H)],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, CHECK, 1, TIMEOUT)],
        counts={CHECK: 1},
    ),
    # immune, counter 1; h1=1, h_safe=0.
    "C06": WorkedCase(
        records=[half(0, 30 * S, immunity="60")],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, IMMUNE, 1, 60 * S)],
        counts={IMMUNE: 1},
    ),
    # 61 s with immunity 60 s: check.
    "C07": WorkedCase(
        records=[half(0, 61 * S, immunity="60")],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, CHECK, 1, 60 * S)],
        counts={CHECK: 1},
    ),
    # 1 s with immunity "0" (0 ms, no lower bound): check, not too_young (immunity is set).
    "C08": WorkedCase(
        records=[half(0, 1 * S, immunity="0")],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, CHECK, 1, 0)],
        counts={CHECK: 1},
    ),
    # 1 s with immunity "abc": immune (immunity 6000 ms, as the broker reads it), no bad
    # record (it takes part in the round) and so no hold: an unparsable_immunity finding.
    "C09": WorkedCase(
        records=[half(0, 1 * S, immunity="abc")],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, IMMUNE, 1, TIMEOUT)],
        counts={IMMUNE: 1},
    ),
    # 5 resolved; 6 too_young; h1=6, p1=1 (op 1 names 7 >= h1).
    "C10": WorkedCase(
        records=[half(5, 60 * S), half(6, 2 * S), op(0, "5"), op(1, "7")],
        committed=(5, 0),
        offsets=(5, 6, 6, 0, 1, 1),
        pending=[(6, TOO_YOUNG, None, TIMEOUT)],
        counts={"resolved": 1, TOO_YOUNG: 1},
    ),
    # h1=10; op 0 done (3 < h0); p1=1.
    "C11": WorkedCase(
        records=[half(10, 2 * S), op(0, "3")],
        committed=(10, 0),
        offsets=(10, 10, 10, 0, 1, 1),
        pending=[(10, TOO_YOUNG, None, TIMEOUT)],
        counts={TOO_YOUNG: 1},
    ),
    # op 0 (tag "x") names nothing, done; p1=1; h1=0.
    "C12": WorkedCase(
        records=[half(0, 2 * S), op(0, "0", tag="x")],
        committed=(0, 0),
        offsets=(0, 0, 0, 0, 1, 1),
        pending=[(0, TOO_YOUNG, None, TIMEOUT)],
        counts={TOO_YOUNG: 1},
    ),
    # 0 resolved; h1=1; op 0 names 2 >= h1: not done; p1=0.
    "C13": WorkedCase(
        records=[half(0, 60 * S), half(1, 2 * S), op(0, "0,2,")],
        committed=(0, 0),
        offsets=(0, 1, 1, 0, 0, 0),
        pending=[(1, TOO_YOUNG, None, TIMEOUT)],
        counts={"resolved": 1, TOO_YOUNG: 1},
    ),
    # 4 resolved; h1=5; both ops done; p1=2.
    "C14": WorkedCase(
        records=[half(4, 60 * S), half(5, 2 * S), op(0, "4"), op(1, "4")],
        committed=(4, 0),
        offsets=(4, 5, 5, 0, 2, 2),
        pending=[(5, TOO_YOUNG, None, TIMEOUT)],
        counts={"resolved": 1, TOO_YOUNG: 1},
    ),
    # smallest available 5: start at 5 with a warning; 5 check; h1=6.
    "C15": WorkedCase(
        records=[half(5, 60 * S), half(6, 2 * S)],
        committed=(0, 0),
        offsets=(5, 6, 5, 0, 0, 0),
        pending=[(5, CHECK, 1, TIMEOUT), (6, TOO_YOUNG, None, TIMEOUT)],
        counts={CHECK: 1, TOO_YOUNG: 1},
        warns=True,
    ),
    # empty: nothing; offsets unchanged.
    "C16": WorkedCase(
        records=[],
        committed=(0, 0),
        offsets=(0, 0, 0, 0, 0, 0),
    ),
    # 1 resolved by rule 2 (and 3); h1=2; p1=1. The broker would check it again.
    "C17": WorkedCase(
        records=[
            half(0, 65 * S, key="K", stored_age_ms=65 * S - 1),
            half(1, 65 * S, key="K", counter=1, prepared=0, immunity="60", stored_age_ms=5 * S),
            op(0, "0"),
        ],
        committed=(1, 1),
        offsets=(1, 2, 2, 1, 1, 1),
        counts={"resolved": 1},
        # The broker loads no op below p0 = 1: it checks the settled copy again.
        broker_only=[(CHECK, 1, 2, 0, False)],
    ),
    # 2 resolved by rule 3; h1=3, p1=1.
    "C18": WorkedCase(
        records=[
            half(0, 60 * S, key="K", stored_age_ms=60 * S - 1),
            half(1, 60 * S, key="K", counter=1, stored_age_ms=30 * S),
            half(2, 60 * S, key="K", counter=2, stored_age_ms=1 * S),
            op(0, "1"),
        ],
        committed=(2, 0),
        offsets=(2, 3, 3, 0, 1, 1),
        counts={"resolved": 1},
        # The broker drops the op item below h0 = 2 and matches exact offsets only.
        broker_only=[(CHECK, 2, 3, 0, False)],
    ),
    # 0 check; 1 too_young; 2 not_reached (a put-back copy keeps its old born time); h1=1.
    "C19": WorkedCase(
        records=[half(0, 60 * S), half(1, 2 * S), half(2, 60 * S, stored_age_ms=1 * S)],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[
            (0, CHECK, 1, TIMEOUT),
            (1, TOO_YOUNG, None, TIMEOUT),
            (2, NOT_REACHED, None, TIMEOUT),
        ],
        counts={CHECK: 1, TOO_YOUNG: 1, NOT_REACHED: 1},
    ),
    # born 5 s in the future (stored 1 ms before T): check (negative age).
    "C20": WorkedCase(
        records=[half(0, -5 * S, stored_age_ms=1)],
        committed=(0, 0),
        offsets=(0, 1, 0, 0, 0, 0),
        pending=[(0, CHECK, 1, TIMEOUT)],
        counts={CHECK: 1},
    ),
}
