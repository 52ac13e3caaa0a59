"""Issue 23, attack 5: a listing is bounded while it is built. 250 nested directories of 250
characters each with 19,000 files at the bottom once cost the Hand 3.5 GiB and blocked its loop
5-9 s, then failed as "too large to send". Now the walk stops at the first path no file tool could
take (over 4,096 bytes), having held almost nothing, and says so; and a listing heavier than its
byte bound is refused the same way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mind.testing.cluster import running

pytestmark = pytest.mark.slow  # a real Mind and Hand, the `mind` CLI


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def deep_tree(top: Path, depth: int, width: int, files: int) -> None:
    """`depth` nested directories named with `width` characters each, `files` files at the bottom,
    made through directory handles (the whole path is far over PATH_MAX)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(depth):
            name = f"{i:03d}".ljust(width, "d")
            os.mkdir(name, dir_fd=fd)
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        for i in range(files):
            os.close(os.open(f"f{i:05d}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def test_attack_5_a_deep_tree_of_long_names_is_refused_early_and_cheaply(tmp_path):
    with running(tmp_path) as c:
        deep_tree(c.tmp / "root-box" / "deep", depth=250, width=250, files=19_000)
        hand = c.hands["box"]
        before = peak_rss_kib(hand.pid)
        r = c.cli("call", "--hand", "box", "list_tree", "path=deep")
        assert r.returncode != 0
        assert b"longer than 4096 bytes" in r.stderr + r.stdout and b"Traceback" not in r.stderr
        dest = tmp_path / "here"
        dest.mkdir()
        r = c.cli("cp", "-r", "box:deep", str(dest))
        assert r.returncode == 1 and b"longer than 4096 bytes" in r.stderr, r.stderr
        assert os.listdir(dest) == []  # nothing half-made
        assert peak_rss_kib(hand.pid) - before < 64 << 10  # was +3.5 GiB
        r = c.cli("exec", "--hand", "box", "--", "true")  # and the Hand still serves
        assert r.returncode == 0, r.stderr


def test_a_listing_over_its_byte_bound_is_refused_with_what_bounded_it(tmp_path):
    """20,000 entries is the count bound; 9,000 files of 240-character names in 3 directories of
    240 characters weigh ~4.4 MiB as a listing: over the byte bound, under the count."""
    with running(tmp_path) as c:
        top = c.tmp / "root-box" / "heavy"
        for d in range(3):
            sub = top / f"{d}".ljust(240, "d")
            sub.mkdir(parents=True)
            for i in range(3000):
                (sub / f"{i:05d}".ljust(240, "f")).touch()
        r = c.cli("call", "--hand", "box", "list_tree", "path=heavy")
        assert r.returncode != 0 and b"the listing is over 4 MiB" in r.stderr + r.stdout, r.stderr
