"""Streams (DESIGN §11) with real processes: stdin as ssh forwards it, output complete and live,
flow control that blocks the remote producer instead of growing the Mind, and the truth about
bytes that could not be delivered."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from mind.testing.cluster import BIN, pid_alive, running, wait_until

pytestmark = pytest.mark.slow  # a real Mind, a real Hand, the `mind` CLI

MIB = 1 << 20


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    with running(tmp_path_factory.mktemp("streams")) as cl:
        yield cl


@pytest.fixture
def root(c) -> Path:
    return c.tmp / "root-box"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("size", [0, 1, 5_000_000])
def test_stdin_reaches_the_command_whole(c, size):
    data = os.urandom(size)
    r = c.cli("exec", "--hand", "box", "--", "sha256sum", input=data, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_a_command_that_never_reads_stdin_ends_normally(c):
    r = c.cli("exec", "--hand", "box", "--", "sh", "-c", "echo done; exit 4", input=os.urandom(8 * MIB), timeout=60)
    assert r.returncode == 4 and r.stdout == b"done\n"


def test_no_stdin_gives_dev_null(c):
    r = c.cli("exec", "-n", "--hand", "box", "--", "wc", "-c", input=b"not for the command", timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == b"0"


def test_tar_through_mind_exec_reproduces_a_tree(c, root, tmp_path):
    src = tmp_path / "tree"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "bin.dat").write_bytes(os.urandom(300_000))
    (src / "name with spaces é").write_text("unicode ✓\n")
    (src / "empty").write_bytes(b"")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(src, arcname="tree")
    (root / "dst").mkdir(exist_ok=True)
    r = c.cli("exec", "--hand", "box", "--", "tar", "x", "-C", "dst", input=buf.getvalue(), timeout=60)
    assert r.returncode == 0, r.stderr
    for f in src.rglob("*"):
        twin = root / "dst" / "tree" / f.relative_to(src)
        assert twin.exists(), twin
        if f.is_file():
            assert twin.read_bytes() == f.read_bytes()


def test_fifty_megabytes_per_stream_arrive_byte_exact_and_interleaved(c, root):
    (root / "both.py").write_text(
        "import os, sys\n"
        "o, e = sys.stdout.buffer, sys.stderr.buffer\n"
        "blk = bytes(range(256)) * 256\n"  # every byte value, 64 KiB
        "for i in range(800):\n"
        "    o.write(blk); e.write(blk[::-1])\n"
        "    if i % 100 == 0: o.flush(); e.flush()\n"
    )
    out, err = tmp_out = (root.parent / "o.bin", root.parent / "e.bin")
    with open(out, "wb") as fo, open(err, "wb") as fe:
        p = subprocess.run(
            [str(BIN / "mind"), "exec", "--hand", "box", "--", "python3", "both.py"],
            env=c.env,
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            timeout=180,
        )
    assert p.returncode == 0
    blk = bytes(range(256)) * 256
    assert out.read_bytes() == blk * 800
    assert err.read_bytes() == blk[::-1] * 800
    del tmp_out


def test_output_is_live_after_the_first_mebibyte(c, root):
    """A line printed after the first MiB appears when it is printed, not at the end."""
    (root / "late.py").write_text(
        "import sys, time\n"
        "sys.stdout.write('x' * (2 << 20) + '\\n'); sys.stdout.flush()\n"
        "time.sleep(0.5); print('LIVE', flush=True)\n"
        "time.sleep(3); print('END', flush=True)\n"
    )
    p = subprocess.Popen(
        [str(BIN / "mind"), "exec", "--hand", "box", "--", "python3", "late.py"],
        env=c.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None
        p.stdout.read((2 << 20) + 1)
        line = p.stdout.readline()
        seen = time.monotonic()
        assert line == b"LIVE\n"
        assert p.stdout.readline() == b"END\n"
        ended = time.monotonic()
        assert ended - seen > 2.0, "LIVE arrived only at the end"
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()


def test_a_slow_reader_blocks_the_producer_and_the_mind_stays_small(c, root):
    (root / "big.bin").write_bytes(os.urandom(64 * MIB))
    mind_pid = c.mind.pid
    idle = rss_kib(mind_pid)
    p = subprocess.Popen(
        [str(BIN / "mind"), "exec", "--hand", "box", "--", "cat", "big.bin"],
        env=c.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None
        first = p.stdout.read(MIB)  # then stop reading: every buffer on the path fills
        assert len(first) == MIB

        def blocked_cat() -> int | None:
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    wchan = Path(f"/proc/{pid}/wchan").read_text()
                except OSError:
                    continue
                if cmd == b"cat\x00big.bin\x00" and "pipe_write" in wchan:
                    return int(pid)
            return None

        cat = wait_until(blocked_cat, 20, "the remote cat to block on its pipe")
        assert pid_alive(cat)
        time.sleep(1.0)  # a second of a stalled reader: nothing may pile up in the Mind
        assert rss_kib(mind_pid) - idle < 16 * 1024
        digest = hashlib.sha256(first)
        while chunk := p.stdout.read(4 * MIB):
            digest.update(chunk)
        assert p.wait(timeout=60) == 0
        assert digest.hexdigest() == hashlib.sha256((root / "big.bin").read_bytes()).hexdigest()
    finally:
        p.kill()
        p.wait()


def test_the_output_limit_cuts_a_stream_and_says_so(c, root):
    (root / "three.bin").write_bytes(os.urandom(3 * MIB))
    r = c.cli("exec", "--hand", "box", "--output-limit", "1M", "--", "cat", "three.bin", timeout=60)
    assert r.stdout == (root / "three.bin").read_bytes()[:MIB]
    assert r.returncode == 122, "never 0 when bytes were not delivered"
    assert b"stdout: cut at offset 1048576" in r.stderr and b"2097152 bytes of 3145728" in r.stderr
    r = c.cli("exec", "--hand", "box", "--json", "--output-limit", "1M", "--", "cat", "three.bin", timeout=60)
    out = json.loads(r.stdout)
    assert r.returncode == 122 and out["delivered"]["stdout"]["bytes"] == MIB


def test_a_reader_that_goes_away_stops_the_remote_writer(c):
    p = subprocess.run(
        f"{BIN / 'mind'} exec --hand box -- yes | head -c 5",
        shell=True,
        env=c.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        executable="/bin/bash",
    )
    assert p.stdout == b"y\ny\ny"
    assert b"signal" not in p.stderr, p.stderr  # `cmd | head` is not a failure worth a word


def test_the_python_client_takes_bytes_files_and_async_iterators(c, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mind.client import MindClient, load_credential
    from protocol.messages import StreamData

    big = tmp_path / "in.bin"
    big.write_bytes(os.urandom(3 * MIB))

    async def main() -> None:
        cred = load_credential(c.home / "admin.cred")
        async with await MindClient.connect(c.url, cred) as mc:
            end = await mc.exec("box", "exec", {"argv": ["sha256sum"]}, stdin=big.read_bytes(), timeout=60)
            assert end.stdout.data.split()[0].decode() == hashlib.sha256(big.read_bytes()).hexdigest()
            with big.open("rb") as f:
                end = await mc.exec("box", "exec", {"argv": ["wc", "-c"]}, stdin=f, timeout=60)
            assert end.stdout.data.strip() == str(3 * MIB).encode()

            async def lines():
                for i in range(1000):
                    yield b"%d\n" % i

            got = bytearray()
            end = await mc.exec(
                "box",
                "exec",
                {"argv": ["cat"]},
                stdin=lines(),
                on_event=lambda e: got.extend(e.data) if isinstance(e, StreamData) else None,
                timeout=60,
            )
            want = b"".join(b"%d\n" % i for i in range(1000))
            assert bytes(got) == want and end.stdout.sent == len(want)
            assert end.stdout.sha256 == hashlib.sha256(want).hexdigest()

    asyncio.run(main())


def test_a_hand_lost_mid_stream_names_what_was_delivered(c, root):
    (root / "slow.sh").write_text("head -c 300000 /dev/zero; sleep 30\n")
    p = subprocess.Popen(
        [str(BIN / "mind"), "exec", "--hand", "box", "--", "sh", "slow.sh"],
        env=c.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None
        assert len(p.stdout.read(300_000)) == 300_000
        c.hands["box"].kill9()
        out, err = p.communicate(timeout=30)
        assert p.returncode == 255
        assert b"stdout: delivered up to offset 300000" in err
    finally:
        p.kill()
        p.wait()
        c.start_hand("box")
        c.wait_connected("box", min_gen=2)
