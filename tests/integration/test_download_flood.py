"""Issue 23 attack 4, performed as the issue did it: a client whose credential allows only
`get_file` starts 1,000 downloads of a 4 MiB file and reads one frame every 0.5 s (or nothing).
Before the bounds the Mind went from 45 to 1,052 MiB and kept it after the client left.

What a user relies on: the Mind's memory stays bounded while it happens, another client's
`mind exec` on the same Hand succeeds meanwhile, and once the flooding client is gone the Mind
gives the memory back. Every wait is bounded; the processes are the toolkit's, killed by PID.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest
from support.rawpeer import handshake
from websockets.exceptions import ConnectionClosed

from mind.client.aio import load_credential
from mind.core.budgets import STREAM_BUDGET_BYTES
from mind.testing.cluster import running, wait_until
from protocol import limits
from protocol.auth import Credential
from protocol.codes import RejectCode
from protocol.envelope import decode
from protocol.messages import Exec, Streams

pytestmark = pytest.mark.slow  # real Mind and Hand processes, hundreds of MiB moved

STARTS = 1000
RSS_BOUND_MIB = 100
"""What the flood may add to the Mind's RSS at its peak: the outbox bound (48 MiB) and a frame's
copies on the way out, with room for the allocator; it was +1,007 MiB."""
KEPT_BOUND_MIB = 16
"""What the Mind may still hold above its level before the flood, once the client is gone: its
allocator's slack (+6 MiB measured); +23 MiB was seen kept before the Mind trimmed its heap after
a connection that had queued megabytes."""


def status_mib(pid: int, field: str) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith(f"{field}:")) / 1024


class Peak:
    """The Mind's RSS sampled every 20 ms on a thread (VmHWM is the process's whole life, and the
    Mind's start-up is not the attack's)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, status_mib(self.pid, "VmRSS"))
            except (OSError, StopIteration):
                return

    def stop(self) -> float:
        self._stop.set()
        self._t.join(5)
        return self.peak


async def gone(*conns) -> None:
    """The flooding client leaves at once, its sockets closed before the test blocks on anything:
    `abort` only schedules the close, and a test that then waits synchronously (a CLI call, a
    poll) leaves the sockets open and the Mind serving them. That was the earlier attempt's stall:
    the Mind waited for a client the test believed gone."""
    for ws in conns:
        ws.transport.abort()
    async with asyncio.timeout(10):
        await asyncio.gather(*(ws.wait_closed() for ws in conns))


def client_cred(cl, name: str, *flags: str) -> Credential:
    path = cl.tmp / f"{name}.cred"
    r = cl.cli("client", "add", name, *flags, "--out", str(path))
    assert r.returncode == 0, r.stderr
    return load_credential(path)


def download(name: str) -> Exec:
    return Exec(
        hand="box",
        tool="get_file",
        args={"path": name, "offset": 0},
        timeout_ms=600_000,
        streams=Streams(output_limit=1 << 50),
        watch=False,
    )


