"""The `forward` figure (issue 37, DESIGN §18): `mind forward -L` against `ssh -L`, the same
destination servers, in the same run.

One Mind and a Hand `fwd` on loopback; two destination servers in a process of their own (an echo
server, and a source that sends N bytes of a pattern and closes); `mind forward fwd -L 0:... -L
0:... --json` as a user runs it, and `ssh -N -L ...` through our own sshd (benchlib.sshd, full mode
only). Measured from this process with plain sockets:
- one connection's throughput: the source's N bytes read to EOF through the tunnel (MiB/s), and N
  bytes sent to the same server as a sink, until it answered how many it counted (upload);
- connect -> first byte: connect, send one byte to the echo server, read it back (p50, p99);
- 100 connections at once, each echoing 1 MiB, every byte checked (wall time);
- the Mind's RSS per open, idle connection (100 held open).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

from benchlib.core import PY, Ctx, Row, med, ms, num, pct, ratio, rss_mib, spread, verdict
from benchlib.figures import figure, sshd

SERVERS = r"""
import asyncio, sys
async def echo(r, w):
    try:
        while data := await r.read(1 << 18):
            w.write(data)
            await w.drain()
        w.write_eof()
    except ConnectionError:
        pass
    finally:
        w.close()
async def source(r, w):
    try:
        line = (await r.readline()).strip()
        if not line:  # a probe that only connects (the readiness check of `ssh -L`'s port)
            return
        if line == b"sink":  # take everything to the EOF, then say how much
            got = 0
            while data := await r.read(1 << 20):
                got += len(data)
            w.write(b"%d\n" % got)
            await w.drain()
            return
        n = int(line)
        block = bytes(range(256)) * 4096
        while n > 0:
            w.write(block[: min(n, len(block))])
            n -= min(n, len(block))
            await w.drain()
    except ConnectionError:
        pass
    finally:
        w.close()
