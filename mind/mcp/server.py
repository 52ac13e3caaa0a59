"""`mind mcp`: the MCP server (the official SDK's `MCPServer`) over stdio or streamable HTTP, acting as
an ordinary client of the Mind.

Stdio: one connection to the Mind, with the credential the connection options name (`--credential`,
`$MINDHAND_CREDENTIAL`, the local Mind's admin credential), as `mind exec` would use.

Streamable HTTP (`--listen HOST:PORT`, endpoint `/mcp`): each request carries `Authorization: Bearer
<token>`, and the token must be a mindhand client credential (`mh1:client:NAME:SECRET`, what `mind
client add` writes). The server connects to the Mind as that credential (one connection per
credential, kept for the next request), so the Mind's own authentication and scope decide: a token
the Mind refuses, or anything that is not a client credential, is answered 401 and reaches no tool.
No second authority exists to configure or to drift from the Mind's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import hashlib
import json
import os
import signal
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from mind import __version__
from mind.client.aio import MindClient
from mind.errors import ClientError
from mind.mcp import tools
from mind.mcp.cancels import PeerCancels
from mind.mcp.runs import Runs
from protocol.auth import Credential
from protocol.codes import ErrorCode

INSTRUCTIONS = (
    "mindhand runs commands and file operations on remote machines (Hands). Call `hands` to see them. "
    "`exec` waits up to wait_s (30 s) and returns a command still going as still_running with its run id: "
    "it was not stopped; use run_get, read_output and cancel with that id. For work of hours use task_start."
)
AUTH_FAILED = frozenset({ErrorCode.AUTH_FAILED, ErrorCode.REVOKED})

current_runs: contextvars.ContextVar[Runs] = contextvars.ContextVar("mindhand_mcp_runs")
"""The credential this call acts as (its client and runs): set per stdio server, or per HTTP request."""


def where(args: argparse.Namespace) -> tuple[str, str, str | None, str | None]:
    """The Mind's URL, the credential file, CA and pin from `mind mcp`'s connection options, found as
    every `mind` command finds them (`locate` of the client library: this server, a client of the
    Mind, imports no CLI module); `ClientError` when no URL is given anywhere."""
    from mind.client.endpoint import locate

    return locate(args.home, args.mind, args.credential, args.ca, args.pin)


def build() -> MCPServer:
    cancels = PeerCancels(current_runs.get)
    server: MCPServer = MCPServer(
        "mindhand",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
        middleware=[cancels.middleware],
    )
    tools.register(server, current_runs.get, cancels)
    return server


async def serve_stdio(args: argparse.Namespace, server: MCPServer) -> int:
    from mind.client.aio import load_credential

    try:
        url, cred_path, ca, pin = where(args)
        client = await MindClient.connect(url, load_credential(cred_path), ca=ca, pin=pin)
    except ClientError as exc:
        print(f"mind: {exc.message}", file=sys.stderr)
        return 125
    runs = Runs(client)
    current_runs.set(runs)
    loop = asyncio.get_running_loop()
    exiting: list[asyncio.Task[None]] = []

    async def finish() -> None:
        with contextlib.suppress(Exception):
            await runs.close(args.keep)
            await client.close()
        os._exit(0)

    # SIGTERM (an agent or a supervisor stopping its server): detach the runs still going, then exit.
    # Not by cancelling the server: the SDK reads stdin in a worker thread, which a cancel cannot
    # interrupt, so it would wait for input that never comes.
    loop.add_signal_handler(signal.SIGTERM, lambda: exiting.append(loop.create_task(finish())))
    try:
        await server.run_stdio_async()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        await runs.close(args.keep)
        await client.close()
    return 0


class Pool:
    """One connection to the Mind per client credential seen as a bearer (keyed by its digest)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.url, _, self.ca, self.pin = where(args)
        self._runs: dict[str, Runs] = {}
        self._lock = asyncio.Lock()
        self.keep: float = args.keep

    async def runs_for(self, token: str) -> Runs:
        """The runs of that credential, connecting as it; `ClientError` if the Mind refuses it."""
        key = hashlib.sha256(token.encode()).hexdigest()
        async with self._lock:
            runs = self._runs.get(key)
            if runs is not None and runs.client.riding_out:  # connected, or back within the window
                return runs
            try:
                cred = Credential.parse(token)
            except ValueError as exc:
                raise ClientError(ErrorCode.AUTH_FAILED, f"the bearer is not a mindhand credential: {exc}") from None
            if cred.role != "client":
                raise ClientError(ErrorCode.AUTH_FAILED, "the bearer must be a client credential")
            client = await MindClient.connect(self.url, cred, ca=self.ca, pin=self.pin)
            if runs is not None:
                await runs.close(self.keep)
            runs = self._runs[key] = Runs(client)
            return runs

    async def close(self) -> None:
        for runs in self._runs.values():
            await runs.close(self.keep)
            await runs.client.close()


class BearerAuth:
    """ASGI middleware: every HTTP request needs a bearer the Mind accepts as a client credential."""

    def __init__(self, app: Any, pool: Pool) -> None:
        self.app = app
        self.pool = pool

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        kind, _, token = header.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            await refuse(send, 401, "invalid_token", "Authorization: Bearer <mindhand client credential> is required")
            return
        try:
            runs = await self.pool.runs_for(token.strip())
        except ClientError as exc:
            status = 401 if exc.code in AUTH_FAILED else 503
            await refuse(send, status, "invalid_token" if status == 401 else "unavailable", exc.message)
            return
        reset = current_runs.set(runs)
        try:
            await self.app(scope, receive, send)
        finally:
            current_runs.reset(reset)


async def refuse(send: Any, status: int, error: str, message: str) -> None:
    body = json.dumps({"error": error, "error_description": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", f'Bearer error="{error}"'.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve_http(args: argparse.Namespace, server: MCPServer, host: str, port: int) -> int:
    import uvicorn

    try:
        pool = Pool(args)
    except ClientError as exc:  # no Mind URL anywhere
        print(f"mind: {exc.message}", file=sys.stderr)
        return 125
    local = host in ("127.0.0.1", "localhost", "::1")
    security = None if local else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(host=host, transport_security=security)
    tls = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key} if args.tls_cert else {}
    config = uvicorn.Config(BearerAuth(app, pool), host=host, port=port, log_level="warning", lifespan="on", **tls)
    web = uvicorn.Server(config)
    scheme = "https" if args.tls_cert else "http"
    print(f"mind mcp: serving {scheme}://{host}:{port}/mcp", file=sys.stderr, flush=True)
    try:
        await web.serve()
    finally:
        with contextlib.suppress(Exception):
            await pool.close()
    return 0


def main(args: argparse.Namespace) -> int:
    server = build()
    if args.listen is None:
        return asyncio.run(serve_stdio(args, server))
    host, _, port = args.listen.rpartition(":")
    return asyncio.run(serve_http(args, server, host.strip("[]") or "127.0.0.1", int(port)))
