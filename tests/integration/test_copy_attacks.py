"""Issue 23, item 1: copies never write outside their destination. Attacks 1, 2, 8 and 9 performed
with real processes (a real Mind, a real Hand or a fake hostile one, the `mind` CLI); each fails
with a clear message and a non-zero exit, and nothing is written outside."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from mind.client.aio import load_credential
from mind.testing.cluster import running, wait_until
from protocol import copy as rules
from protocol import treestream as ts
from protocol.auth import ClientHandshake
from protocol.envelope import Channel
from protocol.messages import Accepted, HandClaims, OutputTail, Result, Rpc, Started, StreamData
from protocol.states import RunState

pytestmark = pytest.mark.slow  # a real Mind, real or fake Hands, the `mind` CLI

DEEP = [f"d{i}" for i in range(1, 31)]
UP31 = "/".join([".."] * 31)
ESC = "/".join(["z", *DEEP, "up", "..", "..", "victim"])
"""By its text four levels below the top; with `z/d1/.../d30/up -> ../..(31)` (the top) two above it."""


def parts(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if rules.is_part_name(n)]


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("attacks")) as cl:
        yield cl


# --- attack 1: a tree copied down whose link resolves outside -----------------------------------


def test_attack_1_a_lexically_inside_link_that_resolves_outside_is_refused_in_a_periodic_sync(c, tmp_path):
    """Before: run 1 made `esc` (lexically inside) and `up`, exit 0; run 2, with `esc` now a directory
    on the Hand, wrote `victim/.bashrc` through the local `esc` link, outside `proj`, exit 0."""
    root = c.tmp / "root-box"
    hand_tree = root / "sync1"
    (hand_tree / "z" / "/".join(DEEP)).mkdir(parents=True)
    os.symlink(UP31, hand_tree / "z" / "/".join(DEEP) / "up")
    os.symlink(ESC, hand_tree / "esc")
    (hand_tree / "ok.txt").write_bytes(b"ok")
    work = tmp_path / "work"
    work.mkdir()
    victim = tmp_path / "victim"  # where `proj/esc` leads: proj/../../victim
    victim.mkdir()
    proj = work / "sync1"  # each run copies `sync1` into `work`
    r = c.cli("cp", "-r", "box:sync1", str(work))
    assert r.returncode == 1, r.stderr
    assert b"esc" in r.stderr and b"leads outside the copied tree" in r.stderr and b"Traceback" not in r.stderr
    assert not os.path.lexists(proj / "esc") and (proj / "ok.txt").read_bytes() == b"ok"
    assert os.readlink(proj / "z" / "/".join(DEEP) / "up") == UP31  # inside: the top itself
    # run 2 of the sync: `esc` is now a directory with a file in it
    os.unlink(hand_tree / "esc")
    (hand_tree / "esc").mkdir()
    (hand_tree / "esc" / ".bashrc").write_bytes(b"evil")
    r = c.cli("cp", "-r", "box:sync1", str(work))
    assert r.returncode == 0, r.stderr
    assert (proj / "esc" / ".bashrc").read_bytes() == b"evil"  # inside proj, a real directory
    # a link left by an older `mind cp` is never written through: refused, said, exit 1
    os.rename(proj / "esc", tmp_path / "esc-was")
    os.symlink(ESC, proj / "esc")
    r = c.cli("cp", "-r", "box:sync1", str(work))
    assert r.returncode == 1 and b"esc" in r.stderr and b"never written through" in r.stderr, r.stderr
    assert os.listdir(victim) == [] and sorted(os.listdir(tmp_path)) == ["esc-was", "victim", "work"]


def test_a_directory_meeting_a_dangling_local_link_is_a_clear_error(c, tmp_path):
    """Before: `FileExistsError` traceback."""
    root = c.tmp / "root-box"
    (root / "dang" / "sub").mkdir(parents=True)
    (root / "dang" / "sub" / "f").write_bytes(b"f")
    proj = tmp_path / "proj"
    (proj / "dang").mkdir(parents=True)
    os.symlink(tmp_path / "nowhere", proj / "dang" / "sub")
    r = c.cli("cp", "-r", "box:dang", str(proj))  # into proj/dang
    assert r.returncode == 1 and b"Traceback" not in r.stderr, r.stderr
    assert b"sub" in r.stderr and b"not a directory" in r.stderr
    assert not os.path.lexists(tmp_path / "nowhere")
    os.symlink(tmp_path / "nowhere", tmp_path / "top-link")
    r = c.cli("cp", "-r", "box:dang", str(tmp_path / "top-link"))
    assert r.returncode == 1 and b"leads nowhere" in r.stderr and b"Traceback" not in r.stderr, r.stderr
    assert not os.path.lexists(tmp_path / "nowhere")


CLAIMS = HandClaims(hostname="evil", platform="p", machine="m", python="3", version="0")


def _tree_stream(files: dict[str, bytes], paths: list[str]) -> bytes:
    """A tree download's stream (`protocol.treestream`) of `paths`, served from `files`."""
    out = b""
    for p in paths:
        data = files[p]
        out += ts.header(ts.Entry(p, "file", len(data), 0o644, 1.0)) + data + hashlib.sha256(data).digest()
    return out + ts.end(len(paths))


