"""The round's anomaly rules together (transforms/anomalies.py, docs/spec/anomalies.md): for
each kind, a case that builds its situation and the nearest non-case, with the exact rows
expected.

Like the worked cases, the round-level kinds run in one round computed once for the module,
each case as its own broker (brokers never influence each other). Each rule family is also
tested alone on small inline frames (test_anomaly_rules_*.py), where the kinds that need a
4.9 broker or earlier runs are tested.
"""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.materialize import SparkMaterializer
from schemas.outputs import RUN_SUMMARY
from tests.transforms.builders import (
    RUN_ID,
    T,
    committed,
    committed_rows,
    frame,
    half,
    op,
    params,
)
from transforms.anomalies import narrowed, round_anomalies, windowed
from transforms.ops import HALF_OFFSET
from transforms.outputs import reconcile
from transforms.round import classify_round

S = 1_000
# Small thresholds so that small cases cross them (the defaults are in conf/default.toml).
THRESHOLDS = {"slow_producer_min_transactions": 2, "op_backlog_records": 2}

RECHECK = "half offset %d is resolved through another record of its transaction (rules 2-3), but the broker matches exact offsets and %s; counter %d of check_max 15"


def _case(name: str, records: list[dict], h0: int, p0: int) -> tuple[list[dict], list]:
    return [{**record, "broker": name} for record in records], committed_rows(h0, p0, broker=name)


def _backlog_ops(count: int) -> list[dict]:
    """Op 0 names half 5 (beyond h1 = 4: it holds p0 back legitimately), then ``count`` op
    records naming half offsets below h1."""
    return [op(0, "5,")] + [op(1 + i, f"{i % 3},") for i in range(count)]


def _four_and_a_young_one(group: str = "PG_ORDERS") -> list[dict]:
    return [half(i, 60 * S, key=f"H{i}", group=group) for i in range(4)] + [
        half(4, 2 * S, key="H4")
    ]


