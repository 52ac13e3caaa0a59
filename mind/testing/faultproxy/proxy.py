"""The fault proxy's engine: an asyncio TCP proxy whose links fail on command.

One `Proxy` listens, connects each accepted connection to its target, and moves each direction's
bytes through a `Direction`: read, cut into units (`frames.py`: whole WebSocket messages when the link
is plain `ws://`, chunks otherwise), matched against frame rules, queued with their latency, then
written in order at the allowed rate, in slices, up to a byte limit, only while the path flows.
Nothing is reordered unless a rule says so (duplicate), and held bytes are delivered in order.

Commands are lines (`command()`), the same from the control port, the console script and the
Python API (`api.py`); the grammar is in the package docstring. An L4 fault naming no connection also
becomes a default that every later connection gets, which closes Toxiproxy's race of connections
made between a proxy's creation and its toxic's (its issue #148): a slow or broken path stays so for
a reconnect. A frame rule is an event, not a path condition, and naming no connection it touches the
live connections, or, when none is live, the next one to open, and no other (issue 24): "cut at the
first `accepted`, then let it reconnect" must not cut every reconnect too. `every` (a flag) makes a
frame rule a default for every later connection as well, as an L4 fault is.

Probabilities are Toxiproxy's `toxicity`: decided once per connection and fault, from the seed, the
connection's number (1, 2, ... in accept order) and the fault's name, so one seed gives the same
decisions in every run that opens its connections in the same order.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import random
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mind.testing.faultproxy.frames import Framer, Unit
from mind.testing.vocabulary import FRAME_ACTIONS, Fault
from protocol.errors import MindhandError

FLAGS = ("fin", "rst", "after", "every")
TARGET_WAIT_S = 30.0
DIRS = ("up", "down", "both")


class FaultProxyError(MindhandError, RuntimeError):
    """The proxy answered `error ...`, or could not be started or reached."""


class CommandError(FaultProxyError, ValueError):
    """A command line the proxy cannot perform; answered `error ...`, never raised to the loop."""


@dataclass
class FrameRule:
    """Act on the k-th (and, with `times`, the following) frame of `kind` in one direction."""

    action: str
    kind: str
    k: int = 1
    times: int = 1  # 0: every match from the k-th on
    ms: float = 0.0
    after: bool = False
    how: str = "rst"
    seen: int = 0
    fired: int = 0

    def match(self, kind: str) -> bool:
        if self.kind not in (kind, "*") or kind in ("http", "bytes"):  # frames only, never raw bytes
            return False
        self.seen += 1
        if self.seen < self.k or (self.times and self.fired >= self.times):
            return False
        self.fired += 1
        return True

    def public(self) -> dict[str, Any]:
        return {"action": self.action, "type": self.kind, "k": self.k, "times": self.times, "fired": self.fired}


@dataclass
class Faults:
    """What happens to one direction of one connection."""

    flowing: bool = True
    delay: float = 0.0  # latency, seconds
    jitter: float = 0.0
    rate: float = 0.0  # bytes per second; 0 = unlimited
    slow_close: float = 0.0
    timeout: float | None = None  # data dropped while set; the connection closes after it (0: never)
    slicer: tuple[int, int, float] | None = None  # average size, variation, delay between slices (s)
    limit: int | None = None
    rules: list[FrameRule] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k != "rules"}
        d["rules"] = [r.public() for r in self.rules]
        return d


_CUT = Unit(b"", "<cut>")


class Direction:
    """One way of one connection (see the module docstring for the pipeline)."""

    def __init__(self, pair: Pair, name: str, src: asyncio.StreamReader, dst: asyncio.StreamWriter, seed: str) -> None:
        self.pair = pair
        self.name = name
        self.src = src
        self.dst = dst
        self.faults = Faults()
        self.framer = Framer()
        self.rng = random.Random(seed)
        self.bytes = 0
        self.held = 0
        """Bytes read from the source and not yet forwarded (blackholed, held, delayed or throttled)."""
        self.dropped = 0
        self.writes = 0
        """Writes to the destination: the pieces a slicer or a rate cut the bytes into."""
        self.frames: Counter[str] = Counter()
        self.holding: list[Unit] | None = None
        self._eof_held = False
        self._queue: asyncio.Queue[tuple[float, Unit] | None] = asyncio.Queue()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._last_ready = 0.0
        self._next_free = 0.0

    def apply(self) -> None:
        if self.faults.flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    # --- reading: rules, holds ---

    async def read(self) -> None:
        try:
            while data := await self.src.read(65536):
                if self.faults.timeout is not None:
                    self.dropped += len(data)
                    continue
                for unit in self.framer.feed(data):
                    self._admit(unit)
        except (ConnectionError, OSError):
            pass
        if self.holding is not None:
            self._eof_held = True
        else:
            self._queue.put_nowait(None)

    def _admit(self, unit: Unit) -> None:
        self.frames[unit.kind] += 1
        self.held += len(unit.raw)
        fired = [r for r in self.faults.rules if r.match(unit.kind)]
        rule = fired[0] if fired else None
        if rule is not None:
            if rule.action == Fault.DROP:
                self.held -= len(unit.raw)
                self.dropped += len(unit.raw)
                return
            if rule.action == Fault.CUT:
                if not rule.after:
                    self.pair.cut(rule.how)
                    return
                self._pass(unit)
                self._pass(Unit(rule.how.encode(), _CUT.kind))
                return
            if rule.action == Fault.DUPLICATE:
                self.held += len(unit.raw)
                self._pass(unit)
                self._pass(unit)
                return
            if self.holding is None:  # hold, delay: this frame and the data after it wait
                self.holding = []
            if rule.action == Fault.DELAY:
                asyncio.get_running_loop().call_later(rule.ms / 1000, self.release)
        if self.holding is not None and not unit.control:
            self.holding.append(unit)
        else:
            self._enqueue(unit)

    def _pass(self, unit: Unit) -> None:
        if self.holding is not None:
            self.holding.append(unit)
        else:
            self._enqueue(unit)

    def _enqueue(self, unit: Unit) -> None:
        now = asyncio.get_running_loop().time()
        f = self.faults
        extra = f.delay + (self.rng.uniform(-f.jitter, f.jitter) if f.jitter else 0.0)
        self._last_ready = max(self._last_ready, now + max(0.0, extra))  # in order, whatever the jitter
        self._queue.put_nowait((self._last_ready, unit))

    def release(self) -> int:
        """Deliver what a frame rule held, in the order it came; answers how many units."""
        held, self.holding = self.holding, None
        for unit in held or ():
            self._enqueue(unit)
        if self._eof_held:
            self._eof_held = False
            self._queue.put_nowait(None)
        return len(held or ())

    # --- writing: latency, blackhole, bandwidth, slicer, limit ---

    async def write(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := await self._queue.get()) is not None:
                at, unit = item
                if unit.kind == _CUT.kind:
                    self.pair.cut(unit.raw.decode())
                    return
                if (wait := at - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await self._flowing.wait()
                if not await self._send(unit.raw):
                    return
            await self._flowing.wait()
            if self.faults.slow_close > 0:
                await asyncio.sleep(self.faults.slow_close)
            if self.dst.can_write_eof():
                self.dst.write_eof()  # pass the FIN on, after everything before it
        except (ConnectionError, OSError):
            pass

    async def _send(self, data: bytes) -> bool:
        """Forward `data`; False once the byte limit closed the connection."""
        loop = asyncio.get_running_loop()
        while data:
            f = self.faults
            size = len(data)
            if f.slicer is not None:
                avg, var, _ = f.slicer
                size = max(1, avg + (self.rng.randint(-var, var) if var else 0))
            if f.rate > 0:
                size = min(size, max(1, int(f.rate / 10)))  # paced in tenths of a second's worth
            if f.limit is not None:
                size = min(size, max(0, f.limit - self.bytes))
                if size == 0:
                    self.pair.cut("fin")
                    return False
            piece, data = data[:size], data[size:]
            if f.rate > 0:
                if (wait := self._next_free - loop.time()) > 0:
                    await asyncio.sleep(wait)
                self._next_free = max(loop.time(), self._next_free) + len(piece) / f.rate
            self.dst.write(piece)
            self.writes += 1
            self.held -= len(piece)
            await self.dst.drain()
            self.bytes += len(piece)
            if f.slicer is not None and data and f.slicer[2] > 0:
                await asyncio.sleep(f.slicer[2])
        if self.faults.limit is not None and self.bytes >= self.faults.limit:
            self.pair.cut("fin")
            return False
        return True


@dataclass(eq=False)
class Pair:
    id: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    up: Direction = field(init=False)
    down: Direction = field(init=False)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    closed: bool = False

    def directions(self, which: str) -> list[Direction]:
        return {"up": [self.up], "down": [self.down], "both": [self.up, self.down]}[which]

    def cut(self, how: str = "fin") -> None:
        """Close both sides (FIN) or reset them (RST); what was held is lost."""
        if self.closed:
            return
        self.closed = True
        for timer in self.timers:
            timer.cancel()
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()
        for w in (self.client, self.upstream):
            _abort(w) if how == "rst" else w.close()

    def later(self, seconds: float, how: str) -> None:
        if seconds <= 0:
            self.cut(how)
        else:
            self.timers.append(asyncio.get_running_loop().call_later(seconds, self.cut, how))


@dataclass
class Command:
    name: str
    values: list[str]
    which: str
    conn: int | None
    opts: dict[str, str]
    flags: set[str]

    @property
    def p(self) -> float:
        return float(self.opts.get("p", 1.0))


VALUES = {
    "latency": 1,
    "delay": 1,
    "bandwidth": 1,
    "throttle": 1,
    "slow_close": 1,
    "timeout": 1,
    "slicer": 1,
    "limit_data": 1,
    "reset_peer": -1,  # optional
    "frame": 2,
    "seed": 1,
    "target": 1,
    "partition": -1,
}
CONNECTION_FAULTS = (
    "blackhole",
    "latency",
    "delay",
    "bandwidth",
    "throttle",
    "slow_close",
    "timeout",
    "slicer",
    "limit_data",
    "reset_peer",
    "frame",
)


def parse(line: str) -> Command:
    words = line.split()
    if not words:
        raise CommandError("empty command")
    name, rest = words[0], words[1:]
    want = VALUES.get(name, 0)
    values: list[str] = []
    which, conn, opts, flags = "both", None, {}, set()
    for w in rest:
        if w in DIRS:
            which = w
        elif w in FLAGS:
            flags.add(w)
        elif "=" in w:
            k, _, v = w.partition("=")
            opts[k] = v
        elif len(values) < abs(want):
            values.append(w)
        elif conn is None:
            try:
                conn = int(w)
            except ValueError:
                raise CommandError(f"{w!r} is neither a direction (up, down, both) nor a connection id") from None
        else:
            raise CommandError(f"unexpected {w!r}")
    if want > 0 and len(values) < want:
        raise CommandError(f"{name} needs {want} argument{'s' if want > 1 else ''}")
    if "id" in opts:
        conn = int(opts.pop("id"))
    return Command(name, values, which, conn, opts, flags)


class Proxy:
    """The engine. `await start(...)` to listen, `command(line)` to change faults, `close()`."""

    def __init__(self, target: tuple[str, int] | None, seed: int = 0, token: str | None = None) -> None:
        self.token = token
        """When set, a control connection's first line must be `auth TOKEN` (issue 23, attack 10:
        the control port took commands from any local user). The token lives in a 0600 file."""
        self.target = target
        """Where connections go; None until a `target` command says (connections made meanwhile
        wait for it, up to TARGET_WAIT_S): a Hand can start, and dial, while its Mind starts."""
        self._targeted = asyncio.Event()
        if target is not None:
            self._targeted.set()
        self.seed = seed
        self.pairs: dict[int, Pair] = {}
        self.refusing = False
        self.defaults: dict[tuple[str, ...], Command] = {}
        self._next = 0
        self._servers: list[asyncio.Server] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0
        self.control_port = 0

    # --- serving ---

    async def start(self, listen: tuple[str, int] = ("127.0.0.1", 0), control: tuple[str, int] | None = None) -> Proxy:
        server = await asyncio.start_server(self.handle, *listen)
        self._servers.append(server)
        self.port = server.sockets[0].getsockname()[1]
        if control is not None:
            ctl = await asyncio.start_server(self.control, *control)
            self._servers.append(ctl)
            self.control_port = ctl.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def close(self) -> None:
        for s in self._servers:
            s.close()
        for pair in list(self.pairs.values()):
            pair.cut("fin")
        if self._handlers:  # each handler ends once its pair is cut; cancelled only if it does not
            _, late = await asyncio.wait(set(self._handlers), timeout=5)
            for t in late:
                t.cancel()
        for s in self._servers:
            await s.wait_closed()

    async def __aenter__(self) -> Proxy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            _abort(writer)
            return
        try:
            async with asyncio.timeout(TARGET_WAIT_S):
                await self._targeted.wait()
            assert self.target is not None
            ureader, uwriter = await asyncio.open_connection(*self.target)
        except (OSError, TimeoutError):
            _abort(writer)
            return
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._next += 1
        pair = Pair(self._next, writer, uwriter)
        pair.up = Direction(pair, "up", reader, uwriter, f"{self.seed}:{pair.id}:up")
        pair.down = Direction(pair, "down", ureader, writer, f"{self.seed}:{pair.id}:down")
        self.pairs[pair.id] = pair
        for key, cmd in list(self.defaults.items()):
            self._apply(cmd, [pair])
            if "next" in cmd.flags:  # a frame rule for the next connection: this one, and no other
                del self.defaults[key]
        pair.tasks = [
            asyncio.create_task(c) for c in (pair.up.read(), pair.up.write(), pair.down.read(), pair.down.write())
        ]
        try:
            await asyncio.gather(*pair.tasks, return_exceptions=True)
        finally:
            self.pairs.pop(pair.id, None)
            pair.closed = True
            for t in pair.timers:
                t.cancel()
            for w in (writer, uwriter):
                w.close()
            self._handlers.discard(task)

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.token is not None:
                word, _, given = (await reader.readline()).decode(errors="replace").strip().partition(" ")
                if word != "auth" or not hmac.compare_digest(given.encode(), self.token.encode()):
                    writer.write(b"error: not authorized: send 'auth TOKEN' first (TOKEN: the proxy's token file)\n")
                    await writer.drain()
                    return
                writer.write(b"ok auth\n")
                await writer.drain()
            while line := await reader.readline():
                writer.write((self.command(line.decode(errors="replace")) + "\n").encode())
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    # --- commands ---

    def send(self, line: str) -> str:
        """`command`, raising on an `error` answer (the same contract as the subprocess controller)."""
        reply = self.command(line)
        if not reply.startswith("ok"):
            raise CommandError(reply)
        return reply

    def status(self) -> dict[str, Any]:
        return json.loads(self.send("status")[3:])

    def command(self, line: str) -> str:
        """Perform one command line; the answer starts `ok` or `error`."""
        try:
            out = self._command(parse(line))
        except (CommandError, ValueError, IndexError) as exc:
            return f"error {exc or 'bad arguments'}"
        return f"ok {out}" if out else "ok"

    def _lucky(self, cmd: Command, pair: Pair, d: str) -> bool:
        p = cmd.p
        if p >= 1:
            return True
        seed = cmd.opts.get("seed", self.seed)
        return random.Random(f"{seed}:{pair.id}:{cmd.name}:{d}").random() < p

    def _targets(self, cmd: Command) -> list[Pair]:
        if cmd.conn is None:
            return list(self.pairs.values())
        if cmd.conn not in self.pairs:
            raise CommandError(f"no connection {cmd.conn}")
        return [self.pairs[cmd.conn]]

    def _command(self, cmd: Command) -> str:
        n = cmd.name
        if n == "status":
            return json.dumps(self._status())
        if n == "seed":
            self.seed = int(cmd.values[0])
            return f"seed {self.seed}"
        if n == "target":
            host, _, port = cmd.values[0].rpartition(":")
            self.target = (host or "127.0.0.1", int(port))
            self._targeted.set()
            return f"target {host or '127.0.0.1'}:{int(port)}"
        if n in ("refuse", "accept", "down", "up", "partition"):
            self.refusing = n in ("refuse", "down", "partition")
            if n in ("down", "partition"):
                for pair in list(self.pairs.values()):
                    pair.cut("rst" if n == "partition" else "fin")
            if n == "partition" and cmd.values and float(cmd.values[0]) > 0:
                asyncio.get_running_loop().call_later(float(cmd.values[0]) / 1000, self.command, "accept")
            return "refusing" if self.refusing else "accepting"
        pairs = self._targets(cmd)
        if n == "cut":
            for pair in pairs:
                pair.cut("rst" if "rst" in cmd.flags else "fin")
            return f"cut {len(pairs)}"
        if n == "release":
            return f"released {sum(d.release() for p in pairs for d in p.directions(cmd.which))}"
        if n in ("clear", "reset", "resume"):
            names = ("blackhole",) if n == "resume" else CONNECTION_FAULTS
            if cmd.conn is None:
                for key in [k for k in self.defaults if k[0] in names and cmd.which in ("both", k[1])]:
                    del self.defaults[key]
            for pair in pairs:
                for d in pair.directions(cmd.which):
                    if n == "resume":
                        d.faults.flowing = True
                    else:
                        d.faults = Faults()
                        d.release()
                    d.apply()
            if n == "reset":
                self.refusing = False
            return f"{len(pairs)}"
        if n not in CONNECTION_FAULTS:
            raise CommandError(f"unknown command {n!r}")
        self._check(cmd)
        # Which later connections get it: an L4 fault and `frame ... every` every one; a frame rule
        # naming no connection only the next one, and only when no connection is live to take it.
        later = n != "frame" or "every" in cmd.flags or not pairs
        if cmd.conn is None and later:
            flags = cmd.flags if n != "frame" or "every" in cmd.flags else cmd.flags | {"next"}
            dirs = ("up", "down") if cmd.which == "both" else (cmd.which,)
            for side in dirs:
                key = (n, side, *cmd.values, "next" if "next" in flags else "every") if n == "frame" else (n, side)
                if n in ("delay", "latency"):  # one latency, under either name
                    self.defaults.pop(("delay" if n == "latency" else "latency", side), None)
                self.defaults[key] = Command(n, cmd.values, side, None, cmd.opts, flags)
        self._apply(cmd, pairs)
        return f"{len(pairs)}"

    def _check(self, cmd: Command) -> None:
        """Refuse a bad value before anything changes (a half-applied command helps nobody)."""
        if cmd.name == "frame":
            action, _ = cmd.values
            if action not in FRAME_ACTIONS:
                raise CommandError(f"frame action must be one of {', '.join(FRAME_ACTIONS)}, not {action!r}")
        for v in cmd.values if cmd.name != "frame" else ():
            if float(v) < 0:
                raise CommandError(f"{cmd.name} takes a value >= 0")
        if not 0 <= cmd.p <= 1:
            raise CommandError("p must be between 0 and 1")

    def _apply(self, cmd: Command, pairs: list[Pair]) -> None:
        n, v = cmd.name, cmd.values
        num = float(v[0]) if v and n != "frame" else 0.0
        for pair in pairs:
            if n == "reset_peer":
                if self._lucky(cmd, pair, "both"):
                    pair.later(num / 1000, "rst")
                continue
            for d in pair.directions(cmd.which):
                f = d.faults
                if not self._lucky(cmd, pair, d.name):
                    continue
                if n == "blackhole":
                    f.flowing = False
                elif n in ("latency", "delay"):
                    f.delay, f.jitter = num / 1000, float(cmd.opts.get("jitter", 0)) / 1000
                elif n == "bandwidth":
                    f.rate = num * 1024
                elif n == "throttle":
                    f.rate = num
                elif n == "slow_close":
                    f.slow_close = num / 1000
                elif n == "timeout":
                    f.timeout = num / 1000
                    if num > 0:
                        pair.later(num / 1000, "fin")
                elif n == "slicer":
                    var = int(cmd.opts.get("variation", 0))
                    f.slicer = (max(1, int(num)), var, float(cmd.opts.get("delay_us", 0)) / 1e6)
                elif n == "limit_data":
                    f.limit = int(num)
                elif n == "frame":
                    f.rules.append(
                        FrameRule(
                            v[0],
                            v[1],
                            k=int(cmd.opts.get("k", 1)),
                            times=int(cmd.opts.get("times", 1)),
                            ms=float(cmd.opts.get("ms", 0)),
                            after="after" in cmd.flags,
                            how="fin" if "fin" in cmd.flags else "rst",
                        )
                    )
                d.apply()

    def _status(self) -> dict[str, Any]:
        conns = [
            {
                "id": p.id,
                "framing": p.up.framer.mode,
                "up_bytes": p.up.bytes,
                "down_bytes": p.down.bytes,
                "up_held": p.up.held,
                "down_held": p.down.held,
                "up_dropped": p.up.dropped,
                "up_writes": p.up.writes,
                "down_writes": p.down.writes,
                "down_dropped": p.down.dropped,
                "up_frames": dict(p.up.frames),
                "down_frames": dict(p.down.frames),
                "up": p.up.faults.public(),
                "down": p.down.faults.public(),
            }
            for p in self.pairs.values()
        ]
        return {
            "connections": conns,
            "refusing": self.refusing,
            "seed": self.seed,
            "defaults": [" ".join(_words(c)) for c in self.defaults.values()],
        }


def _words(c: Command) -> list[str]:
    return [c.name, *c.values, c.which, *sorted(c.flags), *(f"{k}={v}" for k, v in c.opts.items())]


def _abort(w: asyncio.StreamWriter) -> None:
    sock = w.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    w.transport.abort()
