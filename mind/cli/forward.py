"""`mind forward`: ports reached through a Hand, as `ssh -L` (DESIGN §18; mind/client/forward.py).

    mind forward [--json] HAND -L [BIND:]PORT:HOST:HOSTPORT [-L [BIND:]PORT:/PATH/ON/HAND.sock ...]
    mind forward [--json] HAND -R [BIND:]PORT:HOST:HOSTPORT     # the Hand listens, connections come here

In order, so that nothing is opened for a command that cannot work: every spec is read (a bad one:
exit 2), every listening socket is bound (a port in use: exit 2, `cannot listen on 127.0.0.1:5432:
address in use`), then the Mind is reached and the Hand asked whether it lets each destination be
reached (a refusal: exit 125 with its reason), then all listen: one line per forward on stderr
(`forwarding 127.0.0.1:41234 -> box:127.0.0.1:5432`), and with `--json` one object per forward on
stdout, flushed at once so a script that asked for port 0 reads the port. It runs until Ctrl-C or
SIGTERM (exit 0: the connections' runs are cancelled, bounded). A connection that fails (refused,
reset on the Hand's side) is reset here and said in one line on stderr (`box: 127.0.0.1:5433 refused
the connection`); the forward goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time
from typing import Any

from mind.cli import options
from mind.cli.connection import open_client
from mind.cli.exits import EXIT_USAGE, die
from mind.cli.formatting import printable
from mind.client.forward import ForwardError, ForwardSpec, LocalForward, RemoteForward, bind_listener, parse_spec
from mind.errors import ClientError
from protocol import limits
from protocol.io import heap

SPEC_HELP = "[BIND:]PORT:HOST:HOSTPORT, or [BIND:]PORT:/PATH for a Unix socket on the Hand"


def add_parsers(sub: Any) -> None:
    fw = options.command(
        sub,
        "forward",
        help="carry local ports to destinations seen from a Hand (ssh -L), each connection one run",
        description="Listen on this machine and carry each accepted TCP connection to HOST:HOSTPORT as "
        "the Hand sees it (or to a Unix socket inside its root). BIND defaults to 127.0.0.1 ('*': every "
        "interface), PORT 0 picks a free port, IPv6 addresses go in brackets. The Hand decides which "
        "destinations it allows (hand run --forward-allow; default its loopback). Runs until Ctrl-C or "
        "SIGTERM. Exit: 0 stopped, 2 a bad spec or a port that cannot be listened on, 125 refused (the "
        "Hand does not allow the destination, Mind unreachable). Needs the tool forward.",
    )
    options.connection(fw)
    fw.add_argument("hand", metavar="HAND", help="the Hand the connections go through")
    fw.add_argument(
        "-L",
        dest="local",
        action="append",
        default=[],
        metavar="SPEC",
        help=f"a local forward: {SPEC_HELP} (repeatable)",
    )
    fw.add_argument(
        "-R",
        dest="remote",
        action="append",
        default=[],
        metavar="SPEC",
        help="a remote forward: the Hand listens on [BIND:]PORT (its loopback) and carries each connection "
        "to HOST:HOSTPORT (or /PATH, a Unix socket) as seen from HERE (repeatable)",
    )
    options.json_output(
        fw, 'one JSON object per forward on stdout once listening: {"listen", "to", "hand", "direction"}'
    )
    fw.set_defaults(handler=handle)


def specs_of(args: argparse.Namespace) -> list[ForwardSpec]:
    """Every `-L`, read before anything is opened: a bad one ends the command (exit 2)."""
    if not limits.LABEL_RE.match(args.hand):
        die(f"forward: {args.hand!r} is not a Hand name", EXIT_USAGE)
    if not args.local and not getattr(args, "remote", []):
        die(f"forward: give at least one -L {SPEC_HELP} (or -R)", EXIT_USAGE)
    specs: list[ForwardSpec] = []
    for text in args.local:
        try:
            specs.append(parse_spec(text))
        except ValueError as exc:
            die(f"forward: -L: {exc}", EXIT_USAGE)
    return specs


def remote_specs_of(args: argparse.Namespace) -> list[ForwardSpec]:
    """Every `-R`: the Hand's [BIND:]PORT, then the destination here (a bad one: exit 2)."""
    out: list[ForwardSpec] = []
    for text in getattr(args, "remote", []):
        try:
            out.append(parse_spec(text))
        except ValueError as exc:
            die(f"forward: -R: {exc}", EXIT_USAGE)
    return out


