"""Both writers on the same store: equal tables, real row counts, interchangeable roots
(either writer creates, the other writes on), every reader, catalog registration."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import duckdb
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from connectors import delta_jars
from connectors.delta import TABLE_PROPERTIES, can_write_delta, delta_spark_coordinate
from tests.delta.helpers import commit_infos, engine, run_job, tables_of
from tests.robustness.store import TABLES, rows_of
from tests.robustness.test_faults import EXPECTED_PENDING, fault_store

pytestmark = pytest.mark.delta
WRITERS = ("delta-rs", "delta-spark")
WROTE = re.compile(r"wrote (\w+): (-?\d+) rows")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("delta-store") / "broker-d"
    fault_store(root)
    return root


@pytest.fixture(scope="module")
def first_runs(spark, store, tmp_path_factory) -> dict[str, tuple[Path, dict[str, int]]]:
    """Run "a" through each writer into its own root: writer -> (root, reported counts)."""
    runs = {}
    for writer in WRITERS:
        output = tmp_path_factory.mktemp(f"first-{writer}") / "out"
        progress = io.StringIO()  # the job's progress lines (module scope: no capsys)
        with contextlib.redirect_stderr(progress):
            code = run_job(spark, store, output, "a", writer)
        assert code == 0, progress.getvalue()
        runs[writer] = (output, {t: int(n) for t, n in WROTE.findall(progress.getvalue())})
    return runs


def test_the_session_can_write_delta_with_the_derived_coordinate(spark) -> None:
    assert can_write_delta(spark)
    assert not delta_jars._delta_classes_absent(spark)  # the quick check finds the jars too
    assert spark.sparkContext.getConf().get("spark.jars.packages") == delta_spark_coordinate()


def test_both_writers_give_equal_tables(first_runs) -> None:
    (rs_root, _), (spark_root, _) = first_runs["delta-rs"], first_runs["delta-spark"]
    rs_tables, spark_tables = tables_of(rs_root, "a"), tables_of(spark_root, "a")
    assert spark_tables == rs_tables
    assert all(rs_tables[table] for table in TABLES), "every table has rows"


def test_reported_row_counts_are_the_rows_written(first_runs) -> None:
    for writer, (root, counts) in first_runs.items():
        written = {t: sum(tables_of(root, "a")[t].values()) for t in TABLES}
        # discard_history is merged, not per run: its count is the rows merged in.
        written["discard_history"] = len(rows_of(root, "discard_history"))
        written["anomalies"] = len(rows_of(root, "anomalies", "a"))
        assert counts == written, writer
    assert first_runs["delta-rs"][1] == first_runs["delta-spark"][1]


def test_commits_name_their_writer_and_tables_share_one_protocol(first_runs) -> None:
    delta_version = delta_spark_coordinate().rsplit(":", 1)[1]
    for writer, (root, _) in first_runs.items():
        for table in TABLES:
            engines = {engine(info) for info in commit_infos(root / table)}
            if writer == "delta-spark":
                assert engines == {f"Apache-Spark/4.2.0 Delta-Lake/{delta_version}"}, engines
            else:
                assert all(e.startswith("delta-rs") for e in engines), engines
            log = DeltaTable(str(root / table))
            assert log.metadata().configuration == TABLE_PROPERTIES, (writer, table)
            protocol = log.protocol()
            assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)


@pytest.mark.parametrize("first", WRITERS)
def test_a_root_created_by_one_writer_is_written_by_the_other(
    spark, store, first_runs, first
) -> None:
    """first writes run a, the other writer run b, first reruns a: one copy of each run,
    the history and time travel readable by every reader, tables registered in a schema."""
    other = WRITERS[1 - WRITERS.index(first)]
    root, _ = first_runs[first]
    reference = tables_of(root, "a")
    schema_name = f"audit_{first.replace('-', '_')}"
    assert run_job(spark, store, root, "b", other) == 0
    assert run_job(spark, store, root, "a", first, "--catalog-schema", schema_name) == 0

    assert tables_of(root, "a") == reference and tables_of(root, "b") == reference
    pending = sorted((r["half_offset"], r["status"]) for r in _rows(root, "pending", "b"))
    assert pending == EXPECTED_PENDING
    for table in TABLES:
        path = str(root / table)
        writers_seen = [engine(info)[:8] for info in commit_infos(root / table)]
        assert writers_seen[1:] == [e[:8] for e in (_engine(first), _engine(other), _engine(first))]
        history = _spark_history(spark, path)
        assert history == list(range(len(writers_seen)))[::-1]
        for version, runs in ((1, ["a"]), (2, ["a", "b"]), (3, ["a", "b"])):
            expected = sum(reference[table].values()) * len(runs)
            by_spark = spark.read.format("delta").option("versionAsOf", version).load(path)
            assert by_spark.count() == expected, (table, version)
            by_deltalake = DeltaTable(path, version=version).to_pyarrow_dataset(
                filesystem=pafs.SubTreeFileSystem(path, pafs.LocalFileSystem())
            )
            assert by_deltalake.count_rows() == expected, (table, version)
        assert _duckdb_count(path) == 2 * sum(reference[table].values()), table
        assert DeltaTable(path).metadata().configuration == TABLE_PROPERTIES, table
        registered = spark.sql(f"SELECT count(*) AS n FROM {schema_name}.{table}").first()["n"]
        assert registered == 2 * sum(reference[table].values()), table


def _engine(writer: str) -> str:
    return "Apache-Spark" if writer == "delta-spark" else "delta-rs"


def _rows(root: Path, table: str, run_id: str) -> list[dict]:
    from tests.robustness.store import rows_of

    return rows_of(root, table, run_id)


def _spark_history(spark, path: str) -> list[int]:
    from delta.tables import DeltaTable as SparkDeltaTable

    history = SparkDeltaTable.forPath(spark, path).history().select("version")
    return [row["version"] for row in history.orderBy("version", ascending=False).collect()]


def _duckdb_count(path: str) -> int:
    """DuckDB over the table's Arrow dataset (deltalake lists the current files)."""
    filesystem = pafs.SubTreeFileSystem(path, pafs.LocalFileSystem())
    dataset = DeltaTable(path).to_pyarrow_dataset(filesystem=filesystem)
    connection = duckdb.connect()
    connection.register("delta_table", dataset)
    return connection.sql("SELECT count(*) FROM delta_table").fetchall()[0][0]