CASES = {
    # A check copy (counter 1) of a transaction whose original is named: resolved by rule 3,
    # but the broker checks the copy again.
    "recheck": (
        [half(0, 60 * S, key="K"), half(1, 60 * S, key="K", counter=1)],
        [op(0, "0")],
        1,
        1,
    ),
    # The same copy at check_max: the broker discards a committed transaction.
    "recheck-discard": (
        [half(0, 60 * S, key="K"), half(1, 60 * S, key="K", counter=15)],
        [op(0, "0")],
        1,
        1,
    ),
    # Non-case: an immunity copy whose original (at h0 or after) is named: the broker skips it.
    "recheck-none": (
        [half(0, 60 * S, key="K"), half(1, 30 * S, key="K", counter=1, immunity=60, prepared=0)],
        [op(0, "0")],
        0,
        0,
    ),
    # 3600 s of immunity, 10 s old: 3 590 000 ms left > 15 put-backs x 30 000 ms.
    "immunity": ([half(0, 10 * S, key="I", immunity=3600)], [], 0, 0),
    # Non-case: 400 s of immunity: 390 000 ms left <= 450 000 ms.
    "immunity-none": ([half(0, 10 * S, key="I", immunity=400)], [], 0, 0),
    # Transaction A was answered only after its check copy (stored 40 s before T) existed;
    # B was committed 5 s after birth: 1 of 2 = 50 % > 10 %.
    "slow": (
        [
            half(0, 60 * S, key="A", group="PG_SLOW"),
            half(1, 60 * S, key="A", counter=1, group="PG_SLOW", stored_age_ms=40 * S),
            half(2, 60 * S, key="B", group="PG_SLOW"),
        ],
        [op(0, "2,", stored_age_ms=55 * S), op(1, "1,", stored_age_ms=20 * S)],
        1,
        0,
    ),
    # Non-case: A's copy is an immunity copy (it carries the prepared offset), not a check copy.
    "slow-none": (
        [
            half(0, 60 * S, key="A", group="PG_SLOW"),
            half(
                1,
                60 * S,
                key="A",
                counter=1,
                immunity=30,
                prepared=0,
                group="PG_SLOW",
                stored_age_ms=40 * S,
            ),
            half(2, 60 * S, key="B", group="PG_SLOW"),
        ],
        [op(0, "2,", stored_age_ms=55 * S), op(1, "1,", stored_age_ms=20 * S)],
        1,
        0,
    ),
    "backlog": (_four_and_a_young_one(), _backlog_ops(3), 0, 0),
    "backlog-critical": (_four_and_a_young_one(), _backlog_ops(21), 0, 0),
    # Non-case: 2 records, at the threshold.
    "backlog-none": (_four_and_a_young_one(), _backlog_ops(2), 0, 0),
    # Op offsets 2-3 and 5 are missing.
    "gap": (
        [half(i, 60 * S, key=f"G{i}") for i in range(4)],
        [op(0, "0,"), op(1, "1,"), op(4, "2,"), op(6, "3,")],
        0,
        0,
    ),
    # The committed op offset 1 itself is missing (the queue holds 0 and 3).
    "gap-at-p0": (
        [half(i, 60 * S, key=f"G{i}") for i in range(2)],
        [op(0, "0,"), op(3, "1,")],
        0,
        1,
    ),
    # Non-case: a hole below p0 (retention, or consumed) is no gap.
    "gap-none": (
        [half(i, 60 * S, key=f"G{i}") for i in range(2)],
        [op(0, "0,"), op(2, "1,"), op(3, "5,")],
        0,
        2,
    ),
    "systopic": (
        [
            half(0, 60 * S, key="S0", real_topic="rmq_sys_wheel_timer"),
            half(1, 60 * S, key="S1", real_topic="SCHEDULE_TOPIC_XXXX"),
            half(2, 60 * S, key="S2", extra_properties={"DELAY": "3"}),
            half(3, 60 * S, key="S2", counter=1, extra_properties={"DELAY": "3"}),
            half(4, 60 * S, key="S4", extra_properties={"TIMER_DELIVER_MS": "1700000060000"}),
        ],
        [],
        0,
        0,
    ),
    # Non-cases: a topic with the prefix inside its name, a delay level of 0, and a delayed
    # transaction that is resolved.
    "systopic-none": (
        [
            half(0, 60 * S, key="N0", real_topic="orders_rmq_sys_x"),
            half(1, 60 * S, key="N1", extra_properties={"DELAY": "0"}),
            half(2, 60 * S, key="N2", extra_properties={"DELAY": "3"}),
        ],
        [op(0, "2,")],
        0,
        0,
    ),
}

DDL = "broker STRING, kind STRING, severity STRING, uniq_key STRING, producer_group STRING, half_offset BIGINT, op_offset BIGINT, value DOUBLE, threshold DOUBLE, detail STRING"


@pytest.fixture(scope="module")
def round_out(spark: SparkSession) -> dict[str, DataFrame]:
    """The anomalies and run_summary of one round over every case (case name = broker), as
    local frames."""
    records, offsets = [], []
    for name, (halves, ops, h0, p0) in CASES.items():
        rows, committed_offsets = _case(name, halves + ops, h0, p0)
        records += rows
        offsets += committed_offsets
    out = reconcile(
        frame(spark, records),
        committed(spark, offsets),
        params(**THRESHOLDS),
        materialize=SparkMaterializer(),
    )
    assert [(f.name, f.dataType) for f in out.run_summary.schema.fields] == [
        (f.name, f.dataType) for f in RUN_SUMMARY.fields
    ]
    local = {}
    for name in ("anomalies", "run_summary"):
        table = getattr(out, name)
        local[name] = spark.createDataFrame(table.collect(), table.schema)
    return local


@pytest.fixture(scope="module")
def anomalies(round_out: dict[str, DataFrame]) -> DataFrame:
    found = round_out["anomalies"]
    assert {(row.run_id, row.as_of_ms) for row in found.collect()} == {(RUN_ID, T)}
    return found


