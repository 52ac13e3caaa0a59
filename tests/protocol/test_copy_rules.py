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


def test_a_downloads_part_name_is_unpredictable_and_still_a_part_of_its_copy():
    cid = rules.copy_id("h", "p", 1, "x")
    name = rules.private_part_name(cid, "0123456789abcdef")
    assert name == f".mindhand-cp.{cid}.0123456789abcdef.part"
    assert rules.is_part_name(name) and rules.part_copy_id(name) == cid
    assert rules.part_copy_id(rules.part_name(cid)) == cid
    assert rules.part_copy_id(f".mindhand-cp.{cid}.../x.part") is None
    with pytest.raises(ValueError):
        rules.private_part_name(cid, "../x")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e300, -1e300])
def test_an_impossible_mtime_is_refused(bad):
    with pytest.raises(ValueError, match="mtime"):
        rules.check_mtime(bad)
    assert rules.check_mtime(1_600_000_000.5) == 1_600_000_000.5 and rules.check_mtime(-5.0) == -5.0


def _e(path, kind="file", **kw):
    return {"path": path, "type": kind, "mode": 0o644, "size": 0, "mtime": 1.0, **kw}


def test_a_tree_plan_makes_dirs_then_files_then_links():
    plan = rules.plan_tree([_e("a", "dir"), _e("a/l", "symlink", target="f"), _e("a/f"), _e("a/b", "dir"), _e("z")])
    assert [e["path"] for e in plan.dirs] == ["a", "a/b"]
    assert [e["path"] for e in plan.files] == ["a/f", "z"]
    assert [e["path"] for e in plan.links] == ["a/l"]
    assert plan.refused == []


def test_a_hostile_listing_is_refused_entry_by_entry():
    """Issue 23, attack 1: a Hand listing `esc` as a link then `esc/x` as a file; a name twice (a
    link and a directory that reach the wire as the same U+FFFD string); paths that climb."""
    plan = rules.plan_tree(
        [
            _e("esc", "symlink", target="/home/victim"),
            _e("esc/x"),  # through the link: its parent is not a directory of this copy
            _e("\ufffd", "symlink", target="d", lossy=True),  # a non-UTF-8 name, as the Hand sent it
            _e("\ufffd", "dir"),
            _e("\ufffd/inside"),
            _e("d", "dir"),
            _e("d", "symlink", target="."),  # the same name again
            _e("../up"),
            _e("/abs"),
            _e("a//b"),
            _e("./c"),
            _e("nul\x00"),
            _e("fifo", "fifo"),
            _e("missing-parent/f"),
            {"type": "file"},
        ]
    )
    assert [e["path"] for e in plan.dirs] == ["\ufffd", "d"]
    assert [e["path"] for e in plan.files] == ["\ufffd/inside"]
    assert [e["path"] for e in plan.links] == ["esc"]  # judged on the real tree when it is made
    why = dict(plan.refused)
    assert len(why) == len(plan.refused) == 11
    assert "parent is not a directory" in why["esc/x"] and "parent is not a directory" in why["missing-parent/f"]
    assert "collides" in why["d"] and "not UTF-8" in why["\ufffd"]
    for bad in ("../up", "/abs", "a//b", "./c", "nul\x00"):
        assert "outside the tree" in why[bad], bad
    assert "special file" in why["fifo"] and "without a path" in why["None"]


def test_staleness():
    assert rules.is_stale(0, rules.STALE_PART_S + 1) and not rules.is_stale(100, 200)
