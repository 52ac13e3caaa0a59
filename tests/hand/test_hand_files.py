"""File tools confined by handles, bounded paths, no special bits, and threads acting as the run's user
(issue 13, items 1, 2 and 7). In-process; the real-process attacks are in
tests/integration/test_security_files.py."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hand.system import fsuser
from hand.system.paths import PATH_MAX_BYTES, PATH_MAX_COMPONENTS, PathRefused, locate, resolve
from hand.system.sandbox import RunAs, Sandbox, lookup_user
from hand.system.tools import Refusal, ToolFailed, list_dir, prepare, read_file, write_file
from protocol.codes import RejectCode


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "sub" / "deep").mkdir(parents=True)
    (r / "sub" / "deep" / "f.txt").write_text("deep")
    (r / "a.txt").write_text("a")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET")
    (r / "rel-in").symlink_to("sub/deep")
    (r / "abs-in").symlink_to(r / "sub")
    (r / "sub" / "up").symlink_to("..")
    (r / "sub" / "up-out").symlink_to("../..")
    (r / "dir-out").symlink_to(outside)
    (r / "loop1").symlink_to("loop2")
    (r / "loop2").symlink_to("loop1")
    return r


def names(root: Path, user_path: str) -> tuple[str, str]:
    """What `locate` found: the real path of its parent handle, and the name."""
    with locate(root, user_path, follow_last=True) as at:
        return os.readlink(f"/proc/self/fd/{at.parent}"), at.name


def test_the_walk_follows_links_that_stay_under_the_root(root):
    real = os.path.realpath(root)
    assert names(root, "rel-in/f.txt") == (f"{real}/sub/deep", "f.txt")
    assert names(root, "abs-in/deep/f.txt") == (f"{real}/sub/deep", "f.txt")
    assert names(root, "sub/up/a.txt") == (real, "a.txt")
    assert names(root, "rel-in") == (f"{real}/sub", "deep")  # a link as the last name is followed...
    with locate(root, "rel-in", follow_last=False) as at:  # ...unless the tool acts on the name itself
        assert at.name == "rel-in"
    assert names(root, ".") == (real, ".")
    assert names(root, str(root / "sub")) == (real, "sub")


@pytest.mark.parametrize("user_path", ["dir-out/secret.txt", "sub/up-out/outside/secret.txt", "dir-out"])
def test_the_walk_never_leaves_the_root(root, user_path):
    with pytest.raises(PathRefused, match="leads outside the root"):
        locate(root, user_path, follow_last=True)


def test_a_link_loop_ends_in_eloop(root):
    with pytest.raises(OSError, match="Too many levels"):
        locate(root, "loop1", follow_last=True)


def test_paths_are_bounded_before_any_work(root):
    huge = "a/" * (1 << 19)  # 1 MiB: once ~35 s of realpath on the Hand's loop
    started = time.perf_counter()
    for path in (huge, "x" * (PATH_MAX_BYTES + 1), "é" * (PATH_MAX_BYTES // 2 + 1)):
        with pytest.raises(Refusal) as ei:
            prepare("read_file", {"path": path}, root)
        assert ei.value.code is RejectCode.PATH_OUTSIDE_ROOT and "bytes" in ei.value.message
    with pytest.raises(PathRefused, match="components"):
        resolve(root, "a/" * PATH_MAX_COMPONENTS)
    assert time.perf_counter() - started < 0.05
    resolve(root, "/".join(["d"] * (PATH_MAX_COMPONENTS - 1)))  # at the bound: fine


SWAPPER = """
import os, sys
root, target = sys.argv[1], sys.argv[2]
sub, real = root + "/sub", root + "/sub.real"
while True:
    os.rename(sub, real)
    os.symlink(target, sub)
    os.unlink(sub)
    os.rename(real, sub)
