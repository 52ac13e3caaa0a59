"""The bearers of `mind mcp --listen`: each request's `Authorization: Bearer <client credential>`
checked by the Mind itself (a handshake as that credential), and the connection kept for its next
request (`Pool`); the ASGI middleware that answers every request without one (`BearerAuth`).

Anyone who can reach the port can send a made-up bearer, and each costs a handshake with the Mind
(a second of it once the Mind slows this server's address for its failed handshakes). None of that
may reach an agent already connected, so:

- a known bearer is looked up without a lock or a wait (a dict, then its connection);
- a bearer not known yet is checked once: its first request starts the handshake, the others of the
  same bearer wait for that one, and no other bearer waits on it;
- at most `PENDING_MAX` unknown bearers are checked at once; past that a request is refused at once
  (429) instead of queueing;
- a bearer the Mind just refused is refused again at once for `FAILED_FOR_S`, without a handshake.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request

from mind.client.aio import MindClient
from mind.errors import ClientError
from mind.mcp.budget import CREDENTIAL_BYTES, SERVER_BYTES, Ledger
from mind.mcp.runs import Runs
from protocol.auth import Credential
from protocol.codes import ErrorCode
from protocol.errors import MindhandError

PENDING_MAX = 16
"""Unknown bearers checked with the Mind at once. A made-up one costs a handshake, a second of it once
the Mind limits this server's address; past this many a request is refused at once (429) rather than
queued, so a flood costs a bounded number of handshakes in flight and nobody waits behind it. A new
agent arriving in such a flood retries (its `Retry-After`); an agent already connected never notices."""
FAILED_FOR_S = 5.0
"""A bearer the Mind refused is refused again at once for this long, without asking the Mind: a client
retrying a wrong or revoked token in a loop costs one handshake per this period, not one per request."""
FAILED_MAX = 4096
"""Refusals remembered at most, the oldest forgotten first: a spray of distinct bearers cannot grow it."""
UNAUTHORIZED = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.REVOKED})


class Refusal(MindhandError):
    """A request answered without reaching a tool: its HTTP status, OAuth-style error, and sentence."""

    def __init__(self, status: int, error: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.error, self.message, self.retry_after = status, error, message, retry_after

    @staticmethod
    def of(exc: ClientError) -> Refusal:
        """The Mind's refusal of a handshake (or its absence) as an HTTP answer."""
        if exc.code in UNAUTHORIZED:
            return Refusal(401, "invalid_token", exc.message)
        if exc.code is ErrorCode.RATE_LIMITED:
            return Refusal(429, "too_many_requests", f"the Mind: {exc.message}", FAILED_FOR_S)
        return Refusal(503, "unavailable", exc.message, FAILED_FOR_S)

    def again(self, left: float) -> Refusal:
        """The same refusal said from memory, `left` seconds before the bearer is checked again."""
        said = f"{self.message} (this bearer was refused moments ago; it is not checked again for {left:.1f} s)"
        return Refusal(self.status, self.error, said, left if self.status != 401 else None)


