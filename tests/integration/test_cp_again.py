"""`mind cp` run again with the same command line (real processes: a Mind, a Hand, the `mind` CLI).

The second run of the same command must land on what the first made and send nothing unchanged:
rsync's rule for a directory source (`tree/` is its contents, into the destination itself; `tree`
into an existing directory is `DEST/tree`), a single file skipped with `-p` (size and time) or
`-c` (sha256) and said as skipped, for uploads and downloads alike. And a copy that succeeds
leaves no failed run behind: its probes of a destination not made yet answer "nothing there"."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from mind.testing.cluster import running
from protocol.copy import is_part_name

pytestmark = pytest.mark.slow  # a real Mind, a real Hand, the `mind` CLI

FILES = 24


def make_tree(top: Path, files: int = FILES) -> dict[str, bytes]:
    """`files` random files in three directories and at the top; {relative path: bytes}."""
    out: dict[str, bytes] = {}
    for i in range(files):
        rel = f"d{i % 3}/f{i:03d}.bin" if i % 4 else f"top{i:03d}.bin"
        data = os.urandom(1000 + 37 * i)
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(data)
        out[rel] = data
    return out


def tree_of(top: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for here, _, names in os.walk(top):
        for n in names:
            p = Path(here) / n
            out[str(p.relative_to(top))] = p.read_bytes()
    return out


def summary(stdout: bytes) -> dict:
    [line] = [json.loads(x) for x in stdout.decode().splitlines() if x.strip()]
    return line


def total(files: dict[str, bytes]) -> int:
    return sum(len(b) for b in files.values())


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("cpagain")) as cl:
        yield cl


@pytest.fixture
def root(c) -> Path:
    return c.tmp / "root-box"


def _twice(c, *args: str) -> tuple[dict, dict, bytes]:
    """The same command line run twice: both --json summaries, and the second run's stderr."""
    first = c.cli("cp", "--json", *args, timeout=120)
    assert first.returncode == 0, first.stderr
    again = c.cli("cp", "--json", *args, timeout=120)
    assert again.returncode == 0, again.stderr
    return summary(first.stdout), summary(again.stdout), again.stderr


# --- a tree, the same command line twice ------------------------------------------------------


def test_a_tree_down_with_a_trailing_slash_is_copied_into_the_destination_itself_every_time(c, root, tmp_path):
    files = make_tree(root / "tree")
    back = tmp_path / "tree.back"
    first, again, err = _twice(c, "-r", "-p", "box:tree/", str(back))
    assert (first["sent"], first["skipped"], first["files"]) == (FILES, 0, FILES)
    assert first["bytes"] > total(files)  # every byte came (and the entries' framing)
    assert (again["sent"], again["skipped"], again["bytes"], again["failed"]) == (0, FILES, 0, 0), again
    assert f"0 files sent, {FILES} skipped (unchanged)".encode() in err, err
    assert tree_of(back) == files  # the contents, not tree.back/tree
    assert not (back / "tree").exists() and os.listdir(tmp_path) == ["tree.back"]  # nothing beside it
    assert os.stat(back / "d1/f001.bin").st_mtime == os.stat(root / "tree/d1/f001.bin").st_mtime


def test_a_tree_down_without_a_slash_into_a_directory_is_dest_slash_name_every_time(c, root, tmp_path):
    files = make_tree(root / "named")
    (tmp_path / "local").mkdir()
    first, again, err = _twice(c, "-r", "-p", "box:named", str(tmp_path / "local"))
    assert (first["sent"], again["sent"], again["skipped"], again["bytes"]) == (FILES, 0, FILES, 0), again
    assert f"0 files sent, {FILES} skipped (unchanged)".encode() in err, err
    assert os.listdir(tmp_path / "local") == ["named"] and tree_of(tmp_path / "local" / "named") == files


