"""A fault-injecting TCP proxy for putting failure between a Hand and a Mind, on command.

Run by hand:
    python tests/support/faultproxy.py --listen 127.0.0.1:7471 --target 127.0.0.1:7470 --control 127.0.0.1:7472
    hand run --mind ws://127.0.0.1:7471 ...
    printf 'cut fin\n' | nc 127.0.0.1 7472        # or: blackhole, resume, refuse, accept, status, cut rst

From pytest: `FaultProxy.start(target_port)` runs it as a subprocess and `.send("cut fin")`.

Commands (one line each, answered with one line starting `ok` or `error`):
  status            connections and mode
  cut fin|rst       close every live connection, both sides (FIN), or reset it (RST)
  blackhole         stop forwarding in both directions without closing (the peer sees silence)
  resume            forward again (what was held is delivered)
  refuse            new connections are closed at once (the path is down)
  accept            new connections are proxied again
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(eq=False)
class Pair:
    id: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)


class Proxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.pairs: dict[int, Pair] = {}
        self.refusing = False
        self.blackholed = False
        self._next = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            _abort(writer)
            return
        try:
            ureader, uwriter = await asyncio.open_connection(*self.target)
        except OSError:
            _abort(writer)
            return
        self._next += 1
        pair = Pair(self._next, writer, uwriter)
        if not self.blackholed:
            pair.flowing.set()
        self.pairs[pair.id] = pair
        pair.tasks = [
            asyncio.create_task(self._pump(pair, reader, uwriter)),
            asyncio.create_task(self._pump(pair, ureader, writer)),
        ]
        try:
            await asyncio.gather(*pair.tasks, return_exceptions=True)
        finally:
            self.pairs.pop(pair.id, None)
            for w in (writer, uwriter):
                w.close()

    async def _pump(self, pair: Pair, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                await pair.flowing.wait()
                data = await src.read(65536)
                if not data:
                    break
                await pair.flowing.wait()  # blackholed while we read: hold it
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for t in pair.tasks:
                if t is not asyncio.current_task():
                    t.cancel()

    def command(self, line: str) -> str:
        words = line.split()
        if not words:
            return "error empty command"
        cmd, rest = words[0], words[1:]
        if cmd == "status":
            return "ok " + json.dumps({"connections": len(self.pairs), "refusing": self.refusing, "blackholed": self.blackholed})
        if cmd == "cut":
            mode = rest[0] if rest else "fin"
            n = len(self.pairs)
            for pair in list(self.pairs.values()):
                for w in (pair.client, pair.upstream):
                    _abort(w) if mode == "rst" else w.close()
                for t in pair.tasks:
                    t.cancel()
            return f"ok cut {n}"
        if cmd == "blackhole":
            self.blackholed = True
            for pair in self.pairs.values():
                pair.flowing.clear()
            return f"ok blackholed {len(self.pairs)}"
        if cmd == "resume":
            self.blackholed = False
            for pair in self.pairs.values():
                pair.flowing.set()
            return f"ok resumed {len(self.pairs)}"
        if cmd == "refuse":
            self.refusing = True
            return "ok refusing"
        if cmd == "accept":
            self.refusing = False
            return "ok accepting"
        return f"error unknown command {cmd!r}"

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write((self.command(line.decode(errors="replace")) + "\n").encode())
                await writer.drain()
        finally:
            writer.close()


def _abort(w: asyncio.StreamWriter) -> None:
    sock = w.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    w.transport.abort()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def main_async(args: argparse.Namespace) -> None:
    proxy = Proxy(_addr(args.target))
    server = await asyncio.start_server(proxy.handle, *_addr(args.listen))
    control = await asyncio.start_server(proxy.control, *_addr(args.control))
    ports = {
        "listen": server.sockets[0].getsockname()[1],
        "control": control.sockets[0].getsockname()[1],
    }
    print(json.dumps(ports), flush=True)
    async with server, control:
        await asyncio.gather(server.serve_forever(), control.serve_forever())


def main() -> None:
    ap = argparse.ArgumentParser(description="fault-injecting TCP proxy (see module docstring)")
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--target", required=True)
    ap.add_argument("--control", default="127.0.0.1:0")
    try:
        asyncio.run(main_async(ap.parse_args()))
    except KeyboardInterrupt:
        pass


class FaultProxy:
    """The proxy as a subprocess, for tests: `.url`, `.send(cmd)`, `.stop()`."""

    def __init__(self, proc: subprocess.Popen, listen: int, control: int) -> None:
        self.proc = proc
        self.port = listen
        self.url = f"ws://127.0.0.1:{listen}"
        self.control_port = control

    @classmethod
    def start(cls, target_port: int) -> "FaultProxy":
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--target", f"127.0.0.1:{target_port}"],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise RuntimeError("fault proxy did not start")
        ports = json.loads(line)
        return cls(proc, ports["listen"], ports["control"])

    def send(self, command: str) -> str:
        with socket.create_connection(("127.0.0.1", self.control_port), timeout=10) as s:
            s.sendall(command.encode() + b"\n")
            f = s.makefile("rb")
            reply = f.readline().decode().strip()
        if not reply.startswith("ok"):
            raise RuntimeError(f"fault proxy: {reply}")
        return reply

    def status(self) -> dict:
        return json.loads(self.send("status")[3:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


if __name__ == "__main__":
    main()
