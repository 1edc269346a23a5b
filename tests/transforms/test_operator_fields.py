"""The operator columns of check_requests / discards / pending (spec section 6): keys, tags,
transaction id, producer instance, checks left, the earliest discard, UTC timestamps."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.materialize import SparkMaterializer
from schemas.messages import PROP_KEYS, PROP_TAGS, PROP_TRANSACTION_ID
from tests.transforms.builders import BORN_HOST, T, committed, frame, half, params
from transforms.outputs import RoundOutputs, reconcile

S = 1_000
ROUND = 30_000  # check_interval_ms (the broker's default)
RESERVED = 72 * 3_600_000
OUT_COLUMNS = (
    "queue_id INT, half_offset BIGINT, status STRING, checks_left INT, discard_at_ms BIGINT"
)


def _tagged(record: dict[str, Any], tag: str) -> dict[str, Any]:
    return {**record, "tags": tag, "properties": {**record["properties"], PROP_TAGS: tag}}


@pytest.fixture(scope="module")
def forecast_round(spark: SparkSession) -> RoundOutputs:
    records = [
        # queue 0: a first check (counter 1), then a copy at the maximum whose copy the
        # broker does not reach this round (the fresh copy of offset 0 ends its loop).
        _tagged(
            half(
                0,
                60 * S,
                key="UNIQ-0",
                queue=0,
                extra_properties={PROP_KEYS: "order-7  cust-3 ", PROP_TRANSACTION_ID: "tx-0"},
            ),
            "TagA",
        ),
        half(1, 60 * S, counter=14, queue=0),
        # queue 1: a copy at the maximum alone: reached and discarded this round.
        half(0, 60 * S, counter=14, queue=1),
        # queue 2: the same, but a too-young record stops the round: next round.
        half(0, 60 * S, counter=14, queue=2),
        half(1, 2 * S, queue=2),
        # queue 3: discarded for age now; another one expires before its checks run out.
        half(0, RESERVED + 1, queue=3),
        half(1, RESERVED - 45 * S, queue=3),
        half(2, RESERVED - 30 * S, counter=3, queue=3),
        # queue 4: discarded at the maximum now; an immune put-back uses a check up.
        half(0, 60 * S, counter=15, queue=4),
        half(1, 30 * S, immunity=60, counter=4, queue=4),
    ]
    return reconcile(
        frame(spark, records), committed(spark, []), params(), materialize=SparkMaterializer()
    )


def _select(frame_: DataFrame, ddl: str) -> DataFrame:
    columns = [part.split()[0] for part in ddl.split(",")]
    return frame_.select(*columns).orderBy("queue_id", "half_offset")


def test_checks_left_and_the_earliest_discard(
    spark: SparkSession, forecast_round: RoundOutputs
) -> None:
    expected = [
        (0, 0, "check", 14, T + 15 * ROUND),  # counter 1: rounds 2..15 check, round 16 discards
        (0, 1, "check", 0, T + ROUND),
        (1, 0, "check", 0, T),
        (2, 0, "check", 0, T + ROUND),
        (2, 1, "too_young", 15, T + 16 * ROUND),  # stored counter null = 0
        (3, 0, "discard_expired", 0, T),
        (3, 1, "check", 14, T + 2 * ROUND),  # age at T + ROUND is 15 s short of the retention
        (3, 2, "check", 11, T + 2 * ROUND),  # exactly the retention at T + ROUND: not yet older
        (4, 0, "discard_check_max", 0, T),
        (4, 1, "immune", 10, T + 11 * ROUND),
    ]
    assert_df_equality(
        _select(forecast_round.pending, OUT_COLUMNS),
        spark.createDataFrame(expected, OUT_COLUMNS),
        ignore_nullable=True,
    )
    # check_requests carries the same columns for its rows.
    assert_df_equality(
        _select(forecast_round.check_requests.withColumn("status", F.lit("check")), OUT_COLUMNS),
        spark.createDataFrame([row for row in expected if row[2] == "check"], OUT_COLUMNS),
        ignore_nullable=True,
    )


def test_keys_tags_transaction_id_born_host_and_utc_timestamps(
    spark: SparkSession, forecast_round: RoundOutputs
) -> None:
    ddl = (
        "queue_id INT, half_offset BIGINT, keys ARRAY<STRING>, tags STRING, "
        "transaction_id STRING, born_host STRING, born_at TIMESTAMP, stored_at TIMESTAMP, "
        "as_of TIMESTAMP"
    )
    rows = _select(forecast_round.check_requests, ddl).filter(F.col("queue_id") == 0)

    def instant(ms: int) -> datetime:
        # Aware, so that Spark takes the instant whatever the local time zone is.
        return datetime.fromtimestamp(ms / 1000, UTC)

    born = T - 60 * S
    assert_df_equality(
        rows,
        spark.createDataFrame(
            [
                (
                    0,
                    0,
                    ["order-7", "cust-3"],
                    "TagA",
                    "tx-0",
                    BORN_HOST,
                    instant(born),
                    instant(born + 1),
                    instant(T),
                ),
                (0, 1, [], None, None, BORN_HOST, instant(born), instant(born + 1), instant(T)),
            ],
            ddl,
        ),
        ignore_nullable=True,
    )


def test_run_summary_counts_what_needs_attention_and_records_the_settings(
    spark: SparkSession, forecast_round: RoundOutputs
) -> None:
    ddl = (
        "queue_id INT, discard_next_round BIGINT, past_last_check BIGINT, check_max INT, "
        "transaction_timeout_ms BIGINT, file_reserved_hours INT, check_interval_ms BIGINT, "
        "writer STRING"
    )
    columns = [part.split()[0] for part in ddl.split(",")]
    settings = (15, 6_000, 72, ROUND, None)  # the writer fills `writer` when it writes
    assert_df_equality(
        forecast_round.run_summary.select(*columns).orderBy("queue_id"),
        spark.createDataFrame(
            [
                (0, 1, 1, *settings),  # offset 1: next round; offset 0 has 14 checks left
                (1, 1, 1, *settings),  # discarded when this round reaches the copy
                (2, 1, 1, *settings),
                (3, 0, 0, *settings),  # discarded now (not "next round"); the rest later
                (4, 0, 0, *settings),
            ],
            ddl,
        ),
        ignore_nullable=True,
    )
