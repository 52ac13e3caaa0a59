"""Local port forwards through a Hand (`mind forward -L`, DESIGN §18, issue 37): ssh -L's specs and
the asyncio machinery that carries each accepted TCP connection as one `forward` run.

```python
async with mc.forward("box", "0:127.0.0.1:5432") as fwd:     # or host=..., port=..., path=...
    host, port = fwd.address                                   # what this machine listens on
```
- **The spec** (`parse_spec`, pure): `[BIND:]PORT:HOST:HOSTPORT` or `[BIND:]PORT:/PATH/ON/HAND.sock`
  (a path is told from a host by its `/`: `./app.sock` for one in the Hand's root). BIND defaults to
  127.0.0.1 (`*` is every interface), PORT 0 picks a free port, IPv6 addresses go in brackets
  (`[::1]:8080:[::1]:80`). A bad spec is a `ValueError` whose message says what is wrong.
- **Each connection is one run** of the Hand's `forward` tool, streamed: the local socket's bytes
  are the run's stdin (read only as the run's credit allows: a destination that does not read holds
  the local writer back through TCP), the run's stdout is written to the local socket and the next
  chunk is taken only once `drain` says the socket took this one (the acknowledgement, hence the
  window, waits for it: a local reader that does not read holds the far side back, and memory here
  stays bounded by one window). A local EOF ends stdin (the Hand half-closes its socket), the end of
  stdout is a half-close back. So a connection has everything a run has: its own window (one slow
  connection never stalls another), continuity across cuts of either leg, audit, scope and policy.
- **Endings**: the run's success closes the local socket; a failure (refused, reset, unresolvable)
  resets it at once (SO_LINGER 0: no hang) and says one line through `on_error`; a reset of the
  local socket cancels the run. A connection never takes the listener down.
- **Before listening**, `check()` asks the Hand (a `forward` run with `check: true`) whether it lets
  the destination be reached, so a refused destination is refused at start, not at the first
  connection. `close()` stops the listener, cancels the connections' runs and waits for them, bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import re
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.codes import ErrorCode
from protocol.io.sockets import READ_CHUNK, ChunkSocket
from protocol.messages import RunEnd, StreamData
from protocol.states import RunState

MindClient = Any
"""`mind.client.aio.MindClient` (not imported: aio exposes `open_forward` as its `forward` method)."""
RunHandle = Any
"""`mind.client.run.RunHandle`."""

DEFAULT_BIND = "127.0.0.1"
TIMEOUT_S = limits.RUN_TIMEOUT_MAX_MS / 1000
"""A connection's run deadline: the longest the protocol allows (a tunnel may stay open all day)."""
CHECK_TIMEOUT_S = 60.0
OUTPUT_LIMIT = 1 << 50
"""A connection's bytes back are not cut at the default output limit (1 GiB)."""
WINDOW = 512 << 10
"""Each connection's window, each way. A client's stream budget on the Mind is 128 windows of 2 MiB
(256 MiB); at 512 KiB a connection holds 1 MiB (stdin and stdout), so some 250 can be open at once
per client, and one connection still moves 200+ MiB/s on loopback; a far link is window-bound
sooner than with the 2 MiB of `mind exec` (measured: docs/performance.md)."""
QUEUED_MAX = 2 * READ_CHUNK
"""Bytes read from a local socket and not yet taken by its run (no credit yet, or none left): past
this the socket is not read, so the local writer is held back through TCP (a `StreamReader` paused
at twice its limit so)."""
BACKLOG = 1024
CLOSE_GRACE_S = 5.0
"""How long `close()` waits for the connections' runs to end once cancelled, before dropping them."""
LINK_WAIT_S = 30.0
"""How long a new connection waits for the link to the Mind when it is down (then it is reset)."""

_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]{0,252})$")
FORMS = "[BIND:]PORT:HOST:HOSTPORT or [BIND:]PORT:/PATH (a Unix socket on the Hand)"