def handle(args: argparse.Namespace) -> int:
    specs = specs_of(args)
    remotes = remote_specs_of(args)
    heap.keep_large_buffers()  # a tunnel's chunks through this process: their pages kept, not faulted in anew
    return asyncio.run(serve(args, specs, remotes))


def bind_all(specs: list[ForwardSpec]) -> list[socket.socket]:
    """A bound socket per spec, or exit 2 naming the one that cannot listen (the others closed)."""
    socks: list[socket.socket] = []
    try:
        for spec in specs:
            socks.append(bind_listener(spec))
    except ForwardError as exc:
        for s in socks:
            s.close()
        die(f"forward: {exc.message}", EXIT_USAGE)
    return socks


def say(line: str) -> None:
    print(printable(line), file=sys.stderr, flush=True)


class Failures:
    """`on_error`: one line per connection that failed, up to `per_s` a second; past that, a
    burst (10,000 connections refused past the client's stream budget printed 9,744 identical
    lines) is counted and said as `(and 9734 more like it)` when the second is over (at the next
    line) or at the end."""

    def __init__(self, per_s: int = 10) -> None:
        self.per_s = per_s
        self.window = 0.0
        self.said = 0
        self.repeats = 0

    def __call__(self, line: str) -> None:
        now = time.monotonic()
        if now - self.window >= 1.0:
            self.flush()
            self.window, self.said = now, 0
        if self.said < self.per_s:
            self.said += 1
            say(line)
        else:
            self.repeats += 1

    def flush(self) -> None:
        if self.repeats:
            say(f"(and {self.repeats} more like it)")
            self.repeats = 0


async def serve(args: argparse.Namespace, specs: list[ForwardSpec], remotes: list[ForwardSpec] | None = None) -> int:
    socks = bind_all(specs)
    try:
        mc = await open_client(args)
    except ClientError as exc:
        for s in socks:
            s.close()
        die(exc.message, kind=exc.code)
    failed = Failures()
    forwards = [
        LocalForward(mc, args.hand, spec, sock=s, on_error=failed) for spec, s in zip(specs, socks, strict=True)
    ]
    reverse = [RemoteForward(mc, args.hand, spec, on_error=failed) for spec in remotes or []]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    try:
        for fwd in forwards:
            await fwd.check()  # a refused destination: 125, before anything listens
        for fwd in forwards:
            try:
                await fwd.start()
            except ForwardError as exc:
                die(f"forward: {exc.message}", EXIT_USAGE)
        for rev in reverse:
            await rev.start()  # the Hand's refusal (a bind off its loopback, a port in use): 125
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        for fwd in forwards:
            say(f"forwarding {fwd.listen} -> {args.hand}:{fwd.to}")
            if args.json:
                print(json.dumps(fwd.describe()), flush=True)
        for rev in reverse:
            say(f"forwarding {args.hand}:{rev.listen} -> {rev.to}")
            if args.json:
                print(json.dumps(rev.describe()), flush=True)
        await stop.wait()
        return 0
    except ClientError as exc:  # a ForwardError from a check: the Hand's reason
        die(exc.message, kind=exc.code)
    finally:
        await asyncio.gather(*(fwd.close() for fwd in forwards), *(rev.close() for rev in reverse))
        failed.flush()
        await mc.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