async def _fake_hand(
    url: str,
    cred,
    entries: list[dict] | dict[str, list[dict]],
    files: dict[str, bytes],
    asked: list[tuple[str, dict]],
    tree_stream=_tree_stream,
    dirs: frozenset[str] = frozenset(),
):
    """A Hand that authenticates and then serves `list_tree`, `stat_file` and `get_file` from a
    crafted listing, as a hostile Hand would (`tree_stream`: what it sends for a tree's files)."""
    ws = await connect(url, compression=None, max_size=None)
    ch = Channel()
    hs = ClientHandshake(cred, os.urandom(32), CLAIMS)
    await ws.send(ch.stamp(hs.hello()))
    await ws.send(ch.stamp(hs.on_challenge(ch.receive(await ws.recv()).msg)))
    ch.gen = hs.on_welcome(ch.receive(await ws.recv()).msg)

    async def serve() -> None:
        async for frame in ws:
            msg = ch.receive(frame).msg
            if not isinstance(msg, Rpc):
                continue
            asked.append((msg.tool, msg.args))
            rid, path = msg.run_id, str(msg.args.get("path", "")).removeprefix("tree/")
            await ws.send(ch.stamp(Accepted(run_id=rid)))
            await ws.send(ch.stamp(Started(run_id=rid)))
            value: dict = {}
            tail = {}
            if msg.tool == "list_tree":
                listed = entries.get(msg.args.get("path"), []) if isinstance(entries, dict) else entries
                value = {"entries": listed}
            elif msg.tool == "stat_file":
                data = files.get(path)
                value = {"type": None, "part": None}
                if msg.args.get("path") == "tree" or msg.args.get("path") in dirs:
                    value = {"type": "dir", "size": 0, "mode": 0o755, "mtime": 1.0, "part": None}
                elif data is not None:
                    value = {"type": "file", "size": len(data), "mode": 0o644, "mtime": 1.0, "part": None}
            elif msg.tool == "get_file":
                data = tree_stream(files, msg.args["paths"]) if "paths" in msg.args else files[path]
                digest = hashlib.sha256(data).hexdigest()
                await ws.send(ch.stamp(StreamData(run_id=rid, stream="stdout", offset=0, data=data)))
                await ws.send(ch.stamp(StreamData(run_id=rid, stream="stdout", offset=len(data), eof=True)))
                await ws.send(ch.stamp(StreamData(run_id=rid, stream="stderr", offset=0, eof=True)))
                value = {"path": path, "size": len(data), "sha256": digest, "mode": 0o644, "mtime": 1.0}
                tail = {"stdout": OutputTail(total=len(data), sent=len(data), sha256=digest)}
            await ws.send(ch.stamp(Result(run_id=rid, state=RunState.SUCCEEDED, exit_code=0, value=value, **tail)))

    return ws, asyncio.ensure_future(serve())


