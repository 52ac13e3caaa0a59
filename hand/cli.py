"""`hand run ...`: start the Hand agent on this machine. `hand tasks`: list its background tasks.

Local configuration errors (flags, credential file, root, state dir) print one clear line on stderr
and exit 2 before any connection is tried. Configuration errors only the Mind can reveal (its
certificate fails our CA or pin, it refuses our credential) are reported once and exit 2 too
(`hand.aio.agent`, issue 14); everything else the network does (drops, timeouts, a Mind that is down,
busy or rate-limiting) is retried forever.

`hand tasks` reads the Hand's own task database directly (read-only): it works while the Hand runs,
and with no Mind at all, because the Hand is the authority on its tasks (DESIGN §3).

Heavy modules are imported inside `main`, so `hand --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hand import __version__
from hand.config import DEFAULT_STATE_DIR, GROUPS, KEYS, parse_size
from hand.config import parse_duration as parse_duration  # re-exported
from protocol.io import gcstart
from protocol.io.settings import ConfigError, Settings


def _add_settings(p: argparse.ArgumentParser) -> None:
    from protocol.io.settings import add_flags

    add_flags(
        p,
        KEYS,
        GROUPS,
        _GROUP_HELP,
        file_help="TOML settings file (default $MINDHAND_CONFIG, else STATE_DIR/hand.toml if it exists)",
    )


_GROUP_HELP = {
    "sandbox": "What commands (exec, shell, background tasks) see and may use. By default a command sees only "
    "PATH, HOME, LANG, LANGUAGE, LC_*, TERM, TZ, USER, LOGNAME, SHELL and TMPDIR of this Hand's "
    "environment, plus the env of its own request; MINDHAND_* variables and the credential never "
    "reach it. Resource limits are requested per run (the `limits` argument: cpu_seconds, "
    "address_space, open_files, processes); the --max-* flags cap them, and a run that asks for "
    "nothing gets the caps.",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hand", description="The mindhand Hand agent.")
    parser.add_argument("--version", action="version", version=f"hand {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="connect to a Mind and run tools in a root directory",
        description="Connect out to a Mind and run the tools it asks for, confined to --root. "
        "Reconnects forever; SIGTERM/SIGINT stop it gracefully; SIGHUP reloads the tool policy and "
        "log level from the config file.",
    )
    _add_settings(run)
    cfg = sub.add_parser("config", help="show the effective settings and where each comes from")
    cfgs = cfg.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = cfgs.add_parser(
        "show",
        help="print every setting, its value (credentials masked) and its source",
        description="Resolve the settings exactly as `hand run` would with the same flags, environment "
        "and file, and print each value with its source (flag, variable, file line, or default).",
    )
    _add_settings(show)
    show.add_argument("--json", action="store_true", help="a JSON list instead of a table")

    tasks = sub.add_parser(
        "tasks",
        help="list this machine's background tasks (reads the Hand's database; no Mind needed)",
        description="List the background tasks in the Hand's own database, oldest first. "
        "Works while the Hand runs and without any Mind.",
    )
    tasks.add_argument(
        "--state-dir",
        metavar="DIR",
        default=None,
        help="the Hand's state directory (default: as `hand run` resolves it: $MINDHAND_STATE_DIR, "
        f"else state_dir in the config file, else {DEFAULT_STATE_DIR})",
    )
    tasks.add_argument("--config", metavar="FILE", help="the config file `hand run` uses (default $MINDHAND_CONFIG)")
    tasks.add_argument(
        "--state",
        choices=("queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"),
        help="only tasks in this state",
    )
    tasks.add_argument("--json", action="store_true", help="a JSON list instead of a table")
    return parser


def settings_source(args: argparse.Namespace, env: dict[str, str] | None = None) -> Any:
    """What `resolve` needs, kept for SIGHUP: the flags given, the environment, the file's path."""
    from hand.config import config_path, environment
    from protocol.io.settings import Source, flags_given, read_file

    env = environment() if env is None else env
    flags = flags_given(args, KEYS)  # `hand tasks` has only --state-dir of them
    path, explicit = config_path(args.config, flags.get("state_dir"), env)
    return Source(keys=KEYS, flags=flags, env=env, path=path, explicit=explicit, read=read_file)


