"""Layered daemon configuration: flags > environment (`MINDHAND_*`) > TOML file > defaults.

Operators keep a TOML file under configuration management, override one value per machine with an
environment variable in a systemd drop-in, and try a change with a flag: each layer must win over
the next in that order, and when something is wrong the message must say *where* the bad value came
from (the flag, the variable, or the file and line), because "invalid value" alone sends them
grepping through three places.

Pure on purpose: `resolve` is handed the file's text, the environment mapping and the flags, and
reads nothing itself (`read_file` is passed in by the daemons' command lines), so precedence and every error are unit-tested without files or processes. It
lives in `protocol` only because that is the one package both daemons share (`mind` and `hand`
never import each other); the daemons' key tables live with each daemon.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.audit import AuditEvent
from protocol.errors import MindhandError
from protocol.units import parse_duration

ENV_PREFIX = "MINDHAND_"
_TOKEN = re.compile(r"mh1:([a-z]+):([^:\s]+):[0-9a-fA-F]+")
"""A credential token anywhere in a value: masked by `show` (a path to a credential file is not)."""
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]+)(@)")
"""A password in a URL (`database = "postgresql://mind:PASSWORD@db/mindhand"`): masked by `show` too."""


class ConfigError(MindhandError, ValueError):
    """One line an operator can act on: which key, from where, and what is wrong."""


class Duration(float):
    """The kind of a key that holds seconds. Its flag, variable and file value take what every
    duration option of the CLI takes (`90`, `90s`, `5m`, `2h`, `1.5h`: `protocol.units`), and the
    file also a bare TOML number of seconds; the value resolved is a plain float of seconds. A kind
    of its own rather than `float`, because an operator who types `--resume-window 3s` after
    `mind exec --wait 5m` must not be told that a duration "wants a number"."""


@dataclass(frozen=True)
class Key:
    """One setting. Its TOML key is `name`, its flag `--name-with-dashes`, its variable
    `MINDHAND_NAME` unless `env` says otherwise (kept for names that predate the file)."""

    name: str
    kind: type
    """str, int, float, bool, list (a list of strings; a comma-separated string also works) or
    `Duration` (seconds, typed as `90s`, `5m`, `2h` or a number)."""
    default: Any = None
    help: str = ""
    env: str | None = None
    check: Callable[[Any], Any] | None = None
    """Returns the value to use (possibly normalised) or raises ValueError with the reason."""
    required: bool = False
    reloadable: bool = False
    """SIGHUP applies a new value of this key without a restart."""
    metavar: str | None = None
    what: str | None = None
    """How a message names it when it is missing ("no Mind URL"); default: the key."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env_name(self) -> str:
        return self.env or ENV_PREFIX + self.name.upper()


@dataclass(frozen=True)
class Origin:
    kind: str  # "flag", "env", "file" or "default"
    where: str = ""
    """The flag, the variable, or `PATH line N`."""

    def __str__(self) -> str:
        return self.where if self.kind != "default" else "default"


@dataclass(frozen=True)
class Settings:
    """The effective configuration: a value and its origin for every key."""

    keys: tuple[Key, ...]
    values: Mapping[str, Any]
    origins: Mapping[str, Origin]
    file: str | None = None

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def origin(self, name: str) -> str:
        """`--root`, `MINDHAND_ROOT`, `/etc/mindhand/hand.toml line 3`, or `default`: for messages."""
        key = next(k for k in self.keys if k.name == name)
        o = self.origins[name]
        return key.flag if o.kind == "default" else str(o)

    def fail(self, name: str, reason: str) -> ConfigError:
        """An error about an accepted value that a later check refused (e.g. a root that is not a
        directory), naming where the value came from."""
        return ConfigError(_where(self.origins[name], name, next(k for k in self.keys if k.name == name)) + reason)

    def show(self) -> list[dict[str, Any]]:
        """Every key with its effective value (credential tokens masked), source and reloadability."""
        return [
            {
                "key": k.name,
                "value": mask(self.values[k.name]),
                "source": str(self.origins[k.name]),
                "reloadable": k.reloadable,
            }
            for k in self.keys
        ]

    def changed(self, other: Settings) -> list[str]:
        return [k.name for k in self.keys if self.values[k.name] != other.values[k.name]]


def mask(value: Any) -> Any:
    if isinstance(value, str):
        value = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}****{m.group(3)}", value)
        return _TOKEN.sub(lambda m: f"mh1:{m.group(1)}:{m.group(2)}:****", value)
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def _where(origin: Origin, name: str, key: Key) -> str:
    if origin.kind == "file":
        return f"{origin.where}: {name}: "
    if origin.kind in ("flag", "env"):
        return f"{origin.where}: "
    return f"{key.flag} (default): "


