"""The Hand's settings: one table that makes the `hand run` flags, the `MINDHAND_*` variables and
the keys of `hand.toml` (precedence and errors: `protocol.io.settings`).

The file is `--config FILE` or `$MINDHAND_CONFIG`, else `hand.toml` in the state directory if it
exists. Each key is the flag's name with underscores: `--max-running-tasks 8` is
`max_running_tasks = 8`. Checks that need only the value live here, so a bad value in the file is
reported with its line; checks that touch the machine (is the root a directory, can the credential
be read) happen when the agent is built, and still name where the value came from.
"""

from __future__ import annotations

import os
from pathlib import Path

from protocol.io.settings import Duration, Key, between, listen_address, log_levels, one_of, positive
from protocol.units import parse_duration, parse_size, positive_duration, positive_size  # noqa: F401 - re-exported for hand.cli

DEFAULT_STATE_DIR = "~/.local/state/mindhand-hand"
CONFIG_NAME = "hand.toml"


def _size(value: str) -> str:
    positive_size(value)
    return value


def _cpus(value: str) -> str:
    """A CPU share, kept as typed (a number of CPUs is no duration: `Key` floats are seconds)."""
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.01 <= share <= 4096:  # NaN fails too
        raise ValueError("wants a CPU share from 0.01 to 4096 (0.5 = half a CPU)")
    return value


def _cgroup_path(value: str) -> str:
    if not value.startswith("/") or ".." in value.split("/") or "\x00" in value:
        raise ValueError("wants an absolute cgroup path such as /system.slice/hand.service/runs")
    return value


def _forward_allow(value: list[str]) -> list[str]:
    from hand.core.forwards import parse_allow

    parse_allow(value)
    return value


def _tools(value: list[str]) -> list[str]:
    from hand.core.policy import parse_tool_list

    parse_tool_list(",".join(value))
    return value


CONNECTION = "connection"
TASKS = "background tasks"
SANDBOX = "sandbox"
LOGS = "logs and health"

