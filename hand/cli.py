"""`hand run ...`: start the Hand agent on this machine.

Local configuration errors (flags, credential file, root, state dir) are the only things that stop
a Hand for good: they print one clear line on stderr and exit 2 before any connection is tried.
Everything the network does (refusals, drops, a Mind that is down) is retried forever.

Heavy modules are imported inside `main`, so `hand --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = "~/.local/state/mindhand-hand"


class ConfigError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hand", description="The mindhand Hand agent.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="connect to a Mind and run tools in a root directory",
        description="Connect out to a Mind and run the tools it asks for, confined to --root. "
        "Reconnects forever; SIGTERM/SIGINT stop it gracefully.",
    )
    run.add_argument("--mind", metavar="URL", default=os.environ.get("MINDHAND_URL"),
                     help="ws:// or wss:// URL of the Mind (env MINDHAND_URL)")
    run.add_argument("--credential", metavar="FILE", default=os.environ.get("MINDHAND_CREDENTIAL"),
                     help="file holding this hand's credential mh1:hand:LABEL:HEX (env MINDHAND_CREDENTIAL)")
    run.add_argument("--root", metavar="DIR", required=True,
                     help="directory that file tools and command cwd cannot leave")
    run.add_argument("--state-dir", metavar="DIR", default=DEFAULT_STATE_DIR,
                     help=f"private state directory, created 0700 (default {DEFAULT_STATE_DIR})")
    run.add_argument("--allow-tools", metavar="LIST", help="comma-separated tools to allow (default: all)")
    run.add_argument("--deny-tools", metavar="LIST", default="", help="comma-separated tools to deny (wins over allow)")
    run.add_argument("--max-backoff", metavar="S", type=float, default=30.0, help="largest reconnect delay (default 30)")
    run.add_argument("--ping-interval", metavar="S", type=float, default=10.0,
                     help="keepalive ping interval and timeout (default 10)")
    run.add_argument("--kill-grace", metavar="S", type=float, default=5.0,
                     help="seconds between SIGTERM and SIGKILL of a cancelled command (default 5)")
    run.add_argument("--log-format", choices=("auto", "console", "json"), default="auto")
    run.add_argument("--log-level", default="info", help="debug, info, warning, error (default info)")
    return parser


def _read_credential(path: str | None) -> Any:
    from protocol.auth import Credential

    if not path:
        raise ConfigError("no credential: pass --credential FILE or set MINDHAND_CREDENTIAL")
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read credential file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        cred = Credential.parse(text)
    except ValueError as exc:
        raise ConfigError(f"bad credential in {path}: {exc}") from None
    if cred.role != "hand":
        raise ConfigError(f"credential in {path} is for a {cred.role}, not a hand")
    return cred


def _state_dir(path: str) -> Path:
    state = Path(path).expanduser()
    try:
        if not state.is_dir():
            state.mkdir(mode=0o700, parents=True)
            os.chmod(state, 0o700)
    except OSError as exc:
        raise ConfigError(f"cannot create state dir {state}: {exc.strerror or exc}") from None
    return state


def build_config(args: argparse.Namespace) -> Any:
    from hand.agent import AgentConfig, validate_url
    from hand.policy import Policy, parse_tool_list

    if not args.mind:
        raise ConfigError("no Mind URL: pass --mind URL or set MINDHAND_URL")
    try:
        validate_url(args.mind)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cred = _read_credential(args.credential)
    root = Path(args.root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"--root {args.root} is not a directory")
    try:
        allow = None if args.allow_tools is None else parse_tool_list(args.allow_tools)
        deny = parse_tool_list(args.deny_tools)
    except ValueError as exc:
        raise ConfigError(f"--allow-tools/--deny-tools: {exc}") from None
    for name, value, low in (("--max-backoff", args.max_backoff, 0.5), ("--ping-interval", args.ping_interval, 0.1)):
        if not value >= low or value > 3600:
            raise ConfigError(f"{name} must be between {low} and 3600 seconds")
    if not 0 <= args.kill_grace <= 600:
        raise ConfigError("--kill-grace must be between 0 and 600 seconds")
    return AgentConfig(
        url=args.mind,
        credential=cred,
        root=Path(os.path.realpath(root)),
        policy=Policy(allow=allow, deny=deny),
        state_dir=_state_dir(args.state_dir),
        max_backoff=args.max_backoff,
        ping_interval=args.ping_interval,
        kill_grace=args.kill_grace,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = build_config(args)
        from protocol import logs

        try:
            logs.configure(args.log_format, args.log_level)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    except ConfigError as exc:
        print(f"hand: {exc}", file=sys.stderr)
        return 2

    import asyncio

    from hand.agent import run_agent

    return asyncio.run(run_agent(config))
