"""Where the Mind is and who we are to it: flags, then `MINDHAND_*`, then the local Mind's files; and
the frame every asyncio client command runs in (connect, run, say why on a `ClientError`, close)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from mind.cli.exits import die

ClientCommand = Callable[[Any, argparse.Namespace], Awaitable[int]]
"""A command run with a connected `MindClient` (`client, args -> exit code`)."""


def connection_params(args: argparse.Namespace) -> tuple[str, str, str | None, str | None]:
    """URL, credential file, CA file and pin: flags, then env vars, then the local Mind's files (the
    client library's `locate`, which `mind mcp` uses too); no URL anywhere ends the command."""
    from mind.client.endpoint import locate
    from mind.errors import ClientError

    try:
        return locate(args.home, args.mind, args.credential, args.ca, args.pin)
    except ClientError as exc:
        die(exc.message, kind=exc.code)


async def open_client(args: argparse.Namespace) -> Any:
    """A connected `MindClient` by the connection options; raises `ClientError` (a reconnect retries)."""
    from mind.client.aio import MindClient, load_credential

    url, cred_path, ca, pin = connection_params(args)
    return await MindClient.connect(url, load_credential(cred_path), ca=ca, pin=pin)


def with_client(command: ClientCommand) -> Callable[[argparse.Namespace], int]:
    """`command` as a parser's handler: one connection for its whole life, closed at the end, and
    a `ClientError` from anywhere in it as `mind: <why>` and 125 (with its code under `--json`)."""

    def handler(args: argparse.Namespace) -> int:
        import asyncio

        return asyncio.run(_run(command, args))

    return handler


async def _run(command: ClientCommand, args: argparse.Namespace) -> int:
    from mind.errors import ClientError

    try:
        client = await open_client(args)
    except ClientError as exc:
        die(exc.message, kind=exc.code)
    try:
        return await command(client, args)
    except ClientError as exc:
        die(exc.message, kind=exc.code)
    finally:
        await client.close()
