"""A vectorised simulation of a RocketMQ broker's transactional-message life, as store records.

The engine plays a timeline of ``duration`` milliseconds ending at ``end_ms`` (broker clock):
producers in several producer groups send half messages for several real topics; most
transactions are committed or rolled back within milliseconds, some late, some never; the
broker's transaction check service runs a check round every ``check_interval_ms`` and does
what ``TransactionalMessageServiceImpl.check()`` does (4.9 or 5.1+ semantics, see
``docs/broker-check.md`` sections 2, 3 and 5): skip half offsets named by an
op record (exact offset match only), discard to ``TRANS_CHECK_MAX_TIME_TOPIC`` when the
counter reached the maximum or the message is older than the file reserved time, put back
immunity copies (``TRAN_PREPARED_QUEUE_OFFSET``, counter + 1, no check), stop at the first
too-young message, and otherwise put back a copy (counter + 1) and check the producer, whose
answer arrives later as an op record naming the copy's offset (and a real message on commit),
or never. The committed half and op offsets of the last round go to ``consumerOffset.json``.

Everything is computed with numpy / pyarrow over arrays: per-transaction attributes up front,
then one Python iteration per check round (the round itself is array operations over the half
records in its window), and one Arrow table per round window in commit-log order, handed to
``simulator.writer.StoreWriter`` in large batches.

Simplifications versus a live broker (also in ``docs/simulator.md``):

- a round is instantaneous for its decisions: ``now`` = the round's start time for every
  age test, and the whole op queue stored before the round start is loaded before any
  decision (the broker loads it 32 records at a time, so issue #8311-style decisions on a
  partial op map, and ops that arrive while the round runs, are not reproduced);
- the 60 s per-queue time limit of a round, put failures, exceptions, broker restarts and
  lost offset flushes are not simulated; offsets are committed at the end of every round;
- 5.x op batching: the batch thread wakes on a fixed 3 s grid (or at once when the queued
  text exceeds 4096 chars); the 20 000-item queue never fills.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.rocketmq import codec, layout
from schemas.messages import (
    DISCARD_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_IMMUNITY_SECONDS,
    PROP_KEYS,
    PROP_PREPARED_QUEUE_OFFSET,
    PROP_PRODUCER_GROUP,
    PROP_REAL_QUEUE_ID,
    PROP_REAL_TOPIC,
    PROP_TAGS,
    PROP_TRAN_MSG,
    PROP_TRANSACTION_ID,
    PROP_UNIQ_KEY,
    REMOVE_TAG,
)

# 2025-06-15T15:06:40Z: a fixed default end of the timeline, so that runs are reproducible.
DEFAULT_END_MS = 1_750_000_000_000
OP_STYLES = ("4.9", "5.x")

MAX_MESSAGE_SIZE = 4 * 1024 * 1024  # the broker's default maxMessageSize

BROKER_STORE_HOST = "10.0.0.10:10911"
CLUSTER_NAME = "DefaultCluster"
PROP_WAIT = "WAIT"
PROP_MSG_REGION = "MSG_REGION"
PROP_TRACE_ON = "TRACE_ON"
PROP_CLUSTER = "CLUSTER"
PROP_RETRY_TOPIC = "RETRY_TOPIC"
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"

# Half-record kinds.
KIND_ORIGINAL, KIND_CHECK_COPY, KIND_IMMUNITY_COPY = 0, 1, 2
# Transaction categories.
CAT_FAST, CAT_LATE, CAT_NEVER = 0, 1, 2
COMMIT, ROLLBACK = 1, 2
# Tie-break rank of records stored in the same millisecond (commit-log order).
RANK_ROUND, RANK_HALF, RANK_REAL, RANK_OP, RANK_OTHER = 0, 1, 2, 3, 4

NEVER = np.iinfo(np.int64).max
IMMUNITY_CHOICES_S = np.array([5, 10, 30, 60, 120], dtype=np.int64)

_TOPIC_NAMES = [
    "TopicOrder",
    "TopicPayment",
    "TopicInventory",
    "TopicShipping",
    "TopicRefund",
    "TopicCoupon",
    "TopicAccount",
    "TopicPoints",
]
_GROUP_NAMES = [
    "PID_ORDER_TX",
    "PID_PAYMENT_TX",
    "PID_INVENTORY_TX",
    "PID_SHIPPING_TX",
    "PID_REFUND_TX",
    "PID_COUPON_TX",
    "PID_ACCOUNT_TX",
    "PID_POINTS_TX",
]
_OTHER_TOPICS = [
    "TopicUserEvent",
    "TopicClickLog",
    "TopicAudit",
    "TopicNotify",
    "TopicSearchIndex",
    "%RETRY%CID_ORDER_CONSUMER",
]
_TAG_NAMES = ["TagA", "TagB", "TagC", "create", "update", "cancel"]
_LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud "
    "exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat. "
)
_MAX_PAD = 4096


@dataclass(frozen=True)
class SimConfig:
    """Parameters of one simulation. Only ``transactions`` is required.

    Rates are fractions of all transactions. ``duration_s`` defaults to
    max(1800 s, transactions / 1000 per s); ``check_interval_ms`` to the broker default of the
    op style (60 000 ms for 4.9, 30 000 ms for 5.1.1+).
    """

    transactions: int
    seed: int = 0
    op_style: str = "5.x"
    producer_groups: int = 3
    topics: int = 4
    other_traffic: float = 0.5
    clock_skew_ms: int = 0
    commitlog_file_size: int = 1 << 30
    cq_file_entries: int = 300_000
    duration_s: float | None = None
    check_interval_ms: int | None = None
    end_ms: int = DEFAULT_END_MS
    # broker configuration
    check_max: int = 15
    transaction_timeout_ms: int = 6000
    file_reserved_hours: int = 72
    op_batch_interval_ms: int = 3000
    op_msg_max_size: int = 4096
    putback_per_ms: int = 20
    # producer behaviour
    late_fraction: float = 0.03
    never_fraction: float = 0.01
    rollback_fraction: float = 0.1
    immunity_fraction: float = 0.05
    lost_end_fraction: float = 0.002
    body_bytes: int = 200
    ipv6_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.transactions < 0:
            raise ValueError("transactions must be >= 0")
        if self.op_style not in OP_STYLES:
            raise ValueError(f"op_style must be one of {OP_STYLES}, not {self.op_style!r}")
        if self.producer_groups < 1 or self.topics < 1:
            raise ValueError("producer_groups and topics must be >= 1")
        if self.other_traffic < 0 or self.clock_skew_ms < 0:
            raise ValueError("other_traffic and clock_skew_ms must be >= 0")
        if self.commitlog_file_size < 64 * 1024:
            raise ValueError("commitlog_file_size must be at least 64 KiB")
        if self.cq_file_entries < 1:
            raise ValueError("cq_file_entries must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration_s must be > 0")
        if self.check_interval_ms is not None and self.check_interval_ms < 1000:
            raise ValueError("check_interval_ms must be >= 1000")
        for name in (
            "late_fraction",
            "never_fraction",
            "rollback_fraction",
            "immunity_fraction",
            "lost_end_fraction",
            "ipv6_fraction",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if self.late_fraction + self.never_fraction > 1.0:
            raise ValueError("late_fraction + never_fraction must be <= 1")
        if not 16 <= self.body_bytes <= 64 * 1024:
            raise ValueError("body_bytes must be within [16, 65536]")

    @property
    def interval_ms(self) -> int:
        if self.check_interval_ms is not None:
            return int(self.check_interval_ms)
        return 60_000 if self.op_style == "4.9" else 30_000

    @property
    def duration_ms(self) -> int:
        if self.duration_s is not None:
            return round(self.duration_s * 1000)
        return int(max(1800.0, self.transactions / 1000.0) * 1000)

    @property
    def start_ms(self) -> int:
        return self.end_ms - self.duration_ms


@dataclass
class SimSummary:
    """What the simulation wrote, counted by the simulation itself."""

    transactions: int
    op_style: str
    start_ms: int
    end_ms: int
    records_by_topic: dict[str, int] = field(default_factory=dict)
    commitlog_bytes: int = 0
    rounds: int = 0
    checks: int = 0
    immunity_putbacks: int = 0
    discards_check_max: int = 0
    discards_expired: int = 0
    commits: int = 0
    rollbacks: int = 0
    check_answers: int = 0
    direct_rejected: int = 0
    op_records: int = 0
    op_items: int = 0
    half_offset: int = 0
    op_offset: int = 0
    half_queue_end: int = 0
    op_queue_end: int = 0
    store_bytes: int = 0  # on disk (st_blocks): the files are sparse beyond their data
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self) -> str:
        """One line for the command line."""
        by_topic = " ".join(
            f"{topic}={count}" for topic, count in sorted(self.records_by_topic.items())
        )
        rate = self.transactions / self.seconds if self.seconds > 0 else 0.0
        return (
            f"simulated {self.transactions} transactions ({self.op_style} ops, {self.rounds} check rounds): "
            f"records {sum(self.records_by_topic.values())} [{by_topic}] "
            f"checks={self.checks} immunity_putbacks={self.immunity_putbacks} "
            f"discards={self.discards_check_max}+{self.discards_expired} "
            f"offsets half={self.half_offset}/{self.half_queue_end} op={self.op_offset}/{self.op_queue_end} "
            f"commitlog_bytes={self.commitlog_bytes} disk_bytes={self.store_bytes} "
            f"seconds={self.seconds:.1f} ({rate:,.0f} tx/s)"
        )


# --------------------------------------------------------------------------- helpers


class _Grow:
    """An append-only numpy array with amortised growth."""

    def __init__(self, dtype: Any, capacity: int = 1024) -> None:
        self._data = np.empty(max(capacity, 16), dtype=dtype)
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        need = self.n + len(values)
        if need > len(self._data):
            bigger = np.empty(max(need, 2 * len(self._data)), dtype=self._data.dtype)
            bigger[: self.n] = self._data[: self.n]
            self._data = bigger
        self._data[self.n : need] = values
        self.n = need

    @property
    def values(self) -> np.ndarray:
        return self._data[: self.n]


def java_hashmap_order(keys: list[str], capacity: int) -> list[str]:
    """Iteration order of a ``java.util.HashMap`` of ``capacity`` buckets holding ``keys``
    inserted in the given order (bucket index of the spread hash, then insertion order)."""

    def bucket(key: str) -> int:
        h = layout.java_string_hash_one(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return [key for _, _, key in sorted((bucket(key), rank, key) for rank, key in enumerate(keys))]


_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
# byte -> its two upper-case hex characters, as one native uint16 (viewed back as 2 bytes)
_HEX_PAIRS = (
    np.stack([_HEX[np.arange(256) >> 4], _HEX[np.arange(256) & 15]], axis=1)
    .copy()
    .view(np.uint16)[:, 0]
)


def _fixed_strings(matrix: np.ndarray) -> pa.Array:
    """Rows of a (n, w) uint8 matrix of ASCII as a string array, without a Python loop."""
    n, width = matrix.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
    data = np.ascontiguousarray(matrix, dtype=np.uint8)
    return pa.Array.from_buffers(
        pa.large_string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    ).cast(pa.string())


def _month_start_ms(ms: np.ndarray) -> np.ndarray:
    """UTC start of the month of each epoch-ms value."""
    if not len(ms):
        return ms.copy()
    lo, hi = int(ms.min()), int(ms.max())
    months = np.arange(
        np.datetime64(lo, "ms").astype("datetime64[M]"),
        np.datetime64(hi, "ms").astype("datetime64[M]") + 2,
    )
    starts = months.astype("datetime64[ms]").astype(np.int64)
    return starts[np.searchsorted(starts, ms, side="right") - 1]


def _uniq_keys(fingerprint: np.ndarray, born: np.ndarray, counter: np.ndarray) -> pa.Array:
    """RocketMQ client message ids (``MessageClientIDSetter``): 10 fingerprint bytes (IPv4,
    pid, class-loader hash), then int32 ms since the start of the month and a short counter,
    as 32 upper-case hex characters."""
    n = len(born)
    raw = np.empty((n, 16), dtype=np.uint8)
    raw[:, :10] = fingerprint
    diff = (born - _month_start_ms(born)).astype(">u4")
    raw[:, 10:14] = diff.view(np.uint8).reshape(n, 4)
    raw[:, 14:16] = (counter & 0xFFFF).astype(">u2").view(np.uint8).reshape(n, 2)
    return _fixed_strings(_HEX_PAIRS[raw].view(np.uint8).reshape(n, 32))


def _int_strings(values: np.ndarray, present: np.ndarray | None = None) -> pa.Array:
    array = pa.array(values, mask=None if present is None else ~present)
    return pc.cast(array, pa.string())


def _join(*parts: Any) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "", null_handling="emit_null")


def _build_properties(
    entries: dict[str, Any], insertion: list[str], capacity: int, trailing: bool, n: int
) -> pa.Array:
    """Encode ``name\\x01value\\x02…`` per record in Java HashMap order. ``entries`` maps a
    property name to a string array (null = absent) or a str (present everywhere)."""
    order = java_hashmap_order([key for key in insertion if key in entries], capacity)
    pieces = []
    for key in order:
        value = entries[key]
        if isinstance(value, str):
            pieces.append(pa.scalar(f"{key}\x01{value}\x02"))
        else:
            pieces.append(_join(pa.scalar(f"{key}\x01"), value, pa.scalar("\x02")))
    if not pieces:
        return pa.array([""] * n, pa.string())
    if all(isinstance(piece, pa.Scalar) for piece in pieces):
        text = "".join(piece.as_py() for piece in pieces)
        joined = pa.array([text] * n, pa.string())
    else:
        joined = pc.binary_join_element_wise(*pieces, "", null_handling="skip")
    if not trailing:
        joined = pc.utf8_slice_codeunits(joined, 0, -1)
    return joined


_PADS: pa.Array | None = None


def _pads() -> pa.Array:
    global _PADS
    if _PADS is None:
        text = (_LOREM * (_MAX_PAD // len(_LOREM) + 2))[:_MAX_PAD]
        _PADS = pa.array([text[:k] for k in range(_MAX_PAD + 1)], pa.string())
    return _PADS


def _pad_to(header: pa.Array, total: np.ndarray, tail: str) -> pa.Array:
    """``header + pad + tail`` with the pad chosen so the result has ``total`` bytes where
    possible (never shorter than header + tail)."""
    head_len = pc.binary_length(header).to_numpy(zero_copy_only=False).astype(np.int64)
    pad_len = np.clip(total - head_len - len(tail), 0, _MAX_PAD)
    pads = _pads().take(pa.array(pad_len))
    return _join(header, pads, pa.scalar(tail))


# --------------------------------------------------------------------------- the engine


@dataclass
class Window:
    """Records stored in one window of the timeline, in commit-log order."""

    table: pa.Table
    commitlog_offsets: np.ndarray
    stored_sizes: np.ndarray


class Simulation:
    """The simulated broker. Iterate ``windows()`` once; read ``summary`` and
    ``committed_offsets`` afterwards."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.c = config
        seeds = np.random.SeedSequence(config.seed).spawn(6)
        self._rng_actors = np.random.default_rng(seeds[0])
        self._rng_txn = np.random.default_rng(seeds[1])
        self._rng_round = np.random.default_rng(seeds[2])
        self._rng_answer = np.random.default_rng(seeds[3])
        self._rng_other = np.random.default_rng(seeds[4])
        self._rng_batch = np.random.default_rng(seeds[5])
        self.trailing = config.op_style == "5.x"  # 5.2+ keeps the trailing \x02
        self.summary = SimSummary(
            transactions=config.transactions,
            op_style=config.op_style,
            start_ms=config.start_ms,
            end_ms=config.end_ms,
        )
        self._make_actors()
        self._make_transactions()
        self._make_other_traffic()
        # half queue 0, indexed by queue offset
        self.h_txn = _Grow(np.int64)
        self.h_kind = _Grow(np.int8)
        self.h_counter = _Grow(np.int16)
        self.h_prepared = _Grow(np.int64)
        self.h_store = _Grow(np.int64)
        self.h_clog = _Grow(np.int64)
        # op queue 0: store time per op record, CSR of the half offsets it names
        self.op_store = _Grow(np.int64)
        self.op_ptr = _Grow(np.int64)
        self.op_ptr.extend(np.zeros(1, dtype=np.int64))
        self.op_items = _Grow(np.int64)
        # committed offsets of CID_RMQ_SYS_TRANS
        self.half_committed = 0
        self.op_committed = 0
        # END_TRANSACTION events not yet stored: time, txn, half offset, outcome, seq
        self._pending_end: dict[str, np.ndarray] = {
            k: np.empty(0, np.int64) for k in ("t", "txn", "off", "out", "seq")
        }
        self._end_seq = 0
        self._direct_ptr = 0
        self._other_ptr = 0
        # 5.x op batching: items queued but not yet flushed (time, value)
        self._queued_t = np.empty(0, np.int64)
        self._queued_v = np.empty(0, np.int64)
        self._batch_phase = config.start_ms + int(
            self._rng_batch.integers(0, config.op_batch_interval_ms)
        )
        self.position = 0  # commit-log write position (absolute)
        self.round_times: list[int] = []  # start time of every check round
        self.round_ends: list[int] = []  # time of the last put-back / discard write of every round
        # per round: start, offsets before/after, (source offset, counter, action) of every
        # copy and discard (tests replay rounds on the written store and compare with this)
        self.round_log: list[dict[str, Any]] = []
        self._ran = False

    # ------------------------------------------------------------------ actors

    def _make_actors(self) -> None:
        c, rng = self.c, self._rng_actors
        n_groups, n_topics = c.producer_groups, c.topics
        self.topic_names = [
            (_TOPIC_NAMES[k] if k < len(_TOPIC_NAMES) else f"TopicTx{k:03d}")
            for k in range(n_topics)
        ]
        self.group_names = [
            (_GROUP_NAMES[g] if g < len(_GROUP_NAMES) else f"PID_TX_{g:03d}")
            for g in range(n_groups)
        ]
        self.topic_queues = rng.choice(np.array([4, 8, 8, 16]), size=n_topics)
        # topics a group sends to: every topic is used by some group
        self.group_topics = [
            [k for k in range(n_topics) if k % n_groups == g % n_groups] or [g % n_topics]
            for g in range(n_groups)
        ]
        weights = 1.0 / np.arange(1, n_groups + 1)
        self.group_weights = weights / weights.sum()
        self.group_flag = np.zeros(n_groups, dtype=np.int32)
        if n_groups >= 2:
            self.group_flag[1] = 1  # one group sets the user FLAG; put-back copies reset it to 0
        self.group_keys = np.arange(n_groups) % 2 == 0  # even groups set KEYS
        self.group_tags = np.arange(n_groups) % 3 != 2  # most groups set TAGS
        # producer instances (clients)
        per_group = rng.integers(2, 5, size=n_groups)
        self.inst_group = np.repeat(np.arange(n_groups), per_group)
        n_inst = len(self.inst_group)
        self.inst_skew = np.zeros(n_inst, dtype=np.int64)
        if c.clock_skew_ms > 0:
            skewed = rng.random(n_inst) < 0.5
            skewed[rng.integers(0, n_inst)] = True  # at least one
            self.inst_skew[skewed] = rng.integers(
                -c.clock_skew_ms, c.clock_skew_ms + 1, size=int(skewed.sum())
            )
        self.inst_v6 = rng.random(n_inst) < c.ipv6_fraction
        hosts, fingerprint = self._hosts(rng, n_inst, self.inst_v6, subnet=20)
        self.inst_host = pa.array(hosts, pa.string())
        self.inst_fingerprint = fingerprint
        # other-traffic producers
        n_other = 6
        self.other_inst_v6 = rng.random(n_other) < c.ipv6_fraction
        hosts, fingerprint = self._hosts(rng, n_other, self.other_inst_v6, subnet=40)
        self.other_host = pa.array(hosts, pa.string())
        self.other_fingerprint = fingerprint
        self.other_topic_names = list(_OTHER_TOPICS)
        self.other_topic_queues = rng.choice(np.array([4, 8]), size=len(_OTHER_TOPICS))

    @staticmethod
    def _hosts(
        rng: np.random.Generator, n: int, v6: np.ndarray, subnet: int
    ) -> tuple[list[str], np.ndarray]:
        ips = rng.integers(1, 255, size=(n, 2))
        ports = rng.integers(32768, 61000, size=n)
        pids = rng.integers(1000, 65535, size=n)
        loader = rng.integers(0, 2**32, size=n, dtype=np.uint64)
        hosts, fingerprint = [], np.empty((n, 10), dtype=np.uint8)
        for k in range(n):
            ipv4 = (10, subnet + k % 8, int(ips[k, 0]), int(ips[k, 1]))
            if v6[k]:
                hosts.append(
                    f"[fd00::{subnet:x}:{int(ips[k, 0]):x}:{int(ips[k, 1]):x}]:{int(ports[k])}"
                )
            else:
                hosts.append(f"{ipv4[0]}.{ipv4[1]}.{ipv4[2]}.{ipv4[3]}:{int(ports[k])}")
            fingerprint[k, :4] = ipv4
            fingerprint[k, 4:6] = np.frombuffer(int(pids[k]).to_bytes(2, "big"), dtype=np.uint8)
            fingerprint[k, 6:10] = np.frombuffer(int(loader[k]).to_bytes(4, "big"), dtype=np.uint8)
        return hosts, fingerprint

    # ------------------------------------------------------------------ transactions

    def _make_transactions(self) -> None:
        c, rng = self.c, self._rng_txn
        n = c.transactions
        start, end = c.start_ms, c.end_ms
        # half store times (broker clock), sorted: transaction i is the i-th half stored
        self.t_store = np.sort(rng.integers(start, end, size=n, dtype=np.int64))
        self.t_group = rng.choice(len(self.group_names), size=n, p=self.group_weights).astype(
            np.int16
        )
        group_first = np.concatenate(
            ([0], np.cumsum(np.bincount(self.inst_group, minlength=len(self.group_names))))
        )
        group_size = np.diff(group_first)
        self.t_inst = (
            group_first[self.t_group] + (rng.random(n) * group_size[self.t_group]).astype(np.int64)
        ).astype(np.int32)
        latency = rng.integers(1, 6, size=n)
        self.t_born = self.t_store - latency + self.inst_skew[self.t_inst]
        # real topic and queue
        topic = np.empty(n, dtype=np.int64)
        pick = rng.random(n)
        for g, topics in enumerate(self.group_topics):
            mine = self.t_group == g
            topic[mine] = np.asarray(topics)[(pick[mine] * len(topics)).astype(np.int64)]
        self.t_topic = topic.astype(np.int16)
        self.t_qid = (rng.random(n) * self.topic_queues[topic]).astype(np.int16)
        self.t_tag = np.where(
            self.group_tags[self.t_group], rng.integers(0, len(_TAG_NAMES), size=n), -1
        ).astype(np.int8)
        self.t_order = 100_000_000 + np.arange(n, dtype=np.int64) * 7 + rng.integers(0, 7, size=n)
        self.t_amount = rng.integers(100, 500_000, size=n).astype(np.int32)
        self.t_body_len = np.clip(
            rng.lognormal(math.log(c.body_bytes), 0.5, size=n), 96, 4000
        ).astype(np.int32)
        # client message-id counter: per instance, in send order
        order = np.argsort(self.t_inst, kind="stable")
        counts = np.bincount(self.t_inst, minlength=len(self.inst_group))
        firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - np.repeat(firsts, counts)
        base = rng.integers(0, 65536, size=len(self.inst_group))
        self.t_counter = (base[self.t_inst] + rank).astype(np.int32)
        # immunity (CHECK_IMMUNITY_TIME_IN_SECONDS), -1 when absent
        immune = rng.random(n) < c.immunity_fraction
        self.t_imm = np.where(
            immune, IMMUNITY_CHOICES_S[rng.integers(0, len(IMMUNITY_CHOICES_S), size=n)], -1
        ).astype(np.int32)
        # outcome: when the producer knows it (broker clock), which, whether it sends END_TRANSACTION itself
        draw = rng.random(n)
        category = np.where(
            draw < c.never_fraction,
            CAT_NEVER,
            np.where(draw < c.never_fraction + c.late_fraction, CAT_LATE, CAT_FAST),
        )
        fast_delay = np.clip(rng.lognormal(math.log(40.0), 1.2, size=n), 1, 5000)
        # producers that set an immunity run long local transactions: up to ~1.2 x immunity
        imm_delay = rng.uniform(0.05, 1.2, size=n) * np.maximum(self.t_imm, 0) * 1000
        fast_delay = np.where(immune, np.maximum(imm_delay, 1), fast_delay)
        late_delay = np.exp(rng.uniform(math.log(10_000), math.log(1_800_000), size=n))
        delay = np.where(category == CAT_LATE, late_delay, fast_delay).astype(np.int64)
        self.t_decide = np.where(category == CAT_NEVER, NEVER, self.t_store + np.maximum(delay, 1))
        self.t_outcome = np.where(rng.random(n) < c.rollback_fraction, ROLLBACK, COMMIT).astype(
            np.int8
        )
        direct_draw = rng.random(n)
        direct = np.where(
            category == CAT_FAST,
            direct_draw >= c.lost_end_fraction,
            np.where(category == CAT_LATE, direct_draw < 0.5, False),
        )
        if c.op_style == "5.x":
            # 5.1.1+: a non-check END_TRANSACTION of a message with an immunity property is
            # rejected (ILLEGAL_OPERATION, nothing written) once now - born > max(immunity, timeout)
            limit = np.maximum(self.t_imm * 1000, c.transaction_timeout_ms)
            rejected = direct & immune & (self.t_decide - self.t_born > limit)
            self.summary.direct_rejected = int(rejected.sum())
            direct &= ~rejected
        self.t_category = category.astype(np.int8)
        direct_txns = np.flatnonzero(direct & (self.t_decide < end))
        self._direct_order = direct_txns[np.argsort(self.t_decide[direct_txns], kind="stable")]
        self.t_orig_off = np.full(n, -1, dtype=np.int64)

    def _make_other_traffic(self) -> None:
        c, rng = self.c, self._rng_other
        m = round(c.other_traffic * c.transactions)
        self.o_store = np.sort(rng.integers(c.start_ms, c.end_ms, size=m, dtype=np.int64))
        n_topics = len(self.other_topic_names)
        weights = np.array([4.0, 3.0, 2.0, 2.0, 1.0, 0.5])[:n_topics]
        self.o_topic = rng.choice(n_topics, size=m, p=weights / weights.sum()).astype(np.int16)
        self.o_qid = (rng.random(m) * self.other_topic_queues[self.o_topic]).astype(np.int16)
        self.o_inst = rng.integers(0, len(self.other_fingerprint), size=m).astype(np.int32)
        self.o_born = self.o_store - rng.integers(1, 6, size=m)
        self.o_body_len = np.clip(
            rng.lognormal(math.log(c.body_bytes), 0.7, size=m), 64, 4000
        ).astype(np.int32)
        self.o_counter = (
            rng.integers(0, 65536, size=len(self.other_fingerprint))[self.o_inst] + np.arange(m)
        ).astype(np.int64)
        self.o_tag = rng.integers(-1, len(_TAG_NAMES), size=m).astype(np.int8)
        self.o_key = rng.random(m) < 0.3
        self.o_retry = self.o_topic == n_topics - 1

    # ------------------------------------------------------------------ record builders

    def _half_properties(
        self, txn: np.ndarray, counter: np.ndarray, prepared: np.ndarray, uniq: pa.Array
    ) -> pa.Array:
        """Properties of a half record (original, copy, discard copy or, verbatim, the real
        message of a commit): the client's, CLUSTER and the broker's REAL_* (and 5.1+
        ``__transactionId__``), in the HashMap(128) order the broker serialises them."""
        n = len(txn)
        groups = pa.array(self.group_names, pa.string())
        topics = pa.array(self.topic_names, pa.string())
        tags = pa.array(_TAG_NAMES, pa.string())
        tag = self.t_tag[txn]
        group = self.t_group[txn]
        entries: dict[str, Any] = {
            PROP_TRAN_MSG: "true",
            PROP_PRODUCER_GROUP: groups.take(pa.array(group)),
            PROP_UNIQ_KEY: uniq,
            # An immunity re-put sets WAIT=false, and every later copy keeps it (seen on real
            # 5.3.3 and 4.9.7 brokers): exactly the records that carry the prepared offset.
            PROP_WAIT: pa.array(np.where(prepared >= 0, "false", "true"), pa.string()),
            PROP_TAGS: tags.take(pa.array(np.maximum(tag, 0), mask=tag < 0)),
            PROP_KEYS: _join(
                pa.scalar("ORD"), _int_strings(self.t_order[txn], self.group_keys[group])
            ),
            PROP_IMMUNITY_SECONDS: _int_strings(self.t_imm[txn], self.t_imm[txn] >= 0),
            PROP_CLUSTER: CLUSTER_NAME,
            PROP_REAL_TOPIC: topics.take(pa.array(self.t_topic[txn])),
            PROP_REAL_QUEUE_ID: _int_strings(self.t_qid[txn]),
            PROP_CHECK_TIMES: _int_strings(counter.astype(np.int64), counter >= 0),
            PROP_PREPARED_QUEUE_OFFSET: _int_strings(prepared, prepared >= 0),
        }
        if self.c.op_style == "5.x":
            entries[PROP_TRANSACTION_ID] = uniq
            # The 5.x client's own (seen on a real 5.3.3 broker; absent with 4.9.7).
            entries[PROP_MSG_REGION] = "DefaultRegion"
            entries[PROP_TRACE_ON] = "true"
        insertion = [
            PROP_MSG_REGION,
            PROP_TRACE_ON,
            PROP_TRAN_MSG,
            PROP_PRODUCER_GROUP,
            PROP_UNIQ_KEY,
            PROP_WAIT,
            PROP_TAGS,
            PROP_KEYS,
            PROP_IMMUNITY_SECONDS,
            PROP_CLUSTER,
            PROP_REAL_TOPIC,
            PROP_REAL_QUEUE_ID,
            PROP_TRANSACTION_ID,
            PROP_CHECK_TIMES,
            PROP_PREPARED_QUEUE_OFFSET,
        ]
        return _build_properties(entries, insertion, 128, self.trailing, n)

    def _txn_uniq(self, txn: np.ndarray) -> pa.Array:
        return _uniq_keys(
            self.inst_fingerprint[self.t_inst[txn]], self.t_born[txn], self.t_counter[txn]
        )

    def _txn_body(self, txn: np.ndarray, uniq: pa.Array) -> pa.Array:
        topics = pa.array(self.topic_names, pa.string())
        header = _join(
            pa.scalar('{"txId":"'),
            uniq,
            pa.scalar('","orderId":'),
            _int_strings(self.t_order[txn]),
            pa.scalar(',"amountCents":'),
            _int_strings(self.t_amount[txn]),
            pa.scalar(',"topic":"'),
            topics.take(pa.array(self.t_topic[txn])),
            pa.scalar('","note":"'),
        )
        return _pad_to(header, self.t_body_len[txn], '"}')

    def _txn_born_host(self, txn: np.ndarray) -> pa.Array:
        return self.inst_host.take(pa.array(self.t_inst[txn]))

    def _half_sysflag(self, txn: np.ndarray) -> np.ndarray:
        return np.where(self.inst_v6[self.t_inst[txn]], layout.BORNHOST_V6_FLAG, 0).astype(np.int32)

    def _half_records(
        self,
        offsets: np.ndarray,
        topic: str,
        queue_offsets: np.ndarray | None,
        store: np.ndarray,
        counter: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """Columns of copies of half records ``offsets`` stored under ``topic`` (the half topic
        itself, or the discard topic with an overriding counter)."""
        txn = self.h_txn.values[offsets]
        kind = self.h_kind.values[offsets]
        if counter is None:
            counter = self.h_counter.values[offsets]
        prepared = self.h_prepared.values[offsets]
        flag = np.where(kind == KIND_ORIGINAL, self.group_flag[self.t_group[txn]], 0)
        uniq = self._txn_uniq(txn)
        return {
            "topic": topic,
            "queue_id": np.zeros(len(txn), np.int32),
            "queue_offset": queue_offsets,
            "sys_flag": self._half_sysflag(txn),
            "flag": flag.astype(np.int32),
            "born_timestamp_ms": self.t_born[txn],
            "born_host": self._txn_born_host(txn),
            "store_timestamp_ms": store,
            "reconsume_times": np.zeros(len(txn), np.int32),
            "prepared_transaction_offset": np.zeros(len(txn), np.int64),
            "properties_raw": self._half_properties(txn, counter, prepared, uniq),
            "body": self._txn_body(txn, uniq),
            "tags": self._tags_of(txn),
        }

    def _tags_of(self, txn: np.ndarray) -> pa.Array:
        tag = self.t_tag[txn]
        return pa.array(_TAG_NAMES, pa.string()).take(pa.array(np.maximum(tag, 0), mask=tag < 0))

    # ------------------------------------------------------------------ the check round

    def _round(self, now: int) -> dict[str, np.ndarray]:
        """Decisions of one check round at broker time ``now`` over half records [h0, e)
        (h0: the committed half offset; e: the end of the half queue).

        Returns the walk's results: processed record offsets with their action, and the
        stop position (or -1 when the walk reached the end of the records stored before
        ``now``)."""
        c = self.c
        h0, e = self.half_committed, self.h_txn.n
        p0, p_end = self.op_committed, self.op_store.n
        n = e - h0
        ptr = self.op_ptr.values
        vals = self.op_items.values[ptr[p0] : ptr[p_end]]
        op_of_item = np.repeat(np.arange(p0, p_end, dtype=np.int64), np.diff(ptr[p0 : p_end + 1]))
        # removeMap: half offset -> op offset (a later op naming the same offset overwrites)
        in_map = vals >= h0
        winner = np.full(n, -1, dtype=np.int64)
        np.maximum.at(winner, vals[in_map] - h0, op_of_item[in_map])
        resolved = winner >= 0
        txn = self.h_txn.values[h0:e]
        counter = self.h_counter.values[h0:e].astype(np.int64)
        age = now - self.t_born[txn]
        absent = counter < 0
        disc_max = ~resolved & ~absent & (counter >= c.check_max)
        bumped = np.where(absent, 1, counter + 1)
        disc_exp = ~resolved & ~disc_max & (age > c.file_reserved_hours * 3_600_000)
        live = ~resolved & ~disc_max & ~disc_exp
        imm_s = self.t_imm[txn]
        has_imm = imm_s >= 0
        immune = live & has_imm & (age < imm_s * 1000)
        too_young = live & ~has_imm & (age >= 0) & (age < c.transaction_timeout_ms)
        check = live & ~immune & ~too_young
        young = np.flatnonzero(too_young)
        stop = int(young[0]) if young.size else n
        # The prepared-offset lookup of checkPrepareQueueOffset (an immunity copy whose
        # TRAN_PREPARED_QUEUE_OFFSET is in removeMap) cannot succeed here: with the whole op
        # queue loaded up front, an original >= h0 is visited (and removed from removeMap)
        # before any copy of it, and an original < h0 is never in removeMap.
        act = np.zeros(
            stop, dtype=np.int8
        )  # 0 resolved, 1 discard max, 2 discard expired, 3 immune, 4 check
        act[disc_max[:stop]] = 1
        act[disc_exp[:stop]] = 2
        act[immune[:stop]] = 3
        act[check[:stop]] = 4
        acting = np.flatnonzero(act > 0)
        src = h0 + acting
        kind = act[acting]
        new_counter = np.where(kind == 1, counter[acting], bumped[acting]).astype(np.int16)
        prepared = self.h_prepared.values[src]
        new_prepared = np.where((kind == 3) & (prepared < 0), src, prepared)
        return {
            "stop": np.array(stop if stop < n else -1),
            "winner": winner,
            "src": src,
            "kind": kind,
            "counter": new_counter,
            "prepared": new_prepared,
            "op_vals": vals,
            "op_of_item": op_of_item,
        }

    def _commit_op_offset(self, walk: dict[str, np.ndarray], h_start: int, h_end: int) -> None:
        """Op records >= p0 that are done (every half offset they name is below h_start, or in
        [h_start, h_end) with this op as the removeMap winner), then calculateOpOffset."""
        p0, p_end = self.op_committed, self.op_store.n
        if p_end == p0:
            return
        vals, owner, winner = walk["op_vals"], walk["op_of_item"], walk["winner"]
        visited = (vals >= h_start) & (vals < h_end) & (vals < h_start + len(winner))
        ok = vals < h_start
        ok[visited] = winner[vals[visited] - h_start] == owner[visited]
        counts = np.diff(self.op_ptr.values[p0 : p_end + 1])
        bad_per_op = np.bincount(owner - p0, weights=(~ok).astype(np.float64), minlength=p_end - p0)
        done = (bad_per_op == 0) | (counts == 0)
        not_done = np.flatnonzero(~done)
        self.op_committed = p0 + (int(not_done[0]) if not_done.size else p_end - p0)

    # ------------------------------------------------------------------ the timeline

    def windows(self) -> Iterator[Window]:
        """Play the timeline; yield the records of each round window in commit-log order."""
        if self._ran:
            raise RuntimeError("a Simulation runs once")
        self._ran = True
        c = self.c
        start, end, interval = c.start_ms, c.end_ms, c.interval_ms
        lo = start
        next_round = start + interval
        # window before the first round
        if next_round > end:
            next_round = end
        yield from self._emit_window(lo, next_round, None)
        now = next_round
        while now < end:
            walk = self._round(now)
            self.summary.rounds += 1
            kinds = walk["kind"]
            n_writes = len(kinds)
            write_t = now + np.arange(n_writes, dtype=np.int64) // c.putback_per_ms
            round_end = int(write_t[-1]) if n_writes else now
            is_copy = kinds >= 3
            n_orig_early = int(
                np.searchsorted(self.t_store, round_end, side="right")
                - np.searchsorted(self.t_store, now, side="left")
            )
            fresh_bound = int(is_copy.sum()) + n_orig_early
            jitter = int(self._rng_round.integers(1, 50))
            hi = now + interval + (round_end - now) + fresh_bound // c.putback_per_ms + jitter
            walk["write_t"] = write_t
            walk["round_end"] = np.array(round_end)
            self.round_times.append(now)
            self.round_ends.append(round_end)
            yield from self._emit_window(now, min(hi, end), walk)
            now = hi

    def _emit_window(
        self, lo: int, hi: int, walk: dict[str, np.ndarray] | None
    ) -> Iterator[Window]:
        c = self.c
        parts: list[tuple[dict[str, Any], np.ndarray, np.ndarray]] = []  # columns, store time, rank
        H0 = self.half_committed
        E0 = self.h_txn.n
        # --- half records of the window: originals and this round's put-back copies
        a, b = np.searchsorted(self.t_store, [lo, hi], side="left")
        orig_txn = np.arange(a, b, dtype=np.int64)
        if walk is not None:
            kinds, src, write_t = walk["kind"], walk["src"], walk["write_t"]
            copy_sel = kinds >= 3
            copy_src, copy_t = src[copy_sel], write_t[copy_sel]
            copy_kind = np.where(kinds[copy_sel] == 3, KIND_IMMUNITY_COPY, KIND_CHECK_COPY).astype(
                np.int8
            )
            copy_counter, copy_prepared = walk["counter"][copy_sel], walk["prepared"][copy_sel]
            copy_seq = np.flatnonzero(copy_sel).astype(np.int64)
        else:
            copy_src = copy_t = copy_prepared = copy_seq = np.empty(0, np.int64)
            copy_counter = np.empty(0, np.int16)
            copy_kind = np.empty(0, np.int8)
        n_copy, n_orig = len(copy_src), len(orig_txn)
        cat_txn = np.concatenate((self.h_txn.values[copy_src], orig_txn))
        cat_kind = np.concatenate((copy_kind, np.full(n_orig, KIND_ORIGINAL, np.int8)))
        cat_counter = np.concatenate((copy_counter.astype(np.int16), np.full(n_orig, -1, np.int16)))
        cat_prepared = np.concatenate(
            (copy_prepared.astype(np.int64), np.full(n_orig, -1, np.int64))
        )
        cat_store = np.concatenate((copy_t, self.t_store[orig_txn]))
        cat_rank = np.concatenate((np.full(n_copy, RANK_ROUND), np.full(n_orig, RANK_HALF)))
        order = np.lexsort((np.concatenate((copy_seq, orig_txn)), cat_rank, cat_store))
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order), dtype=np.int64)
        new_offsets = E0 + np.arange(len(order), dtype=np.int64)
        self.h_txn.extend(cat_txn[order])
        self.h_kind.extend(cat_kind[order])
        self.h_counter.extend(cat_counter[order])
        self.h_prepared.extend(cat_prepared[order])
        self.h_store.extend(cat_store[order])
        self.h_clog.extend(np.full(len(order), -1, dtype=np.int64))
        self.t_orig_off[orig_txn] = E0 + position[n_copy:]
        copy_offset = E0 + position[:n_copy]
        if len(order):
            parts.append(
                (
                    self._half_records(new_offsets, HALF_TOPIC, new_offsets, cat_store[order]),
                    cat_store[order],
                    cat_rank[order],
                )
            )
        # --- the round: discards, the fresh walk, offsets, checks
        if walk is not None:
            kinds, src, write_t = walk["kind"], walk["src"], walk["write_t"]
            disc = kinds <= 2
            disc_src, disc_t, disc_counter = src[disc], write_t[disc], walk["counter"][disc]
            self.summary.discards_check_max += int((kinds == 1).sum())
            self.summary.discards_expired += int((kinds == 2).sum())
            self.summary.immunity_putbacks += int((kinds == 3).sum())
            self.summary.checks += int((kinds == 4).sum())
            stop = int(walk["stop"])
            if stop >= 0:
                h_end = H0 + stop
            else:
                # The walk reached the records stored after the round started: it goes on
                # while they are discardable (needDiscard / needSkip come before the
                # freshness test), over records already written when it gets there.
                round_end = int(walk["round_end"])
                fresh = np.arange(E0, self.h_txn.n)
                fresh = fresh[self.h_store.values[fresh] <= round_end]
                f_counter = self.h_counter.values[fresh].astype(np.int64)
                f_age = lo - self.t_born[self.h_txn.values[fresh]]
                f_max = f_counter >= c.check_max
                f_exp = ~f_max & (f_age > c.file_reserved_hours * 3_600_000)
                discardable = f_max | f_exp
                run = int(np.argmin(discardable)) if not discardable.all() else len(fresh)
                h_end = E0 + run
                if run:
                    f_src = fresh[:run]
                    f_cnt = np.where(
                        f_max[:run],
                        f_counter[:run],
                        np.where(f_counter[:run] < 0, 1, f_counter[:run] + 1),
                    )
                    f_t = round_end + 1 + np.arange(run, dtype=np.int64) // c.putback_per_ms
                    disc_src = np.concatenate((disc_src, f_src))
                    disc_t = np.concatenate((disc_t, f_t))
                    disc_counter = np.concatenate((disc_counter, f_cnt.astype(np.int16)))
                    self.summary.discards_check_max += int(f_max[:run].sum())
                    self.summary.discards_expired += int((~f_max[:run]).sum())
            if len(disc_src):
                parts.append(
                    (
                        self._half_records(disc_src, DISCARD_TOPIC, None, disc_t, disc_counter),
                        disc_t,
                        np.full(len(disc_src), RANK_ROUND),
                    )
                )
            p_before = self.op_committed
            self._commit_op_offset(walk, H0, h_end)
            self.half_committed = h_end
            n_walk = len(kinds)
            self.round_log.append(
                {
                    "now": lo,
                    "h0": H0,
                    "p0": p_before,
                    "h1": h_end,
                    "p1": self.op_committed,
                    "half_end": E0,
                    "actions": list(
                        zip(src.tolist(), walk["counter"].tolist(), kinds.tolist(), strict=True)
                    )
                    + [
                        (int(s_), int(c_), 1 if int(c_) >= c.check_max else 2)
                        for s_, c_ in zip(
                            disc_src[int((kinds <= 2).sum()) :].tolist(),
                            disc_counter[int((kinds <= 2).sum()) :].tolist(),
                            strict=True,
                        )
                    ],
                    "walked": n_walk,
                }
            )
            # producers answer checks of copies: outcome if they know it, else UNKNOWN (nothing)
            checked = copy_kind == KIND_CHECK_COPY
            ck_off, ck_t = copy_offset[checked], copy_t[checked]
            ck_txn = self.h_txn.values[ck_off]
            known = self.t_decide[ck_txn] <= ck_t
            rtt = 2 + np.minimum(self._rng_answer.exponential(15.0, size=len(ck_off)), 2000).astype(
                np.int64
            )
            self.summary.check_answers += int(known.sum())
            self._add_pending(
                ck_t[known] + rtt[known],
                ck_txn[known],
                ck_off[known],
                self.t_outcome[ck_txn[known]],
            )
        # --- END_TRANSACTION events stored in the window: real messages and op items
        end_t, _end_txn, end_off, end_out = self._take_end_events(hi)
        commit = end_out == COMMIT
        self.summary.commits += int(commit.sum())
        self.summary.rollbacks += int((~commit).sum())
        if commit.any():
            parts.append(
                (
                    self._real_records(end_off[commit], end_t[commit]),
                    end_t[commit],
                    np.full(int(commit.sum()), RANK_REAL),
                )
            )
        op_t, op_bodies, op_counts, op_vals = self._op_records(end_t, end_off, hi)
        if len(op_t):
            offs = self.op_store.n + np.arange(len(op_t), dtype=np.int64)
            self.op_store.extend(op_t)
            self.op_ptr.extend(self.op_ptr.values[-1] + np.cumsum(op_counts))
            self.op_items.extend(op_vals)
            self.summary.op_records += len(op_t)
            self.summary.op_items += len(op_vals)
            parts.append(
                (self._op_columns(offs, op_t, op_bodies), op_t, np.full(len(op_t), RANK_OP))
            )
        # --- other topics' traffic
        oa, ob = np.searchsorted(self.o_store, [lo, hi], side="left")
        if ob > oa:
            parts.append(
                (
                    self._other_records(np.arange(oa, ob)),
                    self.o_store[oa:ob],
                    np.full(ob - oa, RANK_OTHER),
                )
            )
        if parts:
            yield self._assemble(parts)

    def _add_pending(
        self, t: np.ndarray, txn: np.ndarray, off: np.ndarray, out: np.ndarray
    ) -> None:
        seq = self._end_seq + np.arange(len(t), dtype=np.int64)
        self._end_seq += len(t)
        for key, values in (("t", t), ("txn", txn), ("off", off), ("out", out), ("seq", seq)):
            self._pending_end[key] = np.concatenate(
                (self._pending_end[key], values.astype(np.int64))
            )

    def _take_end_events(self, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # direct END_TRANSACTION of the original (producer's own commit/rollback)
        d = self._direct_order
        stop = self._direct_ptr + int(
            np.searchsorted(self.t_decide[d[self._direct_ptr :]], hi, side="left")
        )
        direct = d[self._direct_ptr : stop]
        self._direct_ptr = stop
        if len(direct):
            self._add_pending(
                self.t_decide[direct], direct, self.t_orig_off[direct], self.t_outcome[direct]
            )
        p = self._pending_end
        now = p["t"] < hi
        order = np.lexsort((p["seq"][now], p["t"][now]))
        taken = {key: values[now][order] for key, values in p.items()}
        self._pending_end = {key: values[~now] for key, values in p.items()}
        return taken["t"], taken["txn"], taken["off"], taken["out"]

    def _real_records(self, half_off: np.ndarray, store: np.ndarray) -> dict[str, Any]:
        """Real messages of commits: the committed half record rebuilt for REAL_TOPIC /
        REAL_QID (EndTransactionProcessor.endMessageTransaction: the properties string is
        serialised before REAL_TOPIC / REAL_QID are cleared from the map, so it is stored
        as the half record had it), sysflag COMMIT, prepared offset = the half record's
        commit-log offset (filled in at layout time)."""
        cols = self._half_records(half_off, "", None, store)
        txn = self.h_txn.values[half_off]
        topics = pa.array(self.topic_names, pa.string())
        cols["topic"] = topics.take(pa.array(self.t_topic[txn]))
        cols["queue_id"] = self.t_qid[txn].astype(np.int32)
        cols["sys_flag"] = cols["sys_flag"] | layout.TRANSACTION_COMMIT_TYPE
        cols["_prepared_half"] = half_off
        return cols

    def _op_records(
        self, t: np.ndarray, off: np.ndarray, hi: int
    ) -> tuple[np.ndarray, pa.Array, np.ndarray, np.ndarray]:
        """Op records (store time, body, item count, items) stored before ``hi``."""
        c = self.c
        if c.op_style == "4.9":
            return t, _int_strings(off), np.ones(len(t), np.int64), off
        # 5.1+: items "offset," queue up; the batch thread writes one op message per wake-up
        qt = np.concatenate((self._queued_t, t))
        qv = np.concatenate((self._queued_v, off))
        if not len(qt):
            return (
                np.empty(0, np.int64),
                pa.array([], pa.string()),
                np.empty(0, np.int64),
                np.empty(0, np.int64),
            )
        chars = _decimal_digits(qv) + 1
        step = c.op_batch_interval_ms
        tick = (qt - self._batch_phase) // step
        flush_t, cuts = [], []
        i, n = 0, len(qt)
        csum = np.concatenate(([0], np.cumsum(chars)))
        tick_end = np.searchsorted(tick, tick, side="right")  # end of each item's tick group
        while i < n:
            group_end = int(tick_end[i])
            # first item j in [i, group_end) whose running size exceeds the maximum: flush at once
            j = int(np.searchsorted(csum, csum[i] + c.op_msg_max_size, side="right")) - 1
            if j < group_end:
                cuts.append(j + 1)
                flush_t.append(int(qt[j]) + 1)
                i = j + 1
            else:
                cuts.append(group_end)
                flush_t.append(int(self._batch_phase + (int(tick[i]) + 1) * step))
                i = group_end
        flush = np.asarray(flush_t, dtype=np.int64)
        bounds = np.asarray(cuts, dtype=np.int64)
        keep = int(np.searchsorted(flush, hi, side="left"))
        # batches flushed at or after hi stay queued (with every later item)
        used = int(bounds[keep - 1]) if keep else 0
        self._queued_t, self._queued_v = qt[used:], qv[used:]
        flush, bounds = flush[:keep], bounds[:keep]
        counts = np.diff(np.concatenate(([0], bounds)))
        items = qv[:used]
        texts = _join(_int_strings(items), pa.scalar(","))
        lists = pa.ListArray.from_arrays(
            pa.array(np.concatenate(([0], bounds)).astype(np.int32)), texts
        )
        bodies = pc.binary_join(lists, "")
        return flush, bodies, counts, items

    def _op_columns(
        self, offsets: np.ndarray, store: np.ndarray, bodies: pa.Array
    ) -> dict[str, Any]:
        n = len(offsets)
        props = _build_properties(
            {PROP_WAIT: "true", PROP_TAGS: REMOVE_TAG}, [PROP_WAIT, PROP_TAGS], 16, self.trailing, n
        )
        return {
            "topic": OP_TOPIC,
            "queue_id": np.zeros(n, np.int32),
            "queue_offset": offsets,
            "sys_flag": np.zeros(n, np.int32),
            "flag": np.zeros(n, np.int32),
            "born_timestamp_ms": store,
            "born_host": BROKER_STORE_HOST,
            "store_timestamp_ms": store,
            "reconsume_times": np.zeros(n, np.int32),
            "prepared_transaction_offset": np.zeros(n, np.int64),
            "properties_raw": props,
            "body": bodies,
            "tags": REMOVE_TAG,
        }

    def _other_records(self, idx: np.ndarray) -> dict[str, Any]:
        n = len(idx)
        inst = self.o_inst[idx]
        topic = self.o_topic[idx]
        uniq = _uniq_keys(self.other_fingerprint[inst], self.o_born[idx], self.o_counter[idx])
        tag = self.o_tag[idx]
        tags = pa.array(_TAG_NAMES, pa.string()).take(pa.array(np.maximum(tag, 0), mask=tag < 0))
        retry = self.o_retry[idx]
        names = pa.array(self.other_topic_names, pa.string())
        entries: dict[str, Any] = {
            PROP_UNIQ_KEY: uniq,
            PROP_TAGS: tags,
            PROP_KEYS: _join(pa.scalar("K"), _int_strings(idx, self.o_key[idx])),
            PROP_CLUSTER: CLUSTER_NAME,
            PROP_RETRY_TOPIC: pa.array(np.where(retry, "TopicOrder", None), pa.string()),
            PROP_ORIGIN_MESSAGE_ID: pa.array(
                np.where(retry, uniq.to_numpy(zero_copy_only=False), None), pa.string()
            ),
        }
        entries[PROP_WAIT] = "true"  # both clients set it on plain messages (real 5.3.3, 4.9.7)
        insertion = [
            PROP_UNIQ_KEY,
            PROP_WAIT,
            PROP_TAGS,
            PROP_KEYS,
            PROP_RETRY_TOPIC,
            PROP_ORIGIN_MESSAGE_ID,
            PROP_CLUSTER,
        ]
        props = _build_properties(entries, insertion, 128, self.trailing, n)
        header = _join(
            pa.scalar('{"event":"'),
            uniq,
            pa.scalar('","topic":"'),
            names.take(pa.array(topic)),
            pa.scalar('","seq":'),
            _int_strings(idx),
            pa.scalar(',"data":"'),
        )
        v6 = self.other_inst_v6[inst]
        return {
            "topic": names.take(pa.array(topic)),
            "queue_id": self.o_qid[idx].astype(np.int32),
            "queue_offset": None,
            "sys_flag": np.where(v6, layout.BORNHOST_V6_FLAG, 0).astype(np.int32),
            "flag": np.zeros(n, np.int32),
            "born_timestamp_ms": self.o_born[idx],
            "born_host": self.other_host.take(pa.array(inst)),
            "store_timestamp_ms": self.o_store[idx],
            "reconsume_times": np.where(retry, 1 + idx % 3, 0).astype(np.int32),
            "prepared_transaction_offset": np.zeros(n, np.int64),
            "properties_raw": props,
            "body": _pad_to(header, self.o_body_len[idx], '"}'),
            "tags": tags,
        }

    # ------------------------------------------------------------------ assembly and layout

    def _assemble(self, parts: list[tuple[dict[str, Any], np.ndarray, np.ndarray]]) -> Window:
        tables, stores, ranks, seqs, half_refs = [], [], [], [], []
        for cols, store, rank_per_row in parts:
            n = len(store)
            tables.append(_columns_to_table(cols, n))
            stores.append(store)
            ranks.append(np.asarray(rank_per_row, dtype=np.int64))
            seqs.append(np.arange(n, dtype=np.int64))
            half_refs.append(np.asarray(cols.get("_prepared_half", np.full(n, -1)), dtype=np.int64))
        table = pa.concat_tables(tables)
        store = np.concatenate(stores)
        rank = np.concatenate(ranks)
        part_id = np.concatenate([np.full(len(s), k) for k, s in enumerate(stores)])
        seq = np.concatenate(seqs)
        order = np.lexsort((seq, part_id, rank, store))
        table = table.take(pa.array(order))
        half_ref = np.concatenate(half_refs)[order]
        # layout: stored sizes and commit-log offsets, as the writer will assign them
        sizes = layout.record_sizes(
            table.column("sys_flag").to_numpy().astype(np.int64),
            _lengths(table.column("body")),
            _lengths(table.column("topic")),
            _lengths(table.column("properties_raw")),
            magic_version=np.ones(table.num_rows, dtype=np.int64),
        )
        if sizes.size and int(sizes.max()) > MAX_MESSAGE_SIZE:
            raise ValueError("a simulated record exceeds the broker's maximum message size")
        offsets, self.position = layout.place_records(
            sizes.astype(np.int64), self.position, self.c.commitlog_file_size
        )
        # commit-log offsets of half records, then the prepared offsets of real messages
        is_half = pc.equal(table.column("topic"), HALF_TOPIC).to_numpy(zero_copy_only=False)
        qoff = table.column("queue_offset").to_numpy(zero_copy_only=False)
        if is_half.any():
            self.h_clog.values[qoff[is_half].astype(np.int64)] = offsets[is_half]
        real = half_ref >= 0
        if real.any():
            prepared = (
                table.column("prepared_transaction_offset").to_numpy(zero_copy_only=False).copy()
            )
            prepared[real] = self.h_clog.values[half_ref[real]]
            table = table.set_column(
                table.schema.get_field_index("prepared_transaction_offset"),
                "prepared_transaction_offset",
                pa.array(prepared, pa.int64()),
            )
        counts = pc.value_counts(table.column("topic"))
        for item in counts.to_pylist():
            self.summary.records_by_topic[item["values"]] = (
                self.summary.records_by_topic.get(item["values"], 0) + item["counts"]
            )
        return Window(table=table, commitlog_offsets=offsets, stored_sizes=sizes.astype(np.int64))

    def finish(self) -> None:
        s = self.summary
        s.half_offset = self.half_committed
        s.op_offset = self.op_committed
        s.half_queue_end = self.h_txn.n
        s.op_queue_end = self.op_store.n
        s.commitlog_bytes = self.position

    @property
    def committed_offsets(self) -> dict[str, dict[int, int]]:
        from connectors.rocketmq.offsets_file import HALF_KEY, OP_KEY

        # The broker commits an offset only when a round moves it (offsets start at the
        # queue's minimum, 0 here): an offset never moved has no key in the file.
        table: dict[str, dict[int, int]] = {}
        if self.half_committed:
            table[HALF_KEY] = {0: self.half_committed}
        if self.op_committed:
            table[OP_KEY] = {0: self.op_committed}
        return table


# What the simulator hands the writer: the decoded record's header columns (their types
# come from the decoder's schema), the properties still encoded, the body and the tags.
_HEADER_COLUMNS = (
    "topic",
    "queue_id",
    "queue_offset",
    "sys_flag",
    "flag",
    "born_timestamp_ms",
    "born_host",
    "store_timestamp_ms",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
)
RECORD_SCHEMA = pa.schema(
    [codec.RECORD_SCHEMA.field(name) for name in _HEADER_COLUMNS]
    + [("properties_raw", pa.binary()), ("body", pa.binary()), ("tags", pa.string())]
)


_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)


