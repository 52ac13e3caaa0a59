"""The pure rules of `mind cp` (protocol/copy.py): identities, part names, the resume point, modes,
which symlinks a copied tree may keep."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import copy as rules


def test_copy_id_is_deterministic_and_depends_on_every_part():
    a = rules.copy_id("box", "dir/f", 10, "ab" * 32)
    assert a == rules.copy_id("box", "dir/f", 10, "ab" * 32)
    assert rules.COPY_ID_RE.match(a)
    others = {
        rules.copy_id("box2", "dir/f", 10, "ab" * 32),
        rules.copy_id("box", "dir/g", 10, "ab" * 32),
        rules.copy_id("box", "dir/f", 11, "ab" * 32),
        rules.copy_id("box", "dir/f", 10, "cd" * 32),
    }
    assert a not in others and len(others) == 4


def test_part_names_round_trip_and_refuse_anything_else():
    cid = rules.copy_id("h", "p", 1, "x")
    name = rules.part_name(cid)
    assert name.startswith(".mindhand-cp.") and rules.is_part_name(name)
    assert not rules.is_part_name("file.part") and not rules.is_part_name(".mindhand-cp.zz.part")
    with pytest.raises(ValueError):
        rules.part_name("../../etc/passwd")


@pytest.mark.parametrize(
    ("held", "asked", "size", "want"),
    [(None, 0, 10, 0), (5, 0, 10, 0), (5, 5, 10, 5), (9, 5, 10, 5), (10, 10, 10, 10)],
)
def test_the_resume_point_is_the_senders_offset_when_the_receiver_holds_it(held, asked, size, want):
    assert rules.resume_point(held, asked, size) == want


@pytest.mark.parametrize(("held", "asked", "size"), [(None, 3, 10), (2, 3, 10), (5, 11, 10), (5, -1, 10)])
def test_a_stale_or_impossible_resume_point_is_refused(held, asked, size):
    with pytest.raises(ValueError):
        rules.resume_point(held, asked, size)


@given(st.one_of(st.none(), st.integers(0, 1 << 40)), st.integers(0, 1 << 40))
def test_the_sender_never_starts_past_the_end_and_its_offset_is_accepted(held, size):
    off = rules.sender_offset(held, size)
    assert 0 <= off <= size
    if held is not None and held <= size:
        assert rules.resume_point(held, off, size) == off


def test_modes_never_carry_setuid_setgid_or_sticky():
    assert rules.safe_mode(0o106755) == 0o755
    assert rules.safe_mode(0o1777) == 0o777
    assert rules.safe_mode(0o2750) == 0o750


@pytest.mark.parametrize(
    ("link", "target", "inside"),
    [
        ("a", "b", True),
        ("d/a", "../b", True),
        ("d/e/a", "../../b", True),
        ("a", "../b", False),
        ("d/a", "../../b", False),
        ("d/a", "x/../../..", False),
        ("a", "/etc/passwd", False),
        ("a", "", False),
        ("a", "./x/./y", True),
    ],
)
def test_a_link_stays_inside_the_tree_only_lexically_below_its_top(link, target, inside):
    assert rules.link_stays_inside(link, target) is inside


def test_staleness():
    assert rules.is_stale(0, rules.STALE_PART_S + 1) and not rules.is_stale(100, 200)