def _read_credential(value: str, s: Settings) -> Any:
    """The credential file (or, for deployments that pass secrets in the environment, the token
    itself). Never echo the token in a message."""
    from protocol.auth import Credential

    inline = value.strip().startswith("mh1:")
    where = s.origin("credential") if inline else f"credential file {value}"
    if inline and s.origins["credential"].kind == "flag":
        # A token on argv is readable by every local user in `ps` and /proc/PID/cmdline (issue 13).
        raise ConfigError(
            "--credential takes a file, not the token itself (argv is visible to every user in `ps`): "
            "write the token to a 0600 file, or pass it in MINDHAND_CREDENTIAL"
        )
    if inline:
        text = value
    else:
        try:
            text = Path(value).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise s.fail(
                "credential", f"cannot read credential file {value}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
    try:
        cred = Credential.parse(text)
    except ValueError as exc:
        raise ConfigError(f"bad credential in {where}: {exc}") from None
    if cred.role != "hand":
        raise ConfigError(f"credential in {where} is for a {cred.role}, not a hand")
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


def build_config(settings: Settings) -> Any:
    from hand.aio.agent import AgentConfig, validate_url
    from protocol.urls import split_urls

    s = settings
    urls = split_urls(s["mind"])
    try:
        for url in urls:
            validate_url(url)
    except ValueError as exc:
        raise s.fail("mind", str(exc)) from None
    cred = _read_credential(s["credential"], s)
    root = Path(s["root"]).expanduser()
    if not root.is_dir():
        raise s.fail("root", f"{s['root']} is not a directory")
    task_limits = _task_limits(s)
    sandbox = _sandbox(s)
    state = _state_dir(s["state_dir"])
    _check_task_db(state)
    sandbox = dataclasses.replace(sandbox, cgroups=_cgroups(s, state, sandbox.caps))
    from protocol.io.tls import TLSConfigError, client_context

    try:
        for url in urls:
            client_context(url, s["ca"], s["pin"])
    except TLSConfigError as exc:
        raise ConfigError(str(exc)) from None
    from hand.core.http import parse_listen

    try:
        metrics_listen = parse_listen(s["metrics_listen"]) if s["metrics_listen"] else None
    except ValueError as exc:
        raise s.fail("metrics_listen", str(exc)) from None
    return AgentConfig(
        url=",".join(urls),
        credential=cred,
        root=Path(os.path.realpath(root)),
        policy=policy_of(s),
        state_dir=state,
        max_backoff=s["max_backoff"],
        ping_interval=s["ping_interval"],
        kill_grace=s["kill_grace"],
        tasks=task_limits,
        sandbox=sandbox,
        ca=Path(s["ca"]).expanduser() if s["ca"] else None,
        pin=s["pin"],
        metrics_listen=metrics_listen,
    )


def policy_of(s: Settings | dict[str, Any]) -> Any:
    from hand.core.policy import Policy

    allow = s["allow_tools"]
    return Policy(
        allow=None if allow is None else frozenset(allow), deny=frozenset(s["deny_tools"]), pty=not s["deny_pty"]
    )


def _sandbox(s: Settings) -> Any:
    from hand.system.sandbox import DEFAULT_ALLOW, ResourceLimits, Sandbox, lookup_user, parse_env_allow

    try:
        allow = DEFAULT_ALLOW.extended(parse_env_allow(s["env_allow"]))
    except ValueError as exc:
        raise s.fail("env_allow", str(exc)) from None
    caps: dict[str, int | float | None] = {
        "cpu_seconds": s["max_cpu_seconds"],
        "open_files": s["max_open_files"],
        "processes": s["max_processes"],
        "address_space": parse_size(s["max_address_space"]) if s["max_address_space"] is not None else None,
        "memory": parse_size(s["max_memory"]) if s["max_memory"] is not None else None,
        "pids": s["max_pids"],
        "cpus": float(s["max_cpus"]) if s["max_cpus"] is not None else None,
    }
    try:
        limits = ResourceLimits(**caps)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(f"a --max-* value is out of range: {str(exc).splitlines()[-1].strip()}") from None
    run_as = None
    if s["run_as"] is not None:
        if os.geteuid() != 0:
            raise s.fail("run_as", f"needs the hand to run as root (it runs as uid {os.geteuid()})")
        try:
            run_as = lookup_user(s["run_as"])
        except ValueError as exc:
            raise s.fail("run_as", str(exc)) from None
    upload = s["max_upload_bytes"]
    from hand.core.forwards import DEFAULT_FORWARD_ALLOW, parse_allow

    forward_allow = parse_allow(s["forward_allow"]) or DEFAULT_FORWARD_ALLOW
    return Sandbox(
        forward_allow=forward_allow,
        env_allow=allow,
        env_inherit=s["env_inherit"],
        caps=limits,
        run_as=run_as,
        max_upload_bytes=parse_size(upload) if upload is not None else None,
        max_output_bytes=parse_size(s["output_limit"]),
    )


def _cgroups(s: Settings, state: Path, caps: Any) -> Any:
    """Where runs get a cgroup of their own (DESIGN §20), found now: a cap this host cannot enforce
    is a configuration error, not a limit silently ignored."""
    from hand.system.cgroups import NO_CGROUPS, CgroupLimits, detect, instance_of

    if s["cgroups"] == "off":
        host = dataclasses.replace(NO_CGROUPS, why="--cgroups off")
    else:
        host = detect(instance_of(state), root=s["cgroup_root"])
        if s["cgroup_root"] is not None and not host.enabled:
            raise s.fail("cgroup_root", f"cannot make the runs' cgroups there ({host.why})")
    why = host.refusal(CgroupLimits(memory=caps.memory, pids=caps.pids, cpus=caps.cpus))
    if why is not None:
        flags = [
            f for f, v in (("--max-memory", caps.memory), ("--max-pids", caps.pids), ("--max-cpus", caps.cpus)) if v
        ]
        raise ConfigError(f"{', '.join(flags)}: {why}")
    return host


def _check_task_db(state: Path) -> None:
    """A task database that cannot be opened is a local problem: say so now, not after connecting."""
    from hand.system.taskdb import TaskStore, TaskStoreError

    try:
        TaskStore(state).close()
    except TaskStoreError as exc:
        raise ConfigError(str(exc)) from None


def _task_limits(s: Settings) -> Any:
    from hand.core.tasks import TaskLimits

    return TaskLimits(
        max_running=s["max_running_tasks"],
        max_retained=s["max_retained_tasks"],
        retention_s=s["task_retention"],
        log_max=parse_size(s["task_log_max"]),
    )


_COLUMNS = ("TASK", "STATE", "TOOL", "CREATED", "EXIT", "LOG BYTES", "REASON")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else "-"


def tasks_main(args: argparse.Namespace) -> int:
    from hand.system.taskdb import TaskStoreError, read_rows
    from protocol.states import TaskState

    try:
        settings = settings_source(args).load(require=False)  # the state dir exactly as `hand run` finds it
    except ConfigError as exc:
        print(f"hand: {exc}", file=sys.stderr)
        return 2
    state_dir = Path(settings["state_dir"]).expanduser()
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
                "task_id": r.task_id,
                "state": r.state.value,
                "tool": r.tool,
                "version": r.version,
                "created_at": r.created_at,
                "started_at": r.started_at,
                "finished_at": r.finished_at,
                "exit_code": r.exit_code,
                "signal": r.signal,
                "stage": r.stage.value if r.stage else None,
                "log_bytes": r.log_bytes,
                "truncated": r.truncated,
                "reason": r.reason,
                "error": r.error,
                "max_runtime_ms": r.max_runtime_ms,
                "args_digest": r.args_digest,
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
            r.task_id,
            r.state.value,
            r.tool,
            _when(r.created_at),
            str(r.exit_code) if r.exit_code is not None else (f"sig {r.signal}" if r.signal else "-"),
            f"{r.log_bytes}{'+' if r.truncated else ''}",
            (r.reason or "-")[:80],
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS) - 1)]
    for line in table:
        # no width for the last column (printed as it is): zip stops before it
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1])
    return 0


