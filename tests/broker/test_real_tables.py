"""The tables of the broker's own round against every recorded real-broker round (issue 34):
``check_requests``, ``discards`` and ``consume_offsets``' broker columns equal what the broker
did, with no difference by design. In ``make test`` on the checked-in fixtures (the job
through the notebook API in the shared session), and in ``make test-broker-compare`` on the
harness's runs.
"""

from __future__ import annotations

import pytest

from tests.broker import summary
from tests.broker.compare import broker_variant
from tests.broker.job_rounds import check_source, job_round, snapshot


def _round(spark, tmp_path_factory, source, recorded):
    """The job's round, or a skip when the store's dispatch cut the broker's walk into its
    own copies (a timing the store cannot show: ``broker_variant``), recorded as such."""
    check_source(source, recorded)
    snap = snapshot(recorded.snapshot, recorded.as_of_ms)
    if broker_variant(snap, recorded).own_copies_limit is not None:
        return None
    return job_round(spark, source, recorded, tmp_path_factory.getbasetemp(), cli_first=False)


def test_the_job_names_the_offsets_and_copies_of_the_brokers_own_round(
    spark, tmp_path_factory, source, recorded
):
    """consume_offsets' ``broker_offset_after`` and ``broker_copies`` are what the broker
    committed and appended in the recorded round, unless the store's dispatch cut its walk
    into its own copies (a timing the store cannot show: ``broker_variant``)."""
    job = _round(spark, tmp_path_factory, source, recorded)
    if job is None:
        pytest.skip(f"{recorded.id}: the broker's walk into its own copies was cut by dispatch")
    grown = recorded.half_max_after - recorded.half_max_before
    # No committed offset after the round: the broker left the queue at its minimum, which
    # is where the round started (a first round that read no op record commits none).
    h1 = recorded.half_committed_after
    p1 = recorded.op_committed_after
    assert (job.broker_h1, job.broker_p1, job.broker_copies) == (
        h1 if h1 is not None else job.h0,
        p1 if p1 is not None else job.p0,
        grown,
    ), recorded.id


def test_the_tables_list_every_check_and_discard_of_the_brokers_round(
    spark, tmp_path_factory, source, recorded
):
    """check_requests and discards are the broker's round exactly: every check request and
    every discard (unique key and counter) the broker made, settled transactions and this
    round's own copies included, and nothing else; the copies beyond the checks are its
    immunity put-backs, among them every really pending one. Unless dispatch cut its walk
    into its own copies."""
    job = _round(spark, tmp_path_factory, source, recorded)
    if job is None:
        summary.record(recorded.id, recorded.line, source, "tables", True, dispatch_cut=True)
        pytest.skip(f"{recorded.id}: the broker's walk into its own copies was cut by dispatch")
    # No table lists the put-backs one by one: their number is the copies beyond the check
    # requests, and each really pending one (pending's immune rows) is one of the broker's.
    put_backs = job.broker_copies - job.broker_checks.total()
    differences = (
        (job.broker_checks - recorded.checks).total()
        + (recorded.checks - job.broker_checks).total()
        + (job.broker_discards - recorded.discards).total()
        + (recorded.discards - job.broker_discards).total()
        + abs(put_backs - recorded.immunity.total())
        + (job.immunity - recorded.immunity).total()
    )
    summary.record(
        recorded.id, recorded.line, source, "tables", differences == 0, differences=differences
    )
    assert job.broker_checks == recorded.checks, recorded.id
    assert job.broker_discards == recorded.discards, recorded.id
    assert put_backs == recorded.immunity.total(), recorded.id
    assert not job.immunity - recorded.immunity, recorded.id