async def test_attack_1_a_hostile_hand_listing_a_link_then_a_file_through_it_writes_nothing_outside(tmp_path):
    """Before: `esc` was made (lexically inside), then `esc/x` was downloaded through it into
    `victim/`, outside the destination, exit 0."""
    entries = [{"path": "z", "type": "dir", "mode": 0o755, "size": 0, "mtime": 1.0}]
    for i in range(1, 31):
        entries.append({"path": "/".join(["z", *DEEP[:i]]), "type": "dir", "mode": 0o755, "size": 0, "mtime": 1.0})
    link = {"type": "symlink", "mode": 0o777, "size": 0, "mtime": 1.0}
    entries += [
        {"path": "/".join(["z", *DEEP, "up"]), "target": UP31, **link},
        {"path": "esc", "target": ESC, **link},
        {"path": "esc/x", "type": "file", "mode": 0o644, "size": 5, "mtime": 1.0},
        {"path": "ok", "type": "file", "mode": 0o644, "size": 2, "mtime": 1.0},
    ]
    files = {"esc/x": b"owned", "ok": b"ok"}
    asked: list[tuple[str, dict]] = []
    with running(tmp_path, None) as cl:
        cred = load_credential(cl.add_hand("evil"))
        ws, server = await _fake_hand(cl.url, cred, entries, files, asked)
        try:
            await asyncio.to_thread(cl.wait_connected, "evil")
            work = tmp_path / "work"
            work.mkdir()
            victim = tmp_path / "victim"
            victim.mkdir()
            r = await asyncio.to_thread(cl.cli, "cp", "-r", "evil:tree", str(work / "proj"))
        finally:
            server.cancel()
            await ws.close()
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode()
    assert "esc/x" in err and "parent is not a directory" in err, err
    assert "esc" in err and "leads outside the copied tree" in err, err
    assert os.listdir(victim) == []
    assert (work / "proj" / "ok").read_bytes() == b"ok" and not os.path.lexists(work / "proj" / "esc")
    got = [a for tool, a in asked if tool == "get_file"]
    assert got == [{"path": "tree", "paths": ["ok"]}]  # esc/x never even asked for


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param(["esc/x"], id="a-path-not-asked-for"),
        pytest.param(["../victim/x"], id="dotdot"),
        pytest.param(["ABSOLUTE"], id="absolute"),
        pytest.param(["ok", "ok"], id="the-same-path-twice"),
    ],
)
async def test_attack_1_a_hostile_hand_sending_other_paths_in_the_tree_stream_writes_nothing_outside(tmp_path, sent):
    """A tree download's stream may carry only the files asked for, in their order: a Hand that
    sends another path (one it listed under a link, `..`, an absolute one, one twice) ends the copy
    with a clear refusal; nothing is written outside, and no part file is left."""
    entries = [
        {"path": "esc", "type": "symlink", "target": "../victim", "mode": 0o777, "size": 0, "mtime": 1.0},
        {"path": "ok", "type": "file", "mode": 0o644, "size": 2, "mtime": 1.0},
    ]
    absolute = str(tmp_path / "victim" / "abs")  # inside `victim`, which must stay empty
    sent = [absolute if p == "ABSOLUTE" else p for p in sent]
    files = {"ok": b"ok", "esc/x": b"owned", "../victim/x": b"owned", absolute: b"owned"}

    def hostile(files: dict[str, bytes], paths: list[str]) -> bytes:
        out = b""
        for p in sent:
            data = files[p]
            out += ts.PREFIX.pack(ts.TAG_HEADER, 0)[:1]  # the real header below, built by hand
            body = __import__("msgpack").packb({"path": p, "type": "file", "size": len(data)})
            out = out[:-1] + ts.PREFIX.pack(ts.TAG_HEADER, len(body)) + body + data + hashlib.sha256(data).digest()
        return out + ts.end(len(sent))

    asked: list[tuple[str, dict]] = []
    with running(tmp_path, None) as cl:
        cred = load_credential(cl.add_hand("evil"))
        ws, server = await _fake_hand(cl.url, cred, entries, files, asked, hostile)
        try:
            await asyncio.to_thread(cl.wait_connected, "evil")
            work = tmp_path / "work"
            work.mkdir()
            victim = tmp_path / "victim"
            victim.mkdir()
            r = await asyncio.to_thread(cl.cli, "cp", "-r", "evil:tree", str(work / "proj"))
        finally:
            server.cancel()
            await ws.close()
    assert r.returncode == 1, r.stderr
    assert b"refused" in r.stderr and b"Traceback" not in r.stderr, r.stderr
    assert os.listdir(victim) == []
    proj = work / "proj"
    assert not os.path.lexists(proj / "esc") and parts(proj) == []
    if sent == ["ok", "ok"]:
        assert (proj / "ok").read_bytes() == b"ok"  # the first, asked for, arrived verified