class ForwardError(ClientError):
    """A forward could not be set up: `local` (this machine's listener: a port in use, a bind
    address it does not have), `rejected` or `failed` (the Hand refused the destination, or could
    not resolve it)."""


# --- the spec -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardSpec:
    """One `-L`: where to listen here, and where the Hand connects (`host`:`port`, or `path`)."""

    bind: str
    local_port: int
    host: str | None = None
    port: int | None = None
    path: str | None = None

    def args(self) -> dict[str, Any]:
        """The `forward` tool's arguments."""
        if self.path is not None:
            return {"path": self.path}
        return {"host": self.host, "port": self.port}

    @property
    def target(self) -> str:
        """The destination as written: `db:5432`, `[::1]:80`, `/run/app.sock`."""
        if self.path is not None:
            return self.path
        assert self.host is not None and self.port is not None
        return endpoint(self.host, self.port)

    @property
    def listen(self) -> str:
        return endpoint(self.bind, self.local_port)


def endpoint(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_spec(text: str) -> ForwardSpec:
    """`[BIND:]PORT:HOST:HOSTPORT` or `[BIND:]PORT:/PATH`, as ssh -L reads them; ValueError says
    what is wrong, naming the spec."""
    try:
        return _parse(text)
    except ValueError as exc:
        raise ValueError(f"bad forward {text!r}: {exc}") from None


def make_spec(
    spec: str | ForwardSpec | None = None,
    *,
    host: str | None = None,
    port: int | None = None,
    path: str | None = None,
    local_port: int = 0,
    bind: str = DEFAULT_BIND,
) -> ForwardSpec:
    """A spec from its text, or from its fields (checked as the text would be)."""
    if spec is not None:
        if host is not None or port is not None or path is not None:
            raise ValueError("give a spec, or host and port (or path), not both")
        return spec if isinstance(spec, ForwardSpec) else parse_spec(spec)
    if (path is None) == (host is None and port is None):
        raise ValueError("give host and port, or path (a Unix socket on the Hand)")
    listen = _bind(_bracketed(bind)), _port(str(local_port), "PORT", zero=True)
    if path is not None:
        return ForwardSpec(*listen, path=_path(path))
    if host is None or port is None:
        raise ValueError("give both host and port")
    return ForwardSpec(*listen, host=_host(_bracketed(host), "HOST"), port=_port(str(port), "HOSTPORT", zero=False))


def _bracketed(field: str) -> str:
    """A field's IPv6 address as the text writes it (a field needs no brackets: `::1`)."""
    return f"[{field}]" if ":" in field and not field.startswith("[") else field


def _parse(text: str) -> ForwardSpec:
    if not text:
        raise ValueError(f"empty; expected {FORMS}")
    parts, path = _split(text)
    if path is not None:
        if len(parts) not in (1, 2):
            raise ValueError(f"expected {FORMS}")
        bind = _bind(parts[0]) if len(parts) == 2 else DEFAULT_BIND
        return ForwardSpec(bind, _port(parts[-1], "PORT", zero=True), path=_path(path))
    if len(parts) < 3:
        missing = "HOST:HOSTPORT" if len(parts) == 1 else "HOSTPORT"
        hint = " (a Unix socket path must contain '/': ./name.sock)" if len(parts) == 2 else ""
        raise ValueError(f"missing {missing}; expected {FORMS}{hint}")
    if len(parts) > 4:
        raise ValueError(f"too many parts; expected {FORMS} (an IPv6 address goes in brackets: [::1])")
    bind = _bind(parts[0]) if len(parts) == 4 else DEFAULT_BIND
    local, host, remote = parts[-3:]
    return ForwardSpec(
        bind, _port(local, "PORT", zero=True), host=_host(host, "HOST"), port=_port(remote, "HOSTPORT", zero=False)
    )


def _split(text: str) -> tuple[list[str], str | None]:
    """The colon-separated parts (a bracketed part is one, colons and all), and the path: the rest
    of the text from the first part that contains a `/` (a path may hold colons)."""
    parts: list[str] = []
    i = 0
    while True:
        if text.startswith("[", i):
            close = text.find("]", i)
            if close < 0:
                raise ValueError("'[' without its ']'")
            part, i = text[i : close + 1], close + 1
            if i < len(text) and text[i] != ":":
                raise ValueError(f"expected ':' after {part}")
        else:
            end = text.find(":", i)
            end = len(text) if end < 0 else end
            part = text[i:end]
            if "/" in part:
                return parts, text[i:]
            if "[" in part or "]" in part:
                raise ValueError(f"{part!r}: brackets go around a whole IPv6 address ([::1])")
            i = end
        parts.append(part)
        if i >= len(text):
            return parts, None
        i += 1  # the colon
        if i >= len(text):
            parts.append("")
            return parts, None


def _port(text: str, what: str, *, zero: bool) -> int:
    if not text:
        raise ValueError(f"empty {what}")
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{what} {text!r} is not a port number")
    n = int(text)
    if n > 65535:
        raise ValueError(f"{what} {n} is above 65535")
    if n == 0 and not zero:
        raise ValueError(f"{what} 0 is not a port to connect to (1-65535)")
    return n


def _host(text: str, what: str) -> str:
    """A name or an address; an IPv6 address comes in brackets and leaves without them."""
    if not text:
        raise ValueError(f"empty {what}")
    if text.startswith("["):
        inner = text[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"{what} {text} is not an IPv6 address") from None
        return inner
    if not _NAME.match(text):
        raise ValueError(f"{what} {text!r} is not a host name or an address")
    return text


def _bind(text: str) -> str:
    if text == "*":
        return "0.0.0.0"
    if not text:
        raise ValueError("empty BIND address (write '*' for every interface)")
    return _host(text, "BIND address")


def _path(text: str) -> str:
    if "\x00" in text:
        raise ValueError("a path must not contain NUL characters")
    if len(text.encode()) > 4096:
        raise ValueError("the path is too long")
    return text


# --- listening ------------------------------------------------------------------------------------

_WHY = {
    errno.EADDRINUSE: "address in use",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "this machine has no such address",
}


def _why(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve it ({exc.strerror})"
    return _WHY.get(exc.errno or 0, (exc.strerror or str(exc)).lower())


def bind_listener(spec: ForwardSpec) -> socket.socket:
    """A socket bound to `spec`'s BIND:PORT, not listening yet (so a port in use is known before
    anything else is opened); `ForwardError` (`local`) with the reason. A name is bound at its
    first address, IPv4 first."""
    where = spec.listen
    try:
        infos = socket.getaddrinfo(spec.bind, spec.local_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ForwardError(ClientCode.LOCAL, f"cannot listen on {where}: {_why(exc)}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ForwardError(ClientCode.LOCAL, f"cannot listen on {where}: {_why(exc)}") from None
    return sock


# --- the forward ----------------------------------------------------------------------------------


@dataclass(eq=False)
class ForwardConnection:
    """One accepted connection: who, its run, the bytes each way, and how it ended."""

    peer: str
    run_id: str | None = None
    sent: int = 0
    """Bytes read from the local socket and handed to the run (towards the destination)."""
    received: int = 0
    """Bytes of the destination's written to the local socket."""
    error: str | None = None
    """Why it failed (None: it ended cleanly, or was closed by us)."""


class _Owner:
    """What `LocalForward` and `RemoteForward` share: the callbacks a connection reports through,
    and the bounded wait for the connections' tasks when the forward closes."""

    hand: str
    on_error: Callable[[str], None] | None
    on_closed: Callable[[ForwardConnection], None] | None
    failed: int

    def _report(self, conn: ForwardConnection) -> None:
        self.failed += 1
        if self.on_error is not None:
            with contextlib.suppress(Exception):  # a callback's bug is not the connection's
                self.on_error(f"{self.hand}: {conn.error}")

    def _ended(self, conn: ForwardConnection) -> None:
        if self.on_closed is not None:
            with contextlib.suppress(Exception):
                self.on_closed(conn)

    @staticmethod
    async def _wait_for(tasks: set[asyncio.Task[None]], grace: float) -> None:
        """Wait for `tasks` at most `grace` seconds, then cancel what is left (bounded too)."""
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)


class LocalForward(_Owner):
    """One `-L`: a listener here, each accepted connection one `forward` run on `hand`. `check()`
    (the Hand says whether it allows the destination), then `start()` (listen), then `close()`.
    `on_error(line)`: one line per connection that failed (`box: 127.0.0.1:5433 refused the
    connection`); `on_closed(conn)`: every connection as it ends."""

    def __init__(
        self,
        mc: MindClient,
        hand: str,
        spec: ForwardSpec,
        *,
        sock: socket.socket | None = None,
        on_error: Callable[[str], None] | None = None,
        on_closed: Callable[[ForwardConnection], None] | None = None,
    ) -> None:
        self.mc = mc
        self.hand = hand
        self.spec = spec
        self.to = spec.target
        """Where the Hand connects, as it said at `check()` (the spec's destination before)."""
        self.on_error = on_error
        self.on_closed = on_closed
        self._sock = sock
        self._address: tuple[str, int] | None = None
        if sock is not None:
            self.bind()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: set[_Connection] = set()
        self.closing = False
        self.opened = 0
        """Connections accepted so far."""
        self.failed = 0
        """Connections that ended in a failure (each said through `on_error`)."""

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) this forward is bound to (the port chosen when the spec said 0)."""
        if self._address is None:
            raise ClientError(ClientCode.INVALID_REQUEST, "the forward is not bound yet")
        return self._address

    @property
    def listen(self) -> str:
        """`127.0.0.1:41234`, `[::1]:8080`."""
        return endpoint(*self.address)

    @property
    def active(self) -> int:
        """Connections open now."""
        return len(self._tasks)

    def describe(self) -> dict[str, Any]:
        """What `mind forward --json` prints for this forward."""
        return {"listen": self.listen, "to": self.to, "hand": self.hand, "direction": "local"}

    async def check(self) -> str:
        """Ask the Hand whether it lets the destination be reached, and where it goes (its answer,
        e.g. `127.0.0.1:5432`). `ForwardError` (`rejected`, `failed`) with its reason if not;
        `ClientError` if the Mind cannot be asked."""
        end: RunEnd = await self.mc.exec(
            self.hand, "forward", {**self.spec.args(), "check": True}, timeout=CHECK_TIMEOUT_S, stream=False
        )
        if end.state is RunState.SUCCEEDED:
            value = end.value if isinstance(end.value, dict) else {}
            self.to = str(value.get("to") or self.spec.target)
            return self.to
        why = end_reason(end)
        raise ForwardError(ClientCode(end.state.value), f"cannot forward to {self.hand}:{self.spec.target}: {why}")

    def bind(self) -> None:
        """Bind the listening socket now (`ForwardError` `local`), if it is not bound yet."""
        if self._sock is None:
            self._sock = bind_listener(self.spec)
        if self._address is None:
            name = self._sock.getsockname()
            self._address = str(name[0]), int(name[1])

    async def start(self) -> None:
        """Listen (binding first if `bind` was not called); `ForwardError` (`local`) if it cannot."""
        self.bind()
        assert self._sock is not None
        try:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: _LocalSocket(self._accepted), sock=self._sock, backlog=BACKLOG, start_serving=True
            )
        except OSError as exc:
            raise ForwardError(ClientCode.LOCAL, f"cannot listen on {self.spec.listen}: {_why(exc)}") from None

    async def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop listening, cancel the connections' runs and wait for them to end (at most `grace`
        seconds; then their sockets are reset and their runs left to the Mind)."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        elif self._sock is not None:
            self._sock.close()
        for conn in list(self._conns):
            conn.cancel()
        await self._wait_for(set(self._tasks), grace)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def __aenter__(self) -> LocalForward:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the connections ---

    def _accepted(self, sock: _LocalSocket) -> None:
        if self.closing:
            sock.reset()
            return
        self.opened += 1
        conn = _Connection(self, sock)
        task = asyncio.get_running_loop().create_task(conn.run())
        self._conns.add(conn)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._gone(t, conn))

    def _gone(self, task: asyncio.Task[None], conn: _Connection) -> None:
        self._tasks.discard(task)
        self._conns.discard(conn)


def end_reason(end: RunEnd) -> str:
    """A run's failure as one sentence (the Hand's error, with the refusal's code)."""
    why = end.error or end.reason or end.state.value
    if end.state is RunState.REJECTED and end.reject_code is not None and end.reject_code.value not in why:
        why = f"{why} ({end.reject_code.value})"
    elif end.state not in (RunState.REJECTED, RunState.FAILED):
        why = f"the connection's run ended {end.state.value}" + (f": {why}" if why != end.state.value else "")
    return why


class _LocalSocket(ChunkSocket):
    """A local connection (`protocol.io.sockets`): its reads wait for the run's stdin (`read`), at
    most `QUEUED_MAX` bytes of them, and its writes are the run's stdout."""

    def __init__(self, on_made: Callable[[_LocalSocket], None] | None = None) -> None:
        super().__init__()
        self._on_made = on_made
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._wake: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._on_made is not None:
            self._on_made(self)

    def chunk(self, data: bytes) -> None:
        self._chunks.append(data)
        self._queued += len(data)
        if self._queued >= QUEUED_MAX:
            self.set_reading(False)
        self._wakeup()

    def ended(self) -> None:
        self._wakeup()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._wakeup()

    def _wakeup(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def read(self) -> bytes:
        """The next chunk read from the socket, b"" once it ended; its error if it broke."""
        while True:
            if self.failed is not None:
                raise self.failed
            if self._chunks:
                data = self._chunks.popleft()
                self._queued -= len(data)
                if self._queued < QUEUED_MAX:
                    self.set_reading(True)
                return data
            if self.read_ended.is_set():
                return b""
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake


class _Connection:
    """One accepted connection carried by one `forward` run: the local socket's bytes are its stdin,
    its stdout is written to the socket, one chunk at a time (`drain` before the next)."""

    def __init__(
        self, fwd: LocalForward | RemoteForward, sock: _LocalSocket, args: dict[str, Any] | None = None
    ) -> None:
        self.fwd = fwd
        self.args = args if args is not None else fwd.spec.args()
        """The run's arguments: the destination (`-L`), or the connection the Hand accepted (`-R`)."""
        self.sock = sock
        peer = sock.peer()
        self.info = ForwardConnection(peer=endpoint(str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else "?")
        self.handle: RunHandle | None = None
        self.known = asyncio.Event()
        """The run was started (`handle` set) or could not be."""
        self.local_gone = False
        """The local socket broke (reset, or it stopped taking bytes): the run is cancelled."""
        self.cancelling: asyncio.Task[None] | None = None

    async def run(self) -> None:
        clean = False
        try:
            clean = await self._carry()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a connection never takes the listener down
            self.info.error = f"internal error: {exc!r}"
        finally:
            if self.info.error is not None and not self.fwd.closing:
                self.fwd._report(self.info)
            if clean:
                await self.sock.close(CLOSE_GRACE_S)  # once what is written went out (bounded)
            else:
                self.sock.reset()
            self.fwd._ended(self.info)

    async def _carry(self) -> bool:
        """The connection from its run's start to its end: True when both ways closed cleanly."""
        fwd, mc = self.fwd, self.fwd.mc
        try:
            if not mc.connected:  # the link is down: wait for it (bounded), then go through
                await mc.reconnect(within=max(mc.resume_window, LINK_WAIT_S))
            self.handle = await mc.start(
                fwd.hand,
                "forward",
                self.args,
                timeout=TIMEOUT_S,
                stdin=self._from_local(),
                stream=True,
                watch=False,
                output_limit=OUTPUT_LIMIT,
                verify=False,  # TCP's bytes: no digest to check them against
                window=WINDOW,
            )
        except ClientError as exc:
            self.info.error = exc.message
            return False
        finally:
            self.known.set()
        if fwd.closing:
            self.cancel()
        try:
            end = await self._to_local(self.handle)
        except ClientError as exc:
            self.info.error = exc.message
            return False
        finally:
            self.info.run_id = self.handle.run_id
        if end.state is RunState.SUCCEEDED:
            return not self.local_gone
        if not (end.state is RunState.CANCELLED and (fwd.closing or self.local_gone)):
            self.info.error = end_reason(end)
        return False

    async def _from_local(self) -> AsyncIterator[bytes]:
        """The run's stdin: what the local socket sends, until its EOF (the run's stdin ends, the
        Hand half-closes). A reset is not an EOF: the run is cancelled, and this waits for that."""
        while True:
            try:
                data = await self.sock.read()
            except OSError:
                self._local_broke()
                await asyncio.get_running_loop().create_future()  # the run's end stops this
                return
            if not data:
                return
            self.info.sent += len(data)
            yield data

    async def _to_local(self, handle: RunHandle) -> RunEnd:
        """The run's events: stdout to the local socket, each chunk drained before the next is
        taken (the run's window waits for it), its EOF a half-close; returns the run's end."""
        w = self.sock
        async for ev in handle.events():
            if isinstance(ev, StreamData):
                if ev.stream != "stdout" or self.local_gone:
                    continue
                try:
                    if ev.data:
                        w.write(ev.data)
                        await w.drain()
                        self.info.received += len(ev.data)
                    if ev.eof:
                        w.write_eof()
                except OSError:
                    self._local_broke()
            elif isinstance(ev, RunEnd):
                return ev
        raise ClientError(ErrorCode.INTERNAL_ERROR, "event stream ended without run_end")  # pragma: no cover

    def _local_broke(self) -> None:
        self.local_gone = True
        self.cancel()

    def cancel(self) -> None:
        """Ask for the run's cancel (once), as soon as it has started."""
        if self.cancelling is None:
            self.cancelling = asyncio.get_running_loop().create_task(self._cancel())

    async def _cancel(self) -> None:
        await self.known.wait()
        handle = self.handle
        if handle is None or not handle.live:
            return
        with contextlib.suppress(ClientError):
            await handle.cancel()


async def _nothing() -> AsyncIterator[bytes]:
    """An empty stdin (a `forward` run carries one; the one that drops a connection sends nothing)."""
    return
    yield b""  # pragma: no cover - makes this an async generator


class RemoteForward(_Owner):
    """One `-R`: the Hand listens (on its loopback) and each connection it accepts is carried to
    `spec`'s destination HERE (`host:port`, or a local Unix socket `path`). The Hand's listener is a
    `forward` run of its own (`{"listen": true, ...}`) whose stdout says, one JSON line each, where
    it listens and every connection it accepted; each is taken by a `forward` run (`{"accepted":
    TOKEN}`) once the local side is connected, or dropped at once (`close`) when it cannot be: the
    peer on the Hand's side sees a reset, never a hang. The same `on_error`/`on_closed` as
    `LocalForward`."""

    def __init__(
        self,
        mc: MindClient,
        hand: str,
        spec: ForwardSpec,
        *,
        on_error: Callable[[str], None] | None = None,
        on_closed: Callable[[ForwardConnection], None] | None = None,
    ) -> None:
        self.mc = mc
        self.hand = hand
        self.spec = spec
        self.on_error = on_error
        self.on_closed = on_closed
        self.closing = False
        self.remote = ""
        """Where the Hand listens (`127.0.0.1:41234`), once `start` returned."""
        self.opened = 0
        self.failed = 0
        self._listener: RunHandle | None = None
        self._end: RunEnd | None = None
        """The listener's run's end, once it came (it ends only by a cancel, or a refusal at once)."""
        self._serving: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: set[_Connection] = set()

    @property
    def listen(self) -> str:
        return self.remote

    @property
    def to(self) -> str:
        return self.spec.target

    @property
    def active(self) -> int:
        return len(self._tasks)

    def describe(self) -> dict[str, Any]:
        return {"listen": self.remote, "to": self.to, "hand": self.hand, "direction": "remote"}

    async def start(self) -> None:
        """Have the Hand listen; returns once it does (`ForwardError` with its reason if it cannot)."""
        args = {"listen": True, "bind": self.spec.bind, "port": self.spec.local_port}
        self._listener = await self.mc.start(
            self.hand, "forward", args, timeout=TIMEOUT_S, stream=True, watch=False, verify=False, window=WINDOW
        )
        lines = self._lines(self._listener)
        first = await anext(lines, None)
        if first is None or "listening" not in first:
            end = self._end if self._end is not None else await self._listener.wait()
            raise ForwardError(
                ClientCode(end.state.value), f"cannot listen on {self.hand}:{self.spec.listen}: {end_reason(end)}"
            )
        self.remote = str(first["listening"])
        self._serving = asyncio.get_running_loop().create_task(self._serve(lines))

    async def _lines(self, handle: RunHandle) -> AsyncIterator[dict[str, Any]]:
        buf = b""
        async for ev in handle.events():
            if isinstance(ev, StreamData) and ev.stream == "stdout":
                buf += ev.data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        value = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(value, dict):
                        yield value
            elif isinstance(ev, RunEnd):
                self._end = ev
                if self.remote and not self.closing and self.on_error is not None:
                    with contextlib.suppress(Exception):
                        self.on_error(
                            f"{self.hand}: the listener on {self.remote or self.spec.listen} ended: {end_reason(ev)}"
                        )
                return

    async def _serve(self, lines: AsyncIterator[dict[str, Any]]) -> None:
        async for value in lines:
            token = value.get("accepted")
            if isinstance(token, str) and not self.closing:
                self.opened += 1
                task = asyncio.get_running_loop().create_task(self._one(token))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _one(self, token: str) -> None:
        try:
            loop = asyncio.get_running_loop()
            if self.spec.path is not None:
                _, sock = await loop.create_unix_connection(_LocalSocket, self.spec.path)
            else:
                assert self.spec.host is not None and self.spec.port is not None
                _, sock = await loop.create_connection(_LocalSocket, self.spec.host, self.spec.port)
        except OSError as exc:
            self.failed += 1
            if self.on_error is not None:
                with contextlib.suppress(Exception):
                    self.on_error(f"{self.hand}: {self.to} (here) could not be reached: {_why(exc)}")
            with contextlib.suppress(ClientError):  # the Hand resets the accepted connection at once
                drop = await self.mc.start(
                    self.hand,
                    "forward",
                    {"accepted": token, "close": True},
                    timeout=CHECK_TIMEOUT_S,
                    stdin=_nothing(),
                    stream=True,
                    watch=False,
                    verify=False,
                    window=WINDOW,
                )
                await drop.wait()
            return
        conn = _Connection(self, sock, args={"accepted": token})
        self._conns.add(conn)
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)

    async def close(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop the Hand's listener, cancel the connections' runs, wait for them (bounded)."""
        self.closing = True
        if self._listener is not None and self._listener.live:
            with contextlib.suppress(ClientError):
                await self._listener.cancel()
        for conn in list(self._conns):
            conn.cancel()
        await self._wait_for(set(self._tasks) | ({self._serving} if self._serving is not None else set()), grace)


@contextlib.asynccontextmanager
async def open_forward(
    mc: MindClient,
    hand: str,
    spec: ForwardSpec,
    *,
    on_error: Callable[[str], None] | None = None,
    on_closed: Callable[[ForwardConnection], None] | None = None,
) -> AsyncIterator[LocalForward]:
    """`MindClient.forward`: check the destination with the Hand (a refusal raises `ForwardError`
    before anything listens), listen, and on the way out close the forward (its connections too)."""
    fwd = LocalForward(mc, hand, spec, on_error=on_error, on_closed=on_closed)
    try:
        await fwd.check()
        await fwd.start()
    except BaseException:
        await fwd.close()
        raise
    try:
        yield fwd
    finally:
        await fwd.close()
