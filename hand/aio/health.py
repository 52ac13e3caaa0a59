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
- A scrape only renders what is in memory (`hand.aio.metrics`), so it never waits on the database or
  the Mind, and it works just as well while the Hand is disconnected.
- `/healthz` is 200 whenever the process can answer (liveness); whether it is connected to a
  Mind is in the body (`connected`, and `status` is `ok`, `degraded` or `disconnected`), so a probe that only
  checks the status code does not restart a Hand that is merely waiting for its Mind.
- Port 0 picks a free port; the bound address is logged (`metrics_listening`) and written to
  `<state-dir>/metrics.addr` (`HOST:PORT`, 0600), removed again on a clean stop.

The request parsing (`examine`) and routing (`route`) are plain functions over bytes; the
`HealthServer` shell only moves bytes and owns the connection tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hand.core.http import (
    MAX_HEAD_BYTES,
    Response,
    error,
    examine,
    is_loopback,
    route,
    show_addr,
)
from protocol.io.files import write_private

READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32
LINGER_S = 1.0
LINGER_BYTES = 64 << 10
ADDR_FILE = "metrics.addr"

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
                    write_private(self._addr_file, f"{self.address}\n", fsync=False)
                await asyncio.Event().wait()  # until cancelled: the TaskGroup then cancels the connections
        except Exception:  # losing /metrics must not stop the Hand's work
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
        except Exception:  # a bug answers nothing, it does not stop the Hand
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
        except Exception:
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
