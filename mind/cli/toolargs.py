"""A command line's description of what to run, as the arguments of the `exec` or `shell` tool:
`--shell COMMAND` or `-- ARGV`, `--cwd`, `--env K=V`, and the resource limits. One builder for
`mind exec`, `mind shell`, `mind task start` and fleet runs, so they cannot read a flag differently."""

from __future__ import annotations

import argparse
import math
from typing import Any

from mind.cli.exits import EXIT_USAGE, die


def tool_args_from(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """`--shell COMMAND` or `-- ARGV`, plus `--cwd`, `--env` and the limits (`limits_from`), as a tool call."""
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
    limits = limits_from(args)
    if limits:
        tool_args["limits"] = limits
    return ("shell" if args.shell is not None else "exec"), tool_args


MEMORY_MIN = 1 << 20
"""The least `limits.memory` a Hand takes (hand/system/sandbox.py `ResourceLimits`): said here as a
usage error before anything is sent."""
CPUS_MIN = 0.01
"""The least `limits.cpus` a Hand takes (the same model)."""


def limits_from(args: argparse.Namespace) -> dict[str, int | float]:
    """The run's `limits` from `--cpu-seconds`, `--memory` (the run's cgroup's memory), `--pids`,
    `--cpus`, `--address-space` (per process), `--max-files` and `--max-procs`; a command without some
    of them (`mind shell`) has them unset. A value that cannot be a limit is a usage error."""
    lim: dict[str, int | float] = {}
    for flag, key in (
        ("cpu_seconds", "cpu_seconds"),
        ("pids", "pids"),
        ("max_files", "open_files"),
        ("max_procs", "processes"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            if value <= 0:
                die(f"--{flag.replace('_', '-')} must be positive", EXIT_USAGE)
            lim[key] = value
    if getattr(args, "memory", None) is not None:
        memory = size(args.memory, "--memory")
        if memory < MEMORY_MIN:
            die(f"--memory must be at least 1M (the memory of the whole run), got {args.memory!r}", EXIT_USAGE)
        lim["memory"] = memory
    if getattr(args, "address_space", None) is not None:
        lim["address_space"] = size(args.address_space, "--address-space")
    if getattr(args, "cpus", None) is not None:
        lim["cpus"] = cpus(args.cpus)
    return lim


def size(text: str, flag: str) -> int:
    """A positive size as people type it (`512M`), or a usage error naming the flag."""
    from protocol.units import positive_size

    try:
        return positive_size(text)
    except ValueError as exc:
        die(f"{flag}: {exc}", EXIT_USAGE)


def cpus(text: str) -> float:
    """`--cpus X`: a CPU share (0.5 is half of one CPU), a finite number of at least 0.01."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= CPUS_MIN):
        die(
            f"--cpus must be a number > 0 (at least {CPUS_MIN}): a CPU share, e.g. 0.5 for half of one CPU; "
            f"got {text!r}",
            EXIT_USAGE,
        )
    return value