def config_show(args: argparse.Namespace) -> int:
    from protocol.io.settings import format_table

    source = settings_source(args)
    try:
        settings = source.load(require=False)
    except ConfigError as exc:
        print(f"hand: {exc}", file=sys.stderr)
        return 2
    rows = settings.show()
    missing = source.missing(settings)
    if args.json:
        print(json.dumps({"file": settings.file, "settings": rows, "missing": missing}, indent=2))
    else:
        print(f"# config file: {source.describe(settings)}")
        print(format_table(rows))
    for name in missing:
        key = next(k for k in KEYS if k.name == name)
        print(
            f"hand: {name} is not set (pass {key.flag}, set {key.env_name}, or set {name} in the file): "
            "`hand run` would refuse to start",
            file=sys.stderr,
        )
    return 2 if missing else 0


def reloader(source: Any, started: Settings) -> Any:
    """SIGHUP (`protocol.io.settings.Reloader`): a new log level is applied here; a new tool policy
    is returned to the agent, which swaps it in for every later request."""
    from protocol.io import logs
    from protocol.io.settings import Reloader

    reread, log = Reloader(source, started), logs.get("hand")

    def reload() -> Any:
        changes = reread(log)
        if "log_level" in changes:
            logs.set_levels(changes["log_level"])
        if not {"allow_tools", "deny_tools", "deny_pty"} & set(changes):
            return None
        return policy_of(reread.applied)  # the reloadable values now in force

    return reload


