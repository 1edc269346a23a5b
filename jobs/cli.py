"""The command line: arguments, the configuration they override, the checks that run before
Spark starts (bad input fails fast with one line, exit 2), and the exit codes of ``main``.

``python -m jobs.reconcile`` (and ``spark-submit jobs/reconcile.py``, the
``rmq-txn-reconcile`` script) lands in ``main`` here; the run itself is ``jobs.run.run``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from pyspark.sql import SparkSession

from connectors.errors import InputError
from connectors.mirror import mirror_root
from connectors.rocketmq.offsets_file import load_store_offsets, read_consumer_offsets
from connectors.rocketmq.reader import parse_store_arg
from connectors.rocketmq.store_files import checked_stores
from connectors.segments import validate_segment_path
from jobs import interrupt
from jobs.config import JobConfig, load_config
from jobs.extract import parse_as_of, settle_as_of
from jobs.output import AfterCommit
from jobs.progress import write_stderr
from jobs.run import EXIT_OK, JobRequest, StrictModeError, run
from jobs.session import ConnectUnreachableError, remote_url

EXIT_FAILED, EXIT_BAD_INPUT = 1, 2
__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_OK", "build_parser", "main"]

# The flags that override the configuration (``JobConfig`` fields of the same name).
CONFIG_FLAGS = (
    "check_max",
    "transaction_timeout_ms",
    "file_reserved_hours",
    "broker_version",
    "strict",
    "include_body",
    "verify_crc",
    "mirror",
    "as_of",
    "master",
    "remote",
    "writer",
    "catalog_schema",
    "fail_on",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit code 2 (spec section 7)
        raise InputError(message)


def packaged_defaults() -> JobConfig:
    """conf/default.toml, the one source of the defaults (``--help`` shows them); unreadable,
    it is one ``error:`` line (``main`` builds the parser inside its error handling)."""
    return load_config(None, {})


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    inputs = parser.add_argument_group("inputs (a broker store, or exported segments)")
    inputs.add_argument(
        "--store",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="broker store directory; repeat for several brokers",
    )
    inputs.add_argument("--half", help="exported half records (Parquet/JSON/Delta)")
    inputs.add_argument("--op", help="exported op records (Parquet/JSON/Delta)")
    inputs.add_argument(
        "--discards",
        help="exported TRANS_CHECK_MAX_TIME_TOPIC records (same format as --half), for"
        " the discard_history table",
    )
    inputs.add_argument("--offsets", help="consumerOffset.json for exported segments")
    inputs.add_argument(
        "--format", choices=["parquet", "json", "delta"], help="format of --half/--op"
    )
    inputs.add_argument("--broker", help="broker name of exported segments")


def _add_round_settings(parser: argparse.ArgumentParser) -> None:
    # Flags default to None so that --conf can override the packaged defaults; the help
    # shows the packaged defaults (conf/default.toml, the broker's own).
    defaults = packaged_defaults()
    parser.add_argument(
        "--check-max",
        dest="check_max",
        type=int,
        help=f"discard when the counter reaches it (default {defaults.check_max})",
    )
    parser.add_argument(
        "--transaction-timeout-ms",
        dest="transaction_timeout_ms",
        type=int,
        help=f"default immunity (default {defaults.transaction_timeout_ms})",
    )
    parser.add_argument(
        "--file-reserved-hours",
        dest="file_reserved_hours",
        type=int,
        help=f"discard when older, by born time (default {defaults.file_reserved_hours})",
    )
    parser.add_argument(
        "--broker-version",
        dest="broker_version",
        choices=["5", "4.9"],
        help="the broker's version line: 5 (5.1+, default) or 4.9 (4.9.x and 5.0.0)",
    )


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict", action="store_const", const=True, help="fail on any bad record")
    parser.add_argument(
        "--include-body",
        dest="include_body",
        action="store_const",
        const=True,
        help="keep message bodies in the output (they can hold personal data)",
    )
    parser.add_argument(
        "--verify-crc",
        dest="verify_crc",
        action="store_const",
        const=True,
        help="check each record's body CRC (store input)",
    )
    parser.add_argument(
        "--mirror",
        action="store_const",
        const=True,
        help="read the stores through their mirror under the output root: decode only what"
        " they appended since the last run (docs/spec/reconcile.md section 10)",
    )
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="with the mirror: read every store of the run whole again into it",
    )
    parser.add_argument(
        "--writer",
        choices=["auto", "delta-spark", "delta-rs"],
        help="Delta writer (default auto: delta-spark when the session can write Delta)",
    )
    parser.add_argument(
        "--catalog-schema",
        dest="catalog_schema",
        metavar="NAME",
        help="also register the tables as NAME.<table> in the session's catalog",
    )
    parser.add_argument(
        "--fail-on",
        dest="fail_on",
        choices=["warning", "critical"],
        help="exit 3, after writing everything, when anomalies of this severity or worse exist",
    )
    parser.add_argument("--master", help="Spark master when not launched by spark-submit")
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run on a Spark Connect server (default: SPARK_REMOTE when set; docs/connect.md)",
    )
    parser.add_argument("--verbose", action="store_true", help="show Spark's own logging")


CONSOLE_SCRIPT = "rmq-txn-reconcile"

# --help ends with one example and the exit codes (README, "Exit codes").
EPILOG = """\
example:
  {prog} --store broker-a=/data/rocketmq/store --output out/
  {prog} find --output out/ ORD-1001   # one transaction's rows (find --help)

