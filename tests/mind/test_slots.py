"""The handshake slot table (mind/core/slots.py): the silent are evicted, oldest first, and nobody
is refused for sharing an address (issue 23, must-hold 4)."""

from __future__ import annotations

from mind.core.slots import HandshakeSlots


def test_an_address_full_of_silent_slots_gives_up_its_oldest_to_a_newcomer():
    t = HandshakeSlots(total=64, per_address=8)
    for k in range(8):
        assert t.admit(k, "a") == []
    assert t.admit(100, "a") == [0], "the oldest silent slot makes room; the newcomer is not refused"
    assert t.admit(101, "a") == [1]
    assert t.silent("a") == 8 and t.is_silent(100)


def test_attack_7_renewed_silent_connections_never_keep_a_speaker_out():
    t = HandshakeSlots(total=64, per_address=8)
    key = 0
    for k in range(8):
        t.admit(k, "a")
    for round_ in range(20):
        # the admin connects and speaks at once; the stranger renews its silent eight meanwhile
        admin = 10_000 + round_
        t.admit(admin, "a")
        t.spoke(admin)
        for _ in range(8):
            key += 1
            evicted = t.admit(100 + key, "a")
            assert admin not in evicted
        assert not t.is_silent(admin) and admin in t._addr
        t.done(admin)


def test_speakers_do_not_count_against_their_address_quota():
    t = HandshakeSlots(total=1000, per_address=8)
    for k in range(500):  # a reconnect storm from one NAT: every peer speaks at once
        assert t.admit(k, "nat") == []
        t.spoke(k)
    assert t.speaking("nat") == 500 and t.silent("nat") == 0


def test_a_full_table_evicts_the_silent_before_any_speaker():
    t = HandshakeSlots(total=4, per_address=8)
    t.admit(1, "a")
    t.spoke(1)
    t.admit(2, "b")
    t.admit(3, "b")
    t.admit(4, "c")
    assert t.admit(5, "d") == [2], "the oldest silent slot of the address with the most silent ones"
    t.spoke(3)
    t.spoke(4)
    t.spoke(5)
    assert t.admit(6, "e") == [1], "nobody silent: the oldest speaker of the busiest address"
    assert len(t) == 4


def test_done_is_idempotent_and_forgets_empty_addresses():
    t = HandshakeSlots(total=4, per_address=2)
    t.admit(1, "a")
    t.spoke(1)
    t.done(1)
    t.done(1)
    t.spoke(1)
    assert len(t) == 0 and t.held("a") == 0 and t._silent == {} and t._speaking == {}


def test_a_quota_above_the_table_is_the_table():
    t = HandshakeSlots(total=2, per_address=8)
    t.admit(1, "a")
    t.admit(2, "a")
    assert t.admit(3, "a") == [1]
