"""`hand run ...`: start the Hand agent on this machine. `hand tasks`: list its background tasks.

Local configuration errors (flags, credential file, root, state dir) are the only things that stop
a Hand for good: they print one clear line on stderr and exit 2 before any connection is tried.
Everything the network does (refusals, drops, a Mind that is down) is retried forever.

`hand tasks` reads the Hand's own task database directly (read-only): it works while the Hand runs,
and with no Mind at all, because the Hand is the authority on its tasks (DESIGN §3).

Heavy modules are imported inside `main`, so `hand --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = "~/.local/state/mindhand-hand"


class ConfigError(Exception):
    pass


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_BYTES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `2h`, `7d`, or plain seconds -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (use e.g. 90s, 30m, 2h, 7d)")
    return float(m.group(1)) * _SECONDS[m.group(2)]


def parse_size(text: str) -> int:
    """`64M`, `512K`, `1G` (binary multiples), or plain bytes -> bytes."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (use e.g. 65536, 512K, 64M, 1G)")
    return int(m.group(1)) * _BYTES[m.group(2).lower()]


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
    run.add_argument("--max-running-tasks", metavar="N", type=int, default=4,
                     help="background tasks running at once; others wait queued (default 4)")
    run.add_argument("--max-retained-tasks", metavar="N", type=int, default=1000,
                     help="background tasks kept, finished ones included; more are refused (default 1000)")
    run.add_argument("--task-retention", metavar="DURATION", default="7d",
                     help="how long finished tasks and their logs are kept: 90s, 30m, 2h, 7d (default 7d)")
    run.add_argument("--task-log-max", metavar="SIZE", default="64M",
                     help="bytes of output kept per task (the head): bytes or K, M, G (default 64M)")
    box = run.add_argument_group(
        "sandbox",
        "What commands (exec, shell, background tasks) see and may use. By default a command sees only "
        "PATH, HOME, LANG, LANGUAGE, LC_*, TERM, TZ, USER, LOGNAME, SHELL and TMPDIR of this Hand's "
        "environment, plus the env of its own request; MINDHAND_* variables and the credential never "
        "reach it. Resource limits are requested per run (the `limits` argument: cpu_seconds, "
        "address_space, open_files, processes); the --max-* flags cap them, and a run that asks for "
        "nothing gets the caps.",
    )
    box.add_argument("--env-allow", metavar="NAMES", action="append", default=[],
                     help="also pass these variables of this Hand's environment (comma-separated, repeatable; "
                     "a trailing * is a prefix glob, e.g. CI_*)")
    box.add_argument("--env-inherit", action="store_true",
                     help="UNSAFE: pass this Hand's whole environment (any token or key it holds) to every "
                     "command; only MINDHAND_* and the credential are still removed")
    box.add_argument("--max-cpu-seconds", metavar="N", type=int,
                     help="cap on a run's CPU seconds (whole process tree; spent -> budget_exhausted)")
    box.add_argument("--max-address-space", metavar="SIZE",
                     help="cap on a run's address space per process: bytes or K, M, G (RLIMIT_AS)")
    box.add_argument("--max-open-files", metavar="N", type=int, help="cap on open files per process (RLIMIT_NOFILE)")
    box.add_argument("--max-processes", metavar="N", type=int,
                     help="cap on processes (RLIMIT_NPROC: counts ALL processes of the user; root is exempt, "
                     "so it is meant for --run-as)")
    box.add_argument("--run-as", metavar="USER",
                     help="run commands as USER (uid, primary and supplementary groups); only when this Hand "
                     "runs as root. Nothing is chowned: --root must be usable by USER")
    run.add_argument("--ca", metavar="FILE", default=os.environ.get("MINDHAND_CA"),
                     help="CA file to verify a wss:// Mind (default $MINDHAND_CA, else the system trust store)")
    run.add_argument("--pin", metavar="sha256:HEX", default=os.environ.get("MINDHAND_PIN"),
                     help="require the Mind's certificate to have this fingerprint (default $MINDHAND_PIN)")
    run.add_argument("--log-format", choices=("auto", "console", "json"), default="auto")
    run.add_argument("--log-level", default="info",
                     help="debug, info, warning, error (default info); per component: info,hand=debug")
    run.add_argument("--log-file", metavar="FILE", help="append logs here (follows logrotate) instead of stdout")

    tasks = sub.add_parser(
        "tasks",
        help="list this machine's background tasks (reads the Hand's database; no Mind needed)",
        description="List the background tasks in the Hand's own database, oldest first. "
        "Works while the Hand runs and without any Mind.",
    )
    tasks.add_argument("--state-dir", metavar="DIR", default=DEFAULT_STATE_DIR,
                       help=f"the Hand's state directory (default {DEFAULT_STATE_DIR})")
    tasks.add_argument("--state", choices=("queued", "running", "succeeded", "failed", "cancelled", "timed_out",
                                           "lost"), help="only tasks in this state")
    tasks.add_argument("--json", action="store_true", help="a JSON list instead of a table")
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
    task_limits = _task_limits(args)
    sandbox = _sandbox(args)
    state = _state_dir(args.state_dir)
    _check_task_db(state)
    from protocol.tls import TLSConfigError, client_context

    try:
        client_context(args.mind, args.ca, args.pin)
    except TLSConfigError as exc:
        raise ConfigError(str(exc)) from None
    return AgentConfig(
        url=args.mind,
        credential=cred,
        root=Path(os.path.realpath(root)),
        policy=Policy(allow=allow, deny=deny),
        state_dir=state,
        max_backoff=args.max_backoff,
        ping_interval=args.ping_interval,
        kill_grace=args.kill_grace,
        tasks=task_limits,
        sandbox=sandbox,
        ca=Path(args.ca).expanduser() if args.ca else None,
        pin=args.pin,
    )


