"""The as-of time T before Spark starts (spec section 1): ``parse_as_of``'s refusals of a
negative instant and of epoch seconds, the check against a store's oldest record, and what
``--as-of auto`` chooses. No Spark: stores are small hand-made ones, probed on the driver."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from connectors.errors import InputError
from connectors.rocketmq.probe import StoreTimes
from connectors.rocketmq.reader import StoreSpec
from jobs.cli import build_parser, config_overrides, request_from, settled
from jobs.config import load_config
from jobs.extract import (
    EXPORT_CHOICE,
    AsOfChoice,
    age_text,
    check_after_oldest,
    choose_as_of,
    instant_text,
    parse_as_of,
    settle_as_of,
)
from tests.robustness.corpus import truncated_mid_record
from tests.robustness.store import LOG0, T, base_rows, write
from transforms.staleness import stale_after_ms

CONFIG = load_config(None, {})
LIMIT = stale_after_ms(CONFIG.check_interval_ms, CONFIG.transaction_timeout_ms)
DAY = 86_400_000


def _refusal(text: str) -> str:
    with pytest.raises(InputError) as caught:
        parse_as_of(text)
    return str(caught.value)


def test_the_default_is_auto_and_the_words_stay_symbolic() -> None:
    assert CONFIG.as_of == "auto"
    assert [parse_as_of(word) for word in ("auto", "now", "latest")] == ["auto", "now", "latest"]
    assert parse_as_of("1749999999000") == 1_749_999_999_000
    assert parse_as_of("2025-06-15T15:06:39Z") == 1_749_999_999_000
    assert parse_as_of("1973-03-03T09:46:40Z") == 100_000_000_000  # an ISO instant is explicit


def test_epoch_seconds_are_read_back_as_a_date_with_the_fix() -> None:
    assert _refusal("1749999999") == (
        "--as-of 1749999999 looks like epoch seconds: 1749999999 ms is"
        " 1970-01-21T06:06:39.999Z; as seconds it is 2025-06-15T15:06:39Z:"
        " give --as-of 1749999999000"
    )
    assert "looks like epoch seconds" in _refusal("99999999999")  # 1973-03-03 minus 1 ms
    assert parse_as_of("100000000000") == 100_000_000_000
    # too small to be seconds of any store either
    assert "1970-01-01T00:00:00.005Z, before any store" in _refusal("5")


def test_a_negative_instant_is_refused() -> None:
    message = _refusal("-5")
    assert message.startswith("--as-of -5 is negative (1969-12-31T23:59:59.995Z, before 1970)")
    assert "give auto, now, latest" in message
    assert "before 1970" in _refusal("1969-12-31T23:59:59Z")


def test_micro_and_nanoseconds_are_read_back_too() -> None:
    assert _refusal("1749999999000000").endswith(
        "as microseconds it is 2025-06-15T15:06:39Z: give --as-of 1749999999000"
    )
    assert _refusal("1749999999000000000").endswith(
        "as nanoseconds it is 2025-06-15T15:06:39Z: give --as-of 1749999999000"
    )


def test_instants_and_ages_as_text() -> None:
    assert instant_text(1_749_999_999_000) == "2025-06-15T15:06:39Z"
    assert instant_text(1_749_999_999_662) == "2025-06-15T15:06:39.662Z"
    assert instant_text(-5) == "1969-12-31T23:59:59.995Z"
    assert [age_text(ms) for ms in (850, 12_000, 90_000, 300_000, 3 * 3_600_000, 531 * DAY)] == [
        "850 ms",
        "12 s",
        "90 s",
        "5 min",
        "3 h",
        "531 d",
    ]


def _times(newest_ms: int | None, oldest_ms: int | None = None) -> StoreTimes:
    return StoreTimes(oldest_ms if oldest_ms is not None else newest_ms, newest_ms)


def test_auto_is_now_for_a_live_store_and_latest_for_a_copied_one() -> None:
    now = T + 531 * DAY
    live = choose_as_of({"broker-a": _times(now - 12_000)}, now, LIMIT)
    assert live == AsOfChoice(
        "now", "broker broker-a's newest half/op record is 12 s old: the store looks live"
    )
    copied = choose_as_of({"broker-a": _times(T)}, now, LIMIT)
    assert copied.mode == "latest"
    assert copied.line == (
        "as-of auto: latest (broker broker-a's newest half/op record is 531 d old, a live"
        " broker's is at most 90 s old: the store looks copied)"
    )
    # the limit is the stale-store warning's: at it, live; 1 ms past it, copied
    assert choose_as_of({"a": _times(now - LIMIT)}, now, LIMIT).mode == "now"
    assert choose_as_of({"a": _times(now - LIMIT - 1)}, now, LIMIT).mode == "latest"
    ahead = choose_as_of({"a": _times(now + 5_000)}, now, LIMIT)
    assert ahead.mode == "now" and "5 s ahead of this clock" in ahead.reason


def test_auto_over_several_stores_is_latest_when_any_looks_copied() -> None:
    now = T + DAY
    choice = choose_as_of(
        {"live": _times(now - 1_000), "old": _times(T), "older": _times(T - DAY)}, now, LIMIT
    )
    assert choice.mode == "latest"
    assert choice.reason.startswith("broker older's newest half/op record is 2 d old")
    assert choice.reason.endswith("the store looks copied; 1 more broker(s) look copied")
    both_live = choose_as_of({"a": _times(now - 1_000), "b": _times(now - 40_000)}, now, LIMIT)
    assert both_live.mode == "now" and "broker b's" in both_live.reason  # the oldest of them
    unknown = choose_as_of({"a": _times(now - 1_000), "b": StoreTimes(None, None)}, now, LIMIT)
    assert unknown.mode == "latest"
    assert "broker b has no half/op record readable" in unknown.reason


def test_an_instant_not_after_a_stores_oldest_record_is_refused() -> None:
    times = {"a": _times(T, oldest_ms=T - DAY), "b": _times(T, oldest_ms=T - 60_000)}
    check_after_oldest(T - 60_000 + 1, times)
    with pytest.raises(InputError) as caught:
        check_after_oldest(T - 60_000, times)
    message = str(caught.value)
    assert message.startswith(f"--as-of {instant_text(T - 60_000)} ({T - 60_000} ms)")
    assert f"oldest half/op record of broker b ({instant_text(T - 60_000)})" in message
    check_after_oldest(1, {"empty": StoreTimes(None, None)})  # nothing to compare with


def test_settle_probes_the_stores_before_spark(tmp_path: Path) -> None:
    store = tmp_path / "broker-a"
    write(store, base_rows())  # records stored from T - 60 s to T - 50 s: a copy by now
    specs = [StoreSpec("broker-a", store)]
    mode, choice = settle_as_of("auto", specs, CONFIG)
    assert mode == "latest" and choice is not None and "looks copied" in choice.reason
    assert settle_as_of("now", specs, CONFIG) == ("now", None)
    assert settle_as_of("latest", specs, CONFIG) == ("latest", None)
    assert settle_as_of(T, specs, CONFIG) == (T, None)
    with pytest.raises(InputError, match="not after the oldest half/op record of broker broker-a"):
        settle_as_of(T - 60_000, specs, CONFIG)
    # exported segments: auto is latest, an instant cannot be checked before the read
    assert settle_as_of("auto", [], CONFIG) == ("latest", EXPORT_CHOICE)
    assert settle_as_of(1, [], CONFIG) == (1, None)


def test_a_store_written_just_now_looks_live(tmp_path: Path) -> None:
    store = tmp_path / "live"
    now = int(time.time() * 1000)
    rows = [
        {**row, "born_timestamp_ms": now - 5_001 + i, "store_timestamp_ms": now - 5_000 + i}
        for i, row in enumerate(base_rows())
    ]
    write(store, rows)
    mode, choice = settle_as_of("auto", [StoreSpec("live", store)], CONFIG)
    assert mode == "now" and choice is not None and "the store looks live" in choice.reason
    os.truncate(store / LOG0, 0)  # nothing readable: latest, saying why
    mode, choice = settle_as_of("auto", [StoreSpec("live", store)], CONFIG)
    assert mode == "latest" and choice is not None and "no half/op record" in choice.reason


def test_the_command_line_request_carries_the_choice(tmp_path: Path) -> None:
    store = tmp_path / "broker-a"
    write(store, base_rows())
    args = build_parser().parse_args(["--store", str(store), "--output", str(tmp_path / "out")])
    config = load_config(None, config_overrides(args))
    request = settled(request_from(args, config), config)
    assert request.as_of == "latest"
    assert request.as_of_choice is not None
    assert request.as_of_choice.line.startswith("as-of auto: latest (broker broker-a's newest")
    explicit = build_parser().parse_args(
        ["--store", str(store), "--output", str(tmp_path / "out"), "--as-of", "now"]
    )
    config = load_config(None, config_overrides(explicit))
    request = settled(request_from(explicit, config), config)
    assert (request.as_of, request.as_of_choice) == ("now", None)


def test_latest_over_a_damaged_tail_says_t_may_be_early(tmp_path: Path) -> None:
    store = tmp_path / "broker-a"
    truncated_mid_record(store)  # the last half record cut in half: one entry unreadable
    specs = [StoreSpec("broker-a", store)]

    mode, latest = settle_as_of("latest", specs, CONFIG)
    _, auto = settle_as_of("auto", specs, CONFIG)

    tail = "broker broker-a's last 1 consume-queue entries point at no readable record"
    assert mode == "latest" and latest is not None and latest.warns
    assert latest.line.startswith(f"as-of latest: latest ({tail}")
    assert auto is not None and auto.warns and "looks copied" in auto.reason and tail in auto.reason
    assert settle_as_of("now", specs, CONFIG) == ("now", None)
