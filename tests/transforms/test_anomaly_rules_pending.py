"""The anomaly rules over the pending records and the window's half records
(transforms/anomaly_rules/pending.py), each alone on small inline frames with only the
columns it reads. Each case is its own broker."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import SparkSession

from schemas.outputs import ANOMALY, CHECK, IMMUNE, NOT_REACHED
from tests.transforms.builders import T, params
from transforms.anomaly_rules.evidence import RoundEvidence
from transforms.anomaly_rules.pending import (
    immunity_exhausts_checks,
    recheck_of_resolved,
    system_topic_or_delay,
    unparsable_immunity,
)

S = 1_000
HALF_DDL = (
    "broker STRING, queue_id INT, transaction_key STRING, queue_offset BIGINT, h0 BIGINT,"
    " h1 BIGINT, check_times INT, immunity_raw STRING, born_timestamp_ms BIGINT,"
    " prepared_queue_offset BIGINT, uniq_key STRING, producer_group STRING"
)
ITEMS_DDL = "broker STRING, queue_id INT, half_offset BIGINT, op_store_ms BIGINT"
PENDING_KEYS_DDL = "broker STRING, queue_id INT, transaction_key STRING, queue_offset BIGINT"
RECHECK = (
    "half offset 1 is resolved through another record of its transaction (rules 2-3), but the"
    " broker matches exact offsets and %s; counter %d of check_max 15"
)


def test_recheck_of_resolved_names_the_brokers_action(spark: SparkSession) -> None:
    """Half 0 of transaction K is named by an op record; its copy at 1 (in [h0, h1) = [1, 2))
    is not: resolved by rule 3, yet the broker acts on the copy by its exact offset. Non-cases:
    an immunity copy whose original (at or after h0) is named, and a copy still pending."""
    born = T - 60 * S

    def case(broker: str, h0: int, counter: int, immunity: str | None, prepared: int | None):
        return [
            (broker, 0, "K", 0, h0, 2, None, None, born, None, "K", "PG"),
            (broker, 0, "K", 1, h0, 2, counter, immunity, born, prepared, "K", "PG"),
        ]

    half = spark.createDataFrame(
        case("check", 1, 1, None, None)
        + case("discard", 1, 15, None, None)
        + case("immune-skipped", 0, 1, "600", 0)
        + case("pending", 1, 1, None, None),
        HALF_DDL,
    )
    brokers = ("check", "discard", "immune-skipped", "pending")
    items = spark.createDataFrame([(b, 0, 0, T - 30 * S) for b in brokers], ITEMS_DDL)
    pending = spark.createDataFrame([("pending", 0, "K", 1)], PENDING_KEYS_DDL)
    evidence = RoundEvidence(half, half.limit(0), items, half)

    found = recheck_of_resolved(evidence, pending, params())

    expected = spark.createDataFrame(
        [
            ("check", 0, "recheck_of_resolved", "warning", "K", "PG", 1, None, 1.0, 15.0,
             RECHECK % ("checks it again", 1)),
            ("discard", 0, "recheck_of_resolved", "critical", "K", "PG", 1, None, 15.0, 15.0,
             RECHECK % ("discards it (counter at check_max)", 15)),
        ],
        ANOMALY,
    )  # fmt: skip
    assert_df_equality(found, expected, ignore_row_order=True, ignore_nullable=True)


PENDING_DDL = (
    "broker STRING, queue_id INT, queue_offset BIGINT, uniq_key STRING, producer_group STRING,"
    " check_times INT, immunity_raw STRING, immunity_ms BIGINT, age_ms BIGINT, status STRING"
)
IMMUNITY = (
    "half offset 0 stays immune %d ms more, but %d put-back(s) every 30000 ms bring its counter"
    " (%d) to check_max 15 first: it is discarded without a check"
)


def test_immunity_exhausts_checks_when_immunity_outlasts_the_put_backs(
    spark: SparkSession,
) -> None:
    """3600 s of immunity, 10 s old: 3 590 000 ms left > 15 put-backs x 30 000 ms; with a
    counter of 10, 390 000 ms left > 5 x 30 000 ms. Non-cases: 400 s of immunity (390 000 ms
    <= 450 000 ms), a record past its immunity, and one the round checks."""
    pending = spark.createDataFrame(
        [
            ("exhausts", 0, 0, "I", "PG", None, "3600", 3_600_000, 10 * S, IMMUNE),
            ("counter", 0, 0, "I", "PG", 10, "400", 400_000, 10 * S, NOT_REACHED),
            ("enough", 0, 0, "I", "PG", None, "400", 400_000, 10 * S, IMMUNE),
            ("past", 0, 0, "I", "PG", None, "3600", 3_600_000, 3_600 * S, NOT_REACHED),
            ("checked", 0, 0, "I", "PG", None, "3600", 3_600_000, 10 * S, CHECK),
        ],
        PENDING_DDL,
    )

    found = immunity_exhausts_checks(pending, params())

    expected = spark.createDataFrame(
        [
            ("exhausts", 0, "immunity_exhausts_checks", "warning", "I", "PG", 0, None,
             3_590_000.0, 450_000.0, IMMUNITY % (3_590_000, 15, 0)),
            ("counter", 0, "immunity_exhausts_checks", "warning", "I", "PG", 0, None,
             390_000.0, 150_000.0, IMMUNITY % (390_000, 5, 10)),
        ],
        ANOMALY,
    )  # fmt: skip
    assert_df_equality(found, expected, ignore_row_order=True, ignore_nullable=True)


SYSTEM_DDL = (
    "broker STRING, queue_id INT, transaction_key STRING, queue_offset BIGINT, uniq_key STRING,"
    " producer_group STRING, real_topic STRING, delay_level_raw STRING,"
    " timer_deliver_ms_raw STRING, timer_delay_sec_raw STRING, timer_delay_ms_raw STRING"
)
TAIL = "; the broker does not deliver such a transaction as sent (#1540)"


def test_system_topic_or_delay_once_per_transaction(spark: SparkSession) -> None:
    """One row per pending transaction with a system topic or a delay or timer property, at
    its first pending record. Non-cases: the prefix inside a topic's name, a delay level of
    0, no topic."""
    rows = [
        ("S0", 0, "rmq_sys_wheel_timer", None, None, None),
        ("S1", 1, "SCHEDULE_TOPIC_XXXX", None, None, None),
        ("S2", 3, "ORDERS", "3", None, None),
        ("S2", 2, "ORDERS", "3", None, None),  # the same transaction, its first record
        ("S4", 4, "ORDERS", None, "1700000060000", None),
        ("S5", 5, "TBW102", None, None, "2"),  # both reasons
        ("N0", 6, "orders_rmq_sys_x", None, None, None),
        ("N1", 7, "ORDERS", "0", None, None),
        ("N2", 8, None, None, None, None),
    ]
    pending = spark.createDataFrame(
        [
            ("b", 0, key, offset, key, "PG", topic, level, deliver, seconds, None)
            for key, offset, topic, level, deliver, seconds in rows
        ],
        SYSTEM_DDL,
    )

    found = system_topic_or_delay(pending)

    why = {
        ("S0", 0): "its real topic rmq_sys_wheel_timer is a system topic",
        ("S1", 1): "its real topic SCHEDULE_TOPIC_XXXX is a system topic",
        ("S2", 2): "it carries DELAY=3",
        ("S4", 4): "it carries TIMER_DELIVER_MS=1700000060000",
        ("S5", 5): "its real topic TBW102 is a system topic and it carries TIMER_DELAY_SEC=2",
    }
    expected = spark.createDataFrame(
        [
            ("b", 0, "system_topic_or_delay", "warning", key, "PG", offset, None, None, None,
             f"half offset {offset}: {text}{TAIL}")
            for (key, offset), text in why.items()
        ],
        ANOMALY,
    )  # fmt: skip
    assert_df_equality(found, expected, ignore_row_order=True, ignore_nullable=True)


UNPARSABLE = (
    'half offset 0: CHECK_IMMUNITY_TIME_IN_SECONDS "%s" is not a whole number of seconds;'
    " the broker reads the transaction timeout (6000 ms) instead"
)


def test_unparsable_immunity_is_a_finding_per_pending_record(spark: SparkSession) -> None:
    """Immunities "1e3" and "60s" do not parse as a long (the broker's ``getLong`` gives -1): each
    pending record carrying one is a finding, its value the immunity the round applied.
    Non-cases: a parsed immunity, "-1" (the broker's own "not set"), no property."""
    pending = spark.createDataFrame(
        [
            ("exponent", 0, 0, "I", "PG", None, "1e3", 6_000, 1 * S, IMMUNE),
            ("suffix", 0, 0, "I", "PG", 2, "60s", 6_000, 9 * S, CHECK),
            ("parsed", 0, 0, "I", "PG", None, "60", 60_000, 1 * S, IMMUNE),
            ("not-set", 0, 0, "I", "PG", None, "-1", 6_000, 1 * S, IMMUNE),
            ("absent", 0, 0, "I", "PG", None, None, 6_000, 9 * S, CHECK),
        ],
        PENDING_DDL,
    )

    found = unparsable_immunity(pending, params())

    expected = spark.createDataFrame(
        [
            ("exponent", 0, "unparsable_immunity", "warning", "I", "PG", 0, None, 6_000.0, None,
             UNPARSABLE % "1e3"),
            ("suffix", 0, "unparsable_immunity", "warning", "I", "PG", 0, None, 6_000.0, None,
             UNPARSABLE % "60s"),
        ],
        ANOMALY,
    )  # fmt: skip
    assert_df_equality(found, expected, ignore_row_order=True, ignore_nullable=True)
