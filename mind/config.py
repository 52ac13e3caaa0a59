"""The Mind's settings: one table that makes the `mind serve` flags, the `MINDHAND_*` variables and
the keys of `mind.toml` (precedence and errors: `protocol.io.settings`).

The file is `--config FILE` or `$MINDHAND_CONFIG`, else `mind.toml` in the Mind's home if it
exists. Each key is the flag's name with underscores: `--retain-runs 500` is `retain_runs = 500`.
The home itself (`--home`/`$MINDHAND_HOME`) is not a key: it is where the file is looked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mind.home import DEFAULT_LISTEN
from protocol.io.settings import Duration, Key, between, listen_address, log_levels, one_of
from protocol.limits import RESUME_WINDOW_MAX_S
from protocol.units import parse_size

CONFIG_NAME = "mind.toml"

FILE_HELP = "TOML settings file (default $MINDHAND_CONFIG, else HOME/mind.toml if it exists)"
"""`--config`'s help, the same for `mind serve` (mind/daemon/commands.py) and `mind config show`
(mind/cli/config.py): here, below both, because neither may import the other."""

DATABASE_SCHEMES = ("postgresql://", "postgres://")


def _size(value: str) -> str:
    """A size setting's check (kept as its text: `mind config show` prints what was given)."""
    parse_size(value)
    return value


def check_database(value: str) -> str:
    """The `database` setting's check: a PostgreSQL URL, or nothing (SQLite). Here with the table
    rather than with the engines (mind/store/engines.py): `mind config show` builds its flags from
    this table, and the CLI must not import the store to do it."""
    if value and not value.startswith(DATABASE_SCHEMES):
        raise ValueError("must be a postgresql://USER@HOST:PORT/DBNAME URL (or empty for the home's SQLite)")
    return value


KEYS: tuple[Key, ...] = (
    Key(
        "listen",
        str,
        DEFAULT_LISTEN,
        "HOST:PORT to listen on (port 0 = any free port, written to HOME/mind.url)",
        check=listen_address,
        metavar="HOST:PORT",
    ),
    Key(
        "ping_interval",
        Duration,
        10.0,
        "keepalive ping interval (e.g. 10, 10s, 1m; a silent peer is lost after two)",
        check=between(0.1, 3600, " seconds"),
        metavar="DURATION",
    ),
    Key(
        "database",
        str,
        None,
        "a postgresql://USER@HOST:PORT/DB URL: run as one node of many sharing it (credentials, snapshots, "
        "endings); none: the home's SQLite files",
        check=check_database,
        metavar="URL",
    ),
    Key(
        "node_lease",
        Duration,
        10.0,
        "with a database: how long this node acts after its last successful heartbeat (e.g. 10s); a node "
        "that cannot renew (cut off, paused) closes its connections and refuses starts, and its Hands move "
        "elsewhere",
        check=between(1, 3600, " seconds"),
        metavar="DURATION",
    ),
    Key(
        "node_name",
        str,
        None,
        "with a database: this node's name in `mind hands`/`mind status` (default: host name and port)",
        metavar="NAME",
    ),
    Key(
        "node_url",
        str,
        None,
        "with a database: the URL other nodes reach this one at, to serve their clients' requests for "
        "its Hands (default: its listen URL)",
        metavar="URL",
    ),
    Key("tls_cert", str, None, "serve wss:// with this certificate (PEM; see scripts/mkcerts)", metavar="FILE"),
    Key("tls_key", str, None, "the certificate's private key (PEM)", metavar="FILE"),
    Key(
        "retain_runs",
        int,
        10_000,
        "finished foreground runs kept in memory for `mind runs`/`run get`",
        check=between(0, 10_000_000),
        metavar="N",
    ),
    Key(
        "resume_window",
        Duration,
        60.0,
        "how long a run rides out an absent client or Hand (a cut, a restart of the Mind) before it "
        "ends (e.g. 90s, 5m): client away -> cancelled, Hand away -> lost; 0 ends it at once",
        check=between(0, RESUME_WINDOW_MAX_S, " seconds"),
        metavar="DURATION",
    ),
    Key(
        "keep_max",
        Duration,
        3600.0,
        "the longest a detached run is kept unattended (`mind exec --detach --keep`; e.g. 1h)",
        check=between(1, RESUME_WINDOW_MAX_S, " seconds"),
        metavar="DURATION",
    ),
    Key(
        "record",
        str,
        "pty",
        "what the Mind records as it relays (DESIGN §19): off, pty (terminal sessions) or all (also every "
        "foreground run's stdin, stdout and stderr); `mind recordings`, `mind play`",
        check=one_of("off", "pty", "all"),
        metavar="MODE",
    ),
    Key(
        "record_max_bytes",
        str,
        "64M",
        "stream bytes one run's recording keeps (e.g. 64M, 1G); past it the recording marks a gap with "
        "the byte count and the run goes on",
        check=_size,
        metavar="SIZE",
    ),
    Key(
        "record_strict",
        bool,
        False,
        "cancel runs whose recording cannot be kept (the store failed or fell behind) instead of marking a gap",
    ),
    Key(
        "record_retention",
        Duration,
        90 * 86400.0,
        "how long recordings are kept (e.g. 90d, 12h); older ones are pruned in the background",
        check=between(60, 100 * 365 * 86400, " seconds"),
        metavar="DURATION",
    ),
    Key(
        "record_dir",
        str,
        None,
        "where the embedded default keeps recordings.db (default: the Mind's home); a volume of their own "
        "keeps a full disk of recordings away from the Mind's state (with a database: unused)",
        metavar="DIR",
    ),
    Key(
        "record_key",
        str,
        None,
        "the file holding the key that signs recordings (0600; default HOME/recording.key, made on first "
        "use); give every node of a shared database the same file",
        metavar="FILE",
    ),
    Key(
        "max_pending_handshakes",
        int,
        1024,
        "handshakes in progress at most; past it a newcomer makes room by closing the oldest silent one",
        check=between(1, 100_000),
        reloadable=True,
        metavar="N",
    ),
    Key(
        "auth_fail_limit",
        int,
        10,
        "failed handshakes per source address per minute before it is refused",
        check=between(1, 1_000_000),
        reloadable=True,
        metavar="N",
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
        "debug, info, warning, error; per component: info,mind.tasks=debug",
        check=log_levels,
        reloadable=True,
    ),
    Key("log_file", str, None, "append logs here (follows logrotate) instead of stdout", metavar="FILE"),
)