# --- coercion -------------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _from_text(key: Key, text: str) -> Any:
    """A flag or an environment variable is text: parse it as the key's kind."""
    kind = key.kind
    if kind is str:
        return text
    if kind is Duration:
        return parse_duration(text)
    if kind is list:
        return [p.strip() for p in text.split(",") if p.strip()]
    if kind is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"wants true or false, got {text!r}")
    try:
        return kind(text.strip())
    except ValueError:
        raise ValueError(f"wants {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def _from_toml(key: Key, value: Any) -> Any:
    """A TOML value already has a type: it must be the key's (an int is fine for a float)."""
    kind = key.kind
    if kind is list:
        if isinstance(value, str):
            return _from_text(key, value)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [p.strip() for v in value for p in v.split(",") if p.strip()]
        raise ValueError(f"wants a list of strings, got {_describe(value)}")
    if kind is Duration:
        if isinstance(value, str):
            return parse_duration(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f'wants a duration (seconds, or a string such as "90s" or "5m"), got {_describe(value)}')
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not kind:
        want = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}[kind]
        return _raise(f"wants {want}, got {_describe(value)}")
    return value


def _raise(msg: str) -> Any:
    raise ValueError(msg)


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _coerce(key: Key, raw: Any, typed: bool) -> Any:
    value = _from_toml(key, raw) if typed else _from_text(key, raw)
    return key.check(value) if key.check is not None else value


# --- checks shared by both daemons' key tables ------------------------------------------------


def between(low: float, high: float, unit: str = "") -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g}{unit} (got {value:g})")
        return value

    return check


def positive(value: Any) -> Any:
    if value is not None and value <= 0:
        raise ValueError(f"must be more than 0 (got {value})")
    return value


def one_of(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)} (got {value!r})")
        return value

    return check


def log_levels(value: str) -> str:
    from protocol.io.logs import parse_levels

    parse_levels(value)
    return value


def listen_address(value: str) -> str:
    """`HOST:PORT` or `[V6]:PORT`; port 0 means any free port."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"wants HOST:PORT with a port 0-65535, got {value!r}")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"write an IPv6 address in brackets, e.g. [::1]:{port} (got {value!r})")
    return value


# --- the file -------------------------------------------------------------------------------------


def _key_lines(text: str) -> dict[str, int]:
    """Line number of each top-level `key = ...` (tomllib keeps no positions; we need them for
    messages). The first occurrence wins; tomllib itself refuses duplicates."""
    lines: dict[str, int] = {}
    pattern = re.compile(r"""^\s*(?:"([^"]+)"|'([^']+)'|([A-Za-z0-9_.-]+))\s*=""")
    table = re.compile(r"^\s*\[")
    for n, line in enumerate(text.splitlines(), start=1):
        if table.match(line):
            name = line.strip().strip("[]").strip()
            lines.setdefault(name, n)
            continue
        m = pattern.match(line)
        if m:
            lines.setdefault(next(g for g in m.groups() if g), n)
    return lines


def parse_file(text: str, path: str, keys: Iterable[Key]) -> dict[str, tuple[Any, int | None]]:
    """The file's values with their line numbers. A syntax error, an unknown key (with the closest
    known one suggested: a typo must not be silently ignored) or a table is a ConfigError."""
    import difflib
    import tomllib  # here, not at the top: `mind --help` builds the serve flags but reads no file

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    known = {k.name for k in keys}
    lines = _key_lines(text)
    out: dict[str, tuple[Any, int | None]] = {}
    for name, value in data.items():
        line = lines.get(name)
        at = f"{path} line {line}" if line else path
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(sorted(known))})"
            kind = "table" if isinstance(value, dict) else "key"
            raise ConfigError(f"{at}: unknown {kind} {name!r}{hint}")
        out[name] = (value, line)
    return out


# --- resolution -----------------------------------------------------------------------------------


def resolve(
    keys: Iterable[Key],
    *,
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    file_text: str | None = None,
    file_path: str | None = None,
    require: bool = True,
) -> Settings:
    """The effective configuration. `flags` holds only the flags given on the command line (text,
    or True for a switch, or a list for a repeatable flag); `env` is the whole environment."""
    keys = tuple(keys)
    in_file = parse_file(file_text, file_path or "<config>", keys) if file_text is not None else {}
    values: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    for key in keys:
        if key.name in flags and flags[key.name] is not None:
            raw = flags[key.name]
            origin = Origin("flag", key.flag)
            typed = not isinstance(raw, str)
            if isinstance(raw, list):
                raw, typed = ",".join(raw), False
        elif key.env_name in env:
            raw, origin, typed = env[key.env_name], Origin("env", key.env_name), False
        elif key.name in in_file:
            raw, line = in_file[key.name]
            origin = Origin("file", f"{file_path} line {line}" if line else str(file_path))
            typed = True
        else:
            values[key.name], origins[key.name] = key.default, Origin("default")
            continue
        try:
            value = _coerce(key, raw, typed)
        except ValueError as exc:
            raise ConfigError(_where(origin, key.name, key) + str(exc)) from None
        values[key.name], origins[key.name] = value, origin
    for key in keys if require else ():
        if key.required and values[key.name] in (None, "", []):
            where = f", or set {key.name} in {file_path}" if file_path else f", or set {key.name} in a config file"
            raise ConfigError(f"no {key.what or key.name}: pass {key.flag}, set {key.env_name}{where}")
    return Settings(keys=keys, values=values, origins=origins, file=file_path)


