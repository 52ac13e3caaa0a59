"""`mind cp` (issue 15) with real processes: exact, atomic, resumable, confined and governed.

Every test asserts bytes, digests, exit codes and files; a cut is made with the fault proxy and
the bytes sent after it are counted (`--json` reports `sent`, `attempts`, `resumed_from`)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from mind.testing.cluster import running, wait_until
from protocol import limits
from protocol.copy import is_part_name

pytestmark = pytest.mark.slow  # a real Mind, real Hands, the `mind` CLI

MIB = 1 << 20
WINDOW = limits.STREAM_WINDOW


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def parts(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if is_part_name(n)]


def summaries(stdout: bytes) -> list[dict]:
    return [json.loads(line) for line in stdout.decode().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("cp")) as cl:
        yield cl


@pytest.fixture
def root(c) -> Path:
    return c.tmp / "root-box"


@pytest.fixture
def local(tmp_path) -> Path:
    return tmp_path


def test_100_mb_random_binary_round_trip(c, root, local):
    src = local / "big.bin"
    with open(src, "wb") as f:
        for _ in range(100):
            f.write(os.urandom(MIB))
    digest = file_sha(src)
    r = c.cli("cp", "--json", str(src), "box:big.bin", timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""  # no progress line when stderr is not a terminal
    [up] = summaries(r.stdout)
    assert up["size"] == 100 * MIB and up["sha256"] == digest and up["path"] == "box:big.bin"
    assert file_sha(root / "big.bin") == digest
    r = c.cli("cp", "--json", "box:big.bin", str(local / "back.bin"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert file_sha(local / "back.bin") == digest and summaries(r.stdout)[0]["sha256"] == digest
    assert parts(root) == [] and parts(local) == []
    (root / "big.bin").unlink()


def test_empty_file_both_ways(c, root, local):
    (local / "empty").write_bytes(b"")
    r = c.cli("cp", str(local / "empty"), "box:empty")
    assert r.returncode == 0, r.stderr
    assert (root / "empty").read_bytes() == b""
    r = c.cli("cp", "box:empty", str(local / "empty-back"))
    assert r.returncode == 0, r.stderr
    assert (local / "empty-back").read_bytes() == b""


def test_names_with_spaces_and_non_ascii_into_a_directory(c, root, local):
    names = ["with space.txt", "grüße ünïcødé.bin", "日本語 ファイル"]
    (root / "inbox dir").mkdir()
    for n in names:
        (local / n).write_bytes(n.encode() + os.urandom(3000))
    r = c.cli("cp", *[str(local / n) for n in names], "box:inbox dir")
    assert r.returncode == 0, r.stderr
    for n in names:
        assert (root / "inbox dir" / n).read_bytes() == (local / n).read_bytes()
    out = local / "out"
    out.mkdir()
    r = c.cli("cp", *[f"box:inbox dir/{n}" for n in names], str(out))
    assert r.returncode == 0, r.stderr
    for n in names:
        assert (out / n).read_bytes() == (local / n).read_bytes()


def test_stdin_and_stdout(c, root):
    data = os.urandom(3 * MIB + 17)
    r = c.cli("cp", "-", "box:from-stdin.bin", input=data)
    assert r.returncode == 0, r.stderr
    assert (root / "from-stdin.bin").read_bytes() == data
    r = c.cli("cp", "box:from-stdin.bin", "-")
    assert r.returncode == 0, r.stderr
    assert r.stdout == data


def _tree(top: Path) -> None:
    (top / "a" / "b").mkdir(parents=True)
    (top / "top.txt").write_bytes(b"top\n")
    (top / "a" / "x.bin").write_bytes(os.urandom(700_000))
    (top / "a" / "b" / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(top / "a" / "b" / "run.sh", 0o750)
    os.chmod(top / "a" / "x.bin", 0o600)
    os.chmod(top / "a", 0o711)
    os.symlink("b/run.sh", top / "a" / "link")  # stays inside the tree
    os.utime(top / "top.txt", (1_600_000_000, 1_600_000_000))


def _same_tree(x: Path, y: Path) -> None:
    for sub in ("top.txt", "a/x.bin", "a/b/run.sh"):
        assert (x / sub).read_bytes() == (y / sub).read_bytes(), sub
        assert stat.S_IMODE((x / sub).stat().st_mode) == stat.S_IMODE((y / sub).stat().st_mode), sub
    assert stat.S_IMODE((y / "a").stat().st_mode) == 0o711
    assert os.readlink(y / "a" / "link") == "b/run.sh"
    assert int((y / "top.txt").stat().st_mtime) == 1_600_000_000


def test_a_tree_with_modes_and_a_symlink_round_trips_with_r_p(c, root, local):
    src = local / "tree"
    src.mkdir()
    _tree(src)
    r = c.cli("cp", "-r", "-p", str(src), "box:copied")
    assert r.returncode == 0, r.stderr
    _same_tree(src, root / "copied")
    back = local / "back"
    r = c.cli("cp", "-r", "-p", "box:copied", str(back))
    assert r.returncode == 0, r.stderr
    _same_tree(src, back)


def test_a_symlink_leading_out_of_the_tree_is_not_copied_and_says_so(c, root, local):
    src = local / "t2"
    src.mkdir()
    (src / "ok.txt").write_bytes(b"ok")
    os.symlink("/etc/passwd", src / "out-abs")
    os.symlink("../../x", src / "out-rel")
    r = c.cli("cp", "-r", str(src), "box:t2")
    assert r.returncode == 1
    assert b"leads outside the copied tree" in r.stderr
    assert (root / "t2" / "ok.txt").read_bytes() == b"ok"
    assert not os.path.lexists(root / "t2" / "out-abs") and not os.path.lexists(root / "t2" / "out-rel")


def test_special_files_are_refused_with_a_clear_message(c, root, local):
    os.mkfifo(root / "a-fifo")
    r = c.cli("cp", "box:a-fifo", str(local / "f"), timeout=30)
    assert r.returncode == 1 and b"FIFO" in r.stderr
    assert not (local / "f").exists()


def test_errors_no_such_file_and_a_directory_without_r(c, root, local):
    r = c.cli("cp", "box:does-not-exist", str(local / "x"))
    assert r.returncode == 1 and b"no such file" in r.stderr
    r = c.cli("cp", str(local / "nope"), "box:x")
    assert r.returncode == 1 and b"no such file" in r.stderr
    (root / "adir").mkdir()
    r = c.cli("cp", "box:adir", str(local / "x"))
    assert r.returncode == 1 and b"directory" in r.stderr


def test_paths_outside_the_root_are_refused(c, root, local, tmp_path):
    (local / "f").write_bytes(b"data")
    outside = Path(tempfile.mkdtemp(prefix="mh-outside-"))
    try:
        os.symlink(outside, root / "door")
        for dest in ("box:../escape", f"box:{outside}/x", "box:door/x"):
            r = c.cli("cp", str(local / "f"), dest)
            assert r.returncode == 125, (dest, r.stderr)
            assert b"outside the root" in r.stderr or b"'..'" in r.stderr
        assert os.listdir(outside) == []
        (outside / "secret").write_bytes(b"s")
        r = c.cli("cp", "box:door/secret", str(local / "s"))
        assert r.returncode == 125 and not (local / "s").exists()
    finally:
        shutil.rmtree(outside)


def test_a_setuid_source_arrives_without_setuid(c, root, local):
    src = local / "suid"
    src.write_bytes(b"#!/bin/sh\n")
    os.chmod(src, 0o6755)
    r = c.cli("cp", "-p", str(src), "box:suid")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((root / "suid").stat().st_mode) == 0o755
    os.chmod(root / "suid", 0o4755)
    r = c.cli("cp", "-p", "box:suid", str(local / "suid-back"))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((local / "suid-back").stat().st_mode) == 0o755


def test_an_overwrite_is_atomic_and_a_failed_copy_leaves_the_old_file(c, root, local):
    (root / "keep.txt").write_bytes(b"old")
    (local / "new.txt").write_bytes(b"new content")
    r = c.cli("cp", str(local / "new.txt"), "box:keep.txt")
    assert r.returncode == 0 and (root / "keep.txt").read_bytes() == b"new content"


def test_read_file_raw_gives_every_byte_of_a_3_mb_file(c, root):
    data = os.urandom(3_000_000)
    (root / "three.bin").write_bytes(data)
    r = c.cli("call", "--hand", "box", "read_file", "path=three.bin", "--raw")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) == 3_000_000 and r.stdout == data


def test_args_from_a_file_and_stdin_and_bytes_arguments(c, root, local):
    (local / "args.json").write_text(json.dumps({"path": "from-args.txt", "data": "via @file"}))
    r = c.cli("call", "--hand", "box", "write_file", "--args", f"@{local / 'args.json'}")
    assert r.returncode == 0, r.stderr
    assert (root / "from-args.txt").read_text() == "via @file"
    r = c.cli(
        "call", "--hand", "box", "write_file", "--args", "-", input=b'{"path": "from-stdin.txt", "data": "via -"}'
    )
    assert r.returncode == 0, r.stderr
    assert (root / "from-stdin.txt").read_text() == "via -"
    blob = bytes(range(256)) * 1000
    (local / "blob").write_bytes(blob)
    r = c.cli("call", "--hand", "box", "write_file", "path=blob", f"data=@{local / 'blob'}")
    assert r.returncode == 0, r.stderr
    assert (root / "blob").read_bytes() == blob
    r = c.cli("call", "--hand", "box", "write_file", "path=at.txt", "data=@@literal")
    assert r.returncode == 0 and (root / "at.txt").read_text() == "@literal"
    r = c.cli("call", "--hand", "box", "read_file", "path=at.txt")
    assert json.loads(r.stdout)["data"] == {"$bytes": "QGxpdGVyYWw="}


def test_policy_denies_copies_like_any_tool(tmp_path):
    with running(tmp_path, "ro", "--deny-tools", "put_file") as cl:
        (tmp_path / "f").write_bytes(b"x")
        r = cl.cli("cp", str(tmp_path / "f"), "ro:f")
        assert r.returncode == 125 and b"denied by this hand's policy" in r.stderr
        assert not (tmp_path / "root-ro" / "f").exists()
        (tmp_path / "root-ro" / "g").write_bytes(b"readable")
        r = cl.cli("cp", "ro:g", str(tmp_path / "g"))
        assert r.returncode == 0 and (tmp_path / "g").read_bytes() == b"readable"


def test_an_oversized_upload_is_refused_before_writing(tmp_path):
    with running(tmp_path, "small", "--max-upload-bytes", "1M") as cl:
        (tmp_path / "big").write_bytes(os.urandom(2 * MIB))
        r = cl.cli("cp", str(tmp_path / "big"), "small:big")
        assert r.returncode == 125 and b"max_upload_bytes" in r.stderr
        assert os.listdir(tmp_path / "root-small") == []  # not even a part file
        (tmp_path / "ok").write_bytes(os.urandom(MIB))
        assert cl.cli("cp", str(tmp_path / "ok"), "small:ok").returncode == 0


# --- resume -------------------------------------------------------------------------------------


@pytest.fixture
def px(tmp_path):
    with running(tmp_path, "box", via_proxy=True) as cl:
        yield cl


def _cut_when(cl, direction: str, at: int) -> None:
    """Cut the Hand's link (RST) once `at` bytes went `direction` through the proxy."""

    def moved() -> bool:
        conns = cl.proxy.status()["connections"]
        return any(conn[f"{direction}_bytes"] >= at for conn in conns)

    wait_until(moved, 120, f"{at} bytes {direction}", interval=0.02)
    cl.proxy.send("cut rst")
    cl.proxy.send("clear")