@pytest.mark.parametrize("recursive", [True, False], ids=["-r", "files"])
async def test_a_hostile_hand_listing_dotdot_under_a_glob_writes_nothing_outside(tmp_path, recursive):
    """scp's CVE-2018-20685 / CVE-2019-6111 class. Before: `mind cp -r 'evil:logs/.*' out/` against
    a Hand listing `..` in `logs/` matched `..`, copied `logs/..` into `out/..` and overwrote
    `out/../.profile`, exit 0. Now every name a glob matches obeys a tree entry's rule: `..`, `.`,
    an empty name, one with a slash or NUL is refused and said (exit 1), and never asked for."""
    dirent = {"type": "dir", "mode": 0o755, "size": 0, "mtime": 1.0}
    file = {"type": "file", "mode": 0o644, "mtime": 1.0}
    entries = [
        {"path": "..", **dirent},
        {"path": ".", **dirent},
        {"path": "", **dirent},
        {"path": ".x\x00y", **file, "size": 5},
        {"path": ".profile", **file, "size": 4},
    ]
    files = {"logs/.profile": b"logs", ".profile": b"evil", "logs/../.profile": b"evil"}
    tree = [{"path": ".profile", **file, "size": 4}]
    listings = {"logs": entries, "logs/..": tree, "logs/.": tree}
    asked: list[tuple[str, dict]] = []
    work = tmp_path / "work"
    out = work / "out"
    out.mkdir(parents=True)
    (work / ".profile").write_bytes(b"mine")
    flag = ["-r"] if recursive else []
    (tmp_path / "c").mkdir()
    with running(tmp_path / "c", None) as cl:
        cred = load_credential(cl.add_hand("evil"))
        ws, server = await _fake_hand(cl.url, cred, listings, files, asked, dirs=frozenset({"logs/..", "logs/."}))
        try:
            await asyncio.to_thread(cl.wait_connected, "evil")
            r = await asyncio.to_thread(cl.cli, "cp", *flag, "evil:logs/.*", str(out))
            typed = await asyncio.to_thread(cl.cli, "cp", *flag, "evil:logs/..", str(out))
        finally:
            server.cancel()
            await ws.close()
    err = r.stderr.decode()
    assert (work / ".profile").read_bytes() == b"mine", err  # nothing written outside `out`
    assert r.returncode == 1, err
    assert "refused the name '..'" in err and "refused the name '.'" in err and "Traceback" not in err, err
    assert (out / ".profile").read_bytes() == b"logs" and sorted(os.listdir(out)) == [".profile"]
    touched = [a.get("path") for tool, a in asked if tool != "list_tree"]
    assert all(p == "logs/.profile" for p in touched), touched  # `logs/..` never even asked for
    # the same name typed by the user: refused too, since it would lead out of the destination
    assert typed.returncode == 1 and b"would lead out of" in typed.stderr, typed.stderr
    assert (work / ".profile").read_bytes() == b"mine" and sorted(os.listdir(work)) == [".profile", "out"]


