"""The reconciliation round (spec sections 4-6): resolution, classification, offsets, outputs."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame

from transforms.params import RoundParams


@dataclass(frozen=True)
class RoundOutputs:
    """The output tables of one round, as DataFrames with the schemas of ``schemas.outputs``.

    ``run_summary`` has ``written_at_ms`` and ``duration_ms`` null: they are run-time
    columns filled by the writer.
    """

    check_requests: DataFrame
    discards: DataFrame
    pending: DataFrame
    consume_offsets: DataFrame
    run_summary: DataFrame
    bad_records: DataFrame


def reconcile(
    messages: DataFrame,
    committed_offsets: DataFrame,
    params: RoundParams,
    bad_input: DataFrame | None = None,
) -> RoundOutputs:
    """Run one round over decoded half and op records of any number of brokers.

    Args:
        messages: readable records (``schemas.messages.SOURCED_MESSAGE``) of the half and
            op topics, any store time; duplicates allowed (section 7 settles them).
        committed_offsets: ``schemas.messages.COMMITTED_OFFSET`` rows from the offsets files.
        params: as-of time, run id and broker configuration.
        bad_input: ``schemas.outputs.BAD_RECORD`` rows the readers already produced.
    """
    raise NotImplementedError
