"""`mind mcp`: the MCP server (the official SDK's `MCPServer`) over stdio or streamable HTTP, acting as
an ordinary client of the Mind.

Stdio: one connection to the Mind, with the credential the connection options name (`--credential`,
`$MINDHAND_CREDENTIAL`, the local Mind's admin credential), as `mind exec` would use.

Streamable HTTP (`--listen HOST:PORT`, endpoint `/mcp`): each request carries `Authorization: Bearer
<token>`, and the token must be a mindhand client credential (`mh1:client:NAME:SECRET`, what `mind
client add` writes). The server connects to the Mind as that credential (one connection per
credential, kept for the next request), so the Mind's own authentication and scope decide: a token
the Mind refuses, or anything that is not a client credential, is answered 401 and reaches no tool.
No second authority exists to configure or to drift from the Mind's. How bearers are checked without
one holding up another is mind/mcp/bearers.py; which `Host` headers are answered (DNS rebinding) and
why a listen address beyond loopback needs TLS is mind/mcp/listen.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import os
import signal
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, InputRequiredResult
from mcp_types import Tool as MCPTool

from mind import __version__
from mind.client.aio import MindClient
from mind.errors import ClientError
from mind.mcp import listen, tools
from mind.mcp.bearers import BearerAuth, Pool
from mind.mcp.cancels import PeerCancels
from mind.mcp.runs import Runs
from protocol.io import gcstart

INSTRUCTIONS = (
    "mindhand runs commands and file operations on remote machines (Hands). Call `hands` to see them. "
    "`exec` waits up to wait_s (30 s) and returns a command still going as still_running with its run id: "
    "it was not stopped; use run_get, read_output and cancel with that id. For work of hours use task_start."
)

current_runs: contextvars.ContextVar[Runs] = contextvars.ContextVar("mindhand_mcp_runs")
"""The credential this call acts as (its client and runs): set per stdio server, or per HTTP request."""


def where(args: argparse.Namespace) -> tuple[str, str, str | None, str | None]:
    """The Mind's URL, the credential file, CA and pin from `mind mcp`'s connection options, found as
    every `mind` command finds them (`locate` of the client library: this server, a client of the
    Mind, imports no CLI module); `ClientError` when no URL is given anywhere."""
    from mind.client.endpoint import locate

    return locate(args.home, args.mind, args.credential, args.ca, args.pin)


def _scope_tools() -> tuple[str, ...] | None:
    """The Hand tools this call's credential may use, as the Mind's welcome said (None: unknown)."""
    try:
        runs = current_runs.get()
    except LookupError:
        return None
    return getattr(runs.client, "tools", None)


class Server(MCPServer):
    """The SDK's server, with a tool's arguments closed: its schema says `additionalProperties: false`
    and a call naming an argument the tool does not take is refused (a tool error naming the valid
    ones), where the SDK would drop the argument and run the call without it. Through the two public
    methods the SDK's handlers call, so its answers keep their envelope for every protocol version."""

    _arguments: dict[str, list[str]] | None = None

    async def list_tools(self) -> list[MCPTool]:
        listed = await super().list_tools()
        allowed = _scope_tools()
        return [
            t.model_copy(update={"input_schema": {**t.input_schema, "additionalProperties": False}})
            for t in listed
            if tools.offered(t.name, allowed)
        ]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        if self._arguments is None:
            self._arguments = {t.name: list(t.input_schema.get("properties", {})) for t in await super().list_tools()}
        known = self._arguments.get(name)
        if known is not None and (wrong := tools.unknown_arguments(name, arguments, known)) is not None:
            return tools.failure("invalid_request", wrong)
        return await super().call_tool(name, arguments, context)


def build() -> MCPServer:
    cancels = PeerCancels(current_runs.get)
    server: MCPServer = Server(
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


async def serve_http(args: argparse.Namespace, server: MCPServer, host: str, port: int) -> int:
    import uvicorn

    try:
        url, _, ca, pin = where(args)
    except ClientError as exc:  # no Mind URL anywhere
        print(f"mind: {exc.message}", file=sys.stderr)
        return 125
    pool = Pool(url, ca, pin, args.keep)
    hosts = listen.allowed_hosts(host, port, getattr(args, "allow_host", None))
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=listen.allowed_origins(hosts)
    )
    app = server.streamable_http_app(host=host, transport_security=security)
    tls = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key} if args.tls_cert else {}
    auth = BearerAuth(app, pool, current_runs, security)
    config = uvicorn.Config(auth, host=host, port=port, log_level="warning", lifespan="on", **tls)
    web = uvicorn.Server(config)
    scheme = "https" if args.tls_cert else "http"
    print(f"mind mcp: serving {scheme}://{listen.bracketed(host)}:{port}/mcp", file=sys.stderr, flush=True)
    try:
        await web.serve()
    finally:
        with contextlib.suppress(Exception):
            await pool.close()
    return 0


def main(args: argparse.Namespace) -> int:
    server = build()
    gcstart.started()
    if args.listen is None:
        return asyncio.run(serve_stdio(args, server))
    host, port = listen.split(args.listen)
    return asyncio.run(serve_http(args, server, host, port))