KEYS: tuple[Key, ...] = (
    Key(
        "mind",
        list,
        None,
        "ws:// or wss:// URL of the Mind; repeat it (or a comma list) for Mind nodes sharing one database: "
        "the Hand connects to any, and moves to the next when one refuses",
        env="MINDHAND_URL",
        required=True,
        metavar="URL",
        what="Mind URL",
    ),
    Key(
        "credential",
        str,
        None,
        "file holding this Hand's credential mh1:hand:LABEL:HEX (the token itself only in MINDHAND_CREDENTIAL, "
        "never on argv; `config show` masks it)",
        env="MINDHAND_CREDENTIAL",
        required=True,
        metavar="FILE",
        what="credential",
    ),
    Key(
        "root",
        str,
        None,
        "directory that file tools and command cwd cannot leave",
        required=True,
        metavar="DIR",
        what="root directory",
    ),
    Key(
        "state_dir",
        str,
        DEFAULT_STATE_DIR,
        "private state directory (task database, logs, audit), created 0700",
        metavar="DIR",
    ),
    Key(
        "allow_tools",
        list,
        None,
        "tools to allow, comma-separated (default: all)",
        check=_tools,
        reloadable=True,
        metavar="LIST",
    ),
    Key(
        "deny_tools",
        list,
        [],
        "tools to deny, comma-separated (wins over allow)",
        check=_tools,
        reloadable=True,
        metavar="LIST",
    ),
    Key(
        "deny_pty",
        bool,
        False,
        "refuse terminal runs (mind exec -t, mind shell); without it they follow the policy of their tool",
        reloadable=True,
    ),
    Key(
        "max_backoff",
        Duration,
        30.0,
        "largest reconnect delay (e.g. 30, 30s, 2m)",
        check=between(0.5, 3600, " seconds"),
        metavar="DURATION",
    ),
    Key(
        "ping_interval",
        Duration,
        10.0,
        "keepalive ping interval and timeout (e.g. 10, 10s, 1m)",
        check=between(0.1, 3600, " seconds"),
        metavar="DURATION",
    ),
    Key(
        "kill_grace",
        Duration,
        5.0,
        "time between SIGTERM and SIGKILL of a cancelled command (e.g. 5, 5s, 1m)",
        check=between(0, 600, " seconds"),
        metavar="DURATION",
    ),
    Key(
        "ca",
        str,
        None,
        "CA file to verify a wss:// Mind (default: the system trust store)",
        env="MINDHAND_CA",
        metavar="FILE",
    ),
    Key(
        "pin",
        str,
        None,
        "require the Mind's certificate to have this fingerprint",
        env="MINDHAND_PIN",
        metavar="sha256:HEX",
    ),
    Key(
        "max_running_tasks",
        int,
        4,
        "background tasks running at once; others wait queued",
        check=between(1, 10_000),
        metavar="N",
    ),
    Key(
        "max_retained_tasks",
        int,
        1000,
        "background tasks kept, finished ones included; more are refused",
        check=between(1, 10_000_000),
        metavar="N",
    ),
    Key(
        "task_retention",
        Duration,
        7 * 86400.0,
        "how long finished tasks and their logs are kept: 90s, 30m, 2h, 7d",
        check=positive,
        metavar="DURATION",
    ),
    Key(
        "task_log_max",
        str,
        "64M",
        "bytes of output kept per task (the head): bytes or K, M, G",
        check=_size,
        metavar="SIZE",
    ),
    Key(
        "env_allow",
        list,
        [],
        "also pass these variables of this Hand's environment (comma-separated, "
        "repeatable; a trailing * is a prefix glob, e.g. CI_*)",
        metavar="NAMES",
    ),
    Key(
        "env_inherit",
        bool,
        False,
        "UNSAFE: pass this Hand's whole environment (any token or key it holds) to "
        "every command; only MINDHAND_* and the credential are still removed",
    ),
    Key(
        "max_cpu_seconds",
        int,
        None,
        "cap on a run's CPU seconds (whole process tree; spent -> budget_exhausted)",
        check=positive,
        metavar="N",
    ),
    Key(
        "max_address_space",
        str,
        None,
        "cap on a run's address space per process: bytes or K, M, G (RLIMIT_AS)",
        check=_size,
        metavar="SIZE",
    ),
    Key("max_open_files", int, None, "cap on open files per process (RLIMIT_NOFILE)", check=positive, metavar="N"),
    Key(
        "max_processes",
        int,
        None,
        "cap on processes (RLIMIT_NPROC: counts ALL processes of the user; root is "
        "exempt, so it is meant for --run-as)",
        check=positive,
        metavar="N",
    ),
    Key(
        "max_memory",
        str,
        None,
        "cap on the memory a run uses (its cgroup's, all its processes): bytes or K, M, G; needs cgroups",
        check=_size,
        metavar="SIZE",
    ),
    Key(
        "max_pids",
        int,
        None,
        "cap on a run's processes and threads at once (its cgroup's); needs cgroups",
        check=positive,
        metavar="N",
    ),
    Key(
        "max_cpus",
        str,
        None,
        "cap on a run's CPU share (its cgroup's quota; 0.5 = half a CPU); needs cgroups",
        check=_cpus,
        metavar="CPUS",
    ),
    Key(
        "cgroups",
        str,
        "auto",
        "a cgroup per run and task (a kill nothing escapes, memory/pids/cpus limits, usage): "
        "auto (where this Hand may make them) or off (process-group kill only)",
        check=one_of("auto", "off"),
    ),
    Key(
        "cgroup_root",
        str,
        None,
        "make the runs' cgroups under this cgroup (a path as in /proc/self/cgroup, e.g. a delegated "
        "/system.slice/hand.service/runs); default: under this Hand's own",
        check=_cgroup_path,
        metavar="PATH",
    ),
    Key(
        "forward_allow",
        list,
        [],
        "where `mind forward` may connect through this Hand: HOST:PORT globs, comma-separated, "
        "repeatable (e.g. 'db*.internal:5432,10.0.*:*'); default: this Hand's loopback, any port",
        check=_forward_allow,
        metavar="HOST:PORT",
    ),
    Key(
        "max_upload_bytes",
        str,
        None,
        "largest file `mind cp` may upload: bytes or K, M, G (refused before any write; default: no limit)",
        check=_size,
        metavar="SIZE",
    ),
    Key(
        "output_limit",
        str,
        "1G",
        "bytes each output stream of a run may deliver (bytes or K, M, G); a client asking for more "
        "gets this (the command keeps running, the stream is cut, exit 122). Copies are bounded by "
        "their file instead",
        check=_size,
        metavar="SIZE",
    ),
    Key(
        "run_as",
        str,
        None,
        "run commands as USER (uid, primary and supplementary groups); only when this "
        "Hand runs as root. Nothing is chowned: the root must be usable by USER",
        metavar="USER",
    ),
    Key(
        "log_format",
        str,
        "auto",
        "auto (console on a TTY, else JSON lines), console or json",
        check=one_of("auto", "console", "json"),
    ),
    Key(
        "log_level",
        str,
        "info",
        "debug, info, warning, error; per component: info,hand=debug",
        check=log_levels,
        reloadable=True,
    ),
    Key("log_file", str, None, "append logs here (follows logrotate) instead of stdout", metavar="FILE"),
    Key(
        "metrics_listen",
        str,
        None,
        "serve GET /healthz and /metrics on HOST:PORT (plain HTTP, no auth: keep it "
        "on loopback; port 0 = any free port, written to STATE_DIR/metrics.addr)",
        check=listen_address,
        metavar="HOST:PORT",
    ),
)

GROUPS: dict[str, str] = {
    "max_running_tasks": TASKS,
    "max_retained_tasks": TASKS,
    "task_retention": TASKS,
    "task_log_max": TASKS,
    "env_allow": SANDBOX,
    "env_inherit": SANDBOX,
    "max_cpu_seconds": SANDBOX,
    "max_address_space": SANDBOX,
    "max_open_files": SANDBOX,
    "max_processes": SANDBOX,
    "max_memory": SANDBOX,
    "max_pids": SANDBOX,
    "max_cpus": SANDBOX,
    "cgroups": SANDBOX,
    "cgroup_root": SANDBOX,
    "forward_allow": SANDBOX,
    "max_upload_bytes": SANDBOX,
    "run_as": SANDBOX,
    "log_format": LOGS,
    "log_level": LOGS,
    "log_file": LOGS,
    "metrics_listen": LOGS,
}


def config_path(flag: str | None, state_dir_flag: str | None, env: dict[str, str]) -> tuple[str, bool]:
    """The file to read and whether it was named explicitly (then it must exist)."""
    named = flag or env.get("MINDHAND_CONFIG")
    if named:
        return str(Path(named).expanduser()), True
    state = state_dir_flag or env.get("MINDHAND_STATE_DIR") or DEFAULT_STATE_DIR
    return str(Path(state).expanduser() / CONFIG_NAME), False


def environment() -> dict[str, str]:
    return dict(os.environ)