def assert_found(
    spark: SparkSession,
    anomalies: DataFrame,
    broker: str,
    expected: list[tuple],
    kind: str | None = None,
) -> None:
    """The broker's anomalies (of ``kind`` only, when given) are exactly ``expected``."""
    expected_df = spark.createDataFrame([(broker, *row) for row in expected], DDL)
    found = anomalies.filter(F.col("broker") == broker)
    if kind is not None:
        found = found.filter(F.col("kind") == kind)
    assert_df_equality(
        found.select(*expected_df.columns),
        expected_df,
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_recheck_of_resolved_names_the_brokers_action(
    spark: SparkSession, anomalies: DataFrame
) -> None:
    assert_found(
        spark,
        anomalies,
        "recheck",
        [
            (
                "recheck_of_resolved",
                "warning",
                "K",
                "PG_ORDERS",
                1,
                None,
                1.0,
                15.0,
                RECHECK % (1, "checks it again", 1),
            )
        ],
    )
    discards = "discards it (counter at check_max)"
    assert_found(
        spark,
        anomalies,
        "recheck-discard",
        [
            (
                "recheck_of_resolved",
                "critical",
                "K",
                "PG_ORDERS",
                1,
                None,
                15.0,
                15.0,
                RECHECK % (1, discards, 15),
            ),
            # The same discard counted per queue: the broker's re-discard of a settled one.
            (
                "settled_discards",
                "info",
                None,
                None,
                None,
                None,
                1.0,
                0.0,
                "1 discard(s) of the broker's next round are re-discards of transactions an op"
                " record already settled (table discards, really_pending = false): harmless,"
                " though the broker writes them to TRANS_CHECK_MAX_TIME_TOPIC again",
            ),
        ],
    )
    assert_found(spark, anomalies, "recheck-none", [])


def test_immunity_exhausts_checks(spark: SparkSession, anomalies: DataFrame) -> None:
    detail = (
        "half offset 0 stays immune 3590000 ms more, but 15 put-back(s) every 30000 ms bring"
        " its counter (0) to check_max 15 first: it is discarded without a check"
    )
    assert_found(
        spark,
        anomalies,
        "immunity",
        [
            (
                "immunity_exhausts_checks",
                "warning",
                "I",
                "PG_ORDERS",
                0,
                None,
                3_590_000.0,
                450_000.0,
                detail,
            )
        ],
    )
    assert_found(spark, anomalies, "immunity-none", [])


def test_slow_producer(spark: SparkSession, anomalies: DataFrame) -> None:
    detail = (
        "producer group PG_SLOW: 1 of 2 transactions (50.0 %) were resolved only after a check"
        " copy existed (threshold 10 %); op store time - born time p50 5000 ms, p99 40000 ms"
        " (5.x op times include up to transactionOpBatchInterval, 3000 ms by default)"
    )
    assert_found(
        spark,
        anomalies,
        "slow",
        [("slow_producer", "warning", None, "PG_SLOW", None, None, 50.0, 10.0, detail)],
    )
    assert_found(spark, anomalies, "slow-none", [])


def test_op_backlog(spark: SparkSession, anomalies: DataFrame) -> None:
    detail = (
        "%d op records between op offset 0 and the op queue's end %d name only half offsets"
        " below h1 4: the broker reads them again every round, 1 pulls of 32 (threshold 2)"
    )
    assert_found(
        spark,
        anomalies,
        "backlog",
        [("op_backlog", "warning", None, None, None, 0, 3.0, 2.0, detail % (3, 4))],
    )
    assert_found(
        spark,
        anomalies,
        "backlog-critical",
        [("op_backlog", "critical", None, None, None, 0, 21.0, 2.0, detail % (21, 22))],
    )
    assert_found(spark, anomalies, "backlog-none", [])


def test_op_queue_gap_one_row_per_missing_range(spark: SparkSession, anomalies: DataFrame) -> None:
    detail = (
        "op offsets %d to %d (%d) are missing inside [p0, end): what they named is unknown, so"
        " half records they resolved look pending (deleted consume-queue files, #2133)"
    )
    assert_found(
        spark,
        anomalies,
        "gap",
        [
            ("op_queue_gap", "critical", None, None, None, 2, 2.0, 0.0, detail % (2, 3, 2)),
            ("op_queue_gap", "critical", None, None, None, 5, 1.0, 0.0, detail % (5, 5, 1)),
        ],
        kind="op_queue_gap",  # its four op records are also a backlog over this module's 2
    )
    assert_found(
        spark,
        anomalies,
        "gap-at-p0",
        [("op_queue_gap", "critical", None, None, None, 1, 2.0, 0.0, detail % (1, 2, 2))],
    )
    assert_found(spark, anomalies, "gap-none", [])
    assert anomalies.filter(F.col("kind") == "op_queue_gap").count() == 3


def test_system_topic_or_delay_once_per_transaction(
    spark: SparkSession, anomalies: DataFrame
) -> None:
    tail = "; the broker does not deliver such a transaction as sent (#1540)"
    expected = [
        ("S0", 0, "its real topic rmq_sys_wheel_timer is a system topic"),
        ("S1", 1, "its real topic SCHEDULE_TOPIC_XXXX is a system topic"),
        ("S2", 2, "it carries DELAY=3"),
        ("S4", 4, "it carries TIMER_DELIVER_MS=1700000060000"),
    ]
    assert_found(
        spark,
        anomalies,
        "systopic",
        [
            (
                "system_topic_or_delay",
                "warning",
                key,
                "PG_ORDERS",
                offset,
                None,
                None,
                None,
                f"half offset {offset}: {why}{tail}",
            )
            for key, offset, why in expected
        ],
    )
    assert_found(spark, anomalies, "systopic-none", [])


def test_run_summary_counts_anomalies_by_severity(
    spark: SparkSession, round_out: dict[str, DataFrame]
) -> None:
    """Counted per queue from the round's anomalies: recheck-discard has one critical and
    one info (the re-discard), the systopic rows are four warnings, immunity-none has none."""
    expected = spark.createDataFrame(
        [("immunity-none", 0, 0, 0, 0), ("recheck-discard", 0, 1, 0, 1), ("systopic", 0, 0, 4, 0)],
        "broker STRING, queue_id INT, anomalies_info BIGINT, anomalies_warning BIGINT,"
        " anomalies_critical BIGINT",
    )
    actual = round_out["run_summary"].filter(
        F.col("broker").isin("immunity-none", "recheck-discard", "systopic")
    )
    assert_df_equality(
        actual.select(*expected.columns), expected, ignore_row_order=True, ignore_nullable=True
    )


# A transaction resolved long before the window (OLD), one whose original is before h0 and
# whose immunity copy is in the window (W), and op records before and from p0.
NARROW_CASE = (
    [
        half(0, 90 * S, key="OLD"),
        half(1, 90 * S, key="W"),
        half(2, 60 * S, key="W", counter=1, immunity=30, prepared=1),
        half(3, 60 * S, key="X"),
    ],
    [op(0, "0,"), op(1, "1,"), op(2, "3,")],
    2,
    1,
)


def test_narrowed_evidence_keeps_the_window_and_finds_the_same(spark: SparkSession) -> None:
    """Over every case of this module and the narrow case: the rules find exactly the same
    over the narrowed evidence as over all of it, and the narrowed evidence holds only the
    window's transactions (OLD is out, W's original before h0 is in), the op records from p0
    and the items naming the kept half records."""
    records, offsets = [], []
    for name, (halves, ops, h0, p0) in {**CASES, "narrow": NARROW_CASE}.items():
        rows, committed_offsets = _case(name, halves + ops, h0, p0)
        records += rows
        offsets += committed_offsets
    round_params = params(**THRESHOLDS)
    materialize = SparkMaterializer()
    state = classify_round(
        frame(spark, records), committed(spark, offsets), round_params, materialize=materialize
    )
    assert state.evidence is not None
    queues = materialize.per_queue(state.queues)
    kept: list[DataFrame] = []

    def keep(part: DataFrame) -> DataFrame:
        kept.append(part)
        return part

    evidence = windowed(state.evidence, queues)
    narrow = narrowed(evidence, keep)

    assert len(kept) == 3  # half, ops, op_items: each handed to ``keep`` once
    whole = round_anomalies(evidence, state.pending, round_params)
    found = round_anomalies(narrow, state.pending, round_params)
    assert whole.count() > 10
    assert_df_equality(found, whole, ignore_row_order=True)

    def offsets_of(part: DataFrame, column: str) -> list[int]:
        rows = part.filter(F.col("broker") == "narrow").select(column).collect()
        return sorted(row[0] for row in rows)

    assert offsets_of(narrow.half, "queue_offset") == [1, 2, 3]
    assert offsets_of(narrow.ops, "queue_offset") == [1, 2]
    assert offsets_of(narrow.op_items, HALF_OFFSET) == [1, 3]