class Pool:
    """One connection to the Mind per client credential seen as a bearer (keyed by its digest), and
    the runs it follows, under a byte budget per credential and one for the whole server."""

    def __init__(
        self,
        url: str,
        ca: str | None,
        pin: str | None,
        keep: float,
        clock: Callable[[], float] = time.monotonic,
        connect: Callable[..., Any] = MindClient.connect,
    ) -> None:
        self.url, self.ca, self.pin, self.keep = url, ca, pin, keep
        self.ledger = Ledger(SERVER_BYTES)
        self._clock = clock
        self._connect_to_mind = connect
        self._runs: dict[str, Runs] = {}
        self._pending: dict[str, asyncio.Task[Runs]] = {}
        self._failed: dict[str, tuple[float, Refusal]] = {}  # insertion-ordered: the oldest first

    async def runs_for(self, token: str) -> Runs:
        """The runs of that credential, connecting as it once; `Refusal` if it is not one the Mind
        accepts (or cannot be checked now)."""
        key = hashlib.sha256(token.encode()).hexdigest()
        runs = self._runs.get(key)
        if runs is not None and runs.client.riding_out:  # known: connected, or back within the window
            return runs
        task = self._pending.get(key) or self._check(key, token, runs)
        # shielded: a request that goes away (its client gave up) leaves the check to the others
        return await asyncio.shield(task)

    def _check(self, key: str, token: str, old: Runs | None) -> asyncio.Task[Runs]:
        """Start checking a bearer with the Mind, or refuse at once (from memory, malformed, too many
        being checked)."""
        now = self._clock()
        failed = self._failed.get(key)
        if failed is not None:
            if now < failed[0]:
                raise failed[1].again(failed[0] - now)
            del self._failed[key]
        try:
            cred = Credential.parse(token)
        except ValueError as exc:
            raise Refusal(401, "invalid_token", f"the bearer is not a mindhand credential: {exc}") from None
        if cred.role != "client":
            raise Refusal(401, "invalid_token", "the bearer must be a client credential")
        if old is None and len(self._pending) >= PENDING_MAX:
            raise Refusal(
                429,
                "too_many_requests",
                f"{PENDING_MAX} credentials not seen before are being checked with the Mind already; retry shortly",
                1.0,
            )
        task = asyncio.get_running_loop().create_task(self._connect(key, cred, old), name="mcp-bearer-check")
        self._pending[key] = task
        task.add_done_callback(lambda t: self._checked(key, t))
        return task

    async def _connect(self, key: str, cred: Credential, old: Runs | None) -> Runs:
        try:
            client = await self._connect_to_mind(self.url, cred, ca=self.ca, pin=self.pin)
        except ClientError as exc:
            raise Refusal.of(exc) from None
        if old is not None:  # its connection is gone past the resume window: its runs are detached
            await old.close(self.keep)
        runs = self._runs[key] = Runs(client, ledger=Ledger(CREDENTIAL_BYTES, self.ledger))
        return runs

    def _checked(self, key: str, task: asyncio.Task[Runs]) -> None:
        self._pending.pop(key, None)
        if task.cancelled():
            return
        exc = task.exception()  # (retrieved here, so no waiter left is no warning)
        if isinstance(exc, Refusal):
            self._failed[key] = (self._clock() + FAILED_FOR_S, exc)
            while len(self._failed) > FAILED_MAX:
                del self._failed[next(iter(self._failed))]

    async def close(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
        for runs in self._runs.values():
            await runs.close(self.keep)
            await runs.client.close()


class BearerAuth:
    """ASGI middleware: every HTTP request needs a `Host` (and `Origin`, if any) this server answers
    to, checked first, then a bearer the Mind accepts as a client credential."""

    def __init__(
        self, app: Any, pool: Pool, current: contextvars.ContextVar[Runs], security: TransportSecuritySettings
    ) -> None:
        self.app = app
        self.pool = pool
        self.current = current
        self.hosts = TransportSecurityMiddleware(security)
        self.allowed = ", ".join(security.allowed_hosts)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if await self.foreign(scope, send):
            return
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        kind, _, token = header.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            await refuse(
                send, Refusal(401, "invalid_token", "Authorization: Bearer <mindhand client credential> is required")
            )
            return
        try:
            runs = await self.pool.runs_for(token.strip())
        except Refusal as r:
            await refuse(send, r)
            return
        reset = self.current.set(runs)
        try:
            await self.app(scope, receive, send)
        finally:
            self.current.reset(reset)

    async def foreign(self, scope: Any, send: Any) -> bool:
        """Refuse a request whose `Host` or `Origin` is not this server's (DNS rebinding), before its
        bearer costs anything: the SDK's own check, our sentence."""
        answer = await self.hosts.validate_request(Request(scope))
        if answer is None:
            return False
        headers = dict(scope.get("headers") or [])
        if answer.status_code == 421:
            host = headers.get(b"host", b"").decode("latin-1")
            why = f"Host {host!r} is not a name this server answers to ({self.allowed}; more with --allow-host)"
        else:
            origin = headers.get(b"origin", b"").decode("latin-1")
            why = f"Origin {origin!r} is not this server's ({self.allowed}; more with --allow-host)"
        await refuse(send, Refusal(answer.status_code, "invalid_request", why))
        return True


async def refuse(send: Any, r: Refusal) -> None:
    body = json.dumps({"error": r.error, "error_description": r.message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if r.status == 401:
        headers.append((b"www-authenticate", f'Bearer error="{r.error}"'.encode()))
    if r.retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(r.retry_after))).encode()))
    await send({"type": "http.response.start", "status": r.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
