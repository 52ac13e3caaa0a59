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


FOLLOW_WAIT_S = 60.0
"""How long a command that follows a run or a task (`attach`, `task wait`, `task logs --follow`)
waits for a Mind it cannot reach when it starts: the default resume window, as long as the Mind
keeps the run for it, so a follower started during a restart of the Mind misses nothing (`mind
exec` already rides out the same gap once connected)."""
WAITING = "mind: the Mind at {url} is not answering ({why}); waiting up to {within:g} s for it, as the run waits"


def patient(within: float, url: str) -> Callable[[Exception, float], float | None]:
    """The wait before the next try of a first connection that could not be made (`ClientError`
    UNREACHABLE only: a refused credential is not waited for), or None: give up. Said once on stderr."""
    import sys
    import time

    from mind.errors import ClientCode, ClientError

    start = time.monotonic()
    said = False

    def next_try(exc: Exception, _: float) -> float | None:
        nonlocal said
        if not isinstance(exc, ClientError) or exc.code != ClientCode.UNREACHABLE:
            return None
        left = start + within - time.monotonic()
        if left <= 0:
            return None
        if not said:
            said = True
            print(WAITING.format(url=url, why=exc.message, within=within), file=sys.stderr, flush=True)
        return min(0.5, left)

    return next_try


async def open_client(args: argparse.Namespace, follow: bool = False) -> Any:
    """A connected `MindClient` by the connection options; raises `ClientError` (a reconnect retries).
    `follow`: the command follows a run or a task, and waits for an unreachable Mind (FOLLOW_WAIT_S)."""
    import asyncio

    from mind.client.aio import MindClient, load_credential
    from protocol.io import gcstart

    gcstart.started()

    url, cred_path, ca, pin = connection_params(args)
    credential = load_credential(cred_path)
    next_try = patient(FOLLOW_WAIT_S if follow else 0.0, url)
    while True:
        try:
            return await MindClient.connect(url, credential, ca=ca, pin=pin)
        except Exception as exc:
            pause = next_try(exc, 0.0)
            if pause is None:
                raise
            args.waited_for_mind = True  # an outage at the start: what follows rides it out (`Reasker`)
            await asyncio.sleep(pause)


def with_client(
    command: ClientCommand, follows: Callable[[argparse.Namespace], bool] | None = None
) -> Callable[[argparse.Namespace], int]:
    """`command` as a parser's handler: one connection for its whole life, closed at the end, and
    a `ClientError` from anywhere in it as `mind: <why>` and 125 (with its code under `--json`).
    `follows(args)`: the command follows a run or a task (its first connection waits for the Mind)."""

    def handler(args: argparse.Namespace) -> int:
        import asyncio

        return asyncio.run(_run(command, args, follows is not None and follows(args)))

    return handler


async def _run(command: ClientCommand, args: argparse.Namespace, follow: bool = False) -> int:
    from mind.errors import ClientError

    try:
        client = await open_client(args, follow)
    except ClientError as exc:
        die(exc.message, kind=exc.code)
    try:
        return await command(client, args)
    except ClientError as exc:
        die(exc.message, kind=exc.code)
    finally:
        await client.close()
