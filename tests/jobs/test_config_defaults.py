"""Defaults have one source, conf/default.toml: the job's settings and the round's parameters
come from it, and a packaged file without a setting is one clear error (no silent fallback)."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

import jobs.config
from connectors.errors import InputError
from jobs.config import JobConfig, load_config
from tests.transforms.builders import params

DEFAULTS = Path(__file__).resolve().parents[2] / "conf" / "default.toml"


def _toml_values() -> dict:
    document = tomllib.loads(DEFAULTS.read_text(encoding="utf-8"))
    return {**document["broker"], **document["job"], **document["anomalies"]}


def test_every_setting_takes_its_default_from_the_packaged_file() -> None:
    config = load_config(None, {})
    assert {f.name: getattr(config, f.name) for f in fields(JobConfig)} == _toml_values()


def test_the_round_parameters_of_the_tests_are_the_packaged_defaults() -> None:
    values = _toml_values()
    round_params = params()
    for name in ("check_max", "transaction_timeout_ms", "file_reserved_hours"):
        assert getattr(round_params, name) == values[name]
    assert round_params.check_interval_ms == values["check_interval_ms"]
    assert round_params.broker_version == values["broker_version"]
    for name in document_section("anomalies"):
        assert getattr(round_params, name) == values[name]


def document_section(section: str) -> dict:
    return tomllib.loads(DEFAULTS.read_text(encoding="utf-8"))[section]


def test_anomaly_thresholds_are_validated() -> None:
    for bad in ({"stalled_offset_runs": 1}, {"slow_producer_percent": 101}, {"fail_on": "info"}):
        with pytest.raises(InputError):
            load_config(None, bad)


def test_a_packaged_file_without_a_setting_is_one_error(monkeypatch) -> None:
    text = DEFAULTS.read_text(encoding="utf-8")
    without = "\n".join(line for line in text.splitlines() if not line.startswith("check_max"))
    monkeypatch.setattr(jobs.config, "_packaged_defaults", lambda: without.encode())

    with pytest.raises(InputError, match="no value for check_max"):
        load_config(None, {})


def test_an_unreadable_packaged_file_is_one_error(monkeypatch) -> None:
    monkeypatch.setattr(jobs.config, "_packaged_defaults", lambda: None)

    with pytest.raises(InputError, match="packaged defaults cannot be read"):
        load_config(None, {})
