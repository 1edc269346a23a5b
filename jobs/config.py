"""Job configuration: packaged defaults < ``--conf`` TOML file < command-line flags."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from connectors.errors import InputError

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
DEFAULT_CONF = Path(__file__).resolve().parent.parent / "conf" / "default.toml"
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class JobConfig:
    check_max: int = 15
    transaction_timeout_ms: int = 6000
    file_reserved_hours: int = 72
    check_interval_ms: int = 30000
    as_of: str = "now"
    include_body: bool = False
    strict: bool = False
    verify_crc: bool = False
    master: str = "local[2]"
    shuffle_partitions: int = 8
    driver_memory: str = "4g"
    writer: str = "auto"
    catalog_schema: str = ""  # empty: tables are not registered in a catalog

    def validated(self) -> JobConfig:
        if not 0 <= self.check_max <= _INT32_MAX:
            raise InputError(f"check_max must be between 0 and {_INT32_MAX}: {self.check_max}")
        for name in (
            "transaction_timeout_ms",
            "file_reserved_hours",
            "check_interval_ms",
            "shuffle_partitions",
        ):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must not be negative: {getattr(self, name)}")
        from connectors.delta import WRITERS

        if self.writer not in WRITERS:
            raise InputError(f"writer must be one of {', '.join(WRITERS)}: {self.writer}")
        if self.catalog_schema and not _SCHEMA_NAME.fullmatch(self.catalog_schema):
            raise InputError(
                f"catalog schema must be NAME or CATALOG.NAME (letters, digits, _): {self.catalog_schema}"
            )
        return self


_KNOWN = {field.name: field.type for field in fields(JobConfig)}


def _flatten(document: dict[str, Any], source: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for section in ("broker", "job"):
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


def load_config(conf_file: str | None, overrides: dict[str, Any]) -> JobConfig:
    """Defaults from conf/default.toml, then ``conf_file``, then non-None ``overrides``."""
    config = JobConfig()
    sources = [DEFAULT_CONF] if DEFAULT_CONF.exists() else []
    if conf_file is not None:
        if not Path(conf_file).is_file():
            raise InputError(f"{conf_file}: configuration file not found")
        sources.append(Path(conf_file))
    for source in sources:
        try:
            document = tomllib.loads(source.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{source}: not a TOML file ({exc})") from None
        config = replace(config, **_flatten(document, str(source)))
    config = replace(
        config, **{key: value for key, value in overrides.items() if value is not None}
    )
    return config.validated()
