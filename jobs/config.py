"""Job configuration: packaged defaults < ``--conf`` TOML file < command-line flags."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from connectors import WRITERS
from connectors.errors import InputError

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
DEFAULT_CONF = Path(__file__).resolve().parent.parent / "conf" / "default.toml"
# The same file as this module's loader sees it: in the --py-files zip of `make package`
# it is a zip member, not a file, and must be read through the zip (unresolved path).
_PACKAGED_CONF = os.path.join(os.path.dirname(os.path.dirname(__file__)), "conf", "default.toml")
_INT32_MAX = 2**31 - 1
BROKER_VERSIONS = ("5", "4.9")
FAIL_ON = (
    "",
    "warning",
    "critical",
)  # --fail-on; empty: never  # 5: 5.1+ (batched op bodies); 4.9: 4.9.x and 5.0.0


@dataclass(frozen=True)
class JobConfig:
    """The job's settings. Their defaults have one source, ``conf/default.toml`` (packaged
    with the job): a new setting is a line there and a field here, nothing else."""

    check_max: int
    transaction_timeout_ms: int
    file_reserved_hours: int
    check_interval_ms: int
    as_of: str
    broker_version: str
    include_body: bool
    strict: bool
    verify_crc: bool
    mirror: bool  # read stores through their mirror under the output root
    master: str
    remote: str  # a Spark Connect server's URL (sc://HOST:PORT); empty: SPARK_REMOTE or master
    shuffle_partitions: int
    driver_memory: str
    writer: str
    catalog_schema: str  # empty: tables are not registered in a catalog
    fail_on: str  # empty, "warning" or "critical": exit 3 when anomalies that severe exist
    # Thresholds of the anomaly rules ([anomalies], docs/spec/anomalies.md).
    slow_producer_percent: int
    slow_producer_min_transactions: int
    op_backlog_records: int
    stalled_offset_runs: int

    def validated(self) -> JobConfig:
        if not 0 <= self.check_max <= _INT32_MAX:
            raise InputError(f"check_max must be between 0 and {_INT32_MAX}: {self.check_max}")
        if self.broker_version not in BROKER_VERSIONS:
            raise InputError(
                f"broker_version must be one of {', '.join(BROKER_VERSIONS)}: {self.broker_version!r}"
            )
        for name in (
            "transaction_timeout_ms",
            "file_reserved_hours",
            "check_interval_ms",
            "shuffle_partitions",
        ):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must not be negative: {getattr(self, name)}")
        if self.check_interval_ms <= 0:  # forecasts divide by it
            raise InputError(f"check_interval_ms must be positive: {self.check_interval_ms}")
        self._validate_anomalies()
        if self.writer not in WRITERS:
            raise InputError(f"writer must be one of {', '.join(WRITERS)}: {self.writer}")
        if self.catalog_schema and not _SCHEMA_NAME.fullmatch(self.catalog_schema):
            raise InputError(
                f"catalog schema must be NAME or CATALOG.NAME (letters, digits, _): {self.catalog_schema}"
            )
        return self

    def _validate_anomalies(self) -> None:
        if self.fail_on not in FAIL_ON:
            raise InputError(f"fail_on must be warning or critical (or empty): {self.fail_on!r}")
        if not 0 <= self.slow_producer_percent <= 100:
            raise InputError(
                f"slow_producer_percent must be between 0 and 100: {self.slow_producer_percent}"
            )
        for name in ("slow_producer_min_transactions", "op_backlog_records"):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must not be negative: {getattr(self, name)}")
        if self.stalled_offset_runs < 2:  # one run cannot show an offset that does not move
            raise InputError(f"stalled_offset_runs must be at least 2: {self.stalled_offset_runs}")


_KNOWN = {field.name: field.type for field in fields(JobConfig)}


def _flatten(document: dict[str, Any], source: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for section in ("broker", "job", "anomalies"):
        for key, value in document.get(section, {}).items():
            if key not in _KNOWN:
                raise InputError(f"{source}: unknown setting '{section}.{key}'")
            expected = _KNOWN[key]
            ok = (
                isinstance(value, bool)
                if expected == "bool"
                else (
                    isinstance(value, int) and not isinstance(value, bool)
                    if expected == "int"
                    else isinstance(value, str)
                )
            )
            if not ok:
                raise InputError(f"{source}: '{section}.{key}' must be {expected}: {value!r}")
            values[key] = value
    return values


def _packaged_defaults() -> bytes | None:
    """conf/default.toml beside the packages: a file in a checkout, a member of the zip
    under spark-submit (read by the loader that imported this module)."""
    loader = __spec__.loader if __spec__ is not None else None
    try:
        if loader is not None and hasattr(loader, "get_data"):
            return loader.get_data(_PACKAGED_CONF)
        return Path(_PACKAGED_CONF).read_bytes()
    except OSError:
        return None


def load_config(conf_file: str | None, overrides: dict[str, Any]) -> JobConfig:
    """Defaults from conf/default.toml, then ``conf_file``, then non-None ``overrides``."""
    packaged = _packaged_defaults()
    if packaged is None:
        raise InputError(f"{DEFAULT_CONF}: the packaged defaults cannot be read")
    sources: list[tuple[str, bytes]] = [(str(DEFAULT_CONF), packaged)]
    values: dict[str, Any] = {}
    if conf_file is not None:
        if not Path(conf_file).is_file():
            raise InputError(f"{conf_file}: configuration file not found")
        sources.append((str(Path(conf_file)), Path(conf_file).read_bytes()))
    for source, data in sources:
        try:
            document = tomllib.loads(data.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{source}: not a TOML file ({exc})") from None
        values.update(_flatten(document, source))
    missing = [field.name for field in fields(JobConfig) if field.name not in values]
    if missing:
        raise InputError(f"{DEFAULT_CONF}: no value for {', '.join(missing)}")
    config = replace(
        JobConfig(**values),
        **{key: value for key, value in overrides.items() if value is not None},
    )
    return config.validated()