@pytest.mark.alone  # a thousand downloads, and the Mind closing a slow reader within its bound
@pytest.mark.parametrize("reads", ["slowly", "nothing"])
async def test_attack4_a_thousand_downloads_read_slowly_hold_no_memory_and_delay_nobody(tmp_path, reads):
    with running(tmp_path) as cl:
        big = cl.hands["box"].root / "big.bin"
        big.write_bytes(os.urandom(4 << 20))
        getter = client_cred(cl, "getter", "--tools", "get_file")
        # one honest call first, so what it costs the Mind is in the level the flood is held to
        assert cl.cli("exec", "--hand", "box", "--", "echo", "warm").stdout == b"warm\n"
        before = status_mib(cl.mind.pid, "VmRSS")
        peak = Peak(cl.mind.pid)
        ws, ch = await handshake(cl.url, getter, max_queue=1)
        frames = 0

        async def flood() -> None:
            try:
                for i in range(STARTS):
                    await ws.send(ch.stamp(download(big.name), f"g{i}"))
            except ConnectionClosed:
                pass  # the Mind closed us: what the test waits for

        async def read_slowly() -> None:
            nonlocal frames
            try:
                while True:
                    decode(await ws.recv())
                    frames += 1
                    await asyncio.sleep(0.5)
            except ConnectionClosed:
                pass

        tasks = [asyncio.create_task(flood())]
        if reads == "slowly":
            tasks.append(asyncio.create_task(read_slowly()))
        try:
            await asyncio.sleep(3)  # the flood is under way: the Mind holds what it will hold
            # an unrelated client on the same Hand, meanwhile
            t0 = time.monotonic()
            other = await asyncio.to_thread(
                cl.cli, "exec", "--hand", "box", "--", "sh", "-c", "echo ok; head -c 100000 /dev/zero", timeout=30
            )
            took = time.monotonic() - t0
            assert other.returncode == 0, other.stderr
            assert other.stdout == b"ok\n" + bytes(100_000)
            # the Mind closes the client that does not keep up (or, failing that, the client leaves)
            overflow = lambda: "outbox_overflow" in cl.mind.output()
            await asyncio.to_thread(wait_until, overflow, 15, "the Mind to close the client that does not read")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await gone(ws)
        top = peak.stop()
        ends = [json.loads(ln) for ln in cl.mind.output().splitlines() if '"run_terminal"' in ln and '"getter"' in ln]
        refused = sum(1 for e in ends if e.get("reject_code") == RejectCode.QUOTA_EXCEEDED.value)
        streamed = sum(1 for e in ends if e.get("reject_code") is None)
        overflowed = "outbox_overflow" in cl.mind.output()
        print(
            f"attack 4 ({reads}): Mind RSS {before:.0f} -> peak {top:.0f} MiB with {STARTS} downloads started; "
            f"{frames} frames read; {streamed} streamed, {refused} refused quota_exceeded; "
            f"outbox overflow: {overflowed}; the other client's exec took {took:.2f}s"
        )
        assert top - before < RSS_BOUND_MIB, f"the Mind grew {top - before:.0f} MiB"
        assert took < 10, "the other client's exec was held up"
        # the client's stream budget admits a few dozen; the rest are refused (answers it never reads).
        # A download asks two windows (stdout, stderr) and holds one once its stderr has ended (an ended
        # stream holds nothing: `Relay.holds`), so at most a budget of single windows is admitted.
        assert streamed <= STREAM_BUDGET_BYTES // limits.STREAM_WINDOW, streamed
        assert refused > 0
        assert overflowed, "a peer that does not read is closed once its outbox is full"
        # the client is gone: the Mind ends its runs and gives the memory back
        wait_until(lambda: (cl.hand_info("box") or {}).get("running", 1) == 0, 30, "the flood's runs to end")
        kept = wait_until(
            lambda: (m := status_mib(cl.mind.pid, "VmRSS")) - before < KEPT_BOUND_MIB and m,
            20,
            "the Mind to give the flood's memory back",
            interval=0.5,
        )
        print(f"attack 4 ({reads}): Mind RSS {kept:.0f} MiB once the client left (before {before:.0f})")
        assert cl.cli("exec", "--hand", "box", "--", "echo", "ok").stdout == b"ok\n"


async def test_attack4_downloads_spread_over_connections_hold_no_more_memory(tmp_path):
    """The stream budget is the credential's, the outbox bound a connection's: the same 1,000
    downloads over 4 connections that read nothing (about 32 MiB of windows each, under one
    outbox's bound) must hold the Mind's memory no higher, and cost nobody anything."""
    with running(tmp_path) as cl:
        big = cl.hands["box"].root / "big.bin"
        big.write_bytes(os.urandom(4 << 20))
        getter = client_cred(cl, "getter", "--tools", "get_file")
        assert cl.cli("exec", "--hand", "box", "--", "echo", "warm").stdout == b"warm\n"
        before = status_mib(cl.mind.pid, "VmRSS")
        peak = Peak(cl.mind.pid)
        conns = [await handshake(cl.url, getter, max_queue=1) for _ in range(4)]

        async def flood(k: int) -> None:
            ws, ch = conns[k]
            try:
                for i in range(STARTS // len(conns)):
                    await ws.send(ch.stamp(download(big.name), f"g{k}-{i}"))
            except ConnectionClosed:
                pass

        try:
            async with asyncio.timeout(30):
                await asyncio.gather(*(flood(k) for k in range(len(conns))))
            await asyncio.sleep(5)  # what the Mind holds now, it holds for as long as the client stays
            t0 = time.monotonic()
            other = await asyncio.to_thread(cl.cli, "exec", "--hand", "box", "--", "echo", "ok", timeout=30)
            took = time.monotonic() - t0
            assert other.returncode == 0 and other.stdout == b"ok\n", other.stderr
            held = status_mib(cl.mind.pid, "VmRSS")
        finally:
            await gone(*(ws for ws, _ in conns))
        top = peak.stop()
        print(
            f"attack 4 (4 connections): Mind RSS {before:.0f} -> peak {top:.0f} MiB, {held:.0f} MiB 5 s later; "
            f"the other client's exec took {took:.2f}s"
        )
        assert top - before < RSS_BOUND_MIB, f"the Mind grew {top - before:.0f} MiB"
        assert took < 10
        wait_until(lambda: (cl.hand_info("box") or {}).get("running", 1) == 0, 30, "the flood's runs to end")
        kept = wait_until(
            lambda: (m := status_mib(cl.mind.pid, "VmRSS")) - before < KEPT_BOUND_MIB and m,
            30,
            "the Mind to give the flood's memory back",
            interval=0.5,
        )
        print(f"attack 4 (4 connections): Mind RSS {kept:.0f} MiB once the client left (before {before:.0f})")