def test_the_scp_form_run_twice_nests_and_says_how_to_write_it(c, root, tmp_path):
    """`box:tree DEST` makes DEST the first time (scp's rule) and DEST/tree the second: the second
    run says that `box:tree/` is the form that updates DEST itself."""
    files = make_tree(root / "nest")
    back = tmp_path / "nest.back"
    first, again, err = _twice(c, "-r", "-p", "box:nest", str(back))
    assert tree_of(back / "nest") == files and again["sent"] == FILES  # as cp -r and scp -r do
    assert b"box:nest/" in err and b"already held" in err, err
    r = c.cli("cp", "--json", "-r", "-p", "box:nest/", str(back), timeout=120)
    assert r.returncode == 0 and (summary(r.stdout)["sent"], summary(r.stdout)["skipped"]) == (0, FILES), r.stderr
    assert b"already held" not in r.stderr


def test_a_tree_up_with_a_trailing_slash_is_copied_into_the_destination_itself_every_time(c, root, tmp_path):
    site = tmp_path / "site"
    files = make_tree(site)
    first, again, err = _twice(c, "-r", "-p", f"{site}/", "box:www")
    assert (first["sent"], first["skipped"]) == (FILES, 0)
    assert (again["sent"], again["skipped"], again["bytes"], again["failed"]) == (0, FILES, 0, 0), again
    assert f"0 files sent, {FILES} skipped (unchanged)".encode() in err, err
    assert tree_of(root / "www") == files and not (root / "www" / "site").exists()
    # without the slash, into a directory: www2/site, the same place both times
    first, again, _ = _twice(c, "-r", "-p", str(site), "box:www2/")
    assert (first["sent"], again["sent"], again["skipped"]) == (FILES, 0, FILES), again
    assert os.listdir(root / "www2") == ["site"] and tree_of(root / "www2" / "site") == files
    assert not [n for _, _, fs in os.walk(root) for n in fs if is_part_name(n)]


# --- a single file -----------------------------------------------------------------------------


def test_a_single_unchanged_file_is_skipped_with_p_and_sent_when_it_changed(c, root, tmp_path):
    data = os.urandom(300_000)
    (root / "one.bin").write_bytes(data)
    mine = tmp_path / "one.bin"
    first, again, err = _twice(c, "-p", "box:one.bin", str(mine))
    assert (first["sent"], first["skipped"]) == (len(data), False)
    assert (again["sent"], again["skipped"], again["size"]) == (0, True, len(data)), again
    assert b"one.bin: 0 files sent, 1 skipped (unchanged)" in err, err
    assert mine.read_bytes() == data and os.listdir(tmp_path) == ["one.bin"]
    (root / "one.bin").write_bytes(data + b"more")  # another size: sent again, whole
    r = c.cli("cp", "--json", "-p", "box:one.bin", str(mine))
    assert r.returncode == 0 and summary(r.stdout)["sent"] == len(data) + 4 and b"skipped" not in r.stderr
    assert mine.read_bytes() == data + b"more"


def test_a_single_file_up_twice_with_p_sends_nothing_the_second_time(c, root, tmp_path):
    data = os.urandom(200_000)
    src = tmp_path / "up.bin"
    src.write_bytes(data)
    first, again, err = _twice(c, "-p", str(src), "box:up.bin")
    assert (first["sent"], first["skipped"]) == (len(data), False)
    assert (again["sent"], again["skipped"], again["attempts"]) == (0, True, 0), again
    assert b"box:up.bin: 0 files sent, 1 skipped (unchanged)" in err, err
    assert (root / "up.bin").read_bytes() == data
    # without -p or -c a file is copied as scp copies it: always
    r = c.cli("cp", "--json", str(src), "box:up.bin")
    assert r.returncode == 0 and summary(r.stdout)["sent"] == len(data)


