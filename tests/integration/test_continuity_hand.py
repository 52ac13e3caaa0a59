"""Issue 22, the Hand leg: a run outlives a blink of the Hand <-> Mind link (DESIGN §15).

Real processes: a Mind with a resume window, a Hand behind the fault proxy, `mind exec` as the
client. Each test asserts what a user relies on: the exit code and the sha256 of the complete
output (0 bytes lost, 0 duplicated), or, past the window, `lost` with the command's tree gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import select
import signal
import time
from collections.abc import Iterator

import pytest
from support.rawpeer import admin, handshake

from mind.testing.cluster import Cluster, pid_alive, running, wait_until
from protocol import limits
from protocol.messages import Exec, Pty, RunEnd, RunUpdate, StreamAck, StreamData, StreamResume, Streams
from protocol.streams import Incoming, Outgoing

pytestmark = pytest.mark.slow  # a real Mind, Hand and fault proxy

LINES = 36
TICKER = f"echo $$ > tick.pid; i=1; while [ $i -le {LINES} ]; do echo line $i; i=$((i+1)); sleep 0.25; done; exit 3"
"""About 9 s of a numbered line every 0.25 s, then exit 3 (a real exit code, not 0)."""
EXPECTED = b"".join(b"line %d\n" % i for i in range(1, LINES + 1))


@pytest.fixture
def cl(tmp_path) -> Iterator[Cluster]:
    with running(tmp_path, "box", via_proxy=True, mind_args=("--resume-window", "60")) as c:
        yield c


class Reader:
    """The stdout of a `mind exec` child, read as it comes, each read's time noted: how long
    output stopped around a cut is the largest gap between two reads."""

    def __init__(self, p) -> None:
        self.p = p
        self.data = b""
        self.times: list[tuple[float, int]] = []

    def until(self, needle: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.data:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {needle!r}; got {self.data[-200:]!r}"
            self._read(left)

    def rest(self, timeout: float) -> tuple[int, bytes, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"mind exec did not end; got {self.data[-200:]!r}"
            if not self._read(left):
                break
        err = self.p.stderr.read()
        return self.p.wait(timeout=max(1.0, deadline - time.monotonic())), self.data, err

    def _read(self, left: float) -> bool:
        ready, _, _ = select.select([self.p.stdout], [], [], left)
        if not ready:
            return True
        chunk = os.read(self.p.stdout.fileno(), 65536)
        if chunk:
            self.data += chunk
            self.times.append((time.monotonic(), len(self.data)))
        return bool(chunk)

    def longest_gap(self) -> float:
        """The longest silence between two reads (the command prints every 0.25 s)."""
        times = [when for when, _ in self.times]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    def stalled_after(self, t: float) -> float:
        """Seconds from `t` to the first output read after it."""
        later = [when for when, _ in self.times if when >= t]
        return later[0] - t if later else float("inf")


def exec_ticker(cl: Cluster, *extra: str):
    root = cl.hands["box"].root
    (root / "tick.pid").unlink(missing_ok=True)
    p = cl.cli_popen("exec", "--hand", "box", "-n", *extra, "--", "sh", "-c", TICKER)
    return p, Reader(p)


def generation(cl: Cluster) -> int:
    info = cl.hand_info("box")
    assert info is not None and info["connected"], info
    return int(info["generation"])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_hand_leg_blackholed_20s_mid_run_every_line_and_the_real_exit_code(cl):
    assert cl.proxy is not None
    gen = generation(cl)
    p, r = exec_ticker(cl)
    r.until(b"line 4\n", 15)
    cl.proxy.blackhole()
    t0 = time.monotonic()
    # While the Hand is away the run is still running, and the views say which leg is away.
    listed = wait_until(lambda: b"hand away since" in (out := cl.cli("runs").stdout) and out, 15, "mind runs to say so")
    line = next(ln for ln in listed.decode().splitlines() if "hand away since" in ln)
    assert " running " in f" {line} ", line
    run_id = line.split()[0]
    got = cl.cli("run", "get", run_id)
    assert got.returncode == 0 and b"away     hand away since" in got.stdout, got
    time.sleep(max(0.0, 20 - (time.monotonic() - t0)))
    cl.proxy.clear()
    healed = time.monotonic()
    code, out, err = r.rest(40)
    assert code == 3, err
    assert sha(out) == sha(EXPECTED), out
    assert generation(cl) > gen  # a new connection carried the run's end, not the old one
    print(f"output flowed again {r.stalled_after(healed):.2f} s after the heal")


def test_hand_leg_reset_mid_run_link_back_at_once_every_line_and_the_real_exit_code(cl):
    assert cl.proxy is not None
    gen = generation(cl)
    p, r = exec_ticker(cl)
    r.until(b"line 6\n", 15)
    cl.proxy.cut("rst")
    cut = time.monotonic()
    code, out, err = r.rest(40)
    assert code == 3, err
    assert sha(out) == sha(EXPECTED), out
    assert generation(cl) > gen
    print(f"output flowed again {r.stalled_after(cut):.2f} s after the reset; longest gap {r.longest_gap():.2f} s")


def test_window_shorter_than_the_outage_the_run_is_lost_and_its_tree_killed_on_the_hand(tmp_path):
    with running(tmp_path, "box", via_proxy=True, mind_args=("--resume-window", "3")) as cl:
        assert cl.proxy is not None
        p, r = exec_ticker(cl, "--json")
        pidfile = cl.hands["box"].root / "tick.pid"
        pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 15, "the command to start"))
        time.sleep(1)
        cl.proxy.blackhole()
        cut = time.monotonic()
        # The Hand notices the silence (pings, ~2 s), waits its window (3 s), kills the tree.
        wait_until(lambda: not pid_alive(pid), 9, "the Hand to kill the run's tree at the window's end")
        killed = time.monotonic() - cut
        cl.proxy.clear()
        code, out, err = r.rest(20)
        assert code == 255, err
        assert json.loads(out)["state"] == "lost"
        assert time.monotonic() - cut < 10  # long before the command would have ended by itself
        print(f"tree killed {killed:.2f} s after the cut")


def test_hand_killed_and_restarted_the_run_is_lost_as_soon_as_the_new_hand_is_welcomed(cl):
    assert cl.proxy is not None
    gen = generation(cl)
    p, r = exec_ticker(cl, "--json")
    pidfile = cl.hands["box"].root / "tick.pid"
    pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 15, "the command to start"))
    t0 = time.monotonic()
    try:
        cl.hands["box"].kill9()
        cl.start_hand("box", via=cl.proxy)
        code, out, err = r.rest(30)
        elapsed = time.monotonic() - t0
        assert code == 255, err
        end = json.loads(out)
        assert end["state"] == "lost", end
        assert "hand restarted" in json.dumps(end), end  # its presentation said so, not the window
        assert elapsed < 20, elapsed  # the restarted Hand presents nothing: lost at once, not at 60 s
        assert generation(cl) > gen
        print(f"lost {elapsed:.2f} s after the kill")
    finally:
        if pid_alive(pid):  # the crashed Hand's orphan (a crash cleans nothing up)
            os.kill(pid, signal.SIGKILL)


BIG = 64 << 20


def test_a_64mib_stream_with_two_hand_leg_resets_arrives_whole(cl):
    assert cl.proxy is not None
    gen = generation(cl)
    # Bytes that differ everywhere (a lost, repeated or misplaced chunk changes the digest).
    cmd = f"seq 1 20000000 | head -c {BIG}"
    p = cl.cli_popen("exec", "--hand", "box", "-n", "--", "sh", "-c", cmd)
    digest = hashlib.sha256()
    got = 0
    cuts = [BIG // 5, BIG // 2]
    deadline = time.monotonic() + 90
    assert p.stdout is not None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:  # say what the CLI said: a stall under load was seen once and not yet explained
            p.kill()
            said = p.stderr.read().decode(errors="replace") if p.stderr else ""
            raise AssertionError(f"the stream stalled at {got} bytes; the CLI said: {said[-2000:]!r}")
        ready, _, _ = select.select([p.stdout], [], [], left)
        if not ready:
            continue
        chunk = os.read(p.stdout.fileno(), 1 << 20)
        if not chunk:
            break
        digest.update(chunk)
        got += len(chunk)
        if cuts and got >= cuts[0]:
            cuts.pop(0)
            cl.proxy.cut("rst")
    assert p.wait(timeout=10) == 0, p.stderr.read() if p.stderr else b""
    expected = hashlib.sha256(b"".join(b"%d\n" % i for i in range(1, 20000001))[:BIG]).hexdigest()
    assert got == BIG
    assert digest.hexdigest() == expected
    assert not cuts
    assert generation(cl) >= gen + 2  # two resets, two new connections


# --- stdin through a Hand-leg reset, with a client that drives the one stream endpoint -----------------


class RawRun:
    """One streamed run from a client written against `protocol.streams` alone (`Outgoing` for
    stdin, `Incoming` for output), as every shell is meant to drive it: stdin fed within its
    credit (from the moment `ready` shows in the output), resent from where the Hand says on a
    `stream_resume`; the Hand leg reset once `cut_at` bytes of stdin went out."""

    def __init__(self, cl: Cluster, req: Exec, data: bytes, cut_at: int, ready: bytes = b"") -> None:
        self.cl, self.req, self.data, self.cut_at, self.ready = cl, req, data, cut_at, ready
        self.got: dict[str, bytes] = {}
        self.resumes = 0
        self.cut = False

    async def run(self, timeout: float = 60) -> RunEnd:
        assert self.cl.proxy is not None
        ws, ch = await handshake(self.cl.url, admin(self.cl))
        window = limits.STREAM_WINDOW
        stdin = Outgoing(window)
        incoming: dict[str, Incoming] = {}
        run_id: str | None = None
        fed = 0
        data = self.data

        async def send(msg) -> None:
            await ws.send(ch.stamp(msg))

        async def chunks(out: list) -> None:
            assert run_id is not None
            for offset, piece, eof in out:
                await send(StreamData(run_id=run_id, stream="stdin", offset=offset, data=piece, eof=eof))

        try:
            await ws.send(ch.stamp(self.req, id="r1"))
            async with asyncio.timeout(timeout):
                while True:
                    feeding = run_id is not None and self.ready in b"".join(self.got.values())
                    while feeding and fed < len(data) and stdin.credit() > 0:
                        n = min(stdin.credit(), len(data) - fed, limits.STREAM_CHUNK_MAX)
                        await chunks(stdin.send(data[fed : fed + n]))
                        fed += n
                        if not self.cut and fed >= self.cut_at:
                            self.cut = True
                            self.cl.proxy.cut("rst")
                    if feeding and fed == len(data) and not stdin.eof:
                        await chunks([stdin.close()])
                    msg = ch.receive(await ws.recv()).msg
                    if isinstance(msg, RunUpdate):
                        run_id = msg.run_id
                    elif isinstance(msg, StreamAck) and msg.stream == "stdin":
                        stdin.on_ack(msg.offset)
                    elif isinstance(msg, StreamResume) and msg.stream == "stdin":
                        self.resumes += 1
                        await chunks(stdin.resume(msg.offset, msg.consumed))
                    elif isinstance(msg, StreamData):
                        rx = incoming.setdefault(msg.stream, Incoming(window))
                        if rx.on_data(msg.offset, len(msg.data), msg.eof):
                            self.got[msg.stream] = self.got.get(msg.stream, b"") + msg.data
                            rx.consume(len(msg.data))
                            if (ack := rx.ack_due()) is not None:
                                await send(StreamAck(run_id=msg.run_id, stream=msg.stream, offset=ack))
                    elif isinstance(msg, RunEnd):
                        return msg
        finally:
            await ws.close()


async def test_stdin_through_sha256sum_with_a_hand_leg_reset_in_the_middle_arrives_once(cl):
    """6 MiB into `sha256sum` on the Hand, the Hand leg reset after 2 MiB: the Hand presents its
    stdin position, the Mind tells the client, the client resends from there. The digest the
    command prints is the digest of the bytes sent: 0 lost, 0 duplicated."""
    data = os.urandom(6 << 20)
    req = Exec(hand="box", tool="shell", args={"command": "sha256sum"}, timeout_ms=60_000, streams=Streams(stdin=True))
    raw = RawRun(cl, req, data, cut_at=2 << 20)
    end = await raw.run()
    assert raw.cut and raw.resumes == 1  # the Hand came back once and said where its stdin stood
    assert end.state.value == "succeeded" and end.exit_code == 0, end
    assert raw.got["stdout"] == f"{hashlib.sha256(data).hexdigest()}  -\n".encode(), raw.got


async def test_a_terminal_session_through_a_hand_leg_reset_keys_and_screen_arrive_once(cl):
    """The same through a terminal (`pty`: one output stream, keys as stdin): the session switches
    its terminal to raw (every byte a key, no echo), then 2 MiB of keys go to `sha256sum`, the Hand
    leg reset after 1 MiB. The screen shows the digest of exactly the keys typed, and the numbered
    lines printed around the cut arrive once each."""
    data = os.urandom(2 << 20)
    command = (
        "stty raw -echo -iexten; for i in 1 2 3 4 5; do echo screen $i; done; echo ready; "
        f"head -c {len(data)} | sha256sum; for i in 6 7 8; do echo screen $i; done"
    )
    req = Exec(
        hand="box",
        tool="shell",
        args={"command": command},
        timeout_ms=60_000,
        streams=Streams(pty=Pty(rows=24, cols=80)),
    )
    raw = RawRun(cl, req, data, cut_at=1 << 20, ready=b"ready\n")
    end = await raw.run()
    assert raw.cut and raw.resumes == 1
    assert end.state.value == "succeeded" and end.exit_code == 0, end
    screen = b"".join(b"screen %d\n" % i for i in range(1, 6)) + b"ready\n"
    screen += f"{hashlib.sha256(data).hexdigest()}  -\n".encode() + b"".join(b"screen %d\n" % i for i in (6, 7, 8))
    assert raw.got["pty"] == screen, raw.got["pty"][-300:]
