"""`mind mcp`: serve every Hand's tools to an AI agent over the Model Context Protocol (docs/agents.md).

`--print-config` prints a desktop agent's configuration entry for this machine instead of serving:
this `mind` by its absolute path (an agent starts its servers with its own PATH, which seldom holds
a virtualenv's `bin`), and the Mind's URL and the credential file as `mind exec` finds them here.

Exit codes: 0 when the agent ends the session (stdio), the server is stopped (HTTP), or the
configuration was printed; 2 bad usage (plain HTTP on an address beyond loopback without
`--insecure-http` among it) or the optional SDK missing; 125 the Mind cannot be reached, refused the
credential, or its URL, credential or CA do not fit together (one line on stderr, never a traceback)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from mind.cli import options
from mind.cli.exits import EXIT_USAGE

KEEP_DEFAULT = 3600.0
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
        default=KEEP_DEFAULT,
        metavar="DURATION",
        help="when this server ends, runs still going are kept unattended this long (e.g. 30m, 2h; default "
        "1h; the Mind caps it with --keep-max)",
    )
    sp.add_argument(
        "--print-config",
        action="store_true",
        help="print the JSON a desktop agent's configuration needs to start this server (this mind's "
        "absolute path, the Mind's URL and the credential file as found here) and exit",
    )
    sp.set_defaults(handler=run)


def this_program() -> list[str]:
    """The argv that starts this `mind` from anywhere: its absolute path (the console script that
    was run, or the one beside this Python), else this Python with `-m mind`. Not resolved through
    symlinks: a virtualenv's `bin/python` is a symlink whose target runs outside the virtualenv, and
    pipx's `~/.local/bin/mind` outlives upgrades where its target may not."""
    ran = sys.argv[0] if sys.argv else ""
    beside = os.path.join(os.path.dirname(sys.executable), "mind")
    for path in (ran, beside):
        if os.path.basename(path) == "mind" and os.path.isfile(path) and os.access(path, os.X_OK):
            return [os.path.abspath(path)]
    return [sys.executable, "-m", "mind"]


def print_config(args: argparse.Namespace) -> int:
    """The agent's configuration entry on stdout, checked first: a credential file that cannot be
    read or a CA beside a `ws://` URL is said here, not later in an agent's log."""
    from mind.client.credentials import load_credential
    from mind.client.endpoint import locate
    from mind.errors import ClientError
    from mind.home import admin_cred_file, home

    if args.listen is not None:
        print(
            "mind: --print-config is for a local agent (stdio); an agent over HTTP is configured with the URL "
            "and its bearer (docs/agents.md)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        url, cred, ca, pin = locate(args.home, args.mind, args.credential, args.ca, args.pin)
        load_credential(cred)
    except ClientError as exc:
        print(f"mind: {exc.message}", file=sys.stderr)
        return 125
    cred = os.path.abspath(os.path.expanduser(cred))  # the agent starts the server somewhere else
    env = {"MINDHAND_URL": url, "MINDHAND_CREDENTIAL": cred}
    if ca:
        env["MINDHAND_CA"] = os.path.abspath(os.path.expanduser(ca))
    if pin:
        env["MINDHAND_PIN"] = pin
    command, *head = this_program()
    extra = ["--keep", f"{args.keep:g}s"] if args.keep != KEEP_DEFAULT else []
    entry = {"command": command, "args": [*head, "mcp", *extra], "env": env}
    print(json.dumps({"mcpServers": {"mindhand": entry}}, indent=2))
    if cred == os.path.abspath(admin_cred_file(home(args.home))):
        print(
            "mind mcp: note: that is the local Mind's admin credential (every Hand, every tool); give the agent "
            "its own: mind client add agent --hands ... --out agent.cred, then --print-config --credential agent.cred",
            file=sys.stderr,
        )
    return 0


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
    if args.print_config:
        return print_config(args)
    from mind.mcp.server import main

    return main(args)
