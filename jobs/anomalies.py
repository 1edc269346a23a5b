"""The job's side of the anomalies table: the rule that spans runs (``stalled_offset``, fed
from ``run_summary`` of the output root like ``jobs.history``), the lines the summary
prints per kind, and ``--fail-on`` (exit 3 once everything is written).

The rules themselves are pure (``transforms.anomalies``, shaped into the table by
``transforms.outputs``); this module reads earlier runs through delta-rs in the driver and
decides what the command line does with the findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from connectors.delta_commit import absolute_root
from connectors.delta_read import arrow_dataset
from schemas.outputs import RUN_SUMMARY_TABLE, SEVERITIES
from transforms.params import RoundParams

EXIT_ANOMALIES = 3  # --fail-on: anomalies of that severity (or worse) were found and written

EARLIER_OFFSETS = T.StructType(
    [
        T.StructField("broker", T.StringType()),
        T.StructField("queue_id", T.IntegerType()),
        T.StructField("as_of_ms", T.LongType()),
        T.StructField("h0", T.LongType()),
        T.StructField("p0", T.LongType()),
    ]
)


def earlier_offsets(root: str, run_id: str, as_of_ms: int, runs: int) -> list[dict[str, Any]]:
    """Per (broker, queue_id), h0 and p0 of the ``runs - 1`` latest earlier runs of the
    output root before T (``run_summary``; ``run_id`` itself excluded, like
    ``jobs.history``). Reruns of one T count once: the larger run id is taken."""
    summary = arrow_dataset(f"{absolute_root(root)}/{RUN_SUMMARY_TABLE}")
    if summary is None:
        return []
    columns = ["broker", "queue_id", "run_id", "as_of_ms", "h0", "p0"]
    by_t: dict[tuple[str, int, int], tuple[str, dict[str, Any]]] = {}
    for row in summary.to_table(columns=columns).to_pylist():  # runs x queues rows
        if row["run_id"] == run_id or row["as_of_ms"] >= as_of_ms or row["h0"] is None:
            continue
        key = (row["broker"], row["queue_id"], row["as_of_ms"])
        if key not in by_t or row["run_id"] > by_t[key][0]:
            by_t[key] = (row["run_id"], row)
    per_queue: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for (broker, queue_id, _), (_, row) in by_t.items():
        per_queue.setdefault((broker, queue_id), []).append(row)
    latest = []
    for rows in per_queue.values():
        rows.sort(key=lambda row: row["as_of_ms"], reverse=True)
        latest += [
            {name: row[name] for name in EARLIER_OFFSETS.fieldNames()} for row in rows[: runs - 1]
        ]
    return latest


def earlier_offsets_frame(spark: SparkSession, root: str, params: RoundParams) -> DataFrame | None:
    """``EARLIER_OFFSETS`` rows of the output root's earlier runs for ``stalled_offset``
    (``earlier_offsets``), or None when there is none."""
    rows = earlier_offsets(root, params.run_id, params.as_of_ms, params.stalled_offset_runs)
    if not rows:
        return None
    return spark.createDataFrame(
        [tuple(row[name] for name in EARLIER_OFFSETS.fieldNames()) for row in rows],
        EARLIER_OFFSETS,
    )


@dataclass(frozen=True)
class KindCount:
    """How many anomalies of one kind and severity a run found, per queue."""

    kind: str
    severity: str
    queues: tuple[tuple[str, int | None, int], ...]  # (broker, queue_id, count)

    @property
    def total(self) -> int:
        return sum(count for _, _, count in self.queues)


def kind_counts(anomalies: DataFrame) -> DataFrame:
    """``kind, severity, broker, queue_id, n``: the anomalies per kind, severity and queue
    (a small aggregate; the job collects it with the other small tables)."""
    return anomalies.groupBy("kind", "severity", "broker", "queue_id").agg(
        F.count(F.lit(1)).alias("n")
    )


def anomaly_counts(rows: Iterable[Mapping[str, Any]]) -> list[KindCount]:
    """Per kind and severity, the count per queue, from ``kind_counts``' rows."""
    grouped: dict[tuple[str, str], list[tuple[str, int | None, int]]] = {}
    for row in rows:
        grouped.setdefault((row["kind"], row["severity"]), []).append(
            (row["broker"], row["queue_id"], row["n"])
        )
    return [
        KindCount(kind, severity, tuple(sorted(queues, key=lambda q: (q[0], q[1] or -1))))
        for (kind, severity), queues in sorted(grouped.items())
    ]


def anomaly_lines(counts: Sequence[KindCount]) -> list[str]:
    """The summary's lines: one per anomaly kind (and severity) found, with its queues."""
    if not counts:
        return ["anomalies: none"]
    lines = ["anomalies (rows in the anomalies table):"]
    for count in counts:
        where = ", ".join(f"{broker} queue {queue}: {n}" for broker, queue, n in count.queues)
        lines.append(f"  {count.kind} ({count.severity}): {count.total} ({where})")
    return lines


def failing(counts: Iterable[KindCount], fail_on: str) -> int:
    """How many anomalies are of severity ``fail_on`` or worse (0 when ``fail_on`` is empty)."""
    if not fail_on:
        return 0
    worse = set(SEVERITIES[SEVERITIES.index(fail_on) :])
    return sum(count.total for count in counts if count.severity in worse)
