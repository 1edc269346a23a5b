"""Stores the reader does not understand are refused with one line (exit 2), recognised
from the store's own files (connectors/rocketmq/store_kind.py, docs/store-reader.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.rocketmq.store_kind import read_broker_properties, unsupported_reason
from tests.jobs.test_cli import assert_one_line_error, run_cli
from tests.robustness.store import base_rows, half, write


def _store(root: Path) -> Path:
    write(root, base_rows())
    return root


def _write(path: Path, text: str | bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)


def _rocksdb(folder: Path) -> None:
    # What RocksDB leaves in its database folder.
    for name in ("CURRENT", "IDENTITY", "LOCK", "MANIFEST-000005", "OPTIONS-000007", "000004.log"):
        _write(folder / name, b"x")


UNSUPPORTED = {
    "rocksdb-consume-queues": (
        lambda root: _rocksdb(root / "consumequeue"),
        "consumequeue/ is a RocksDB database",
    ),
    "rocksdb-config-v1": (
        lambda root: _rocksdb(root / "config" / "consumerOffsets"),
        "config/consumerOffsets/ is a RocksDB database",
    ),
    "rocksdb-config-v2": (
        lambda root: _rocksdb(root / "config" / "rdb"),
        "config/rdb/ is a RocksDB database",
    ),
    "store-type-setting": (
        lambda root: _write(root / "config" / "broker.properties", "storeType=defaultRocksDB\n"),
        "config/broker.properties sets storeType=defaultRocksDB",
    ),
    "config-v2-setting": (
        lambda root: _write(root / "config" / "broker.conf", "configManagerVersion = v2\n"),
        "config/broker.conf sets configManagerVersion=v2",
    ),
    "dledger-dir": (
        lambda root: _write(root / "dledger-n0" / "data" / "00000000000000000000", b"x"),
        "dledger-n0/ found: a DLedger commit log",
    ),
    "dledger-setting": (
        lambda root: _write(root / "config" / "broker.properties", "enableDLegerCommitLog=true\n"),
        "sets enableDLegerCommitLog=true",
    ),
    "several-paths-setting": (
        lambda root: _write(
            root / "config" / "broker.properties",
            "storePathCommitLog=/data1/commitlog,/data2/commitlog\n",
        ),
        "spreads the commit log over several paths",
    ),
    "slave-role": (
        lambda root: _write(
            root / "config" / "broker.properties", "# copied\nbrokerRole=SLAVE\nbrokerId=1\n"
        ),
        "describes a slave (brokerRole=SLAVE, brokerId=1)",
    ),
    "slave-id": (
        lambda root: _write(root / "config" / "broker.properties", "brokerId: 2\n"),
        "describes a slave",
    ),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_each_unsupported_kind_is_recognised(tmp_path: Path, name: str) -> None:
    root = _store(tmp_path / name)
    assert unsupported_reason(root) is None
    make, reason = UNSUPPORTED[name]
    make(root)
    assert reason in (unsupported_reason(root) or "")


def test_a_commit_log_file_missing_inside_the_sequence_is_a_gap(tmp_path: Path) -> None:
    # 4 KiB files: enough halves for three files; then the middle one goes elsewhere (a
    # second commit-log path).
    root = tmp_path / "store"
    write(root, [half(i) for i in range(100)], commitlog_file_size=4096)
    files = sorted((root / "commitlog").iterdir())
    assert len(files) >= 3
    assert unsupported_reason(root) is None
    files[1].unlink()
    assert "commitlog/ has no file between" in (unsupported_reason(root) or "")


def test_a_short_damaged_file_is_not_a_gap(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write(root, [half(i) for i in range(100)], commitlog_file_size=4096)
    files = sorted((root / "commitlog").iterdir())
    files[1].write_bytes(files[1].read_bytes()[:100])
    assert unsupported_reason(root) is None


def test_a_master_setting_file_is_fine(tmp_path: Path) -> None:
    root = _store(tmp_path / "store")
    _write(
        root / "config" / "broker.properties",
        "brokerRole=ASYNC_MASTER\nbrokerId=0\nstoreType=default\nstorePathCommitLog=/x/commitlog\n",
    )
    assert unsupported_reason(root) is None


def test_properties_syntax() -> None:
    assert read_broker_properties("a=1\n b : 2\n#c=3\n!d=4\ne 5\nf==6\n") == {
        "a": "1",
        "b": "2",
        "e": "5",
        "f": "6",
    }


def test_the_command_line_refuses_with_one_line_before_spark(tmp_path: Path) -> None:
    root = _store(tmp_path / "store")
    _rocksdb(root / "consumequeue")
    output = tmp_path / "out"
    result = run_cli("--store", str(root), "--output", str(output))
    assert_one_line_error(result, str(root), "unsupported store", "RocksDB", "store-reader.md")
    assert not output.exists()