@dataclass
class Source:
    """Where `resolve` gets its inputs, kept so a SIGHUP can resolve again with the same flags and
    environment and a freshly read file."""

    keys: tuple[Key, ...]
    flags: Mapping[str, Any]
    env: Mapping[str, str]
    path: str | None
    explicit: bool
    """The file was named (`--config`/`MINDHAND_CONFIG`): then it must exist."""
    read: Callable[[str], str | None] = field(repr=False, default=lambda _p: None)

    def load(self, require: bool = True) -> Settings:
        """`require=False` (for `config show`): a missing required key stays None instead of failing."""
        text = self.read(self.path) if self.path else None
        if text is None and self.explicit:
            raise ConfigError(f"config file {self.path} does not exist")
        return resolve(
            self.keys,
            flags=self.flags,
            env=self.env,
            file_text=text,
            file_path=self.path if text is not None else None,
            require=require,
        )

    def describe(self, settings: Settings) -> str:
        if settings.file:
            return settings.file
        return f"none ({self.path} does not exist)" if self.path else "none"

    def missing(self, settings: Settings) -> list[str]:
        return [k.name for k in self.keys if k.required and settings[k.name] in (None, "", [])]


def read_file(path: str) -> str | None:
    """A config file's text, None if it does not exist (a default path need not); any other failure
    is the operator's to fix."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {getattr(exc, 'strerror', None) or exc}") from None


class Reloader:
    """SIGHUP for either daemon: read the file again (same flags and environment) and say which
    reloadable keys changed; other changed keys are reported as needing a restart. A file that no
    longer parses changes nothing: the daemon keeps its settings and the log says why. The event
    is logged before the caller applies a new log level, so it is seen at the old one."""

    def __init__(self, source: Source, started: Settings) -> None:
        self.source = source
        self.started = started
        self.applied = {k.name: started[k.name] for k in source.keys if k.reloadable}

    def __call__(self, log: Any) -> dict[str, Any]:
        try:
            new = self.source.load()
        except ConfigError as exc:
            log.error(AuditEvent.CONFIG_RELOAD_FAILED, error=str(exc), file=self.source.path)
            return {}
        keys = self.source.keys
        now = {k.name: new[k.name] for k in keys if k.reloadable and new[k.name] != self.applied[k.name]}
        restart = [k.name for k in keys if not k.reloadable and new[k.name] != self.started[k.name]]
        log.info(AuditEvent.CONFIG_RELOADED, file=self.source.path, applied=sorted(now), needs_restart=restart)
        if restart:
            log.warning("config_needs_restart", keys=restart)
        self.applied.update(now)
        return now


# --- the command line -----------------------------------------------------------------------------


def add_flags(
    parser: Any, keys: Iterable[Key], groups: Mapping[str, str], group_help: Mapping[str, str], *, file_help: str
) -> None:
    """Every key as a flag (`--config` too). Flags default to None: only flags actually given take
    precedence over the environment and the file."""
    parser.add_argument(
        "--config", metavar="FILE", help=file_help + "; precedence: flags > MINDHAND_* variables > file > defaults"
    )
    made: dict[str, Any] = {}
    for key in keys:
        group_name = groups.get(key.name)
        target = parser
        if group_name:
            if group_name not in made:
                made[group_name] = parser.add_argument_group(group_name, group_help.get(group_name))
            target = made[group_name]
        shown = duration_text(key.default) if key.kind is Duration and key.default is not None else key.default
        default = f" (default {shown})" if key.default not in (None, [], False) else ""
        help_text = (
            key.help + default + f" [env {key.env_name}]" + (" [SIGHUP reloads]" if key.reloadable else "")
        ).replace("%", "%%")
        if key.kind is bool:
            target.add_argument(key.flag, action="store_true", default=None, help=help_text)
        elif key.kind is list:
            target.add_argument(key.flag, action="append", default=None, metavar=key.metavar, help=help_text)
        else:
            target.add_argument(key.flag, default=None, metavar=key.metavar, help=help_text)


def duration_text(seconds: float) -> str:
    """Seconds as a person would type them back (`3600` -> `1h`, `90` -> `90s`): for help texts."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def flags_given(args: Any, keys: Iterable[Key]) -> dict[str, Any]:
    return {k.name: getattr(args, k.name) for k in keys if getattr(args, k.name, None) is not None}


def format_table(rows: list[dict[str, Any]]) -> str:
    """`config show` as a table: key, value, source (reloadable keys marked)."""
    cells = [("KEY", "VALUE", "SOURCE")] + [
        (r["key"] + (" *" if r["reloadable"] else ""), _show_value(r["value"]), r["source"]) for r in rows
    ]
    w0 = max(len(c[0]) for c in cells)
    w1 = min(60, max(len(c[1]) for c in cells))
    lines = [f"{a.ljust(w0)}  {b.ljust(w1)}  {c}" for a, b, c in cells]
    lines.append("(* = applied by SIGHUP without a restart)")
    return "\n".join(lines)


def _show_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value) if value else "[]"
    return str(value)
