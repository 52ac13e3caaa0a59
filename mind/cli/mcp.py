"""`mind mcp`: serve every Hand's tools to an AI agent over the Model Context Protocol (docs/agents.md).

Exit codes: 0 when the agent ends the session (stdio) or the server is stopped (HTTP); 2 bad usage or
the optional SDK missing; 125 the Mind cannot be reached or refused the credential."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mind.cli import options
from mind.cli.exits import EXIT_USAGE

MISSING = "mind mcp needs the MCP SDK, an optional extra: pip install 'mindhand[mcp]'"


def add_parsers(sub: Any) -> None:
    sp = options.command(
        sub,
        "mcp",
        help="serve every Hand's tools to an AI agent (Model Context Protocol, stdio or HTTP)",
        description="An MCP server acting as a client of the Mind with its credential: stdio by default "
        "(for a local agent), streamable HTTP at /mcp with --listen (each request's bearer must be a "
        "mindhand client credential; the server acts as that one). See docs/agents.md.",
    )
    options.connection(sp)
    sp.add_argument(
        "--listen", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio"
    )
    sp.add_argument("--tls-cert", metavar="FILE", help="with --listen: serve HTTPS with this certificate (PEM)")
    sp.add_argument("--tls-key", metavar="FILE", help="with --listen: the certificate's private key (PEM)")
    sp.add_argument(
        "--keep",
        type=options.duration,
        default=3600.0,
        metavar="DURATION",
        help="when this server ends, runs still going are kept unattended this long (e.g. 30m, 2h; default "
        "1h; the Mind caps it with --keep-max)",
    )
    sp.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        import mcp  # noqa: F401 - only whether it is there
    except ImportError:
        print(f"mind: {MISSING}", file=sys.stderr)
        return EXIT_USAGE
    if args.listen is not None:
        host, sep, port = args.listen.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            print(f"mind: --listen wants HOST:PORT (e.g. 127.0.0.1:7480), not {args.listen!r}", file=sys.stderr)
            return EXIT_USAGE
    if (args.tls_cert is None) != (args.tls_key is None):
        print("mind: --tls-cert and --tls-key go together", file=sys.stderr)
        return EXIT_USAGE
    if args.keep <= 0:
        print("mind: --keep must be more than 0 (e.g. 30m, 2h)", file=sys.stderr)
        return EXIT_USAGE
    from mind.mcp.server import main

    return main(args)
