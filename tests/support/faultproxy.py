"""A fault-injecting TCP proxy for putting failure between a Hand and a Mind, on command.

Run by hand:
    python tests/support/faultproxy.py --listen 127.0.0.1:7471 --target 127.0.0.1:7470 --control 127.0.0.1:7472
    hand run --mind ws://127.0.0.1:7471 ...
    python tests/support/faultproxy.py --control 127.0.0.1:7472 --send 'cut fin'   # or blackhole, resume, ...

From pytest: `FaultProxy.start(target_port)` runs it as a subprocess and `.send("cut fin")`.

Commands (one line each, answered with one line starting `ok` or `error`). DIR is `up` (Hand to
Mind), `down` (Mind to Hand) or `both` (the default); ID is a connection id from `status` (default:
every live connection, and the default for new ones):
  status                  connections (id, bytes each way, faults) and the defaults
  cut fin|rst [ID]        close the connection on both sides (FIN), or reset it (RST); held data is lost
  blackhole [DIR] [ID]    stop forwarding without closing (the peer sees silence; data is held)
  resume [DIR] [ID]       forward again (what was held is delivered, in order)
  delay MS [DIR] [ID]     hold every chunk MS milliseconds before forwarding it (0: none)
  throttle BPS [DIR] [ID] forward at most BPS bytes per second (0: unlimited)
  refuse                  new connections are closed at once (the path is down)
  accept                  new connections are proxied again
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Faults:
    """What happens to one direction of one connection."""

    flowing: bool = True
    delay: float = 0.0
    rate: float = 0.0  # bytes per second; 0 = unlimited

    def copy(self) -> Faults:
        return Faults(self.flowing, self.delay, self.rate)


class Direction:
    """One way of one connection: a reader that takes bytes off the source as they come, and a
    writer that forwards them in order once their delay has passed, at the throttled rate, and only
    while flowing. Held bytes stay in order; nothing is reordered or duplicated."""

    def __init__(self, name: str, src: asyncio.StreamReader, dst: asyncio.StreamWriter, faults: Faults) -> None:
        self.name = name
        self.src = src
        self.dst = dst
        self.faults = faults
        self.bytes = 0
        self.held = 0
        """Bytes read from the source and not yet forwarded (blackholed, delayed or throttled)."""
        self._queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        self._flowing = asyncio.Event()
        self._next_free = 0.0
        self.apply()

    def apply(self) -> None:
        if self.faults.flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await self.src.read(65536):
                self.held += len(data)
                self._queue.put_nowait((loop.time() + self.faults.delay, data))
        except (ConnectionError, OSError):
            pass
        self._queue.put_nowait(None)

    async def _send(self, data: bytes) -> None:
        """Forward `data`; throttled, in slices of a tenth of a second's worth, paced before sending."""
        loop = asyncio.get_running_loop()
        while data:
            rate = self.faults.rate
            piece = data if rate <= 0 else data[: max(1, int(rate / 10))]
            data = data[len(piece) :]
            if rate > 0:
                if (wait := self._next_free - loop.time()) > 0:
                    await asyncio.sleep(wait)
                self._next_free = max(loop.time(), self._next_free) + len(piece) / rate
            self.dst.write(piece)
            self.held -= len(piece)
            await self.dst.drain()
            self.bytes += len(piece)

    async def write(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := await self._queue.get()) is not None:
                at, data = item
                if (wait := at - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await self._flowing.wait()
                await self._send(data)
            await self._flowing.wait()
            if self.dst.can_write_eof():
                self.dst.write_eof()  # pass the FIN on, after everything before it
        except (ConnectionError, OSError):
            pass


@dataclass(eq=False)
class Pair:
    id: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    up: Direction
    down: Direction
    tasks: list[asyncio.Task] = field(default_factory=list)

    def directions(self, which: str) -> list[Direction]:
        return {"up": [self.up], "down": [self.down], "both": [self.up, self.down]}[which]


class Proxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.pairs: dict[int, Pair] = {}
        self.refusing = False
        self.defaults = {"up": Faults(), "down": Faults()}
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
        up = Direction("up", reader, uwriter, self.defaults["up"].copy())
        down = Direction("down", ureader, writer, self.defaults["down"].copy())
        pair = Pair(self._next, writer, uwriter, up, down)
        self.pairs[pair.id] = pair
        pair.tasks = [asyncio.create_task(c) for c in (up.read(), up.write(), down.read(), down.write())]
        try:
            await asyncio.gather(*pair.tasks, return_exceptions=True)
        finally:
            self.pairs.pop(pair.id, None)
            for w in (writer, uwriter):
                w.close()

    def _targets(self, args: list[str]) -> tuple[str, list[Pair], bool]:
        """Parse `[DIR] [ID]` -> (direction, pairs, also_defaults)."""
        which, ident = "both", None
        for a in args:
            if a in ("up", "down", "both"):
                which = a
            else:
                ident = int(a)
        if ident is None:
            return which, list(self.pairs.values()), True
        if ident not in self.pairs:
            raise ValueError(f"no connection {ident}")
        return which, [self.pairs[ident]], False

    def _set(self, args: list[str], **change: object) -> str:
        which, pairs, defaults = self._targets(args)
        if defaults:
            for d in ("up", "down") if which == "both" else (which,):
                for k, v in change.items():
                    setattr(self.defaults[d], k, v)
        for pair in pairs:
            for d in pair.directions(which):
                for k, v in change.items():
                    setattr(d.faults, k, v)
                d.apply()
        return f"ok {len(pairs)}"

    def command(self, line: str) -> str:
        words = line.split()
        if not words:
            return "error empty command"
        cmd, rest = words[0], words[1:]
        try:
            if cmd == "status":
                conns = [
                    {
                        "id": p.id,
                        "up_bytes": p.up.bytes,
                        "down_bytes": p.down.bytes,
                        "up_held": p.up.held,
                        "down_held": p.down.held,
                        "up": vars(p.up.faults),
                        "down": vars(p.down.faults),
                    }
                    for p in self.pairs.values()
                ]
                return "ok " + json.dumps(
                    {
                        "connections": conns,
                        "refusing": self.refusing,
                        "defaults": {k: vars(v) for k, v in self.defaults.items()},
                    }
                )
            if cmd == "cut":
                mode = rest[0] if rest and rest[0] in ("fin", "rst") else "fin"
                _, pairs, _ = self._targets([a for a in rest if a not in ("fin", "rst")])
                for pair in pairs:
                    for t in pair.tasks:
                        t.cancel()
                    for w in (pair.client, pair.upstream):
                        _abort(w) if mode == "rst" else w.close()
                return f"ok cut {len(pairs)}"
            if cmd == "blackhole":
                return self._set(rest, flowing=False)
            if cmd == "resume":
                return self._set(rest, flowing=True)
            if cmd == "delay":
                return self._set(rest[1:], delay=max(0.0, float(rest[0]) / 1000))
            if cmd == "throttle":
                return self._set(rest[1:], rate=max(0.0, float(rest[0])))
            if cmd == "refuse":
                self.refusing = True
                return "ok refusing"
            if cmd == "accept":
                self.refusing = False
                return "ok accepting"
        except (ValueError, IndexError) as exc:
            return f"error {exc or 'bad arguments'}"
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
    ap.add_argument("--target")
    ap.add_argument("--control", default="127.0.0.1:0")
    ap.add_argument("--send", metavar="COMMAND", help="send one command to a running proxy's --control port and exit")
    args = ap.parse_args()
    if args.send is not None:
        host, port = _addr(args.control)
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(args.send.encode() + b"\n")
            reply = s.makefile("rb").readline().decode().strip()
        print(reply)
        raise SystemExit(0 if reply.startswith("ok") else 1)
    if args.target is None:
        ap.error("--target is required to run the proxy")
    try:
        asyncio.run(main_async(args))
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
    def start(cls, target_port: int) -> FaultProxy:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--target", f"127.0.0.1:{target_port}"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
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