# --- attack 2: a put_file-only client makes a door out of the root --------------------------------


def test_attack_2_a_put_file_only_client_cannot_make_a_link_out_of_the_root(c):
    """Before: `root/escape -> /etc` on the Hand, exit 0 both times."""
    root = c.tmp / "root-box"
    cred = c.client_credential("putonly", "--hands", "box", "--tools", "put_file")
    deep = "/".join(["a2", *DEEP])

    def put(path: str, target: str):
        args = json.dumps({"path": path, "type": "symlink", "target": target})
        return c.cli("call", "--credential", str(cred), "--hand", "box", "put_file", "--args", args)

    assert c.cli("call", "--credential", str(cred), "--hand", "box", "list_dir").returncode == 125  # only put_file
    r = put(f"{deep}/up", "/".join([".."] * 31))  # a2/d1/.../d30/up: the root itself, inside
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(root / deep / "up") == os.path.realpath(root)
    r = put(f"{deep}/up/escape", "/".join([".."] * 30) + "/etc")
    assert r.returncode != 0 and b"outside the root" in r.stderr, r.stderr
    assert not os.path.lexists(root / "escape") and not os.path.lexists(root / deep / "escape")


# --- attack 8: a part file planted in a shared directory ------------------------------------------


def test_attack_8_a_planted_part_file_is_never_written_and_parts_are_private(c, tmp_path):
    """Before: the download's bytes landed in the planted link's target (the part's name was
    predictable), parts were 0644 for a 0600 source, and never pruned locally."""
    root = c.tmp / "root-box"
    src = root / "private.bin"
    src.write_bytes(b"secret bytes")
    os.chmod(src, 0o600)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    theirs = tmp_path / "theirs.txt"
    theirs.write_bytes(b"the planter's file")
    local = str(shared / "private.bin")
    old_cid = rules.copy_id("box:private.bin", local, src.stat().st_size, f"mtime:{src.stat().st_mtime!r}")
    planted = shared / rules.part_name(old_cid)
    os.symlink(theirs, planted)
    stale = shared / rules.private_part_name("0" * 32, "0123456789abcdef")
    stale.write_bytes(b"old")
    os.utime(stale, (time.time() - rules.STALE_PART_S - 60,) * 2)
    for extra in ((), ("--resume",)):
        r = c.cli("cp", "-p", *extra, "box:private.bin", local)
        assert r.returncode == 0, r.stderr
        assert Path(local).read_bytes() == b"secret bytes"
        assert stat.S_IMODE(os.stat(local).st_mode) == 0o600
        assert theirs.read_bytes() == b"the planter's file" and planted.is_symlink()
    assert not stale.exists()  # a stale part of ours, pruned
    assert parts(shared) == [planted.name]  # only the planted link, never used


def test_attack_8_the_part_of_a_download_is_unpredictable_and_owner_only(tmp_path):
    size = 16 << 20
    with running(tmp_path, "box", via_proxy=True) as px:
        src = tmp_path / "root-box" / "big.bin"
        src.write_bytes(os.urandom(size))
        os.chmod(src, 0o640)
        out = tmp_path / "out"
        out.mkdir()
        px.proxy.send("throttle 4000000 up")  # Hand -> Mind: the download's direction
        p = px.cli_popen("cp", "box:big.bin", str(out / "big.bin"))
        try:
            wait_until(lambda: any(os.path.getsize(out / n) > 0 for n in parts(out)), 60, "a part file", interval=0.05)
            [name] = parts(out)
            st = os.lstat(out / name)
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
            cid = rules.part_copy_id(name)
            assert cid is not None and name != rules.part_name(cid)  # carries a token nobody could guess
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        px.proxy.send("clear")
        r = px.cli("cp", "--resume", "box:big.bin", str(out / "big.bin"), timeout=120)
        assert r.returncode == 0, r.stderr
        assert (out / "big.bin").read_bytes() == src.read_bytes() and parts(out) == []