def test_an_upload_resumes_after_a_cut_without_resending_acknowledged_bytes(px, tmp_path):
    size = 24 * MIB
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    px.proxy.send("throttle 8000000 down")  # Mind -> Hand: the upload's direction
    p = px.cli_popen("cp", "--json", str(src), "box:up.bin")
    _cut_when(px, "down", size // 2)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    [res] = summaries(out)
    print("upload after cut:", res)
    assert res["attempts"] >= 2 and res["resumed_from"] and res["resumed_from"][0] > 0
    # Everything acknowledged before the cut was kept: at most a window per cut is sent twice.
    assert res["sent"] <= size + (res["attempts"] - 1) * WINDOW, res
    assert file_sha(tmp_path / "root-box" / "up.bin") == file_sha(src)
    assert parts(tmp_path / "root-box") == []


def test_a_download_resumes_after_a_cut(px, tmp_path):
    size = 24 * MIB
    data = os.urandom(size)
    (tmp_path / "root-box" / "down.bin").write_bytes(data)
    px.proxy.send("throttle 8000000 up")  # Hand -> Mind: the download's direction
    p = px.cli_popen("cp", "--json", "box:down.bin", str(tmp_path / "got.bin"))
    _cut_when(px, "up", size // 2)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    [res] = summaries(out)
    assert res["attempts"] >= 2 and res["resumed_from"][0] > 0
    assert res["sent"] == size  # each byte received once
    assert (tmp_path / "got.bin").read_bytes() == data and parts(tmp_path) == []


def test_a_killed_cp_is_continued_by_cp_resume(px, tmp_path):
    size = 16 * MIB
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    px.proxy.send("throttle 4000000 down")
    p = px.cli_popen("cp", str(src), "box:resumed.bin")
    root = tmp_path / "root-box"

    def half() -> bool:
        return any(os.path.getsize(root / n) >= size // 3 for n in parts(root))

    wait_until(half, 60, "a third of the part file", interval=0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    px.proxy.send("clear")
    assert not (root / "resumed.bin").exists()  # nothing under the final name
    wait_until(lambda: len(parts(root)) == 1, 20, "the part file kept for a resume")
    r = px.cli("cp", "--resume", "--json", str(src), "box:resumed.bin", timeout=120)
    assert r.returncode == 0, r.stderr
    [res] = summaries(r.stdout)
    assert res["resumed_from"][0] >= size // 3 and res["sent"] == size - res["resumed_from"][0]
    assert file_sha(root / "resumed.bin") == file_sha(src) and parts(root) == []


def test_a_killed_download_is_continued_by_cp_resume(px, tmp_path):
    size = 16 * MIB
    data = os.urandom(size)
    (tmp_path / "root-box" / "big.bin").write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    px.proxy.send("throttle 4000000 up")  # Hand -> Mind: the download's direction
    p = px.cli_popen("cp", "box:big.bin", str(out / "big.bin"))

    def third() -> bool:
        return any(os.path.getsize(out / n) >= size // 3 for n in parts(out))

    wait_until(third, 60, "a third of the local part file", interval=0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    px.proxy.send("clear")
    assert not (out / "big.bin").exists()
    r = px.cli("cp", "--resume", "--json", "box:big.bin", str(out / "big.bin"), timeout=120)
    assert r.returncode == 0, r.stderr
    [res] = summaries(r.stdout)
    assert res["resumed_from"][0] >= size // 3 and res["sent"] == size - res["resumed_from"][0]
    assert (out / "big.bin").read_bytes() == data and parts(out) == []


def test_copy_tools_without_a_stream_are_refused_not_hung(c):
    r = c.cli("call", "--hand", "box", "get_file", "path=empty", timeout=30)
    assert r.returncode == 125 and b"carries its bytes as a stream" in r.stderr


# --- as root: a full disk, the run user's permissions --------------------------------------------


needs_root = pytest.mark.usefixtures("as_root")


@needs_root
def test_a_full_disk_on_the_hand_leaves_the_old_file_intact(tmp_path):
    root = tmp_path / "root-box"
    small = root / "small"
    small.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        (small / "f.bin").write_bytes(b"the old content")
        (tmp_path / "big").write_bytes(os.urandom(5 * MIB))
        with running(tmp_path, "box") as cl:
            r = cl.cli("cp", str(tmp_path / "big"), "box:small/f.bin", timeout=60)
            assert r.returncode == 1, r.stderr
            assert b"no space left" in r.stderr
            assert (small / "f.bin").read_bytes() == b"the old content"
            assert parts(small) == []
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.fixture
def user():
    from hand.system.sandbox import lookup_user

    name = "mhc" + secrets.token_hex(4)
    subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", name], check=True)
    try:
        yield lookup_user(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@needs_root
def test_copies_act_as_the_run_user(tmp_path, user):
    base = Path(tempfile.mkdtemp(prefix="mh-cp-"))
    os.chmod(base, 0o755)
    try:
        root = base / "root"
        root.mkdir()
        os.chown(root, user.uid, user.gid)
        (root / "locked").mkdir()  # root's, 0755: the user cannot write into it
        (root / "secret").write_bytes(b"root only")
        os.chmod(root / "secret", 0o600)
        (tmp_path / "f").write_bytes(b"payload")
        with running(tmp_path, None) as cl:
            cl.start_hand("box", "--run-as", user.name, root=root)
            cl.wait_connected("box")
            r = cl.cli("cp", str(tmp_path / "f"), "box:locked/f")
            assert r.returncode == 1 and b"Permission denied" in r.stderr
            assert os.listdir(root / "locked") == []
            r = cl.cli("cp", "box:secret", str(tmp_path / "s"))
            assert r.returncode == 1 and b"Permission denied" in r.stderr and not (tmp_path / "s").exists()
            r = cl.cli("cp", str(tmp_path / "f"), "box:mine")
            assert r.returncode == 0, r.stderr
            assert (root / "mine").stat().st_uid == user.uid and (root / "mine").read_bytes() == b"payload"
            tree = tmp_path / "tree"  # a tree in one run: the same user, the same refusals
            (tree / "d").mkdir(parents=True)
            (tree / "d" / "g").write_bytes(b"in a tree")
            r = cl.cli("cp", "-r", str(tree), "box:locked/t")
            assert r.returncode != 0 and b"Permission denied" in r.stderr and os.listdir(root / "locked") == []
            r = cl.cli("cp", "-r", str(tree), "box:t")
            assert r.returncode == 0, r.stderr
            assert (root / "t" / "d" / "g").stat().st_uid == user.uid
            (root / "t" / "d" / "h").write_bytes(b"root's")
            os.chmod(root / "t" / "d" / "h", 0o600)
            r = cl.cli("cp", "-r", "box:t", str(tmp_path / "back"))
            assert r.returncode == 1 and b"Permission denied" in r.stderr
            assert (tmp_path / "back" / "d" / "g").read_bytes() == b"in a tree"
            assert not (tmp_path / "back" / "d" / "h").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- Hand to Hand, and the Python client's in-memory variants ------------------------------------


def test_hand_to_hand_goes_through_the_client(c, root, tmp_path):
    c.start_hand("box2")
    c.wait_connected("box2")
    data = os.urandom(2 * MIB + 3)
    (root / "h2h.bin").write_bytes(data)
    r = c.cli("cp", "box:h2h.bin", "box2:copied.bin")
    assert r.returncode == 0, r.stderr
    assert (c.tmp / "root-box2" / "copied.bin").read_bytes() == data


async def test_the_python_client_uploads_and_downloads_in_memory(c, root):
    from mind.client.aio import MindClient, load_credential
    from mind.client.files import CopyError

    data = os.urandom(3 * MIB + 1)

    async def pieces():
        for i in range(0, len(data), 100_000):
            yield data[i : i + 100_000]

    async with await MindClient.connect(c.url, load_credential(c.home / "admin.cred")) as mc:
        res = await mc.upload_bytes("box", pieces(), "mem.bin")
        assert res.sha256 == sha(data) and res.size == len(data)
        assert (root / "mem.bin").read_bytes() == data
        got = b"".join([chunk async for chunk in mc.download_iter("box", "mem.bin")])
        assert got == data
        with pytest.raises(CopyError, match="no such file"):
            await mc.download("box", "missing.bin", root.parent / "never")
        assert not (root.parent / "never").exists()


async def test_a_source_that_changes_while_it_is_sent_is_refused_and_nothing_is_renamed(c, root, tmp_path):
    """An upload is hashed as it is sent, the digest after the bytes (one read of the file): so the
    file's size and modification time are read again after its last byte, and a file written
    meanwhile ends its stream without the digest. The Hand refuses the part file, the old file at
    the destination stays, and the error says why."""
    from mind.client.aio import MindClient, load_credential
    from mind.client.files import CopyError

    src = tmp_path / "changing.bin"
    first = os.urandom(8 * MIB)
    src.write_bytes(first)
    (root / "kept.bin").write_bytes(b"the old file")
    touched = []

    def write_into_it(done: int, size: int) -> None:  # half way: the file is rewritten in place
        if done >= size // 2 and not touched:
            with open(src, "r+b") as f:
                f.write(os.urandom(MIB))
            touched.append(done)

    async with await MindClient.connect(c.url, load_credential(c.home / "admin.cred")) as mc:
        with pytest.raises(CopyError, match="changed while it was being copied") as err:
            await mc.upload("box", src, "kept.bin", on_progress=write_into_it)
        assert err.value.code == "local" and touched
        assert (root / "kept.bin").read_bytes() == b"the old file"
        assert parts(root) == []
        res = await mc.upload("box", src, "kept.bin")  # unchanged now: it goes through whole
        assert res.sha256 == file_sha(src) == file_sha(root / "kept.bin")


async def test_a_digest_that_does_not_match_the_bytes_is_refused(c, root):
    """The attack a forged stream makes: the bytes of one file and the digest of another after
    them. The Hand hashes what it wrote and compares: refused, no file, no part left."""
    from mind.client.aio import MindClient, load_credential
    from protocol import copy as rules

    data, other = os.urandom(3 * MIB), os.urandom(3 * MIB)

    async def stream():
        yield data
        yield hashlib.sha256(other).digest()

    args = {"path": "forged.bin", "size": len(data), "digest_follows": True}
    args["copy_id"] = rules.copy_id("box", "forged.bin", len(data), "forged")
    async with await MindClient.connect(c.url, load_credential(c.home / "admin.cred")) as mc:
        handle = await mc.start("box", "put_file", args, stdin=stream(), stream=True, watch=False)
        end = await handle.wait()
        assert end.state.value == "failed" and "sha256 mismatch" in (end.error or ""), end
        short = {**args, "path": "short.bin"}
        handle = await mc.start("box", "put_file", short, stdin=stream_short(data), stream=True, watch=False)
        end = await handle.wait()
        assert end.state.value == "failed" and "without the file's sha256" in (end.error or ""), end
    assert not (root / "forged.bin").exists() and not (root / "short.bin").exists()
    assert parts(root) == []


async def stream_short(data: bytes):
    yield data  # the file's bytes, and no digest after them
