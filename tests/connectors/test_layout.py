"""The store layout's rules (connectors/rocketmq/layout.py), which the decoder, the writer
and the simulator share: record sizes and the end-of-file rule."""

from __future__ import annotations

import numpy as np

from connectors.rocketmq import layout


def test_place_records_follows_the_end_of_file_rule():
    offsets, end = layout.place_records(np.array([40, 40, 40]), 0, 100)
    # 40 + 8 <= 100 -> 0; 40 + 8 <= 60 -> 40; 40 + 8 > 20 -> next file at 100
    assert offsets.tolist() == [0, 40, 100] and end == 140
    offsets, end = layout.place_records(np.array([52, 40]), 0, 100)
    assert offsets.tolist() == [0, 52] and end == 92  # 52 + 40 + 8 == 100: fits exactly
    offsets, end = layout.place_records(np.array([52, 41]), 0, 100)
    assert offsets.tolist() == [0, 100] and end == 141


def test_place_records_continues_from_a_position_in_a_later_file():
    offsets, end = layout.place_records(np.array([30, 30]), 150, 100)
    # 30 + 8 <= 50 left in the second file -> 150; 30 + 8 > 20 left -> the third file at 200
    assert offsets.tolist() == [150, 200] and end == 230


def test_a_record_too_large_for_any_file_is_refused():
    try:
        layout.place_records(np.array([93]), 0, 100)
    except ValueError as exc:
        assert "93 bytes" in str(exc)
    else:
        raise AssertionError("a 93-byte record was placed in a 100-byte file")


def test_fits_in_file_keeps_eight_bytes_free():
    assert layout.fits_in_file(92, 100)
    assert not layout.fits_in_file(93, 100)


def test_record_sizes_count_hosts_topic_width_and_variable_parts():
    v4 = layout.record_sizes(
        np.array([0]), np.array([0]), np.array([0]), np.array([0]), np.array([1])
    )
    assert v4.tolist() == [layout.MIN_RECORD_SIZE]
    both_v6_v2 = layout.record_sizes(
        np.array([layout.BORNHOST_V6_FLAG | layout.STOREHOST_V6_FLAG]),
        np.array([5]),
        np.array([7]),
        np.array([11]),
        np.array([2]),
    )
    assert both_v6_v2.tolist() == [layout.MIN_RECORD_SIZE + 12 + 12 + 1 + 5 + 7 + 11]
