"""The file tools' attacks of issue 13 (items 1, 2, 7, 15), performed with real processes: a Hand running
as root with `--run-as` a fresh user (made with `useradd`, removed after), a client over the wire,
and a process of that user racing the Hand."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hand.system.sandbox import RunAs, lookup_user
from mind.client.aio import MindClient, load_credential
from mind.testing.cluster import Cluster, running
from protocol.states import RunState

pytestmark = pytest.mark.slow  # a real Mind and Hand

needs_root = pytest.mark.usefixtures("as_root")  # fails, never skips, when not root (tests/conftest.py)
ROOT_SECRET = "ROOT-ONLY-SECRET"


@pytest.fixture
def user() -> Iterator[RunAs]:
    name = "mhf" + secrets.token_hex(4)
    subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", name], check=True)
    try:
        yield lookup_user(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory the run's user can traverse (pytest's own tmp is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="mh-files-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def run_as_hand(tmp_path: Path, open_dir: Path, user: RunAs) -> Iterator[tuple[Cluster, Path]]:
    root = open_dir / "root"
    root.mkdir()
    os.chown(root, user.uid, user.gid)
    with running(tmp_path, None) as cl:
        cl.start_hand("box", "--run-as", user.name, root=root)
        cl.wait_connected("box")
        yield cl, root


def admin(cl: Cluster) -> MindClient:
    return MindClient.connect(cl.url, load_credential(cl.home / "admin.cred"))  # type: ignore[return-value]


# --- item 1: no setuid file through write_file ----------------------------------------------------


@needs_root
async def test_write_file_never_leaves_a_setuid_file_and_writes_as_the_run_user(tmp_path, open_dir, user):
    """Before: the overwrite made a new inode as root and copied the old mode, setuid included, so
    the user's own setuid file became a setuid-root program."""
    with run_as_hand(tmp_path, open_dir, user) as (cl, root):
        async with await admin(cl) as mc:
            end = await mc.exec("box", "exec", {"argv": ["sh", "-c", "printf old > prog && chmod 6755 prog"]})
            assert end.state is RunState.SUCCEEDED, end
            st = (root / "prog").stat()
            assert st.st_uid == user.uid and st.st_mode & stat.S_ISUID  # the user's own setuid file
            await mc.call("box", "write_file", {"path": "prog", "data": b"#!/bin/sh\nid\n"})
            st = (root / "prog").stat()
            assert (st.st_uid, st.st_gid) == (user.uid, user.gid)
            assert stat.S_IMODE(st.st_mode) == 0o755  # permission bits kept, setuid and setgid gone
            await mc.call("box", "write_file", {"path": "fresh", "data": b"x", "mode": "create"})
            await mc.call("box", "write_file", {"path": "d/e/f", "data": b"x", "make_dirs": True})
            for made in (root / "fresh", root / "d", root / "d" / "e", root / "d" / "e" / "f"):
                st = made.stat()
                assert (st.st_uid, st.st_gid) == (user.uid, user.gid), made
                assert not st.st_mode & 0o7000, made
            end = await mc.exec("box", "exec", {"argv": ["sh", "-c", "chmod 4755 fresh"]})
            await mc.call("box", "write_file", {"path": "fresh", "data": b"+", "mode": "append"})
            assert not (root / "fresh").stat().st_mode & 0o7000 and (root / "fresh").read_bytes() == b"x+"


# --- item 2: the path check raced by a directory swapped for a symlink ------------------------------

SWAPPER = "cd {root} && while :; do mv sub sub.real; ln -s {vault} sub; rm sub; mv sub.real sub; done"