exit codes:
  0        done
  1        failure while running
  2        bad arguments or input: one error: line, nothing written
  3        anomalies as severe as --fail-on (everything written)
  130/143  interrupted (SIGINT, Ctrl-C) / terminated (SIGTERM)
"""


def invoked_as() -> str:
    """How the user started the job, for ``--help``: the console script by its name, any
    other way (``python -m``, ``spark-submit``) as the module."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return CONSOLE_SCRIPT if name == CONSOLE_SCRIPT else "python -m jobs.reconcile"


def build_parser() -> argparse.ArgumentParser:
    """The job's arguments (``docs/spec/reconcile.md`` section "Command line")."""
    prog = invoked_as()
    parser = _Parser(
        prog=prog,
        description="Reconcile RocketMQ transactional messages offline and write Delta tables.",
        epilog=EPILOG.format(prog=prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the epilog's lines
    )
    _add_inputs(parser)
    parser.add_argument("--output", required=True, help="output root: one Delta table per folder")
    parser.add_argument(
        "--as-of",
        dest="as_of",
        help="T: auto | now | latest | ISO-8601 | epoch ms (default auto: now when the store"
        " looks live, latest when it looks copied)",
    )
    parser.add_argument(
        "--run-id", dest="run_id", help="default: derived from the inputs, T and settings"
    )
    parser.add_argument("--conf", help="TOML file overriding conf/default.toml")
    _add_round_settings(parser)
    _add_run_options(parser)
    return parser


# -- checks before Spark starts ------------------------------------------------------------


def validate_output(output: str, stores: Sequence[str]) -> None:
    """A local ``--output`` must not be a file nor inside a store (the job never writes
    into a broker's store). URIs of other file systems pass through."""
    if "://" in output and not output.startswith("file://"):
        return
    path = Path(output.removeprefix("file://")).resolve()
    if _kind(path) == "file":
        raise InputError(f"--output {output}: is a file, not a directory")
    for arg in stores:
        root = parse_store_arg(arg).root.resolve()
        if path == root or root in path.parents:
            raise InputError(f"--output {output}: is inside the store {root}; write elsewhere")
    probe_output(output, path)


def _kind(path: Path) -> str | None:
    """``"dir"``, ``"file"`` (anything else that exists) or None, from one ``stat``: two
    calls (exists, then is_dir) can see another run's probe remove the directory between
    them and call it a file."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # absent, or under a file
        return None
    return "dir" if stat.S_ISDIR(mode) else "file"


class _Vanished(Exception):
    """A directory the probe saw was removed under it (by a concurrent run's probe)."""


# Concurrent runs on one new root each create it and remove it again; a probe that loses
# its directory to another one's clean-up simply probes again.
_PROBE_ATTEMPTS = 5


def probe_output(output: str, path: Path) -> None:
    """Create the root as the run would, then a file inside it, and remove both: an
    output that cannot be written (read-only, immutable, under a file) fails now, not
    after the whole read. The probe leaves nothing behind (the directories it created
    are removed again; the run creates them for good)."""
    for _ in range(_PROBE_ATTEMPTS):
        missing = [folder for folder in (path, *path.parents) if _kind(folder) is None]
        try:
            _probe_once(output, path, missing)
            return
        except _Vanished:
            continue
        finally:
            for folder in missing:  # deepest first; only the empty ones this probe made
                with contextlib.suppress(OSError):
                    folder.rmdir()
    raise InputError(f"--output {output}: cannot create a file in it: the directory vanished")


def _probe_once(output: str, path: Path, missing: list[Path]) -> None:
    existing = path.parents[len(missing) - 1] if missing else path
    kind = _kind(existing)
    if kind is None:
        raise _Vanished
    if kind == "file":
        raise InputError(f"--output {output}: cannot be created: {existing} is a file")
    step = "cannot create the directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
        step = "cannot create a file in it"
        handle, probe = tempfile.mkstemp(dir=path, prefix=".rmq-txn-reconcile-probe-")
        os.close(handle)
        os.unlink(probe)
    except FileNotFoundError as exc:
        if _kind(path) is None:
            raise _Vanished from None
        raise InputError(f"--output {output}: {step}: {exc.strerror}") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"--output {output}: {step}: {reason}") from None


def _validate_segments(args: argparse.Namespace) -> None:
    segments = [args.half, args.op, args.format, args.broker]
    if any(value is None for value in segments):
        raise InputError("give --store DIR, or all of --half, --op, --format and --broker")
    validate_segment_path(args.half, args.format)
    validate_segment_path(args.op, args.format)
    if args.discards is not None:
        validate_segment_path(args.discards, args.format)
    if args.offsets is not None:
        if not Path(args.offsets).is_file():
            raise InputError(f"{args.offsets}: offsets file not found")
        read_consumer_offsets(args.offsets)


def _validate_stores(stores: Sequence[str]) -> None:
    for spec in checked_stores(stores):
        load_store_offsets(spec.root)  # malformed without a usable .bak -> InputError now


def validate_arguments(args: argparse.Namespace) -> None:
    """Everything that can be checked before Spark starts (exit code 2, one line)."""
    validate_output(args.output, args.store)
    segments = [args.half, args.op, args.format, args.broker]
    if args.store and any(value is not None for value in [*segments, args.offsets, args.discards]):
        raise InputError("use either --store or --half/--op/--format/--broker, not both")
    if args.store:
        _validate_stores(args.store)
    else:
        _validate_segments(args)
    _validate_mirror(args)


def _validate_mirror(args: argparse.Namespace) -> None:
    """``--mirror``/``--rebuild``: stores only, under a local output root (spec §10)."""
    if not (args.mirror or args.rebuild):
        return
    if not args.store:
        raise InputError(
            "--mirror and --rebuild read --store stores through their mirror; exported segments"
            " have no mirror"
        )
    mirror_root(args.output)


def config_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The flags given on the command line, over ``--conf`` and the packaged defaults (a
    flag not given is None and overrides nothing)."""
    return {key: getattr(args, key) for key in CONFIG_FLAGS}


def request_from(args: argparse.Namespace, config: JobConfig) -> JobRequest:
    """The run's inputs, output, T and run id from checked arguments."""
    return JobRequest(
        output=args.output,
        as_of=parse_as_of(config.as_of),
        stores=tuple(args.store),
        half=args.half,
        op=args.op,
        fmt=args.format,
        broker=args.broker,
        offsets=args.offsets,
        discards=args.discards,
        run_id=args.run_id,
        verbose=args.verbose,
        rebuild=args.rebuild,
    )


def settled(request: JobRequest, config: JobConfig) -> JobRequest:
    """T checked against the stores and ``auto`` decided (``jobs.extract.settle_as_of``),
    once the stores are known to be stores, before Spark starts."""
    specs = [parse_store_arg(arg) for arg in request.stores]
    as_of, choice = settle_as_of(request.as_of, specs, config)
    return dataclasses.replace(request, as_of=as_of, as_of_choice=choice)


def run_command(
    args: argparse.Namespace,
    spark: SparkSession | None = None,
    after_commit: AfterCommit | None = None,
) -> int:
    """Configuration, T and the checks before Spark starts, then the run."""
    started = time.time()
    config = load_config(args.conf, config_overrides(args))
    request = request_from(args, config)  # a malformed --as-of fails here, before the checks
    validate_arguments(args)
    remote = remote_url(config.remote)
    request = settled(request, config)
    return run(request, config, spark, started, after_commit, remote if spark is None else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def error_line(exc: BaseException) -> str:
    """One line for a failure: Python's first line and, for an error raised in the JVM, the
    innermost Java cause (Py4J's own first line only names the call, e.g.
    ``An error occurred while calling o868.parquet.``)."""
    line = f"{type(exc).__name__}: {_first_line(exc)}"
    java = getattr(exc, "java_exception", None)
    if java is None:
        return line
    while java.getCause() is not None:
        java = java.getCause()
    cause = str(java.toString()).strip().splitlines()
    return f"{line} Cause: {cause[0]}" if cause else line


def main(
    argv: Sequence[str] | None = None,
    spark: SparkSession | None = None,
    after_commit: AfterCommit | None = None,
) -> int:
    """Command line entry point; returns the exit code (0 done, 1 failure, 2 bad input, 3
    anomalies as severe as ``--fail-on``, everything written; 130 / 143 on SIGINT /
    SIGTERM, ``jobs.interrupt``).
    ``after_commit`` (tests): called with each table's name once it is committed."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["find"]:  # rmq-txn-reconcile find --output OUT KEY... (jobs.find)
        from jobs.find import main as find_main

        return find_main(words[1:], spark)
    # The command line's own process: a signal ends it with one line (jobs.interrupt); a
    # caller's session (a notebook, a test) keeps its caller's handlers.
    signals = interrupt.handled() if spark is None else contextlib.nullcontext()
    try:
        with signals:
            args = build_parser().parse_args(argv)
            return run_command(args, spark, after_commit)
    except InputError as exc:
        write_stderr(f"error: {exc}")
        return EXIT_BAD_INPUT
    except (StrictModeError, ConnectUnreachableError) as exc:
        write_stderr(f"error: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:  # a caller's session: PySpark's handler raised it
        write_stderr(interrupt.interrupted_line(signal.SIGINT))
        return interrupt.exit_code(signal.SIGINT)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            write_stderr(f"error: {exc.code}")
            return EXIT_FAILED
        return int(exc.code or 0)
    except Exception as exc:  # a failure while running: one line, details with --verbose
        write_stderr(f"error: {error_line(exc)}")
        if "--verbose" in (argv or sys.argv):
            raise
        return EXIT_FAILED
