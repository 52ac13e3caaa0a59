"""`protocol.io.tree`: directories entered through handles, never through a link, and a symlink's
target judged on the real tree (issue 23, attacks 1 and 2), on real directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from protocol.io import tree

DEEP = [f"d{i}" for i in range(1, 31)]


def _fd(p: Path) -> int:
    return os.open(p, os.O_RDONLY | os.O_DIRECTORY)


def judge(top: Path, where: str, target: str) -> bool:
    ceiling, start = _fd(top), _fd(top / where)
    try:
        return tree.target_stays_inside(ceiling, start, target)
    finally:
        os.close(ceiling), os.close(start)


@pytest.fixture
def top(tmp_path: Path) -> Path:
    t = tmp_path / "top"
    (t / "/".join(["z", *DEEP])).mkdir(parents=True)
    (t / "a" / "b").mkdir(parents=True)
    (t / "file").write_bytes(b"")
    return t


@pytest.mark.parametrize(
    ("where", "target", "inside"),
    [
        (".", "a/b", True),
        ("a/b", "../../file", True),
        ("a/b", "../../..", False),
        (".", "..", False),
        (".", "/etc", False),
        (".", "", False),
        (".", "missing/deeper", True),  # wherever it is made, below the top
        (".", "missing/../..", False),  # a climb after a missing name: its meaning could change
        (".", "file/../..", False),
        ("a", "./../a/./b/", True),
    ],
)
def test_targets_are_judged_from_where_the_link_is(top, where, target, inside):
    assert judge(top, where, target) is inside


def test_a_lexically_inside_target_through_a_link_of_the_tree_is_outside(top):
    """Attack 1: `esc -> z/d1/.../d30/up/../../victim` with `up -> ../..(31)`: by its text it stays
    four levels below the top; on the real tree it is two levels above it."""
    deep = top / "z" / "/".join(DEEP)
    esc = "/".join(["z", *DEEP, "up", "..", "..", "victim"])
    assert judge(top, ".", esc) is False  # before `up` exists: a climb after a missing name
    os.symlink("/".join([".."] * 31), deep / "up")
    assert judge(top, ".", esc) is False
    assert os.path.realpath(top / esc) == str(top.parent.parent / "victim")  # where it really leads
    assert judge(top, ".", "z/" + "/".join(DEEP) + "/up/a") is True  # through a link, descending


def test_links_in_the_tree_are_expanded_by_their_own_rules(top):
    os.symlink("../a", top / "z" / "up1")  # -> top/a
    assert judge(top, "z", "up1/b") is True
    assert judge(top, "z", "up1/..") is False  # `..` after a link of the same text
    os.symlink("/etc", top / "abs")
    assert judge(top, ".", "abs/passwd") is False
    os.symlink("loop", top / "loop")
    assert judge(top, ".", "loop/x") is False


def test_walk_dirs_and_make_dir_never_follow_a_link(top, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, top / "a" / "door")
    t = _fd(top)
    try:
        with pytest.raises(OSError):
            tree.walk_dirs(t, ["a", "door"])
        a = tree.walk_dirs(t, ["a"])
        with pytest.raises(OSError):
            tree.make_dir(a, "door", 0o777)
        fd, created = tree.make_dir(a, "new", 0o700)
        os.close(fd)
        fd, again = tree.make_dir(a, "new", 0o700)
        os.close(fd), os.close(a)
        assert created and not again and (top / "a" / "new").is_dir()
    finally:
        os.close(t)
    assert os.listdir(outside) == []
