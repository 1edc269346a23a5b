"""Inputs at the edge of the contract that the generated cases do not produce, each in its
own round (a failure of one, even a failed run, does not hide the others)."""

from __future__ import annotations

from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from jobs.materialize import SparkMaterializer
from schemas.messages import HALF_TOPIC, OP_TOPIC
from tests.reference import KIND_DUPLICATE, KIND_OP_BODY, reason_kind
from tests.transforms.builders import committed, committed_rows, frame, half, op, params
from tests.transforms.collecting import collect_outputs
from transforms.outputs import RoundOutputs, reconcile

S = 1_000


def reconcile_round(spark: SparkSession, records: list[dict[str, Any]]) -> RoundOutputs:
    return reconcile(
        frame(spark, records), committed(spark, []), params(), materialize=SparkMaterializer()
    )


def _rows(spark: SparkSession, rows: list[dict[str, Any]], ddl: str) -> DataFrame:
    """The ``ddl`` columns of collected rows, as a DataFrame for chispa."""
    columns = [part.split()[0] for part in ddl.split(",")]
    return spark.createDataFrame([tuple(row[c] for c in columns) for row in rows], ddl)


def test_an_op_body_that_is_not_utf8_is_a_bad_record_and_the_run_goes_on(
    spark: SparkSession,
) -> None:
    # Section 7: "A record that cannot be decoded or used ... becomes a row of bad_records
    # and the run goes on." The 0xFF byte spoils its item only; item "1" still names 1.
    records = [half(0, 60 * S), half(1, 60 * S), op(0, b"\xff0,1,")]

    out = collect_outputs(reconcile_round(spark, records))

    assert_df_equality(
        _rows(spark, out["pending"], "half_offset BIGINT, status STRING"),
        spark.createDataFrame([(0, "check")], "half_offset BIGINT, status STRING"),
        ignore_nullable=True,
    )
    bad = [{**row, "kind": reason_kind(row["reason"])} for row in out["bad_records"]]
    assert_df_equality(
        _rows(spark, bad, "topic STRING, queue_offset BIGINT, kind STRING"),
        spark.createDataFrame(
            [(OP_TOPIC, 0, KIND_OP_BODY)], "topic STRING, queue_offset BIGINT, kind STRING"
        ),
        ignore_nullable=True,
    )


def test_identical_duplicate_rows_are_used_once(spark: SparkSession) -> None:
    # Section 7: "Two records with the same (broker, topic, queue_id, queue_offset): the one
    # with the smallest commitlog_offset is used, the others are bad records." Rows equal in
    # commitlog_offset, source and position too (the same input read twice) are no
    # exception: one is used, the other is a bad record, nothing is counted twice.
    records = [half(0, 60 * S), half(0, 60 * S)]

    out = collect_outputs(reconcile_round(spark, records))

    assert_df_equality(
        _rows(spark, out["check_requests"], "half_offset BIGINT"),
        spark.createDataFrame([(0,)], "half_offset BIGINT"),
        ignore_nullable=True,
    )
    bad = [{**row, "kind": reason_kind(row["reason"])} for row in out["bad_records"]]
    assert_df_equality(
        _rows(spark, bad, "topic STRING, queue_offset BIGINT, kind STRING"),
        spark.createDataFrame(
            [(HALF_TOPIC, 0, KIND_DUPLICATE)], "topic STRING, queue_offset BIGINT, kind STRING"
        ),
        ignore_nullable=True,
    )
    assert [row["check"] for row in out["run_summary"]] == [1]


def test_broker_version_49_keeps_p1_at_an_op_of_another_tag(spark: SparkSession) -> None:
    """Spec §5 (2026-11-24): a 4.9 broker never marks an op of another tag done, so its op
    offset stays at it; p_safe passes it (it names nothing). 5.x: done (case C12)."""
    records = [half(0, 2 * 1000), op(0, "0", tag="x")]
    summary_ddl = "p0 BIGINT, p1 BIGINT, p_safe BIGINT"
    for version, p1 in (("5", 1), ("4.9", 0)):
        out = reconcile(
            frame(spark, records),
            committed(spark, committed_rows(0, 0)),  # committed: the queue is not held
            params(broker_version=version),
            materialize=SparkMaterializer(),
        )
        assert_df_equality(
            out.run_summary.select("p0", "p1", "p_safe"),
            _rows(spark, [{"p0": 0, "p1": p1, "p_safe": 1}], summary_ddl),
            ignore_nullable=True,
        )


@pytest.mark.parametrize(
    "materialize",
    [
        SparkMaterializer(literal_queues=0),
        SparkMaterializer(literal_queues=64),
        SparkMaterializer(floor_rows=2**62),
    ],
    ids=["join", "literal", "no-floors"],
)
def test_a_transaction_reaching_far_below_the_committed_offsets_is_resolved(
    spark: SparkSession, materialize: SparkMaterializer
) -> None:
    # Spec §4: rule 3 reaches every half record of a transaction, below h0 included, and
    # rule 2 an immunity copy's original, whatever its key; the op records naming those may
    # lie far below p0. The round reads from floors (transforms.floors) that must reach
    # both: the put-back copy of K (20) is resolved through K's original (8) and op 8, the
    # immunity copy P (21) through its original (3) and op 3, below K's original.
    records = [half(i, 60 * S, key="K" if i == 8 else f"T{i}") for i in range(20)]
    records += [op(i, f"{i},") for i in range(20)]
    records += [
        half(20, 60 * S, key="K"),
        half(21, 60 * S, key="P", prepared=3),
        half(22, 60 * S, key="M"),
    ]
    out = collect_outputs(
        reconcile(
            frame(spark, records),
            committed(spark, committed_rows(20, 20)),
            params(),
            materialize=materialize,
        )
    )
    ddl = "half_offset BIGINT, status STRING"
    assert_df_equality(
        _rows(spark, out["pending"], ddl),
        spark.createDataFrame([(22, "check")], ddl),
        ignore_nullable=True,
    )
    assert [(row["h0"], row["resolved"]) for row in out["run_summary"]] == [(20, 2)]
