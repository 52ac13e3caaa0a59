"""`mind.client.localfs`: the local end of a download, on real directories (issue 23, attacks 1, 8)."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import pytest

from mind.client import localfs
from protocol import copy as rules

CID = "a" * 32


def test_a_tree_is_never_built_through_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    top = tmp_path / "top"
    with localfs.LocalTree(str(top)) as t:
        t.make_dir(["d"])
        os.symlink(outside, top / "door")
        with pytest.raises(localfs.LocalRefused, match="never written through"):
            t.make_dir(["door"])
        with pytest.raises(localfs.LocalRefused, match="never written through"):
            t.dir_handle(["door"])
        with pytest.raises(localfs.LocalRefused, match="leads outside"):
            t.make_link(["d", "l"], "../..")
        t.make_link(["d", "l"], "../d")
        t.make_link(["d", "l"], "..")  # an existing link of the copy is replaced
        with pytest.raises(localfs.LocalRefused, match="not a symlink"):
            t.make_link(["d"], ".")
        t.set_mode_time(["d"], 0o4711, 1_600_000_000.0)
        with pytest.raises(localfs.LocalRefused, match="mtime"):
            t.set_mode_time(["d"], None, float("nan"))
    assert os.readlink(top / "d" / "l") == ".."
    assert stat.S_IMODE((top / "d").stat().st_mode) == 0o711 and (top / "d").stat().st_mtime == 1_600_000_000.0
    assert os.listdir(outside) == []


def test_the_top_may_be_the_operators_link_to_a_directory_but_not_a_dangling_one(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "mine")
    with localfs.LocalTree(str(tmp_path / "mine")) as t:
        t.make_dir(["x"])
    assert (tmp_path / "real" / "x").is_dir()
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    with pytest.raises(localfs.LocalRefused, match="leads nowhere"):
        localfs.LocalTree(str(tmp_path / "dangling"))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(localfs.LocalRefused, match="not a directory"):
        localfs.LocalTree(str(tmp_path / "file"))


def _part(d: Path, name: str = "f") -> localfs.LocalPart:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return localfs.LocalPart(fd, name, str(d / name), CID)
    finally:
        os.close(fd)


def test_a_part_is_private_unpredictable_and_never_a_planted_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"theirs")
    os.symlink(victim, tmp_path / rules.part_name(CID))  # the old, predictable name
    os.symlink(victim, tmp_path / rules.private_part_name(CID, "0" * 16))  # a guess at the new one
    old = tmp_path / rules.private_part_name("b" * 32, "1" * 16)
    old.write_bytes(b"stale")
    os.utime(old, (time.time() - rules.STALE_PART_S - 1,) * 2)
    p = _part(tmp_path)
    assert p.open(resume=True) == 0  # neither planted link is continued
    name = p.part
    assert stat.S_IMODE(os.lstat(tmp_path / name).st_mode) == 0o600 and not old.exists()
    p.write(b"hello")
    p.close()  # interrupted: kept for a resume
    q = _part(tmp_path)
    assert q.open(resume=True) == 5 and q.part == name
    q.write(b" world")
    assert q.finish(11, hashlib.sha256(b"hello world").hexdigest(), 0o640, None)
    q.close()
    assert (tmp_path / "f").read_bytes() == b"hello world" and stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o640
    assert victim.read_bytes() == b"theirs"
    r = _part(tmp_path)
    r.open(resume=False)
    r.write(b"x")
    assert not r.finish(1, "0" * 64, 0o644, None)  # not verified: dropped
    r.close()
    assert sorted(n for n in os.listdir(tmp_path) if rules.is_part_name(n)) == sorted(
        [rules.part_name(CID), rules.private_part_name(CID, "0" * 16)]
    )
