"""A command line's description of what to run, as the arguments of the `exec` or `shell` tool:
`--shell COMMAND` or `-- ARGV`, `--cwd`, `--env K=V`, and the resource limits. One builder for
`mind exec`, `mind shell`, `mind task start` and fleet runs, so they cannot read a flag differently."""

from __future__ import annotations

import argparse
from typing import Any

from mind.cli.exits import EXIT_USAGE, die


def tool_args_from(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """`--shell COMMAND` or `-- ARGV`, plus `--cwd` and `--env`, as a tool call."""
    if args.shell is not None and args.argv:
        die("give either --shell COMMAND or -- ARGV, not both", EXIT_USAGE)
    login = getattr(args, "login", False)  # `mind shell`: the Hand starts the user's login shell
    if args.shell is None and not args.argv and not login:
        die("nothing to run: give -- ARGV or --shell COMMAND", EXIT_USAGE)
    tool_args: dict[str, Any] = (
        {} if login else {"command": args.shell} if args.shell is not None else {"argv": list(args.argv)}
    )
    if args.cwd:
        tool_args["cwd"] = args.cwd
    if args.env:
        env = {}
        for kv in args.env:
            k, sep, v = kv.partition("=")
            if not sep or not k:
                die(f"--env wants K=V, got {kv!r}", EXIT_USAGE)
            env[k] = v
        tool_args["env"] = env
    lim: dict[str, int] = {}
    for flag, key in (("cpu_seconds", "cpu_seconds"), ("max_files", "open_files"), ("max_procs", "processes")):
        value = getattr(args, flag, None)
        if value is not None:
            if value <= 0:
                die(f"--{flag.replace('_', '-')} must be positive", EXIT_USAGE)
            lim[key] = value
    if getattr(args, "memory", None):
        lim["address_space"] = size(args.memory)
    if lim:
        tool_args["limits"] = lim
    return ("shell" if args.shell is not None else "exec"), tool_args


def size(text: str) -> int:
    """A positive size as people type it (`512M`), or a usage error."""
    from protocol.units import positive_size

    try:
        return positive_size(text)
    except ValueError as exc:
        die(str(exc), EXIT_USAGE)
