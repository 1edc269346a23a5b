"""``reconcile`` agrees with the pure-Python reference on generated brokers.

Hypothesis generates cases (``generators.cases``): one or two queues with gaps, duplicates,
records stored after ``T``, 4.9 and 5.x op bodies with unparsable and out-of-range items,
counters and immunities at the edges, put-back copies sharing a UNIQ_KEY, prepared offsets,
and committed offsets that are missing, below the smallest available or beyond the end.

Speed: a Spark round costs seconds, so Hypothesis only *collects* cases, and all of them
run in one ``reconcile`` call, each case as its own broker (``case-<i>``): brokers never
influence each other. The outputs are collected once and compared case by case with
``tests.reference``. Hypothesis' shrinker would need a Spark round per step, so a failing
case is shrunk by hand instead: every one-step-simpler variant of it runs in a single round,
the smallest still failing one is kept, and so on until none fails.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import pytest
from pyspark.sql import SparkSession

from jobs.materialize import BROADCAST_ROWS, SparkMaterializer
from schemas.outputs import CLASSES, HALF_ROW_FIELDS
from tests import reference
from tests.transforms.builders import T, committed, frame, params
from tests.transforms.generators import Case, describe, generate, simpler, with_broker
from transforms.outputs import reconcile
from transforms.params import RoundParams
from transforms.round import Materializer

DEFAULTS = params()
TIGHT = params(
    run_id="tight-run",
    check_max=3,
    transaction_timeout_ms=10_000,
    file_reserved_hours=1,
    check_interval_ms=20_000,
)

HALF_COLUMNS = tuple(f.name for f in HALF_ROW_FIELDS)
# check_requests and discards are the broker's own round (transforms.broker_round, compared
# with the broker's model in test_broker_walk and with real brokers in tests/broker): here
# only their records are held against the spec's pending records. The counter and what
# follows from it are the broker's (it reads an unparsable counter as -1).
RECORD_COLUMNS = tuple(
    name for name in HALF_COLUMNS if name not in ("check_times", "checks_left", "discard_at_ms")
)
OFFSET_COLUMNS = (
    "topic",
    "queue_id",
    "group",
    "offset_committed",
    "offset_before",
    "offset_after",
    "offset_safe",
    "offset_hold",
)
SUMMARY_COLUMNS = (
    "queue_id",
    "h0",
    "h1",
    "h_safe",
    "p0",
    "p1",
    "p_safe",
    *CLASSES,
    "bad_records",
    "offset_hold",
    "has_warnings",
)
BAD_COLUMNS = ("source", "position", "topic", "queue_id", "queue_offset", "kind")


# ---------------------------------------------------------------------------------------
# Both sides as comparable rows, grouped by broker.

Tables = dict[str, dict[str, Counter]]  # table -> broker -> multiset of row tuples


def _comparable(value: Any) -> Any:
    """Lists (keys) as tuples; timestamps as epoch ms (Spark hands back naive local
    datetimes, the reference aware UTC ones: the same instants)."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, datetime):
        return round(value.timestamp() * 1000)
    return value


def _rows(tables: Tables, table: str, broker: str, row: tuple) -> None:
    row = tuple(_comparable(value) for value in row)
    tables.setdefault(table, {}).setdefault(broker, Counter())[row] += 1


def _summary_row(row: dict[str, Any], has_warnings: bool) -> tuple:
    return (*tuple(row[c] for c in SUMMARY_COLUMNS[:-1]), has_warnings)