def test_checksum_finds_a_single_file_change_that_size_and_time_miss(c, root, tmp_path):
    data = os.urandom(100_000)
    src = tmp_path / "sum.bin"
    src.write_bytes(data)
    assert c.cli("cp", "-p", str(src), "box:sum.bin").returncode == 0
    theirs = root / "sum.bin"
    st = os.stat(theirs)
    theirs.write_bytes(bytes(len(data)))  # the same size and, again, the same time
    os.utime(theirs, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = c.cli("cp", "--json", "-p", str(src), "box:sum.bin")
    assert summary(r.stdout)["skipped"] is True  # size and time: the same, as rsync's quick check
    r = c.cli("cp", "--json", "-p", "-c", str(src), "box:sum.bin")
    assert r.returncode == 0, r.stderr
    assert (summary(r.stdout)["sent"], summary(r.stdout)["skipped"]) == (len(data), False)
    assert theirs.read_bytes() == data
    os.utime(src, (1_000_000, 1_000_000))  # another time, the same bytes: -c skips, by sha256
    r = c.cli("cp", "--json", "-c", str(src), "box:sum.bin")
    res = summary(r.stdout)
    assert (res["sent"], res["skipped"], res["sha256"]) == (0, True, hashlib.sha256(data).hexdigest()), res
    # down: the local copy changed behind size and time; -c sees it, then skips the repaired file
    local = tmp_path / "down.bin"
    assert c.cli("cp", "-p", "box:sum.bin", str(local)).returncode == 0
    st = os.stat(local)
    local.write_bytes(bytes(len(data)))
    os.utime(local, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = c.cli("cp", "--json", "-c", "box:sum.bin", str(local))
    assert (summary(r.stdout)["sent"], summary(r.stdout)["skipped"]) == (len(data), False), r.stderr
    assert local.read_bytes() == data
    r = c.cli("cp", "--json", "-c", "box:sum.bin", str(local))
    assert (summary(r.stdout)["sent"], summary(r.stdout)["skipped"]) == (0, True), r.stderr
    assert b"0 files sent, 1 skipped (unchanged)" in r.stderr


def test_hand_to_hand_with_p_twice_is_skipped_before_a_byte_moves(c, root):
    c.start_hand("other")
    c.wait_connected("other")
    data = os.urandom(150_000)
    (root / "h2h.bin").write_bytes(data)
    first, again, err = _twice(c, "-p", "box:h2h.bin", "other:h2h.bin")
    assert (first["sent"], first["skipped"]) == (len(data), False)
    assert (again["sent"], again["skipped"], again["path"]) == (0, True, "other:h2h.bin"), again
    assert b"other:h2h.bin: 0 files sent, 1 skipped (unchanged)" in err, err
    assert (c.tmp / "root-other" / "h2h.bin").read_bytes() == data


# --- no failed run from a copy that succeeded ---------------------------------------------------


def test_a_copy_to_a_destination_not_made_yet_leaves_no_failed_run(tmp_path):
    """The copy probes its destination (`stat_file`, `list_tree`) before making it: "nothing there,
    not even its directory" is an answer, not a failed run in `mind status` and `mind runs`."""
    site = tmp_path / "site"
    files = make_tree(site, 6)
    one = tmp_path / "one.bin"
    one.write_bytes(b"x" * 5000)
    (tmp_path / "cl").mkdir()
    said: list[tuple[tuple[str, ...], int, bytes]] = []
    with running(tmp_path / "cl") as cl:
        for args in (
            ("-r", "-p", str(site), "box:fresh"),  # a tree to a name not there yet
            ("-r", "-p", f"{site}/", "box:a/b/c"),  # ... nor its directories
            ("-r", str(site), "box:into/"),  # into a directory not made yet
            ("-p", str(one), "box:one.bin"),  # a single file compared with nothing
            ("-c", str(one), "box:two.bin"),
            ("-r", "-p", "box:fresh", str(tmp_path / "down")),
        ):
            r = cl.cli("cp", *args, timeout=120)
            said.append((args[-2:], r.returncode, r.stderr))
        status = json.loads(cl.cli("status", "--json").stdout)
        runs = json.loads(cl.cli("runs", "--json", "--limit", "500").stdout)
        root = cl.tmp / "root-box"
    failures = [(f["tool"], f["state"], (f.get("end") or {}).get("error")) for f in status["recent_failures"]]
    assert failures == [], failures
    assert runs and {r["state"] for r in runs} == {"succeeded"}, [(r["tool"], r["state"]) for r in runs]
    assert [rc for _, rc, _ in said] == [0] * len(said), said
    assert tree_of(root / "fresh") == files and tree_of(root / "a/b/c") == files
    assert tree_of(root / "into" / "site") == files and tree_of(tmp_path / "down") == files
