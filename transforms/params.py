"""Parameters of one reconciliation round (spec section 1 configuration, plus the run identity)."""

from __future__ import annotations

from dataclasses import dataclass

MS_PER_HOUR = 3_600_000


@dataclass(frozen=True)
class RoundParams:
    """What a round is evaluated with. No defaults here: the job's come from
    ``conf/default.toml`` through ``jobs.pipeline.round_params`` (their one source).

    Attributes:
        as_of_ms: the instant T (epoch ms); only records stored before it exist.
        run_id: identity of the round; every output row carries it.
        check_max: [transactionCheckMax] discard when the counter reaches it.
        transaction_timeout_ms: [transactionTimeOut] default immunity.
        file_reserved_hours: [fileReservedTime] discard when older than this (born time).
        include_body: keep message bodies in check_requests/discards/pending.
        broker_version: "5" (5.1+) or "4.9": a 4.9 broker never marks an op record of
            another tag than ``d`` done, so its op offset stops there (p1; not p_safe).
        check_interval_ms: [transactionCheckInterval] the broker's round period; only
            forecasts (``discard_at_ms``) use it.
        slow_producer_percent, slow_producer_min_transactions, op_backlog_records,
        stalled_offset_runs: thresholds of the anomaly rules (``transforms.anomalies``).
    """

    as_of_ms: int
    run_id: str
    check_max: int
    transaction_timeout_ms: int
    file_reserved_hours: int
    include_body: bool
    broker_version: str
    check_interval_ms: int
    slow_producer_percent: int
    slow_producer_min_transactions: int
    op_backlog_records: int
    stalled_offset_runs: int

    @property
    def reserved_ms(self) -> int:
        return self.file_reserved_hours * MS_PER_HOUR
