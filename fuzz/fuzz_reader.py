"""Long fuzz target for the store decoder (outside the default test suite).

Feeds arbitrary bytes to the reader as a commit-log file, a consume-queue file, or both,
through ``connectors.rocketmq.reader.read_batches`` (the code each Spark task runs), and
checks that it never raises and that every live consume-queue entry yields its record or a
bad record. Uses atheris (coverage-guided) when it is installed, else hypothesis with many
examples.

    .venv/bin/python fuzz/fuzz_reader.py                      # hypothesis, 20 000 examples per target
    FUZZ_EXAMPLES=200000 .venv/bin/python fuzz/fuzz_reader.py
    .venv/bin/python fuzz/fuzz_reader.py -atheris_runs=1000000 # with atheris installed
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

try:
    import atheris
except ImportError:
    atheris = None

# Coverage-guided fuzzing needs the code under test instrumented as it is imported: the
# decoder and the reader (and what they call in the project). Without this, atheris only
# sees its own entry point and reports "no interesting inputs were found".
INSTRUMENTED = ["connectors", "schemas", "transforms"]
with atheris.instrument_imports(include=INSTRUMENTED) if atheris else contextlib.nullcontext():
    import connectors.rocketmq.codec
    import connectors.rocketmq.reader  # noqa: F401
    from simulator.writer import StoreWriter
from tests.connectors.reference import messages_table  # noqa: E402
from tests.robustness.store import HALF, LOG0, base_rows, half  # noqa: E402
from tests.robustness.test_fuzz import assert_every_entry_accounted, read_all  # noqa: E402

CQ = Path("consumequeue") / HALF / "0" / "00000000000000000000"


def _valid_store() -> Path:
    root = Path(tempfile.mkdtemp(prefix="fuzz-valid-"))
    rows = [*base_rows(), half(4, CHECK_IMMUNITY_TIME_IN_SECONDS="60")]
    rows[1]["sys_flag"] = 0x1
    with StoreWriter(root, commitlog_file_size=4096, cq_file_entries=64) as writer:
        writer.append(messages_table(rows))
    return root


VALID = _valid_store()
atexit.register(shutil.rmtree, VALID, True)
VALID_LOG = (VALID / LOG0).read_bytes()[:1300]
VALID_CQ = (VALID / CQ).read_bytes()[:200]


def one_input(data: bytes) -> None:
    """First byte: mode (0 commit log only, walked; 1 consume queue over the valid log;
    2 both replaced; 3 the valid log with XOR damage), then a 2-byte split point."""
    if len(data) < 3:
        return
    mode, split = data[0] % 4, struct.unpack(">H", data[1:3])[0]
    payload = data[3:]
    cut = split % (len(payload) + 1)
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        shutil.copytree(VALID, root, dirs_exist_ok=True)
        cq = VALID_CQ
        if mode == 0:
            shutil.rmtree(root / "consumequeue")
            (root / LOG0).write_bytes(payload)
        elif mode == 1:
            cq = payload
        elif mode == 2:
            (root / LOG0).write_bytes(payload[:cut])
            cq = payload[cut:]
        else:
            log = bytearray(VALID_LOG)
            for i in range(0, len(payload) - 2, 3):
                log[struct.unpack(">H", payload[i : i + 2])[0] % len(log)] ^= payload[i + 2] or 1
            (root / LOG0).write_bytes(bytes(log))
        if mode != 0:
            (root / CQ).write_bytes(cq)
        rows = read_all(root, verify_crc=bool(split & 1), include_half_body=bool(split & 2))
        if mode != 0:
            assert_every_entry_accounted(rows, cq, HALF)
    finally:
        shutil.rmtree(root)


def _seed(mode: int, split: int, payload: bytes) -> bytes:
    return bytes([mode]) + struct.pack(">H", split % 65536) + payload


def _simulated_store() -> tuple[bytes, bytes]:
    """The head of a simulated broker's commit log and its half consume queue."""
    with tempfile.TemporaryDirectory(prefix="fuzz-sim-") as tmp:
        store = Path(tmp) / "store"
        subprocess.run(
            [sys.executable, "-m", "simulator", "--out", str(store), "--transactions", "12"]
            + ["--commitlog-file-size", "65536", "--cq-file-entries", "64", "--other-traffic", "0"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        log = sorted((store / "commitlog").iterdir())[0].read_bytes()
        queue = sorted((store / "consumequeue" / HALF / "0").iterdir())[0].read_bytes()
    return log[:16384], queue[:400]


def write_seeds(folder: Path) -> list[Path]:
    """Valid inputs for every mode: the valid test log and queue, the real broker's commit
    log (tests/fixtures), a simulated broker's log and half queue."""
    folder.mkdir(parents=True, exist_ok=True)
    real = (ROOT / "tests" / "fixtures" / "real-commitlog" / "00000000000000000000").read_bytes()
    sim_log, sim_cq = _simulated_store()
    seeds = {
        "valid-log": _seed(0, 0, VALID_LOG),
        "valid-log-crc-bodies": _seed(0, 3, VALID_LOG),
        "real-broker-log": _seed(0, 1, real),
        "simulated-log": _seed(0, 0, sim_log),
        "valid-cq": _seed(1, 0, VALID_CQ),
        "valid-log-and-cq": _seed(2, len(VALID_LOG), VALID_LOG + VALID_CQ),
        "simulated-log-and-cq": _seed(2, len(sim_log), sim_log + sim_cq),
        "valid-log-xor": _seed(3, 0, b"\x00\x10\x01"),
    }
    written = []
    for name, data in seeds.items():
        (folder / name).write_bytes(data)
        written.append(folder / name)
    return written


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--write-seeds":
        for path in write_seeds(Path(sys.argv[2])):
            print(f"seed {path} ({path.stat().st_size} bytes)")
        return
    if atheris is not None:
        atheris.Setup(sys.argv, one_input)
        atheris.Fuzz()
        return
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    examples = int(os.environ.get("FUZZ_EXAMPLES", "20000"))

    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(st.binary(min_size=3, max_size=2000))
    def fuzz(data: bytes) -> None:
        one_input(data)

    fuzz()
    print(f"fuzz_reader: {examples} examples, no failure")


if __name__ == "__main__":
    main()
