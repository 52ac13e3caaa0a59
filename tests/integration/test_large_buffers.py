"""Both daemons keep the memory of their large buffers between uses (`protocol.io.heap`): a Hand's
`read_file` of 4 MiB faulted in about 16 MiB of fresh pages every time (the bytes read, the frame,
its masked copy), a third of the Hand's CPU per read; a Mind relaying a stream over `wss://` faulted
in 60 % of its bytes' worth of pages. Counted in page faults, not in time: a machine's speed does
not change how many pages the kernel had to find."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from mind.client import MindClient
from mind.client.credentials import load_credential
from mind.testing.cluster import Cluster, program, running

pytestmark = pytest.mark.slow  # processes of their own: a Python child, a real Mind and Hand

BURSTS = textwrap.dedent(
    """
    import resource, sys
    if sys.argv[1] == "kept":
        from protocol.io import heap
        assert heap.keep_large_buffers()
    def burst():  # four 4 MiB buffers alive at once, as a large read's are, then all freed
        bufs = [b"\\x01" * (4 << 20) for _ in range(4)]
        del bufs
    for _ in range(5):
        burst()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        burst()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 20)
    """
)


def _faults_per_burst(mode: str) -> int:
    r = subprocess.run([sys.executable, "-c", BURSTS, mode], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def test_large_buffers_freed_and_made_again_fault_in_no_new_pages():
    # The control shows what the C library does by itself here (each burst's 16 MiB faulted in
    # again: 4,096 pages); kept, the same bursts reuse the heap's pages.
    assert _faults_per_burst("default") >= 1024
    assert _faults_per_burst("kept") < 64


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def test_the_hand_serves_4_mib_reads_without_faulting_in_their_buffers_each_time(tmp_path):
    data = os.urandom(4 << 20)
    with running(tmp_path, "box") as cl:
        (cl.tmp / "root-box" / "big.bin").write_bytes(data)
        hand = cl.hands["box"].pid

        async def reads(n: int) -> None:
            async with await MindClient.connect(cl.url, load_credential(cl.home / "admin.cred")) as mc:
                for _ in range(n):
                    end = await mc.exec("box", "read_file", {"path": "big.bin", "limit": 4 << 20}, timeout=30)
                    assert end.value is not None and end.value["data"] == data

        asyncio.run(asyncio.wait_for(reads(5), 60))
        before = _minor_faults(hand)
        asyncio.run(asyncio.wait_for(reads(20), 120))
        per_read = (_minor_faults(hand) - before) / 20
    # Before: ~3,000-4,000 pages (12-16 MiB) per read. Kept: what a run's own objects need.
    assert per_read < 256, per_read


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    out = subprocess.run([str(ROOT / "scripts" / "mkcerts"), str(d)], capture_output=True, text=True, check=True)
    return d, next(ln.split()[-1] for ln in out.stdout.splitlines() if ln.startswith("pin:"))


@contextlib.contextmanager
def _over_wss(tmp_path, certs, size: int) -> Iterator[tuple[Cluster, Path]]:
    """A Mind serving `wss://`, a Hand `box` pinning it, and a file of `size` random bytes."""
    d, pin = certs
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    with running(
        tmp_path, hand=None, mind_args=("--tls-cert", str(d / "mind.crt"), "--tls-key", str(d / "mind.key"))
    ) as cl:
        cl.start_hand("box", "--pin", pin)
        cl.wait_connected("box")
        yield cl, src


def test_the_mind_relays_a_stream_over_wss_without_faulting_in_its_buffers(tmp_path, certs):
    with _over_wss(tmp_path, certs, 128 << 20) as (cl, src):
        mind = cl.mind.pid  # type: ignore[union-attr]
        warm = cl.cli("exec", "--hand", "box", "--", "head", "-c", str(8 << 20), str(src), timeout=60)
        assert warm.returncode == 0 and len(warm.stdout) == 8 << 20  # a run's own start paid here
        before = _minor_faults(mind)
        r = cl.cli("exec", "--hand", "box", "--", "cat", str(src), timeout=120)
        per_mib = (_minor_faults(mind) - before) / 128
    assert r.returncode == 0 and len(r.stdout) == 128 << 20
    # Before: ~150 pages per MiB relayed (of 256). Kept: what the connection's own objects need.
    assert per_mib < 32, per_mib


def test_mind_cp_moves_a_file_over_wss_without_faulting_in_its_buffers(tmp_path, certs):
    # The CLI's side of a copy: its chunks, framed, encrypted, freed and made again.
    with _over_wss(tmp_path, certs, 128 << 20) as (cl, src):
        p = subprocess.Popen([*program("mind"), "cp", str(src), "box:up.bin"], env=cl.env, stdout=subprocess.DEVNULL)
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            p.returncode = 0  # reaped here: Popen must not wait for it again
        assert os.waitstatus_to_exitcode(status) == 0
        assert (cl.tmp / "root-box" / "up.bin").read_bytes() == src.read_bytes()
    # Before: 420-590 pages per MiB sent (of 256). Kept: ~35, the CLI's own start included.
    assert usage.ru_minflt / 128 < 128, usage.ru_minflt / 128
