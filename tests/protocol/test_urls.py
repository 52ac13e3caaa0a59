"""Several Mind URLs (DESIGN §16): parsed one way for Hands and clients, and gone round so that a
node that refuses costs one quick hop, and all nodes refusing costs a backoff, not a busy loop."""

from __future__ import annotations

import pytest

from protocol.urls import Rotation, split_urls


def test_urls_come_from_repeated_flags_and_comma_lists_each_once_in_order():
    assert split_urls("ws://a:1, ws://b:2,,") == ["ws://a:1", "ws://b:2"]
    assert split_urls(["ws://a:1", "ws://b:2,ws://a:1", " ws://c:3 "]) == ["ws://a:1", "ws://b:2", "ws://c:3"]
    assert split_urls("") == []


def test_a_rotation_stays_on_a_working_node_and_moves_on_at_a_refusal():
    r = Rotation(["a", "b", "c"], start=1)
    assert r.current == "b"
    r.worked()
    assert r.current == "b"  # stays while it works
    assert r.failed() is True and r.current == "c"  # dial c at once
    assert r.failed() is True and r.current == "a"  # and a
    assert r.failed() is False and r.current == "b"  # every node refused: back off, then a new round
    assert r.failed() is True and r.current == "c"
    r.worked()
    assert r.failed() is True and r.failed() is True and r.failed() is False


def test_one_url_backs_off_at_every_refusal():
    r = Rotation(["a"])
    assert r.failed() is False and r.current == "a"


def test_starts_spread_over_the_nodes():
    starts = {Rotation(["a", "b", "c", "d"]).current for _ in range(200)}
    assert starts == {"a", "b", "c", "d"}


def test_no_url_is_a_clear_error():
    with pytest.raises(ValueError, match="no Mind URL"):
        Rotation([])
