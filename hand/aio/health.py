"""The Hand's optional local HTTP port (`hand run --metrics-listen HOST:PORT`): `GET /healthz` and
`GET /metrics`, nothing else.

Rules:
- Off unless asked for. It is unauthenticated: it says how busy this machine is and which Mind it
  serves (never a credential), so it belongs on loopback; any other address gets a warning on
  stderr and in the log.
- It must never become a way to hurt the Hand. One request per connection, then close; the head
  is read with a size bound (`MAX_HEAD_BYTES`) and a time bound (`READ_TIMEOUT_S`), the reply is
  written with a time bound too, and at most `MAX_CONNECTIONS` are served at once (more are
  dropped on accept). Garbage or an oversized head gets `400`, a head that never completes `408`,
  a method other than GET `405`, any other path `404`: always an answer and a close, never an
  exception that reaches the agent.
- A scrape only renders what is in memory (`hand.metrics`), so it never waits on the database or
  the Mind, and it works just as well while the Hand is disconnected.
- `/healthz` is 200 whenever the process can answer (liveness); whether it is connected to a
  Mind is in the body (`connected`, and `status` is `ok` or `disconnected`), so a probe that only
  checks the status code does not restart a Hand that is merely waiting for its Mind.
- Port 0 picks a free port; the bound address is logged (`metrics_listening`) and written to
  `<state-dir>/metrics.addr` (`HOST:PORT`, 0600), removed again on a clean stop.

The request parsing (`examine`) and routing (`route`) are plain functions over bytes; the
`HealthServer` shell only moves bytes and owns the connection tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from hand.aio.metrics import CONTENT_TYPE

MAX_HEAD_BYTES = 8192
MAX_HEADERS = 64
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32
LINGER_S = 1.0
LINGER_BYTES = 64 << 10
ADDR_FILE = "metrics.addr"

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    500: "Internal Server Error",
}
_METHOD = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,20}$")
_HEADER_NAME = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


# --- parsing and routing (pure) -----------------------------------------------------------------


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` -> (host, port); port 0 means any free port."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9470; port 0 = any free port)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:9470")
    return host, int(port)


def show_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    """Without the query string."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())

    def encode(self) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {_REASONS.get(self.status, '')}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Cache-Control: no-store",
            "Connection: close",
            *(f"{k}: {v}" for k, v in self.headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + self.body


def error(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def examine(buf: bytes) -> Request | Response | None:
    """What the bytes received so far amount to: a complete request, an error to answer with, or
    None (need more). A bad request line is refused as soon as it is complete, without waiting for
    the rest of the head."""
    end = buf.find(b"\r\n\r\n")
    if end < 0 and len(buf) > MAX_HEAD_BYTES:
        return error(400, f"request head larger than {MAX_HEAD_BYTES} bytes")
    if end > MAX_HEAD_BYTES:
        return error(400, f"request head larger than {MAX_HEAD_BYTES} bytes")
    first_end = buf.find(b"\r\n")
    if first_end < 0:
        return None
    bad = _bad_request_line(buf[:first_end])
    if bad is not None:
        return bad
    if end < 0:
        return None
    lines = buf[first_end + 2 : end].split(b"\r\n") if end > first_end else []
    if len(lines) > MAX_HEADERS:
        return error(400, f"more than {MAX_HEADERS} header lines")
    for line in lines:
        name, sep, _ = line.partition(b":")
        if not sep or not _HEADER_NAME.match(name):
            return error(400, "malformed header line")
    method, target, _ = buf[:first_end].split(b" ")
    return Request(method.decode("ascii"), target.decode("ascii").split("?", 1)[0])


def _bad_request_line(line: bytes) -> Response | None:
    parts = line.split(b" ")
    if len(parts) != 3:
        return error(400, "malformed request line")
    method, target, version = parts
    if not _METHOD.match(method) or version not in (b"HTTP/1.0", b"HTTP/1.1"):
        return error(400, "malformed request line")
    if not target.startswith(b"/") or not all(0x21 <= b < 0x7F for b in target):
        return error(400, "malformed request target")
    return None


def route(req: Request, health: Callable[[], dict[str, Any]], metrics: Callable[[], bytes]) -> Response:
    if req.method != "GET":
        return Response(405, b"only GET is served here\n", headers=(("Allow", "GET"),))
    if req.path == "/healthz":
        return Response(200, json.dumps(health()).encode(), "application/json")
    if req.path == "/metrics":
        return Response(200, metrics(), CONTENT_TYPE)
    return error(404, "not found: try /healthz or /metrics")


def shown_url(url: str) -> str:
    """A URL as `/healthz` may show it: scheme, host, port and path only. Userinfo, query and
    fragment are where a token could hide, and this port is unauthenticated."""
    u = urlsplit(url)
    host = u.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = u.port
    except ValueError:
        port = None
    return urlunsplit((u.scheme, f"{host}:{port}" if port is not None else host, u.path, "", ""))


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


# --- the asyncio shell --------------------------------------------------------------------------


class HealthServer:
    """Lifecycle: `await start()` binds (an `OSError` here is a local configuration error), then
    `await serve()` listens, writes the address file, runs until cancelled owning every
    connection's task, and closes the listener and removes the address file on the way out."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        health: Callable[[], dict[str, Any]],
        metrics: Callable[[], bytes],
        log: Any,
        addr_file: Path | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._health = health
        self._metrics = metrics
        self._log = log
        self._addr_file = addr_file
        self._server: asyncio.Server | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._open = 0
        self._bound: list[str] = []
        self.address: str | None = None
        """Where it listens, `HOST:PORT` (the first socket when a name resolved to several)."""

    async def start(self) -> str:
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, start_serving=False, limit=MAX_HEAD_BYTES * 2
        )
        bound = [s.getsockname()[:2] for s in self._server.sockets]
        self.address = show_addr(*bound[0])
        self._bound = [show_addr(*b) for b in bound]
        exposed = [show_addr(*b) for b in bound if not is_loopback(b[0])]
        if exposed:
            self._log.warning("metrics_listen_not_loopback", addresses=exposed)
            print(
                f"hand: warning: --metrics-listen {', '.join(exposed)} is not a loopback address: /healthz and "
                "/metrics are unauthenticated and anyone who can reach it can read them",
                file=sys.stderr,
            )
        return self.address

    async def serve(self) -> None:
        assert self._server is not None, "start() first"
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                await self._server.start_serving()
                # Only now is it listening: whoever reads the address can connect at once.
                self._log.info("metrics_listening", address=self.address, addresses=self._bound)
                if self._addr_file is not None:
                    _write_private(self._addr_file, f"{self.address}\n")
                await asyncio.Event().wait()  # until cancelled: the TaskGroup then cancels the connections
        except Exception:  # noqa: BLE001 - losing /metrics must not stop the Hand's work
            self._log.exception("metrics_server_failed", address=self.address)
        finally:
            self._tg = None
            self._server.close()
            if self._addr_file is not None:
                try:
                    if self._addr_file.read_text().strip() == self.address:
                        self._addr_file.unlink()
                except OSError:
                    pass
            self._log.info("metrics_closed", address=self.address)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._tg is None or self._open >= MAX_CONNECTIONS:
            writer.transport.abort()  # busy or closing: refusing is cheaper than queueing
            return
        try:
            self._tg.create_task(self._connection(reader, writer))
        except RuntimeError:  # the task group is closing
            writer.transport.abort()
            return
        self._open += 1

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one head, answer, close. Never raises (but cancellation): a failure here must not
        end the agent's task group."""
        clean = False
        try:
            response = await self._read(reader)
            if response is not None:
                writer.write(response.encode())
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await writer.drain()
                await _linger(reader, writer)
            clean = True
        except (OSError, TimeoutError):
            pass
        except Exception:  # noqa: BLE001 - a bug answers nothing, it does not stop the Hand
            self._log.exception("metrics_request_failed")
        finally:
            self._open -= 1
            if clean:
                writer.close()
            else:  # the peer does not read: drop what is buffered instead of holding the socket
                writer.transport.abort()

    async def _read(self, reader: asyncio.StreamReader) -> Response | None:
        buf = b""
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                while True:
                    chunk = await reader.read(4096)
                    if not chunk:
                        return None  # the peer gave up: nobody to answer
                    buf += chunk
                    seen = examine(buf)
                    if seen is not None:
                        break
        except TimeoutError:
            return error(408, "request head not received in time")
        if isinstance(seen, Response):
            self._log.debug("metrics_bad_request", status=seen.status, size=len(buf))
            return seen
        try:
            return route(seen, self._health, self._metrics)
        except Exception:  # noqa: BLE001
            self._log.exception("metrics_render_failed", path=seen.path)
            return error(500, "internal error")


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then read and discard what the peer still sends (a body we did not want, the
    rest of an oversized head), bounded in bytes and time. Closing with unread input would make
    the kernel reset the connection, and a reset can destroy the answer before the peer reads it."""
    if writer.can_write_eof():
        writer.write_eof()
    left = LINGER_BYTES
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(LINGER_S):
            while left > 0:
                chunk = await reader.read(min(left, 4096))
                if not chunk:
                    return
                left -= len(chunk)


def _write_private(path: Path, text: str) -> None:
    """Write-then-rename, 0600: a reader sees the old address or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