def _sandbox(args: argparse.Namespace) -> Any:
    from hand.sandbox import DEFAULT_ALLOW, ResourceLimits, Sandbox, lookup_user, parse_env_allow

    try:
        allow = DEFAULT_ALLOW.extended(parse_env_allow(args.env_allow))
    except ValueError as exc:
        raise ConfigError(f"--env-allow: {exc}") from None
    caps: dict[str, int | None] = {}
    for name, flag, value in (("cpu_seconds", "--max-cpu-seconds", args.max_cpu_seconds),
                              ("open_files", "--max-open-files", args.max_open_files),
                              ("processes", "--max-processes", args.max_processes)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be more than 0")
        caps[name] = value
    if args.max_address_space is not None:
        try:
            caps["address_space"] = parse_size(args.max_address_space)
        except ValueError as exc:
            raise ConfigError(f"--max-address-space: {exc}") from None
        if caps["address_space"] <= 0:
            raise ConfigError("--max-address-space must be more than 0")
    try:
        limits = ResourceLimits(**caps)
    except ValueError as exc:
        raise ConfigError(f"a --max-* value is out of range: {str(exc).splitlines()[-1].strip()}") from None
    run_as = None
    if args.run_as is not None:
        if os.geteuid() != 0:
            raise ConfigError(f"--run-as needs the hand to run as root (it runs as uid {os.geteuid()})")
        try:
            run_as = lookup_user(args.run_as)
        except ValueError as exc:
            raise ConfigError(f"--run-as: {exc}") from None
    return Sandbox(env_allow=allow, env_inherit=args.env_inherit, caps=limits, run_as=run_as)


def _check_task_db(state: Path) -> None:
    """A task database that cannot be opened is a local problem: say so now, not after connecting."""
    from hand.taskstore import TaskStore, TaskStoreError

    try:
        TaskStore(state).close()
    except TaskStoreError as exc:
        raise ConfigError(str(exc)) from None


def _task_limits(args: argparse.Namespace) -> Any:
    from hand.tasks import TaskLimits

    if not 1 <= args.max_running_tasks <= 10_000:
        raise ConfigError("--max-running-tasks must be between 1 and 10000")
    if not 1 <= args.max_retained_tasks <= 10_000_000:
        raise ConfigError("--max-retained-tasks must be between 1 and 10000000")
    try:
        retention = parse_duration(args.task_retention)
    except ValueError as exc:
        raise ConfigError(f"--task-retention: {exc}") from None
    if retention <= 0:
        raise ConfigError("--task-retention must be more than 0")
    try:
        log_max = parse_size(args.task_log_max)
    except ValueError as exc:
        raise ConfigError(f"--task-log-max: {exc}") from None
    return TaskLimits(max_running=args.max_running_tasks, max_retained=args.max_retained_tasks,
                      retention_s=retention, log_max=log_max)


_COLUMNS = ("TASK", "STATE", "TOOL", "CREATED", "EXIT", "LOG BYTES", "REASON")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else "-"


def tasks_main(args: argparse.Namespace) -> int:
    from hand.taskstore import TaskStoreError, read_rows
    from protocol.states import TaskState

    state_dir = Path(args.state_dir).expanduser()
    if not state_dir.is_dir():
        print(f"hand: state dir {state_dir} does not exist (pass the --state-dir of `hand run`)", file=sys.stderr)
        return 2
    try:
        rows = read_rows(state_dir, TaskState(args.state) if args.state else None)
    except TaskStoreError as exc:
        print(f"hand: {exc}", file=sys.stderr)
        return 2
    rows = rows or []
    if args.json:
        out = [
            {
                "task_id": r.task_id, "state": r.state.value, "tool": r.tool, "version": r.version,
                "created_at": r.created_at, "started_at": r.started_at, "finished_at": r.finished_at,
                "exit_code": r.exit_code, "signal": r.signal, "stage": r.stage.value if r.stage else None,
                "log_bytes": r.log_bytes, "truncated": r.truncated, "reason": r.reason, "error": r.error,
                "max_runtime_ms": r.max_runtime_ms, "args_digest": r.args_digest,
            }
            for r in rows
        ]
        print(json.dumps(out, indent=2))
        return 0
    if not rows:
        print("no tasks")
        return 0
    table = [_COLUMNS] + [
        (
            r.task_id, r.state.value, r.tool, _when(r.created_at),
            str(r.exit_code) if r.exit_code is not None else (f"sig {r.signal}" if r.signal else "-"),
            f"{r.log_bytes}{'+' if r.truncated else ''}", (r.reason or "-")[:80],
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS) - 1)]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "tasks":
        return tasks_main(args)
    import signal

    early: list[int] = []  # SIGTERM/SIGINT while starting: stop gracefully once the agent runs
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    try:
        config = build_config(args)
        from protocol import logs

        try:
            audit = logs.AuditLog(config.state_dir / "audit.jsonl") if config.state_dir else None
            stream = logs.ReopeningFile(args.log_file) if args.log_file else None
            logs.configure(args.log_format, args.log_level, stream=stream, audit=audit)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        except OSError as exc:
            raise ConfigError(f"cannot open the audit log in {config.state_dir}: {exc.strerror}") from None
    except ConfigError as exc:
        print(f"hand: {exc}", file=sys.stderr)
        return 2

    import asyncio

    from hand.agent import run_agent

    return asyncio.run(run_agent(config, stop_requested=lambda: bool(early)))
