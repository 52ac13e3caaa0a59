"""`mind cp -r` as one run per tree (issue 25, item 4) with real processes: what is already the same
is skipped and counted, `--checksum` compares digests, the Hand's policy per tool still governs a
tree, and a tree survives a cut of the Hand's link and a killed `mind cp` (what arrived is skipped)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
from pathlib import Path

import pytest

from mind.testing.cluster import running, wait_until
from protocol.copy import is_part_name

pytestmark = pytest.mark.slow  # a real Mind, real Hands, the `mind` CLI


def make_tree(top: Path, files: int, size: int, seed: int = 0) -> dict[str, bytes]:
    """`files` random files in a few directories, a link inside; {relative path: bytes}."""
    out: dict[str, bytes] = {}
    for i in range(files):
        rel = f"d{i % 4}/sub{i % 3}/f{i:04d}.bin"
        data = os.urandom(size + (i * 7 + seed) % 97)
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(data)
        out[rel] = data
    os.symlink("d0/sub0/f0000.bin", top / "first")
    return out


def tree_of(top: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for here, _, names in os.walk(top):
        for n in names:
            p = Path(here) / n
            if not p.is_symlink():
                out[str(p.relative_to(top))] = p.read_bytes()
    return out


def no_parts(top: Path) -> bool:
    return not [n for _, _, fs in os.walk(top) for n in fs if is_part_name(n)]


def sub(tmp: Path, name: str) -> Path:
    (tmp / name).mkdir()
    return tmp / name


def summary(stdout: bytes) -> dict:
    [line] = [json.loads(x) for x in stdout.decode().splitlines() if x.strip()]
    return line


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("cptree")) as cl:
        yield cl


def test_a_tree_goes_up_and_down_and_again_only_what_changed(c, tmp_path):
    src = tmp_path / "src"
    files = make_tree(src, 60, 3000)
    root = c.tmp / "root-box"
    r = c.cli("cp", "-r", "-p", "--json", str(src), "box:t1/")  # into t1 (made): t1/src, as scp
    assert r.returncode == 0, r.stderr
    assert summary(r.stdout) | {"duration_s": 0, "bytes": 0} == {
        "path": "box:t1/src",
        "type": "tree",
        "files": 60,
        "sent": 60,
        "skipped": 0,
        "failed": 0,
        "bytes": 0,
        "attempts": 1,
        "duration_s": 0,
    }
    assert b"60 files sent, 0 skipped (unchanged)" in r.stderr
    t1 = root / "t1" / "src"
    assert tree_of(t1) == files and os.readlink(t1 / "first") == "d0/sub0/f0000.bin"
    st = os.stat(src / "d1/sub1/f0001.bin")
    assert os.stat(t1 / "d1/sub1/f0001.bin").st_mtime == st.st_mtime
    assert no_parts(t1)

    r = c.cli("cp", "-r", "-p", "--json", str(src), "box:t1/")  # the same tree again
    assert r.returncode == 0, r.stderr
    res = summary(r.stdout)
    assert (res["sent"], res["skipped"]) == (0, 60) and b"0 files sent, 60 skipped (unchanged)" in r.stderr

    (src / "d2/sub2/f0002.bin").write_bytes(b"changed")  # another size
    r = c.cli("cp", "-r", "-p", "--json", str(src), "box:t1/")
    assert (summary(r.stdout)["sent"], summary(r.stdout)["skipped"]) == (1, 59)
    assert (t1 / "d2/sub2/f0002.bin").read_bytes() == b"changed"

    down = tmp_path / "down"
    r = c.cli("cp", "-r", "-p", "--json", "box:t1/src", str(down))
    assert r.returncode == 0, r.stderr
    assert summary(r.stdout)["sent"] == 60 and tree_of(down) == tree_of(src)
    assert os.readlink(down / "first") == "d0/sub0/f0000.bin" and no_parts(down)
    assert os.stat(down / "d3/sub0/f0003.bin").st_mtime == os.stat(src / "d3/sub0/f0003.bin").st_mtime
    os.mkdir(tmp_path / "into")
    r = c.cli("cp", "-r", "-p", "--json", "box:t1/src", str(tmp_path / "into"))
    r = c.cli("cp", "-r", "-p", "--json", "box:t1/src", str(tmp_path / "into"))
    res = summary(r.stdout)
    assert r.returncode == 0 and (res["sent"], res["skipped"]) == (0, 60), r.stderr


def test_checksum_finds_a_change_that_size_and_time_miss(c, tmp_path):
    src = tmp_path / "src"
    make_tree(src, 10, 500)
    root = c.tmp / "root-box"
    assert c.cli("cp", "-r", "-p", str(src), "box:sums/").returncode == 0
    victim = root / "sums/src/d1/sub1/f0001.bin"
    st = os.stat(victim)
    victim.write_bytes(bytes(st.st_size))  # the same size, and the same time again
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = c.cli("cp", "-r", "-p", "--json", str(src), "box:sums/")
    assert summary(r.stdout)["sent"] == 0  # size and time: the same, as rsync's quick check
    r = c.cli("cp", "-r", "-p", "-c", "--json", str(src), "box:sums/")
    assert r.returncode == 0, r.stderr
    assert (summary(r.stdout)["sent"], summary(r.stdout)["skipped"]) == (1, 9)
    assert victim.read_bytes() == (src / "d1/sub1/f0001.bin").read_bytes()
    local = tmp_path / "back"
    assert c.cli("cp", "-r", "-p", "box:sums/src", str(local)).returncode == 0
    mine = local / "d2/sub2/f0002.bin"
    st = os.stat(mine)
    mine.write_bytes(bytes(st.st_size))
    os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.mkdir(tmp_path / "side")
    os.rename(local, tmp_path / "side" / "src")  # into an existing directory: `side/src` again
    r = c.cli("cp", "-r", "-p", "-c", "--json", "box:sums/src", str(tmp_path / "side"))
    assert r.returncode == 0, r.stderr
    assert (summary(r.stdout)["sent"], summary(r.stdout)["skipped"]) == (1, 9)
    assert (tmp_path / "side/src/d2/sub2/f0002.bin").read_bytes() == (root / "sums/src/d2/sub2/f0002.bin").read_bytes()


def test_a_tree_with_a_setuid_file_and_a_link_out_keeps_every_per_file_rule(c, tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "tool").write_bytes(b"#!/bin/sh\n")
    os.chmod(src / "d" / "tool", 0o4755)
    os.symlink("/etc/passwd", src / "d" / "out")
    r = c.cli("cp", "-r", "-p", str(src), "box:rules")
    assert r.returncode == 1 and b"leads outside the copied tree" in r.stderr
    root = c.tmp / "root-box"
    assert stat.S_IMODE(os.stat(root / "rules/d/tool").st_mode) == 0o755
    assert not os.path.lexists(root / "rules/d/out")
    r = c.cli("cp", "-r", "-p", "box:rules", str(tmp_path / "back"))
    assert r.returncode == 0 and stat.S_IMODE(os.stat(tmp_path / "back/d/tool").st_mode) == 0o755


def test_the_hands_policy_governs_a_tree_as_it_does_each_file(tmp_path):
    src = tmp_path / "src"
    make_tree(src, 5, 100)
    with running(sub(tmp_path, "a"), "ro", "--deny-tools", "put_file") as cl:
        r = cl.cli("cp", "-r", str(src), "ro:t")
        assert r.returncode == 125 and b"denied by this hand's policy" in r.stderr, r.stderr
        assert os.listdir(cl.tmp / "root-ro") == []
    with running(sub(tmp_path, "d"), "drop", "--deny-tools", "list_tree") as cl:  # a drop box: write, never list
        for _ in range(2):
            r = cl.cli("cp", "-r", "--json", str(src), "drop:")
            assert r.returncode == 0 and summary(r.stdout)["sent"] == 5, r.stderr  # no listing: all sent
        r = cl.cli("cp", "-r", "-c", str(src), "drop:")
        assert r.returncode == 125 and b"denied by this hand's policy" in r.stderr  # -c needs the digests
    with running(sub(tmp_path, "b"), "wo", "--deny-tools", "get_file") as cl:
        assert cl.cli("cp", "-r", str(src), "wo:t").returncode == 0
        r = cl.cli("cp", "-r", "wo:t", str(tmp_path / "got"))
        assert r.returncode == 125 and b"denied by this hand's policy" in r.stderr, r.stderr
        assert not [n for _, _, fs in os.walk(tmp_path / "got") for n in fs]


def test_an_oversized_file_in_a_tree_is_refused_and_the_rest_arrives(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(os.urandom(2 << 20))
    (src / "small").write_bytes(b"ok")
    with running(sub(tmp_path, "c"), "small", "--max-upload-bytes", "1M") as cl:
        r = cl.cli("cp", "-r", str(src), "small:t")
        assert r.returncode == 1 and b"max_upload_bytes" in r.stderr
        assert os.listdir(cl.tmp / "root-small" / "t") == ["small"]


# --- cuts -----------------------------------------------------------------------------------------


@pytest.fixture
def px(tmp_path):
    with running(sub(tmp_path, "px"), "box", via_proxy=True) as cl:
        yield cl


def _moved(cl, direction: str, at: int) -> bool:
    return any(conn[f"{direction}_bytes"] >= at for conn in cl.proxy.status()["connections"])


@pytest.mark.parametrize("way", ["up", "down"])
def test_a_tree_survives_a_cut_of_the_hands_link(px, tmp_path, way):
    src = tmp_path / "src"
    files = make_tree(src, 40, 256 << 10)  # ~10 MiB
    total = sum(len(v) for v in files.values())
    root = px.tmp / "root-box"
    if way == "down":
        assert px.cli("cp", "-r", "-p", str(src), "box:t").returncode == 0
    direction = "down" if way == "up" else "up"
    px.proxy.send(f"throttle 4000000 {direction}")
    argv = (
        ["cp", "-r", "-p", "--json", str(src), "box:t2"]
        if way == "up"
        else ["cp", "-r", "-p", "--json", "box:t", str(tmp_path / "got")]
    )
    p = px.cli_popen(*argv)
    wait_until(lambda: _moved(px, direction, total // 2), 120, "half the tree through the proxy", interval=0.02)
    px.proxy.send("cut rst")
    px.proxy.send("clear")
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    res = summary(out)
    assert res["failed"] == 0 and res["sent"] == 40, res
    got = root / "t2" if way == "up" else tmp_path / "got"
    assert tree_of(got) == files and no_parts(got)


def test_a_killed_cp_of_a_tree_is_finished_by_the_next_one_without_resending_what_arrived(px, tmp_path):
    src = tmp_path / "src"
    files = make_tree(src, 40, 256 << 10)
    total = sum(len(v) for v in files.values())
    px.proxy.send("throttle 4000000 down")
    p = px.cli_popen("cp", "-r", "-p", str(src), "box:k/")
    wait_until(lambda: _moved(px, "down", total // 2), 120, "half the tree through the proxy", interval=0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(30)
    px.proxy.send("clear")
    root = px.tmp / "root-box"
    k = root / "k" / "src"
    arrived = [rel for rel, data in files.items() if (k / rel).exists()]
    assert arrived and all((k / rel).read_bytes() == files[rel] for rel in arrived)  # whole or absent
    r = px.cli("cp", "-r", "-p", "--json", str(src), "box:k/", timeout=180)
    assert r.returncode == 0, r.stderr
    res = summary(r.stdout)
    assert res["skipped"] >= len(arrived) and res["sent"] + res["skipped"] == 40, res
    assert tree_of(k) == files
    wait_until(lambda: no_parts(k), 120, "the killed copy's part file gone (its run ended)")


def test_list_tree_digests_are_computed_on_the_hand_in_one_call(c, tmp_path):
    (c.tmp / "root-box" / "dg").mkdir(exist_ok=True)
    (c.tmp / "root-box" / "dg" / "f").write_bytes(b"abc")
    r = c.cli("call", "--hand", "box", "list_tree", "--args", json.dumps({"path": "dg", "sha256": True}))
    assert r.returncode == 0, r.stderr
    [e] = json.loads(r.stdout)["entries"]
    assert e["sha256"] == hashlib.sha256(b"abc").hexdigest()