async def main():
    a = await asyncio.start_server(echo, "127.0.0.1", 0, backlog=1024)
    b = await asyncio.start_server(source, "127.0.0.1", 0, backlog=1024)
    print(a.sockets[0].getsockname()[1], b.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
BLOCK = bytes(range(256)) * 4096
STALL_S = 120.0
"""Every socket here gives up after this long without a byte: a tunnel that stalls is an ERROR row
naming this figure, never a benchmark that waits for ever."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def throughput(port: int, n: int) -> float:
    """MiB/s of `n` bytes from the source through `port`, checked."""
    with socket.create_connection(("127.0.0.1", port), timeout=STALL_S) as s:
        t0 = time.perf_counter()
        s.sendall(f"{n}\n".encode())
        got = 0
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while True:
            k = s.recv_into(view)
            if not k:
                break
            got += k
        dt = time.perf_counter() - t0
    if got != n:
        raise RuntimeError(f"{got} of {n} bytes came through")
    return n / dt / 2**20


def upload(port: int, n: int) -> float:
    """MiB/s of `n` bytes sent through `port` to the sink until it counted them all (after our EOF)."""
    with socket.create_connection(("127.0.0.1", port), timeout=STALL_S) as s:
        t0 = time.perf_counter()
        s.sendall(b"sink\n")
        view = memoryview(BLOCK)
        left = n
        while left > 0:
            left -= s.send(view[: min(left, len(view))])
        s.shutdown(socket.SHUT_WR)
        answer = s.makefile("rb").readline()
        dt = time.perf_counter() - t0
    if answer.strip() != str(n).encode():
        raise RuntimeError(f"the sink counted {answer.strip()!r} of {n} bytes")
    return n / dt / 2**20


def first_byte(port: int) -> float:
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=STALL_S) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise RuntimeError("the echo did not come back")
    return (time.perf_counter() - t0) * 1000


def many(port: int, conns: int, size: int) -> float:
    """`conns` connections at once, each sending `size` bytes and reading them back; wall seconds."""
    errors: list[str] = []
    payload = os.urandom(size)

    def one() -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=STALL_S) as s:
                sender = threading.Thread(target=lambda: (s.sendall(payload), s.shutdown(socket.SHUT_WR)))
                sender.start()
                got = bytearray()
                while chunk := s.recv(1 << 18):
                    got += chunk
                sender.join()
                if bytes(got) != payload:
                    errors.append(f"{len(got)} of {size} bytes, or not the same")
        except OSError as exc:
            errors.append(str(exc))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if errors:
        raise RuntimeError(f"{len(errors)} of {conns} connections wrong: {errors[0]}")
    return time.perf_counter() - t0


def idle_rss(mind_pid: int, port: int, conns: int) -> float:
    """KiB of the Mind's RSS per open connection (each has echoed one byte: its run is running)."""
    before = rss_mib(mind_pid)
    socks = []
    try:
        for _ in range(conns):
            s = socket.create_connection(("127.0.0.1", port), timeout=STALL_S)
            s.sendall(b"x")
            if s.recv(1) != b"x":
                raise RuntimeError("no echo")
            socks.append(s)
        time.sleep(0.5)
        return (rss_mib(mind_pid) - before) * 1024 / conns
    finally:
        for s in socks:
            s.close()


@figure("forward", "mind forward -L vs ssh -L: one connection's MiB/s, connect -> first byte, 100 at once")
def fig_forward(ctx: Ctx) -> list[Row]:
    d = ctx.dir("forward")
    cl = ctx.cluster("forward")
    cl.start_mind()
    cl.start_hand("fwd")
    cl.wait_connected("fwd")
    servers = subprocess.Popen([PY, "-c", SERVERS], stdout=subprocess.PIPE, text=True)
    ctx.on_close(servers.kill)
    echo_port, source_port = (int(x) for x in servers.stdout.readline().split())  # type: ignore[union-attr]
    fwd = subprocess.Popen(
        [
            *cl_mind(cl),
            "forward",
            "fwd",
            "-L",
            f"0:127.0.0.1:{echo_port}",
            "-L",
            f"0:127.0.0.1:{source_port}",
            "--json",
        ],
        env=cl.env,
        stdout=subprocess.PIPE,
        stderr=open(d / "forward.err", "wb"),
        text=True,
    )
    ctx.on_close(lambda: (fwd.terminate(), fwd.wait(10)))
    lines = [json.loads(fwd.stdout.readline()) for _ in range(2)]  # type: ignore[union-attr]
    ours_echo, ours_src = (int(x["listen"].rsplit(":", 1)[1]) for x in lines)
    s = sshd(ctx)
    ssh_echo = ssh_src = 0
    if not isinstance(s, str):
        ssh_echo, ssh_src = _free_port(), _free_port()
        argv = s.argv(mux=False)[:-1] + ["-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{ssh_echo}:127.0.0.1:{echo_port}",
                                        "-L", f"{ssh_src}:127.0.0.1:{source_port}", "root@127.0.0.1"]  # fmt: skip
        tunnel = subprocess.Popen(argv, env=s.env, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ctx.on_close(lambda: (tunnel.terminate(), tunnel.wait(10)))
        _wait_listening(ssh_echo)
        _wait_listening(ssh_src)
    n = (32 if ctx.quick else 256) << 20
    reps = 20 if ctx.quick else 100
    conns, each = (20, 256 << 10) if ctx.quick else (100, 1 << 20)
    tput_o, tput_s, fb_o, fb_s, many_o, many_s = [], [], [], [], [], []
    up_o: list[float] = []
    up_s: list[float] = []
    for _ in range(ctx.rounds):
        tput_o.append(throughput(ours_src, n))
        up_o.append(upload(ours_src, n))
        fb_o.append([first_byte(ours_echo) for _ in range(reps)])
        many_o.append(many(ours_echo, conns, each))
        if ssh_src:
            tput_s.append(throughput(ssh_src, n))
            up_s.append(upload(ssh_src, n))
            fb_s.append([first_byte(ssh_echo) for _ in range(reps)])
            many_s.append(many(ssh_echo, conns, each))
    rss_kib = idle_rss(cl.mind.pid, ours_echo, conns)
    fbo = [x for r in fb_o for x in r]
    fbs = [x for r in fb_s for x in r]
    no_ssh = s if isinstance(s, str) else ""
    ctx.note(
        "forward",
        f"one connection: {n >> 20} MiB from a source server, and {n >> 20} MiB to it (a sink that counts them); first byte: connect + 1 byte echoed, {reps} a round; "
        f"{conns} connections at once echoing {each >> 10} KiB each, every byte checked; ssh: "
        + (no_ssh or "-N -L through our own sshd, same servers"),
    )

    def ref(value: str) -> str:
        return value if ssh_src else f"n/a ({no_ssh})"

    def mibs(what: str, ours: list[float], theirs: list[float]) -> Row:
        """A throughput row, ours against `ssh -L` in the same rounds."""
        return Row(
            "forward",
            what,
            num(med(ours)),
            "",
            spread(ours, num),
            ref(f"{num(med(theirs))} (ssh -L)" if theirs else ""),
            ratio(med(ours), med(theirs)) if theirs else "",
            ">= 1.0x ssh -L",
            verdict(med(ours) >= med(theirs)) if theirs else "n/a",
        )

    return [
        mibs("one connection MiB/s", tput_o, tput_s),
        mibs("one connection MiB/s to a sink (upload)", up_o, up_s),
        Row(
            "forward",
            "connect -> first byte p50 ms",
            ms(med(fbo)),
            ms(pct(fbo, 99)),
            spread([med(r) for r in fb_o], ms),
            ref(f"{ms(med(fbs))} (ssh -L)" if fbs else ""),
            ratio(med(fbo), med(fbs)) if fbs else "",
            "<= 1.0x ssh -L",
            verdict(med(fbo) <= med(fbs)) if fbs else "n/a",
        ),
        Row(
            "forward",
            f"{conns} connections at once, {each >> 10} KiB echoed each, s",
            f"{med(many_o):.2f}",
            "",
            spread(many_o, lambda x: f"{x:.2f}"),
            ref(f"{med(many_s):.2f} (ssh -L)" if many_s else ""),
            ratio(med(many_o), med(many_s)) if many_s else "",
            "all exact; time reported",
            "info",
        ),
        Row(
            "forward",
            "Mind RSS per open idle connection KiB",
            f"{rss_kib:.0f}",
            "",
            "",
            "",
            "",
            "<= 64 KiB",
            verdict(rss_kib <= 64),
        ),
    ]


def cl_mind(cl) -> list[str]:
    from mind.testing.cluster import program

    return program("mind")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: scripts/bench forward")