@needs_root
async def test_a_swapped_directory_never_leads_the_hand_into_a_root_only_directory(tmp_path, open_dir, user):
    """Before (issue 13): root-run `read_file` leaked a root-only file after 13 tries, `list_dir`
    listed a root-only directory, `write_file` created root-owned files in it."""
    vault = open_dir / "vault"  # sub -> vault makes sub/t the root-only directory vault/t
    (vault / "t").mkdir(parents=True)
    os.chmod(vault / "t", 0o700)
    (vault / "t" / "s.txt").write_text(ROOT_SECRET)
    (vault / "t" / "root-only-entry").touch()
    with run_as_hand(tmp_path, open_dir, user) as (cl, root):
        async with await admin(cl) as mc:
            await mc.call("box", "write_file", {"path": "sub/t/s.txt", "data": b"user", "make_dirs": True})
            await mc.call("box", "write_file", {"path": "sub/t/user-entry", "data": b""})
            swapper = subprocess.Popen(
                ["sh", "-c", SWAPPER.format(root=root, vault=vault)],
                user=user.uid,
                group=user.gid,
                extra_groups=[],
                start_new_session=True,
            )
            counts = {"ok": 0, "not ok": 0}
            try:
                await asyncio.sleep(0.2)
                for i in range(200):
                    calls = (
                        ("read_file", {"path": "sub/t/s.txt"}),
                        ("list_dir", {"path": "sub/t"}),
                        ("write_file", {"path": f"sub/t/w{i}", "data": b"w", "mode": "create"}),
                    )
                    ends = await asyncio.gather(*(mc.exec("box", tool, args) for tool, args in calls))
                    for (tool, _), end in zip(calls, ends, strict=True):
                        if end.state is not RunState.SUCCEEDED:
                            counts["not ok"] += 1
                            continue
                        counts["ok"] += 1
                        if tool == "read_file":
                            assert end.value["data"] == b"user"
                        if tool == "list_dir":
                            names = [e["name"] for e in end.value["entries"]]
                            assert "root-only-entry" not in names and "user-entry" in names
            finally:
                os.killpg(swapper.pid, 9)
                swapper.wait()
    assert sorted(os.listdir(vault / "t")) == ["root-only-entry", "s.txt"]  # nothing created there
    assert (vault / "t" / "s.txt").read_text() == ROOT_SECRET
    assert counts["not ok"] > 0, counts  # the swapper did get in the way


# --- item 7: a 1 MB path --------------------------------------------------------------------------


async def test_a_huge_path_is_refused_at_once_and_other_runs_go_on(tmp_path):
    """Before: a 1 MB path held the Hand's loop ~35 s in realpath, and runs in flight were lost."""
    with running(tmp_path) as cl:
        async with await admin(cl) as mc:
            other = asyncio.ensure_future(mc.exec("box", "shell", {"command": "sleep 1; echo alive"}))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            end = await mc.exec("box", "read_file", {"path": "a/" * 500_000})  # 1,000,000 bytes
            refused_in = time.monotonic() - started
            assert end.state is RunState.REJECTED and end.reject_code is not None
            assert "bytes" in end.reason or "too large" in end.reason, end.reason
            started = time.monotonic()
            await mc.call("box", "list_dir", {})  # the Hand answers at once after it
            after = time.monotonic() - started
            done = await asyncio.wait_for(other, 20)
            assert done.state is RunState.SUCCEEDED and done.stdout.data == b"alive\n"
    print(f"1 MB path refused in {refused_in * 1000:.0f} ms; next call {after * 1000:.1f} ms")
    assert refused_in < 2.0 and after < 0.5


# --- item 15: --out never writes through a planted symlink ----------------------------------------


def test_out_files_never_follow_a_planted_symlink(tmp_path):
    with running(tmp_path, None) as cl:
        for argv in (("hand", "add", "h1"), ("client", "add", "c1"), ("client", "rotate", "c1")):
            out = tmp_path / f"{argv[0]}-{argv[1]}.cred"
            victims = tmp_path / "victims" / out.name
            victims.mkdir(parents=True)
            for name in (out.name, out.name + ".tmp"):
                (victims / name).write_text("untouched")
                (out.parent / name).unlink(missing_ok=True)
                (out.parent / name).symlink_to(victims / name)
            r = cl.cli(*argv, "--out", str(out))
            assert r.returncode == 0, r.stderr
            assert r.stdout == b""  # --out: the secret is in the file only
            assert not out.is_symlink() and out.read_text().strip()  # the link was replaced
            assert stat.S_IMODE(out.stat().st_mode) == 0o600
            assert (out.parent / (out.name + ".tmp")).is_symlink()  # never used as the temporary name
            for name in (out.name, out.name + ".tmp"):
                assert (victims / name).read_text() == "untouched"