# --- attack 9: put_file type=dir with a mode on the root or an existing directory -----------------


def test_attack_9_put_file_never_re_modes_the_root_or_an_existing_directory(c):
    """Before: the root became 0777, a 1777 directory lost its sticky bit."""
    root = c.tmp / "root-box"
    (root / "tmpdir").mkdir()
    os.chmod(root / "tmpdir", 0o1777)
    before = stat.S_IMODE(root.stat().st_mode)
    r = c.cli("call", "--hand", "box", "put_file", "--args", json.dumps({"path": ".", "type": "dir", "mode": 0o777}))
    assert r.returncode != 0 and b"the root" in r.stderr, r.stderr
    r = c.cli(
        "call", "--hand", "box", "put_file", "--args", json.dumps({"path": "tmpdir", "type": "dir", "mode": 0o777})
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["created"] is False
    assert stat.S_IMODE(root.stat().st_mode) == before
    assert stat.S_IMODE((root / "tmpdir").stat().st_mode) == 0o1777


@pytest.mark.parametrize("mtime", ["1e300", "NaN"])
def test_put_file_with_an_impossible_mtime_is_refused_before_anything_is_made(c, mtime):
    root = c.tmp / "root-box"
    args = '{"path": "mt/sub", "type": "dir", "make_dirs": true, "mtime": ' + mtime + "}"
    r = c.cli("call", "--hand", "box", "put_file", "--args", args)
    assert r.returncode == 125 and b"mtime" in r.stderr and b"Traceback" not in r.stderr, r.stderr
    assert not (root / "mt").exists()


# --- uploads of a tree: names as UTF-8 or refused; nothing sent below a directory the Hand refused -


def test_an_upload_of_a_tree_refuses_names_that_are_not_utf8_and_links_where_directories_go(c, tmp_path):
    """Before: a local name that is not UTF-8 was a msgpack traceback; a file below a directory the
    Hand had as a symlink (inside the root) went wherever the link led, outside the destination."""
    root = c.tmp / "root-box"
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_bytes(b"f")
    (src / "ok").write_bytes(b"ok")
    os.mkdir(os.fsencode(src) + b"/\xff")
    with open(os.fsencode(src) + b"/\xff/g", "wb") as f:
        f.write(b"g")
    (root / "elsewhere").mkdir()
    (root / "up8").mkdir()
    (root / "up8" / "src").mkdir()
    os.symlink("../../elsewhere", root / "up8" / "src" / "sub")  # the destination's `sub`: a link
    r = c.cli("cp", "-r", str(src), "box:up8")
    assert r.returncode == 1 and b"Traceback" not in r.stderr, r.stderr
    assert b"not UTF-8" in r.stderr and b"symlink" in r.stderr
    assert (root / "up8" / "src" / "ok").read_bytes() == b"ok"
    assert os.listdir(root / "elsewhere") == []  # nothing written through the link
    assert sorted(os.listdir(root / "up8" / "src")) == ["ok", "sub"]


def test_attack_1_a_non_utf8_link_name_never_stands_for_a_real_directory_of_the_same_wire_name(c, tmp_path):
    """Before: the link `\\xff` reached the wire as U+FFFD, was made locally under the name of the
    real directory `\\ufffd`, and that directory's files were then written through it."""
    root = c.tmp / "root-box"
    t = root / "lossy"
    (t / "elsewhere").mkdir(parents=True)
    os.symlink(b"elsewhere", os.fsencode(t) + b"/\xff")
    (t / "\ufffd").mkdir()
    (t / "\ufffd" / "x").write_bytes(b"x")
    r = c.cli("cp", "-r", "box:lossy", str(tmp_path))
    assert r.returncode == 1 and b"not UTF-8" in r.stderr and b"Traceback" not in r.stderr, r.stderr
    made = tmp_path / "lossy"
    assert (made / "\ufffd").is_dir() and not (made / "\ufffd").is_symlink()
    assert (made / "\ufffd" / "x").read_bytes() == b"x" and os.listdir(made / "elsewhere") == []
