"""`protocol.units`: the one parser of durations and sizes for the CLI and both daemons' config."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.units import parse_duration, parse_size, positive_duration, positive_size


def test_what_people_type() -> None:
    assert [parse_duration(t) for t in ("90s", "30m", "2h", "7d", "15", "1.5h", " 2H ")] == [
        90,
        1800,
        7200,
        604800,
        15,
        5400,
        7200,
    ]
    assert [parse_size(t) for t in ("65536", "512K", "64M", "1G", "2k", "64MiB", "1GB")] == [
        65536,
        512 << 10,
        64 << 20,
        1 << 30,
        2048,
        64 << 20,
        1 << 30,
    ]


@pytest.mark.parametrize("bad", ["", "7w", "-1s", "soon", "1e3", "s"])
def test_bad_durations_say_what_to_type(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(bad)


@pytest.mark.parametrize("bad", ["", "1.5M", "-1", "12X", "M"])
def test_bad_sizes_say_what_to_type(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(bad)


def test_zero_is_a_value_but_not_a_positive_one() -> None:
    assert parse_duration("0s") == 0 and parse_size("0") == 0
    with pytest.raises(ValueError, match="more than 0"):
        positive_duration("0")
    with pytest.raises(ValueError, match="more than 0"):
        positive_size("0K")


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "K", "M", "G", "k", "KiB", "MB"]))
def test_sizes_round_trip(n: int, unit: str) -> None:
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit[:1].lower()]
    assert parse_size(f"{n}{unit}") == n * mult


@given(st.text(max_size=12))
def test_any_text_is_a_duration_or_a_value_error(text: str) -> None:
    try:
        assert parse_duration(text) >= 0
    except ValueError:
        pass