def actual_tables(
    spark: SparkSession,
    records: list[dict],
    offsets: list[tuple],
    round_params: RoundParams,
    materialize: Materializer,
) -> tuple[Tables, set]:
    out = reconcile(
        frame(spark, records), committed(spark, offsets), round_params, materialize=materialize
    )
    tables: Tables = {}
    run_columns: set[tuple] = set()

    def collected(df: Any) -> Iterable[dict[str, Any]]:
        for row in df.collect():
            values = row.asDict()
            run_columns.add((values["run_id"], values["as_of_ms"]))
            yield values

    for row in collected(out.pending):
        _rows(tables, "pending", row["broker"], (*(row[c] for c in HALF_COLUMNS), row["status"]))
    # The broker's actions on really pending records (not this round's copies): each one's
    # record is a pending record of the spec's round (``broker_actions_are_pending``).
    for actions in (out.check_requests, out.discards):
        for row in collected(actions):
            if row["really_pending"] and not row["own_copy"]:
                _rows(
                    tables, "broker_actions", row["broker"], tuple(row[c] for c in RECORD_COLUMNS)
                )
    for row in collected(out.consume_offsets):
        _rows(tables, "consume_offsets", row["broker"], tuple(row[c] for c in OFFSET_COLUMNS))
    for row in collected(out.run_summary):
        assert row["written_at_ms"] is None and row["duration_ms"] is None
        _rows(tables, "run_summary", row["broker"], _summary_row(row, bool(row["warnings"])))
    for row in collected(out.bad_records):
        row["kind"] = reference.reason_kind(row["reason"])
        _rows(tables, "bad_records", row["broker"], tuple(row[c] for c in BAD_COLUMNS))
    return tables, run_columns


def expected_tables(records: list[dict], offsets: list[tuple], round_params: RoundParams) -> Tables:
    result = reference.reconcile(records, offsets, round_params)
    tables: Tables = {}
    for row in result.pending:
        _rows(tables, "pending", row["broker"], (*(row[c] for c in HALF_COLUMNS), row["status"]))
    for row in result.pending:
        _rows(tables, "broker_actions", row["broker"], tuple(row[c] for c in RECORD_COLUMNS))
    for row in result.consume_offsets:
        _rows(tables, "consume_offsets", row["broker"], tuple(row[c] for c in OFFSET_COLUMNS))
    for summary in result.summaries.values():
        row = reference.summary_row(summary)
        _rows(tables, "run_summary", summary.broker, _summary_row(row, bool(summary.warnings)))
    for row in result.bad_records:
        row = {**row, "kind": reference.reason_kind(row["reason"])}
        _rows(tables, "bad_records", row["broker"], tuple(row[c] for c in BAD_COLUMNS))
    return tables


def _columns(table: str) -> tuple[str, ...]:
    return {
        "pending": (*HALF_COLUMNS, "status"),
        "broker_actions": RECORD_COLUMNS,
        "consume_offsets": OFFSET_COLUMNS,
        "run_summary": SUMMARY_COLUMNS,
        "bad_records": BAD_COLUMNS,
    }[table]


def _show(table: str, rows: Counter) -> list[str]:
    columns = _columns(table)
    return [
        f"      {dict(zip(columns, row, strict=True))}" + (f" x{n}" if n > 1 else "")
        for row, n in sorted(rows.items(), key=repr)
    ]


def check_batch(
    spark: SparkSession,
    batch: list[Case],
    round_params: RoundParams,
    materialize: Materializer,
) -> dict[int, list[str]]:
    """Run all cases in one round; return, per failing case index, what differs."""
    named = [with_broker(case, f"case-{index}") for index, case in enumerate(batch)]
    records = [record for case in named for record in case.records]
    offsets = [row for case in named for row in case.committed]

    actual, run_columns = actual_tables(spark, records, offsets, round_params, materialize)
    expected = expected_tables(records, offsets, round_params)

    failures: dict[int, list[str]] = defaultdict(list)
    assert run_columns <= {(round_params.run_id, round_params.as_of_ms)}, run_columns
    for table in (
        "run_summary",
        "consume_offsets",
        "pending",
        "broker_actions",
        "bad_records",
    ):
        for index in range(len(batch)):
            broker = f"case-{index}"
            got = actual.get(table, {}).get(broker, Counter())
            want = expected.get(table, {}).get(broker, Counter())
            # Every action on a really pending record is on a pending record; the broker's
            # round may stop before the spec's (at a settled record too young to check).
            if table == "broker_actions":
                want = want & got
            if got != want:
                failures[index].append(f"  {table}:")
                if want - got:
                    failures[index] += [
                        "    expected, missing from the output:",
                        *_show(table, want - got),
                    ]
                if got - want:
                    failures[index] += [
                        "    in the output, not expected:",
                        *_show(table, got - want),
                    ]
        stray = set(actual.get(table, {})) - {f"case-{index}" for index in range(len(batch))}
        assert not stray, f"{table} has rows of unknown brokers {stray}"
    return dict(failures)