SHARED_IDENTITY_WARNING = (
    "commands run as this Hand's own user (uid {uid}): a client allowed `exec` or `shell` can read the "
    "Hand's credential, state dir, task logs and environment and act as this Hand. To prevent it, run the "
    "Hand as root with --run-as USER (a user of its own)."
)


def _warn_shared_identity(log: Any) -> None:
    """Without `--run-as` the children share the Hand's uid, so nothing the Hand holds is out of
    their reach (issue 13): say so at every start, on stderr and in the log, in plain words."""
    text = SHARED_IDENTITY_WARNING.format(uid=os.geteuid())
    print(f"hand: WARNING: {text}", file=sys.stderr, flush=True)
    log.warning("commands_share_hand_identity", uid=os.geteuid(), detail=text)


def main(argv: list[str] | None = None) -> int:
    """The `hand` program. Every command runs inside `stdout_may_close`, so `hand tasks | head` ends
    as `ls | head` does (quiet, 141) rather than with a traceback, as every `mind` command does."""
    gcstart.starting()
    from protocol.io.pipes import stdout_may_close

    return stdout_may_close(lambda: command(argv))


def command(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "tasks":
        return tasks_main(args)
    if args.command == "config":
        return config_show(args)
    import signal

    early: list[int] = []  # SIGTERM/SIGINT while starting: stop gracefully once the agent runs
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload before the agent runs has nothing to reload
    try:
        source = settings_source(args)
        settings = source.load()
        config = build_config(settings)
        # The token may have come from the environment: commands (and anything that inherits ours
        # later) must not find it there, so drop it once it is read.
        os.environ.pop("MINDHAND_CREDENTIAL", None)
        from hand.core.sanitize import Sanitizer
        from protocol.io import logs

        try:
            audit = logs.AuditLog(config.state_dir / "audit.jsonl") if config.state_dir else None
            stream = logs.ReopeningFile(settings["log_file"]) if settings["log_file"] else None
            # A logged traceback is local, but the same rule holds as for error text on the wire: never
            # the root (the machine's layout) or the credential.
            redact = Sanitizer(config.root, secrets=[config.credential.secret.hex()], limit=1 << 20, other_paths=False)
            logs.configure(settings["log_format"], settings["log_level"], stream=stream, audit=audit, redact=redact)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        except OSError as exc:
            raise ConfigError(f"cannot open the audit log in {config.state_dir}: {exc.strerror}") from None
    except ConfigError as exc:
        print(f"hand: {exc}", file=sys.stderr)
        return 2
    if config.sandbox.run_as is None:
        _warn_shared_identity(logs.get("hand"))

    import asyncio

    from hand.aio.agent import run_agent
    from protocol.io import heap

    heap.keep_large_buffers()
    gcstart.started()
    try:
        return asyncio.run(run_agent(config, stop_requested=lambda: bool(early), reload=reloader(source, settings)))
    finally:
        if audit is not None:
            audit.close()  # writes the counts of repeated refusals not yet written
