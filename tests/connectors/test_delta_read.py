"""connectors.delta_read: a local table is read through Arrow's own local file system,
never delta-rs' Python one (a short process scanning with it can abort at exit)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake
from pyarrow.fs import LocalFileSystem, SubTreeFileSystem

from connectors.delta_read import arrow_dataset, table_filesystem


def _write(path: Path) -> None:
    rows = pa.table({"run_id": ["r1", "r1", "r2"], "n": [1, 2, 3]})
    write_deltalake(str(path), rows, partition_by=["run_id"])
    write_deltalake(str(path), pa.table({"run_id": ["r3"], "n": [4]}), mode="append")


def test_a_local_table_gets_arrows_local_file_system_rooted_at_its_folder(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for given in ("out/pending", f"file://{tmp_path}/out/pending", "file:out/pending"):
        filesystem = table_filesystem(given)
        assert isinstance(filesystem, SubTreeFileSystem), given
        assert isinstance(filesystem.base_fs, LocalFileSystem), given
        assert filesystem.base_path == f"{tmp_path}/out/pending/", given


def test_a_table_on_an_object_store_keeps_delta_rs_file_system() -> None:
    assert table_filesystem("s3://bucket/out/pending") is None
    assert table_filesystem("abfss://c@account.dfs.core.windows.net/out/pending") is None


def test_the_dataset_reads_the_current_version_or_an_older_one_and_a_run_filter_prunes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "table"
    _write(path)

    dataset = arrow_dataset(str(path))
    assert dataset is not None
    assert isinstance(dataset.filesystem, SubTreeFileSystem)
    assert sorted(dataset.to_table()["n"].to_pylist()) == [1, 2, 3, 4]
    of_r1 = pc.field("run_id") == "r1"
    assert sorted(dataset.to_table(filter=of_r1)["n"].to_pylist()) == [1, 2]
    assert len(list(dataset.get_fragments(filter=of_r1))) == 1  # only r1's file is opened

    first = arrow_dataset(str(path), version=0)
    assert first is not None
    assert sorted(first.to_table()["n"].to_pylist()) == [1, 2, 3]


def test_no_table_is_none(tmp_path: Path) -> None:
    assert arrow_dataset(str(tmp_path / "absent")) is None