def _decimal_digits(values: np.ndarray) -> np.ndarray:
    """Number of decimal digits of non-negative integers."""
    return 1 + np.searchsorted(_POWERS_OF_TEN, values, side="right").astype(np.int64)


def _lengths(column: pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(pc.binary_length(column), 0).to_numpy().astype(np.int64)


_NUMPY_TYPES = {pa.int32(): np.int32, pa.int64(): np.int64}


def _columns_to_table(cols: dict[str, Any], n: int) -> pa.Table:
    arrays = []
    for fld in RECORD_SCHEMA:
        value = cols.get(fld.name, BROKER_STORE_HOST if fld.name == "store_host" else None)
        if isinstance(value, str):
            array = pa.array([value], fld.type).take(pa.array(np.zeros(n, dtype=np.int32)))
        elif value is None:
            array = pa.nulls(n, fld.type)
        elif isinstance(value, np.ndarray):
            array = pa.array(value.astype(_NUMPY_TYPES[fld.type], copy=False), fld.type)
        else:
            array = value if value.type == fld.type else pc.cast(value, fld.type)
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


# --------------------------------------------------------------------------- writing a store


def _disk_bytes(root: Path) -> int:
    """Bytes the store takes on disk (its files are created at full size but sparse)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def write_store(
    config: SimConfig,
    root: str | os.PathLike[str],
    *,
    batch_rows: int = 262_144,
    writer_factory: Callable[..., Any] | None = None,
    verify: bool = True,
) -> SimSummary:
    """Simulate and write the store at ``root`` (commitlog/, consumequeue/,
    config/consumerOffset.json). Returns the simulation's own summary.

    ``verify`` compares the writer's returned commit-log offsets and stored sizes with the
    simulation's layout (the real messages' prepared offsets depend on it)."""
    from connectors.rocketmq.offsets_file import write_consumer_offsets

    began = time.perf_counter()
    root = Path(root)
    if writer_factory is None:
        from simulator.writer import StoreWriter

        writer_factory = StoreWriter
    sim = Simulation(config)
    pending: list[Window] = []
    pending_rows = 0

    def flush(writer: Any) -> None:
        nonlocal pending, pending_rows
        if not pending:
            return
        table = pa.concat_tables([w.table for w in pending])
        assigned = writer.append(table)
        if verify:
            expected = np.concatenate([w.commitlog_offsets for w in pending])
            got = np.asarray(
                assigned.column("commitlog_offset").to_numpy(zero_copy_only=False), dtype=np.int64
            )
            if not np.array_equal(expected, got):
                bad = int(np.flatnonzero(expected != got)[0])
                raise RuntimeError(
                    f"writer layout differs from the simulation's at row {bad}: "
                    f"commit-log offset {got[bad]} != {expected[bad]}"
                )
        pending, pending_rows = [], 0

    with writer_factory(
        root, commitlog_file_size=config.commitlog_file_size, cq_file_entries=config.cq_file_entries
    ) as writer:
        for window in sim.windows():
            pending.append(window)
            pending_rows += window.table.num_rows
            if pending_rows >= batch_rows:
                flush(writer)
        flush(writer)
    sim.finish()
    offsets_path = root / "config" / "consumerOffset.json"
    write_consumer_offsets(offsets_path, sim.committed_offsets)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(offsets_path, 0o666 & ~umask)  # like a file the broker writes, not mkstemp's 0600
    summary = sim.summary
    summary.store_bytes = _disk_bytes(root)
    summary.seconds = time.perf_counter() - began
    return summary


def iterate_records(config: SimConfig) -> tuple[Simulation, Iterator[Window]]:
    """The simulation and its windows, without writing anything (for tests and tools)."""
    sim = Simulation(config)
    return sim, sim.windows()
