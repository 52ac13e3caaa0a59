"""`mind mcp`: serve every Hand's tools to an AI agent over the Model Context Protocol (docs/agents.md).

Exit codes: 0 when the agent ends the session (stdio) or the server is stopped (HTTP); 2 bad usage
(plain HTTP on an address beyond loopback without `--insecure-http` among it) or the optional SDK
missing; 125 the Mind cannot be reached or refused the credential."""

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
        "--insecure-http",
        action="store_true",
        help="with --listen on an address beyond loopback: serve plain HTTP anyway (only where TLS is "
        "terminated in front of this server: every request carries a client credential)",
    )
    sp.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME[:PORT]",
        help="with --listen: also answer requests whose Host header is NAME (the name clients or a proxy "
        "in front use); others are refused (DNS rebinding). Default: the listen address (for 0.0.0.0, "
        "this machine's names and addresses). Repeat it for several",
    )
    sp.add_argument(
        "--keep",
        type=options.duration,
        default=3600.0,
        metavar="DURATION",
        help="when this server ends, runs still going are kept unattended this long (e.g. 30m, 2h; default "
        "1h; the Mind caps it with --keep-max)",
    )
    sp.set_defaults(handler=run)


def checked_listen(args: argparse.Namespace) -> str | None:
    """What is wrong with `--listen` and its companions (a sentence), or None; warns on stderr when
    plain HTTP is served beyond loopback because `--insecure-http` asked for it."""
    from mind.mcp import listen

    if args.listen is None:
        if args.insecure_http or args.allow_host or args.tls_cert:
            return "--tls-cert, --insecure-http and --allow-host go with --listen HOST:PORT"
        return None
    try:
        host, _ = listen.split(args.listen)
    except ValueError as exc:
        return str(exc)
    if args.insecure_http and args.tls_cert is not None:
        return "--insecure-http and --tls-cert exclude each other: with a certificate this server speaks HTTPS"
    if listen.loopback(host) or args.tls_cert is not None:
        return None
    if not args.insecure_http:
        return (
            f"--listen {args.listen} is beyond loopback, and over plain HTTP every request's bearer (a client "
            "credential, its long-term secret) would cross the network in clear text: give --tls-cert and "
            "--tls-key, or --insecure-http if TLS is terminated in front of this server"
        )
    print(
        f"mind mcp: warning: --insecure-http: serving plain HTTP on {args.listen}; every bearer (a client "
        "credential) crosses the network in clear text unless TLS is terminated in front of this server",
        file=sys.stderr,
        flush=True,
    )
    return None


def run(args: argparse.Namespace) -> int:
    try:
        import mcp  # noqa: F401 - only whether it is there
    except ImportError:
        print(f"mind: {MISSING}", file=sys.stderr)
        return EXIT_USAGE
    if (args.tls_cert is None) != (args.tls_key is None):
        print("mind: --tls-cert and --tls-key go together", file=sys.stderr)
        return EXIT_USAGE
    if (wrong := checked_listen(args)) is not None:
        print(f"mind: {wrong}", file=sys.stderr)
        return EXIT_USAGE
    if args.keep <= 0:
        print("mind: --keep must be more than 0 (e.g. 30m, 2h)", file=sys.stderr)
        return EXIT_USAGE
    from mind.mcp.server import main

    return main(args)