GROUPS = {"log_format": "logs", "log_level": "logs", "log_file": "logs"}


def config_path(flag: str | None, home: Path, env: dict[str, str]) -> tuple[str, bool]:
    """The file to read and whether it was named explicitly (then it must exist)."""
    named = flag or env.get("MINDHAND_CONFIG")
    if named:
        return str(Path(named).expanduser()), True
    return str(home / CONFIG_NAME), False


def settings_source(args: Any) -> Any:
    """Where `mind serve` and `mind config show` read their settings: the flags given, the
    environment, and the file (`--config`, `$MINDHAND_CONFIG`, or HOME/mind.toml)."""
    import os

    from mind import home as paths
    from protocol.io.settings import Source, flags_given, read_file

    env = dict(os.environ)
    path, explicit = config_path(args.config, paths.home(args.home), env)
    return Source(keys=KEYS, flags=flags_given(args, KEYS), env=env, path=path, explicit=explicit, read=read_file)


def database_setting(args: Any) -> str | None:
    """The database the local admin commands (`mind hand add`, `mind client revoke`, ...) act on:
    `--database`, else the same `database` `mind serve` would use from this home
    (`$MINDHAND_DATABASE`, then the file), else the one this home's Mind last served from (a node
    started with `mind serve --database URL` records it in its home): so a credential added on
    one node's machine is the shared one every node checks, never a new SQLite file beside it."""
    import os

    from mind import home as paths
    from protocol.io.settings import ConfigError, Source, read_file

    flag = getattr(args, "database", None)
    if flag:
        return str(flag)
    env = dict(os.environ)
    home = paths.home(args.home)
    path, explicit = config_path(getattr(args, "config", None), home, env)
    source = Source(keys=KEYS, flags={}, env=env, path=path, explicit=explicit, read=read_file)
    value = source.load(require=False)["database"]
    if value:
        return str(value)
    try:  # what this home's Mind last served from (`mind serve --database`, recorded at start)
        recorded = paths.database_file(home).read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {paths.database_file(home)}: {exc.strerror}") from None
    return recorded or None