"""


@pytest.mark.slow
def test_a_directory_swapped_for_a_link_never_leads_out(root, tmp_path):
    """The race of issue 13 item 2, without users: another process swaps `sub` for a link out and
    back in a loop while the tools run; admission (realpath) passes whenever `sub` is a directory at
    that moment. The path-string tools this replaced leaked the secret ~3 times in 300 reads."""
    secret_dir = tmp_path / "outside"
    (root / "sub" / "outside").mkdir()
    (root / "sub" / "outside" / "secret.txt").write_text("mine")
    (root / "sub" / "outside" / "inside-marker").touch()
    assert read_file(root, "sub/outside/secret.txt", 0, 100, "'x'")["data"] == b"mine"  # works unraced
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root), str(tmp_path)])
    outcomes = {"ok": 0, "failed": 0, "refused": 0}
    try:
        time.sleep(0.2)
        for i in range(300):
            for user_path, call in (
                ("sub/outside/secret.txt", lambda: read_file(root, "sub/outside/secret.txt", 0, 100, "'x'")["data"]),
                ("sub/outside", lambda: [e["name"] for e in list_dir(root, "sub/outside", "'x'")["entries"]]),
                ("sub/outside/w", lambda i=i: write_file(root, f"sub/outside/w{i}", b"w", "create", False, "'x'")),
            ):
                try:
                    resolve(root, user_path)  # what admission does
                    value = call()
                except PathRefused:
                    outcomes["refused"] += 1
                    continue
                except ToolFailed:
                    outcomes["failed"] += 1
                    continue
                outcomes["ok"] += 1
                assert value != b"SECRET"
                assert not isinstance(value, list) or "inside-marker" in value  # never the outside listing
    finally:
        swapper.kill()
        swapper.wait()
    assert os.listdir(secret_dir) == ["secret.txt"]  # nothing written outside
    assert outcomes["failed"] + outcomes["refused"] > 0, outcomes  # it did race


def test_no_write_leaves_a_setuid_setgid_or_sticky_bit(root):
    target = root / "prog"
    target.write_bytes(b"old")
    os.chmod(target, 0o7755)
    write_file(root, "prog", b"new", "overwrite", False, "'prog'")
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o755
    os.chmod(target, 0o6750)
    write_file(root, "prog", b"+", "append", False, "'prog'")
    assert target.read_bytes() == b"new+" and stat.S_IMODE(target.stat().st_mode) == 0o750
    os.chmod(root / "sub", 0o2775)  # a setgid directory gives new subdirectories its setgid bit
    write_file(root, "sub/made/new.txt", b"x", "create", True, "'x'")
    assert not stat.S_IMODE((root / "sub" / "made").stat().st_mode) & 0o7000
    assert not stat.S_IMODE((root / "sub" / "made" / "new.txt").stat().st_mode) & 0o7000


# --- threads acting as the run's user (needs root; CI is root) ---------------------------------------

needs_root = pytest.mark.usefixtures("as_root")  # fails, never skips, when not root (tests/conftest.py)


def _nobody() -> RunAs:
    return lookup_user(pwd.getpwnam("nobody").pw_name)


@pytest.fixture
def open_tmp():
    """A directory another user can traverse (pytest's own is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="hand-files-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


@needs_root
def test_a_switched_thread_acts_as_the_user_and_only_that_thread(open_tmp):
    tmp_path = open_tmp
    user = _nobody()
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    (private / "s").write_text("root's")
    seen: dict[str, object] = {}

    def probe() -> None:
        fsuser.become(user)
        seen["groups"] = fsuser.thread_groups()
        try:
            open(private / "s").read()
            seen["read"] = "leaked"
        except PermissionError:
            seen["read"] = "denied"
        fd = os.open(tmp_path / "made", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)

    os.chmod(tmp_path, 0o777)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert seen["read"] == "denied" and seen["groups"] == tuple(sorted(user.groups))
    made = (tmp_path / "made").stat()
    assert (made.st_uid, made.st_gid) == (user.uid, user.gid)
    assert (private / "s").read_text() == "root's"  # this thread is still root
    assert fsuser.thread_groups() != seen["groups"] or user.groups == (0,)


@needs_root
def test_a_run_as_hand_runs_file_tools_on_the_users_threads(open_tmp):
    tmp_path = open_tmp
    user = _nobody()
    root = tmp_path / "r"
    root.mkdir()
    os.chmod(root, 0o777)
    (root / "mine").write_text("x")
    os.chmod(root / "mine", 0o600)  # root's, unreadable to nobody
    call = prepare("read_file", {"path": "mine"}, root, Sandbox(run_as=user))
    assert call.executor is not None and not call.quick
    with pytest.raises(ToolFailed, match="Permission denied"):
        call.executor.submit(call.call).result(10)
    with pytest.raises(fsuser.NotThisUser):
        call.call()  # on a thread that is not the user's: refused, never run as root
    made = prepare("write_file", {"path": "new", "data": b"d"}, root, Sandbox(run_as=user))
    made.executor.submit(made.call).result(10)
    assert (root / "new").stat().st_uid == user.uid
