"""Which transactions are resolved (transforms/resolve.py, spec section 4), through both the
shuffle branch and the broadcast branch of ``resolved_transactions``, on inline frames."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from transforms.resolve import (
    resolved_transactions,
    transaction_records,
    with_settled_by,
    with_transaction_key,
)

HALF = "broker STRING, queue_id INT, queue_offset BIGINT, prepared_queue_offset BIGINT, uniq_key STRING"
KEYS = "broker STRING, queue_id INT, transaction_key STRING"


@pytest.fixture(scope="module")
def half(spark: SparkSession) -> DataFrame:
    return with_transaction_key(
        spark.createDataFrame(
            [
                ("b", 0, 0, None, "K1"),  # named by offset (rule 1)
                ("b", 0, 1, 0, "K1"),  # its immunity copy
                ("b", 0, 2, None, "K2"),  # original of K2, not named itself
                ("b", 0, 3, 2, "K2"),  # copy naming K2's original: named (rule 2)
                ("b", 0, 4, None, "K3"),  # never named
                ("b", 0, 5, None, None),  # no UNIQ_KEY, named by offset: its own transaction
                ("b", 0, 6, None, None),  # no UNIQ_KEY, never named
                ("b", 1, 0, None, "K4"),  # queue 1's offset 0 is not named (queue 0's is)
            ],
            HALF,
        )
    )


@pytest.fixture(scope="module")
def named(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [("b", 0, 0), ("b", 0, 0), ("b", 0, 2), ("b", 0, 5), ("c", 1, 0)],
        "broker STRING, queue_id INT, half_offset BIGINT",
    )


def _keys(spark: SparkSession, keys: list[str]) -> DataFrame:
    return spark.createDataFrame([("b", 0, key) for key in keys], KEYS)


@pytest.mark.parametrize("small", [False, True], ids=["shuffle", "broadcast"])
def test_resolved_transactions_by_rules_1_and_2(
    spark: SparkSession, half: DataFrame, named: DataFrame, small: bool
) -> None:
    got = resolved_transactions(half, named, small=small).distinct()
    expected = _keys(spark, ["K1", "K2", "\u0000offset:5"])
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


@pytest.mark.parametrize("small", [False, True], ids=["shuffle", "broadcast"])
def test_resolved_transactions_of_some_records_settles_only_theirs(
    spark: SparkSession, half: DataFrame, named: DataFrame, small: bool
) -> None:
    # The copy at offset 3 asks about K2: every record of K2 is looked up, and K1 is not.
    of = half.filter("queue_offset IN (3, 4)")
    linked = transaction_records(half, of, small=small)
    offsets = sorted(row["queue_offset"] for row in linked.collect())
    assert offsets == [2, 3, 4]  # K2's original below the records asked about, and K3
    got = resolved_transactions(linked, named, small=small).distinct()
    assert_df_equality(got, _keys(spark, ["K2"]), ignore_row_order=True, ignore_nullable=True)


def test_with_settled_by_names_the_first_op_of_every_record_of_a_resolved_transaction(
    spark: SparkSession, half: DataFrame
) -> None:
    named_by = spark.createDataFrame(
        [("b", 0, 0, 7), ("b", 0, 0, 3), ("b", 0, 2, 8), ("b", 0, 5, 9), ("c", 1, 0, 1)],
        "broker STRING, queue_id INT, half_offset BIGINT, op_offset BIGINT",
    )
    settling = resolved_transactions(half, named_by)
    got = with_settled_by(half, settling).select("queue_id", "queue_offset", "settled_by_op_offset")
    expected = spark.createDataFrame(
        # K1 by the first op naming 0 (3, not 7); K2 through its original at 2 (rule 2 for
        # the copy at 3); offset 5 alone; 4, 6 and queue 1's 0 are really pending.
        [(0, 0, 3), (0, 1, 3), (0, 2, 8), (0, 3, 8), (0, 4, None), (0, 5, 9), (0, 6, None)]
        + [(1, 0, None)],
        "queue_id INT, queue_offset BIGINT, settled_by_op_offset BIGINT",
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)
