"""The floor of ``bench.small``: what a run of the job costs with no round at all.

``python -m bench.floor --store [NAME=]DIR ... --output DIR [--remote URL]`` does, with the
job's own functions, the part of a run that no change to the pipeline can remove:

- the job's session, shaped as the job shapes it for this read (``jobs.run.session_shape``
  on the planned read: for the sample store ``local[2]``, 2 shuffle partitions, adaptive
  execution off); with ``--remote``, a Connect session of that server, given the job's
  code as the job gives it (``jobs.session.ship_code``);
- the job's read of the stores (``jobs.extract.read_store_inputs``) and one count of its
  records: one Spark job, the stores decoded once;
- the job's writer (``connectors.delta.open_output``) creating the 8 output tables and
  committing each once in the job's way (``jobs.output.write_tables``: ``ensure_table``,
  then ``merge_offsets`` / ``replace_run_rows`` / ``merge_rows`` / ``replace_run``), with
  no rows.

The job's time over this process's is what its round (resolve, classify, discard
history, shaping the tables) costs; this process's time over bare Spark's
(``bench.bare_spark``) is what a session, one decode of the stores and 8 Delta commits
cost. It prints one line: the records read, the writer, and the seconds of each part.
The output root must be new or empty (every table is created).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession

from connectors.arrow import to_arrow_schema
from connectors.delta import MERGED_TABLES, open_output
from jobs.config import JobConfig, load_config
from jobs.extract import read_store_inputs
from jobs.progress import planned_read
from jobs.run import session_shape
from jobs.session import build_session, own_connect_session, ship_code
from schemas.outputs import CONSUME_OFFSETS_TABLE, TABLE_SCHEMAS, table_schema
from transforms.outputs import SMALL_TABLES

RUN_ID = "floor"


@contextlib.contextmanager
def job_session(
    config: JobConfig, planned_records: int | None, remote: str | None
) -> Iterator[SparkSession]:
    """The session the job would start for a read of ``planned_records``: its own Connect
    session of ``remote`` (released on leaving, as the job's is), else a local one."""
    adaptive, partitions = session_shape(config, planned_records)
    if remote:
        with own_connect_session(remote, partitions, adaptive=adaptive) as spark:
            ship_code(spark)  # the readers run on the server's workers
            yield spark
        return
    yield build_session(
        master=config.master,
        shuffle_partitions=partitions,
        driver_memory=config.driver_memory,
        delta=config.writer == "delta-spark",
        adaptive=adaptive,
    )


def write_empty_tables(spark: SparkSession, output: Path, config: JobConfig) -> str:
    """Every output table created and committed once with no rows, each the way
    ``jobs.output.write_tables`` commits it; the writer's name."""
    writer = open_output(spark, output, config.writer)
    for name in TABLE_SCHEMAS:  # in the job's write order, offsets last
        writer.ensure_table(name, table_schema(name, config.include_body))
    for name in TABLE_SCHEMAS:
        schema = table_schema(name, config.include_body)
        if name == CONSUME_OFFSETS_TABLE:
            writer.merge_offsets(to_arrow_schema(schema).empty_table(), schema)
        elif name in SMALL_TABLES:
            writer.replace_run_rows(name, to_arrow_schema(schema).empty_table(), schema, RUN_ID)
        elif name in MERGED_TABLES:
            writer.merge_rows(name, spark.createDataFrame([], schema), schema)
        else:
            writer.replace_run(name, spark.createDataFrame([], schema), schema, RUN_ID)
    return str(getattr(writer, "name", type(writer).__name__))


def run_floor(stores: list[str], output: Path, remote: str | None = None) -> str:
    """The floor once: session, read and count, empty tables; its one-line summary."""
    started = time.monotonic()
    config = load_config(None, {})
    planned = planned_read(stores)
    plan = planned.plan if planned is not None else None  # read with it, not planned again
    with job_session(config, planned.entries if planned else None, remote) as spark:
        session_s = time.monotonic() - started
        records = read_store_inputs(spark, stores, config, plan).messages.count()
        read_s = time.monotonic() - started - session_s
        writer = write_empty_tables(spark, output, config)
        write_s = time.monotonic() - started - session_s - read_s
    return (
        f"floor: {records} records read, {len(TABLE_SCHEMAS)} empty tables written by {writer}"
        f" (session {session_s:.2f} s, read {read_s:.2f} s, write {write_s:.2f} s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", action="append", required=True, help="[NAME=]DIR, repeatable")
    parser.add_argument("--output", type=Path, required=True, help="a new or empty folder")
    parser.add_argument("--remote", default=None, help="sc://HOST:PORT of a Connect server")
    args = parser.parse_args(argv)
    if args.output.exists() and (not args.output.is_dir() or any(args.output.iterdir())):
        print(f"error: {args.output}: the output root must be new or empty", file=sys.stderr)
        return 2
    print(run_floor(args.store, args.output, args.remote), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