def shrink(
    spark: SparkSession,
    case: Case,
    problems: list[str],
    round_params: RoundParams,
    materialize: Materializer,
    rounds: int = 30,
) -> tuple[Case, list[str]]:
    """Greedy one-step simplification, one Spark round per step (see the module docstring)."""
    for _ in range(rounds):
        candidates = simpler(case)
        if not candidates:
            break
        failing = check_batch(spark, candidates, round_params, materialize)
        if not failing:
            break
        smallest = min(
            failing,
            key=lambda index: (len(candidates[index].records), len(describe(candidates[index]))),
        )
        case, problems = candidates[smallest], failing[smallest]
    return case, problems


def assert_generator_reaches_the_edges(batch: list[Case], round_params: RoundParams) -> None:
    """Guard against a generator that silently stops producing the interesting inputs."""
    named = [with_broker(case, f"case-{index}") for index, case in enumerate(batch)]
    result = reference.reconcile(
        [r for c in named for r in c.records], [o for c in named for o in c.committed], round_params
    )
    counts = Counter()
    for summary in result.summaries.values():
        counts.update({name: 1 for name, n in summary.counts.items() if n})
        counts["warning"] += bool(summary.warnings)
        counts["h_safe < h1"] += summary.h_safe < summary.h1
        counts["p_safe < p1"] += summary.p_safe < summary.p1
        counts["p1 > p0"] += summary.p1 > summary.p0
    counts.update(reference.reason_kind(bad["reason"]) for bad in result.bad_records)
    wanted = [
        *CLASSES,
        "warning",
        "h_safe < h1",
        "p_safe < p1",
        "p1 > p0",
        reference.KIND_DUPLICATE,
        reference.KIND_OP_BODY,
        *reference.PROPERTY_KINDS,
    ]
    missing = [name for name in wanted if counts[name] == 0]
    assert not missing, f"no generated case reaches {missing}: {dict(counts)}"


@pytest.mark.parametrize(
    ("round_params", "count", "broadcast"),
    [(DEFAULTS, 240, True), (TIGHT, 160, True), (DEFAULTS, 120, False)],
    ids=["broker-defaults", "check-max-3-timeout-10s-1h", "broker-defaults-shuffled-resolution"],
)
def test_round_matches_the_reference_on_generated_brokers(
    spark: SparkSession,
    round_params: RoundParams,
    count: int,
    broadcast: bool,
) -> None:
    # broadcast=False: the path for many records from h0 (an offset stalled far back),
    # shuffled joins.
    materialize = SparkMaterializer(broadcast_rows=BROADCAST_ROWS if broadcast else -1)
    batch = generate(round_params, count)
    assert len(batch) == count
    assert_generator_reaches_the_edges(batch, round_params)

    failing = check_batch(spark, batch, round_params, materialize)

    if failing:
        first = min(failing, key=lambda index: len(batch[index].records))
        minimal, problems = shrink(spark, batch[first], failing[first], round_params, materialize)
        pytest.fail(
            f"{len(failing)} of {len(batch)} generated brokers differ from the reference "
            f"(T={T}, {round_params}).\nA minimal failing case:\n{describe(minimal)}\nDifferences:\n"
            + "\n".join(problems),
            pytrace=False,
        )
