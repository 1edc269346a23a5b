"""T = latest and the round's start offsets from one aggregate (jobs.extract.latest_round):
the T ``resolve_as_of`` finds, and the round a run gets when the round reads its own
bounds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pyspark.sql import SparkSession

from jobs.extract import Inputs, latest_round, resolve_as_of
from jobs.materialize import SparkMaterializer
from schemas.outputs import BAD_RECORD
from tests.transforms.builders import committed, committed_rows, frame, half, op, params
from tests.transforms.collecting import collect_outputs
from transforms.outputs import shape_tables
from transforms.round import NOTE, classify_round

S = 1_000


def _inputs(spark: SparkSession, records: list[dict[str, Any]]) -> Inputs:
    return Inputs(
        messages=frame(spark, records),
        bad_records=spark.createDataFrame([], BAD_RECORD),
        committed_offsets=committed(spark, committed_rows(1, 0)),
        notes=spark.createDataFrame([], NOTE),
        identity=[],
        offsets_unique=True,
    )


# Half records 0-5 (1 resolved by op 0, 3 young), op records 0-1; the newest is op 1.
RECORDS = [
    *[half(i, 90 * S, key=f"K{i}") for i in range(5)],
    half(5, 2 * S, key="K5"),
    op(0, "1,", stored_age_ms=30 * S),
    op(1, "2,", stored_age_ms=S // 2),
]


def test_latest_is_the_t_of_resolve_as_of_and_its_bounds_give_the_same_round(
    spark: SparkSession,
) -> None:
    inputs = _inputs(spark, RECORDS)
    latest = latest_round(inputs, "latest")
    assert latest is not None
    assert latest.as_of_ms == resolve_as_of("latest", inputs.messages)
    at_latest = params(as_of_ms=latest.as_of_ms)

    def tables(**given: Any) -> dict[str, list[dict[str, Any]]]:
        state = classify_round(
            inputs.messages,
            inputs.committed_offsets,
            at_latest,
            materialize=SparkMaterializer(),
            offsets_unique=True,
            **given,
        )
        return collect_outputs(shape_tables(state))

    with_bounds = tables(bounds=latest.bounds)
    assert with_bounds == tables()
    assert [row["h0"] for row in with_bounds["run_summary"]] == [1]
    assert sorted(row["half_offset"] for row in with_bounds["pending"]) == [3, 4, 5]


def test_only_latest_over_records_without_duplicates_is_found_this_way(
    spark: SparkSession,
) -> None:
    inputs = _inputs(spark, RECORDS)
    assert latest_round(inputs, "auto") is not None  # auto left to this point is latest
    for as_of in (1_000, "now"):
        assert latest_round(inputs, as_of) is None
    assert latest_round(replace(inputs, offsets_unique=False), "latest") is None
