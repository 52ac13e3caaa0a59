"""structlog setup shared by the daemons and the CLI: console on a TTY, JSON lines otherwise.

Bind `hand`, `gen`, `run_id`, `task_id`; never log raw tool arguments, secrets or output (digests,
sizes and counts only). A logged exception (`log.exception(...)`, or `exc_info=`) becomes three fields,
`exc_type`, `exc_message` and `traceback`: frames and messages, never local variables, with a
pydantic error's input values left out and the daemon's own redaction applied (the Hand removes its
root and its secret). The events written to the audit file are `protocol.audit.AuditEvent`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import datetime
import errno
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, Literal

import structlog

from protocol.audit import AUDITED, AuditEvent

LogFormat = Literal["auto", "console", "json"]
Redact = Callable[[str], str]

EXC_MESSAGE_MAX = 1000
"""Characters of an exception's message kept in a log line: one error cannot flood the log."""


AGGREGATED: frozenset[str] = frozenset(
    {
        AuditEvent.HANDSHAKE_REFUSED,
        AuditEvent.HANDSHAKE_FAILED,
        AuditEvent.HAND_INPUT_WRONG_GENERATION,
        AuditEvent.HAND_INPUT_UNKNOWN_RUN,
        AuditEvent.TASK_UPDATE_FOREIGN,
        AuditEvent.TASK_UPDATE_UNSOLICITED,
        AuditEvent.DENIED_BY_SCOPE,
    }
)
"""Refusals a stranger, a hostile Hand or a scoped client can provoke in a loop: written
`AUDIT_BURST` times per (event, who, what, why) and interval, then counted (issue 13: a connection
flood wrote ~8.8 GiB a day; issue 23, attack 6: one client's requests outside its scope wrote
5.4 MiB/s). A counted line is dropped from the console too, so the flood is bounded there as well."""
AUDIT_BURST = 10
AUDIT_INTERVAL_S = 60.0
AUDIT_KEYS_MAX = 256
"""Distinct (event, who, why) keys counted per interval; beyond it one key per event takes the rest,
so a flood from many addresses is bounded too."""
_KEY_FIELDS = ("peer", "hand", "client", "label", "what", "why", "code", "tool", "reject_code")


def _aggregated(event: str, event_dict: dict[str, Any]) -> bool:
    """A refusal the peer can repeat at will: the `AGGREGATED` events, and a run refused before
    anything ran (its `run_admitted` with a `reject_code`, `run_rejected`, and its `run_terminal`
    in state `rejected`): a scoped client's
    flood of requests outside its scope wrote three audit lines per request (issue 23, attack 6)."""
    if event in AGGREGATED or event == AuditEvent.RUN_REJECTED:
        return True
    if event == AuditEvent.RUN_ADMITTED:
        return event_dict.get("reject_code") is not None  # refused by the Mind as it was admitted
    return event == AuditEvent.RUN_TERMINAL and event_dict.get("state") == "rejected"


class Dropped:
    """Lines a sink could not write (a full disk, a quota, a pipe gone), counted by sink (`audit`,
    `log`): a failed write is counted and the line dropped, never raised into the code that logged.
    A Hand whose state disk filled exited 1 when the audit line of a run's end raised ENOSPC out of
    the run's task group; a log line is worth less than the run it describes. The counts are what
    the Hand's `/metrics` exposes (`mindhand_hand_log_writes_dropped`); `failing` says which sinks
    are in a run of failures now, so each run is told once when it starts and once when it ends."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._since: dict[str, int] = {}

    def failed(self, sink: str) -> bool:
        """Count one line `sink` dropped; True when it starts a run of failures."""
        self.counts[sink] = self.counts.get(sink, 0) + 1
        first = sink not in self._since
        self._since[sink] = self._since.get(sink, 0) + 1
        return first

    def wrote(self, sink: str) -> int:
        """`sink` wrote a line: the lines it dropped in the run of failures this ends (0: none)."""
        return self._since.pop(sink, 0) if self._since else 0

    def failing(self, sink: str) -> bool:
        return sink in self._since


DROPPED = Dropped()
"""This process's dropped lines (one process, one log and one audit file)."""


def _append(fd: int, data: bytes) -> tuple[int, OSError | None]:
    """Write all of `data` to `fd` (a short write is continued); (bytes written, the error that
    stopped it, if one did). Never raises: a sink that cannot write drops the line."""
    done = 0
    while done < len(data):
        try:
            n = os.write(fd, data[done:])
        except OSError as exc:
            return done, exc
        if n <= 0:  # no progress and no error: as good as a full disk
            return done, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n
    return done, None


def _why(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{name}: {exc.strerror or exc}" if name else str(exc)


def _stderr_notice(event: str, fields: dict[str, Any]) -> None:
    """Where a sink's trouble is told before `configure` routes it through the log (the admin
    commands write the audit file with no log configured): one line on stderr, best effort."""
    detail = ", ".join(f"{k}={v}" for k, v in fields.items())
    try:
        os.write(2, f"mindhand: {event}: {detail}\n".encode(errors="replace"))
    except OSError:
        pass


class _Repeats:
    __slots__ = ("fields", "start", "seen", "suppressed", "first", "last")

    def __init__(self, fields: dict[str, Any], start: float) -> None:
        self.fields, self.start, self.seen, self.suppressed = fields, start, 0, 0
        self.first = self.last = ""


class AuditLog:
    """Append-only JSON lines (0600): every admission decision and terminal state, with who, hand,
    generation, tool, args digest, decision, reason and time. Fed from the same log events as the
    console, so it can never carry more than they do: never raw arguments or secrets.

    Repeated refusals (`AGGREGATED`) are written `AUDIT_BURST` times per (event, who, why) and
    `AUDIT_INTERVAL_S`; the rest are counted and written as one line with `"repeated": N` (and the
    first and last time) when the interval is over or the log closes. The file follows logrotate's
    move-and-create (checked at most once a second, so SIGHUP is not needed, as for `ReopeningFile`).

    A line the file cannot take (its disk is full) is counted (`DROPPED`, sink `audit`) and dropped;
    `notice` is told once when such a run of failures starts and once when a line is written again.
    A line cut short by the failure is closed by a newline before the next one, so every line
    written whole stays a line of its own."""

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = self._open()
        self._checked = 0.0
        self._repeats: dict[tuple[str, ...], _Repeats] = {}
        self._swept = 0.0
        self._lock = threading.Lock()
        self._torn = False
        """The last write stopped part way: the next line starts on a line of its own."""
        self._told: tuple[str, dict[str, Any]] | None = None
        self.notice: Callable[[str, dict[str, Any]], None] = _stderr_notice
        """Told `log_writes_failing` / `log_writes_recovered` (`configure` routes it to the log)."""

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        return fd

    def write(self, record: dict) -> None:
        self.record(record, _json(record))

    def record(self, event_dict: dict[str, Any], line: str) -> bool:
        """Write `line` (the JSON of `event_dict`), or count it if it is a repeat over its burst;
        False when it was counted, not written."""
        now = time.monotonic()
        with self._lock:
            if self._fd < 0:  # closed at exit: a late line must not reach a reused descriptor
                return True
            self._follow(now)
            if now - self._swept >= 1.0:
                self._sweep(now, force=False)
            event = str(event_dict.get("event"))
            if _aggregated(event, event_dict) and self._counted(event, event_dict, now):
                return False
            self._put(line)  # one write per line: O_APPEND keeps it whole
            told, self._told = self._told, None
        if told is not None:  # outside the lock: the notice is a log line of its own
            self.notice(*told)
        return True

    def _put(self, line: str) -> None:
        """(under the lock) Append one line, or count it dropped; when the sink's state changes
        (failures began, or a line went through after them), what to tell `notice` is kept in
        `_told` for the caller to say once the lock is released."""
        data = (line + "\n").encode()
        if self._torn:
            data = b"\n" + data
        done, exc = _append(self._fd, data)
        if exc is not None:
            self._torn = self._torn or done > 0
            if DROPPED.failed("audit"):
                self._told = "log_writes_failing", {"sink": "audit", "path": str(self.path), "error": _why(exc)}
            return
        self._torn = False
        dropped = DROPPED.wrote("audit")
        if dropped:
            self._told = "log_writes_recovered", {"sink": "audit", "path": str(self.path), "dropped": dropped}

    def _counted(self, event: str, event_dict: dict[str, Any], now: float) -> bool:
        key = (event, *(str(event_dict.get(f, "")) for f in _KEY_FIELDS))
        rep = self._repeats.get(key)
        if rep is None:
            if len(self._repeats) >= AUDIT_KEYS_MAX:
                key = (event, "*")
                rep = self._repeats.get(key)
            if rep is None:
                kept = {f: event_dict[f] for f in _KEY_FIELDS if f in event_dict} if key[1:] != ("*",) else {}
                rep = self._repeats[key] = _Repeats(kept, now)
        rep.seen += 1
        if rep.seen <= AUDIT_BURST:
            return False
        if rep.suppressed == 0:
            rep.first = str(event_dict.get("timestamp", ""))
        rep.suppressed += 1
        rep.last = str(event_dict.get("timestamp", ""))
        return True

    def _sweep(self, now: float, force: bool) -> None:
        """Write the count of every interval that is over (all of them when `force`), forget it."""
        self._swept = now
        for key, rep in list(self._repeats.items()):
            if not force and now - rep.start < AUDIT_INTERVAL_S:
                continue
            del self._repeats[key]
            if rep.suppressed:
                summary = {
                    "event": key[0],
                    **rep.fields,
                    "repeated": rep.suppressed,
                    "first": rep.first,
                    "last": rep.last,
                    "interval_s": AUDIT_INTERVAL_S,
                    "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
                }
                if key[1:] == ("*",):
                    summary["who"] = "many (over the per-interval key limit)"
                self._put(_json(summary))  # a count that cannot be written is one more line dropped

    def _follow(self, now: float) -> None:
        if now - self._checked <= 1.0:
            return
        self._checked = now
        try:
            moved = os.stat(self.path).st_ino != os.fstat(self._fd).st_ino
        except FileNotFoundError:
            moved = True
        if moved:
            try:
                fd = self._open()
            except OSError:
                return  # keep writing to the file we hold rather than lose the line
            os.close(self._fd)
            self._fd = fd

    def close(self) -> None:
        _DEFERRED.flush()  # the lines waiting for the loop's turn to end are the file's too
        with self._lock:
            if self._fd < 0:
                return
            self._sweep(time.monotonic(), force=True)
            os.close(self._fd)
            self._fd = -1
            told, self._told = self._told, None
        if told is not None:  # the last counts' line changed the sink's state: said as any other
            self.notice(*told)


_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))
"""`json.dumps` with these arguments builds a new encoder on every call: one made once writes the
same bytes for less (issue 25: every call's audit lines pass here on both daemons)."""


def _json(event_dict: dict) -> str:
    return _ENCODER.encode(event_dict)


def parse_levels(spec: str) -> tuple[int, dict[str, int]]:
    """`info` or `info,mind.tasks=debug,hand=warning` -> (default level, per-component levels).
    A component level applies to that component and those below it (`mind` covers `mind.tasks`)."""
    default: int | None = None
    per: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, lvl = part.rpartition("=")
        level = _LEVELS.get(lvl.lower())
        if level is None:
            raise ValueError(f"unknown log level {lvl!r} in {spec!r} (use debug, info, warning, error)")
        if sep:
            per[name] = level
        else:
            default = level
    return (logging.INFO if default is None else default), per


def _level_for(component: str | None, default: int, per: dict[str, int]) -> int:
    while component:
        if component in per:
            return per[component]
        component = component.rpartition(".")[0]
    return default


class _Levels:
    """The levels in force, read by every log call: `set_levels` (SIGHUP) changes them in place, so
    loggers already bound and cached keep working and follow the new levels."""

    floor = logging.INFO  # the lowest level any component lets through: cheaper calls stop here
    default = logging.INFO
    per: dict[str, int] = {}


def set_levels(spec: str) -> None:
    """Apply a new level spec (`info,hand=debug`) to every logger, cached or not. ValueError if bad."""
    default, per = parse_levels(spec)
    _Levels.default, _Levels.per = default, per
    _Levels.floor = min([default, logging.INFO, *per.values()])  # INFO: audit events pass to the tee


class _Deferred:
    """Lines logged on a running event loop, written when the loop's turn is over (DESIGN §13:
    audit lines are batched off the call's path). A call's `run_admitted` and `run_terminal` lines
    were rendered and written, two `write(2)` each with the audit file, before the frames of the
    same turn left: on both daemons that was a tenth of a call's latency. Kept here, a line costs
    its arguments and a copy of the context (contextvars are bound when it is logged, so it is
    rendered as it would have been); its time is taken when it is logged.

    Only `info` and `debug` lines wait: a warning or an error, and any line with an exception, is
    written at once, after what waits (the order of lines is kept). Off a loop (the CLI, a worker
    thread, the daemons' start and exit) every line is written at once. What waits is written at
    the end of the turn (`call_soon`, so after the frames the turn queued), when the audit file
    closes, and at exit: a SIGKILL loses at most the lines of the one turn in flight, never an
    ending, which the store holds before any client is told."""

    def __init__(self) -> None:
        self.on = False
        self._pending: list[tuple[Any, str, Any, dict[str, Any], contextvars.Context]] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop a flush is scheduled on (None: none is)."""

    def add(self, logger: Any, name: str, event: Any, kw: dict[str, Any]) -> bool:
        """Keep the line for the end of this turn; False if there is no running loop (write it now)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        kw["_logged_at"] = time.time()
        with self._lock:
            self._pending.append((logger, name, event, kw, contextvars.copy_context()))
            if self._loop is loop:
                return True
            stale = self._loop is not None  # scheduled on a loop that ended before its flush ran
            self._loop = loop
        if stale:
            self.flush(keep_schedule=True)
        loop.call_soon(self.flush)
        return True

    def flush(self, keep_schedule: bool = False) -> None:
        """Write every line that waits, in the order they were logged."""
        with self._lock:
            pending, self._pending = self._pending, []
            if not keep_schedule:
                self._loop = None
        for logger, name, event, kw, ctx in pending:
            ctx.run(logger._proxy_to_logger, name, event, **kw)


_DEFERRED = _Deferred()
atexit.register(_DEFERRED.flush)


def flush() -> None:
    """Write the lines that wait for the end of the loop's turn (`_Deferred`) now."""
    _DEFERRED.flush()


def _method(name: str, level: int):
    waits = level <= logging.INFO

    def method(self, event=None, *args, **kw):
        if level < _Levels.floor:
            return None
        if args:
            event = event % args
        if _DEFERRED.on:
            if waits and "exc_info" not in kw and _DEFERRED.add(self, name, event, kw):
                return None
            _DEFERRED.flush()  # what waits was logged first: it is written first
        return self._proxy_to_logger(name, event, **kw)

    method.__name__ = name
    return method


def _exception(self, event=None, *args, **kw):
    kw.setdefault("exc_info", True)
    return self.error(event, *args, **kw)


class LevelledLogger(structlog.BoundLoggerBase):
    """A bound logger whose threshold can change at run time (structlog's filtering loggers fix it
    when they are made, and the daemons cache theirs)."""

    debug = _method("debug", logging.DEBUG)
    info = _method("info", logging.INFO)
    msg = _method("info", logging.INFO)
    warning = _method("warning", logging.WARNING)
    warn = warning
    error = _method("error", logging.ERROR)
    critical = _method("critical", logging.CRITICAL)
    exception = _exception


def exception_fields(exc: BaseException, redact: Redact | None = None) -> dict[str, str]:
    """`exc_type`, `exc_message` and `traceback` of a logged exception (its causes and contexts
    included, like Python prints them). Frames show code, never values; a pydantic error is
    described without its input (a raw argument, or a secret); `redact` applies to the text."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
    parts = []
    for i, e in enumerate(reversed(chain)):
        if i:
            cause = e.__cause__ is chain[len(chain) - i]
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if cause
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
        frames = "".join(traceback.format_tb(e.__traceback__))
        parts.append(f"Traceback (most recent call last):\n{frames}{_exc_type(e)}: {_exc_message(e)}\n")
    fields = {"exc_type": _exc_type(exc), "exc_message": _exc_message(exc), "traceback": "".join(parts)}
    if redact is not None:
        fields = {k: redact(v) for k, v in fields.items()}
    return fields


def _exc_type(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _exc_message(exc: BaseException) -> str:
    pydantic = sys.modules.get("pydantic")  # not imported: no error of its (`mind hand add` never imports it)
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        errs = exc.errors(include_input=False, include_url=False, include_context=False)
        text = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '(value)'}: {err['msg']}" for err in errs)
        text = f"{exc.error_count()} validation error(s) for {exc.title}: {text}"
    else:
        try:
            text = str(exc)
        except Exception:  # a broken __str__ must not lose the log line
            text = "(unprintable)"
    return text if len(text) <= EXC_MESSAGE_MAX else text[: EXC_MESSAGE_MAX - 3] + "..."


def _exceptions(redact: Redact | None):
    """`exc_info` (set by `log.exception`, or passed) -> `exception_fields`, on the logging thread
    while the exception is being handled. Replaces structlog's own formatters: its console one can
    show local variables, and the JSON line had only `"exc_info": true`."""

    def processor(logger: object, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        exc_info = event_dict.pop("exc_info", None)
        if not exc_info:
            return event_dict
        if isinstance(exc_info, BaseException):
            exc: BaseException | None = exc_info
        elif isinstance(exc_info, tuple):
            exc = exc_info[1]
        else:
            exc = sys.exc_info()[1]
        if exc is not None:
            event_dict.update(exception_fields(exc, redact))
        return event_dict

    return processor


def _tee_and_render(audit: AuditLog | None, json_console: bool, console_renderer):
    """The last processor: writes audit events whatever the console level (the bound logger lets
    INFO through for that reason), drops what the console's level filters out, and renders. With a
    JSON console an audited event is encoded once for both."""

    def processor(logger: object, method: str, event_dict: dict[str, Any]) -> str:
        line: str | None = None
        if audit is not None and event_dict.get("event") in AUDITED:
            line = _json(event_dict)
            if not audit.record(event_dict, line):
                raise structlog.DropEvent  # a repeat the audit file counts: the console skips it too
        level_no = _LEVELS.get(method)
        per = _Levels.per
        floor = _level_for(event_dict.get("component"), _Levels.default, per) if per else _Levels.default
        if level_no is not None and level_no < floor:
            raise structlog.DropEvent
        if json_console:
            return line if line is not None else _json(event_dict)
        if "traceback" in event_dict:  # printed below the line, as Python prints it
            event_dict["exception"] = event_dict.pop("traceback")
        return console_renderer(logger, method, event_dict)

    return processor


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


class ReopeningFile:
    """A log file that follows rotation (logrotate's move-and-create): if the path no longer names
    the file we hold, reopen it. Checked at most once a second. Each line is one `write(2)` of its
    own, unbuffered: a line the disk refused is not kept in a buffer to come out later, cut, in the
    middle of another (`_Console` counts it dropped)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = self._open()
        self._checked = 0.0

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)

    def append(self, data: bytes) -> tuple[int, OSError | None]:
        """Write one line's bytes (`_append`'s answer: bytes written, the error that stopped it)."""
        now = time.monotonic()
        if now - self._checked > 1.0:
            self._checked = now
            try:
                moved = os.stat(self.path).st_ino != os.fstat(self._fd).st_ino
            except FileNotFoundError:
                moved = True
            except OSError:
                moved = False
            if moved:
                try:
                    fd = self._open()
                except OSError:
                    pass  # keep writing to the file we hold rather than lose the line
                else:
                    os.close(self._fd)
                    self._fd = fd
        return _append(self._fd, data)

    def write(self, text: str) -> int:
        done, exc = self.append(text.encode(errors="backslashreplace"))
        if exc is not None:
            raise exc
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


Render = Callable[[str, dict[str, Any]], str]
"""A notice (event and fields) as the console shows a line (JSON or the console's format)."""


class _Console:
    """The console stream as structlog's `WriteLogger` sees it: a line the stream cannot take (a
    `--log-file` or a redirected stdout on a full disk) is counted (`DROPPED`, sink `log`) and
    dropped, never raised into the code that logged. One notice when a run of failures starts (on
    stderr, best effort: the console itself is what fails) and one in the console when a line is
    written again, with the count.

    A stream with a file descriptor is written one `write(2)` per line, bypassing its buffer (the
    stream is flushed first): a buffered writer keeps the bytes a full disk refused and writes
    them, cut, once there is room, in the middle of later lines."""

    def __init__(self, stream: Any, render: Render) -> None:
        self._stream = stream
        self._render = render
        self._torn = False
        self._fd: int | None = None
        if not isinstance(stream, ReopeningFile):
            try:
                stream.flush()
                self._fd = stream.fileno()
            except (OSError, ValueError, AttributeError):  # a StringIO, a test's stream: its own write
                self._fd = None

    def _raw(self, data: bytes, text: str) -> tuple[int, OSError | None]:
        if isinstance(self._stream, ReopeningFile):
            return self._stream.append(data)
        if self._fd is not None:
            return _append(self._fd, data)
        try:
            self._stream.write(text)
            self._stream.flush()
        except OSError as exc:
            return 0, exc
        return len(data), None

    def write(self, text: str) -> int:
        data = text.encode(errors="backslashreplace")
        if self._torn:
            data, text = b"\n" + data, "\n" + text
        done, exc = self._raw(data, text)
        if exc is not None:
            self._torn = self._torn or done > 0
            if DROPPED.failed("log"):
                notice = self._render("log_writes_failing", {"sink": "log", "error": _why(exc)}) + "\n"
                if self._fd != 2:
                    _append(2, notice.encode(errors="backslashreplace"))
            return len(text)
        self._torn = False
        dropped = DROPPED.wrote("log")
        if dropped:
            notice = self._render("log_writes_recovered", {"sink": "log", "dropped": dropped}) + "\n"
            self._raw(notice.encode(errors="backslashreplace"), notice)
        return len(text)

    def flush(self) -> None:
        pass  # every `write` went out whole (or was dropped)

    def isatty(self) -> bool:
        return bool(self._stream.isatty())


def configure(
    fmt: LogFormat = "auto",
    level: str = "info",
    stream=None,
    audit: AuditLog | None = None,
    redact: Redact | None = None,
    defer: bool = True,
) -> None:
    """Logs go to stdout by default (systemd/journald collect it), or to `stream` (a `ReopeningFile`
    for `--log-file`). `level` is `info` or `info,component=debug,...`. `redact` applies to the text
    of logged exceptions (the Hand passes one that removes its root and its secret). `defer`: the
    `info` lines logged on a running loop are written at the end of its turn (`_Deferred`)."""
    _DEFERRED.flush()
    _DEFERRED.on = defer
    stream = stream or sys.stdout
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    console = structlog.dev.ConsoleRenderer(colors=stream.isatty()) if fmt == "console" else None
    set_levels(level)

    def render(event: str, fields: dict[str, Any]) -> str:
        level = _NOTICE_LEVELS[event]
        line = {"event": event, **fields, "component": "logs", "level": level}
        line["timestamp"] = datetime.datetime.now(datetime.UTC).isoformat()
        return _json(line) if console is None else console(None, level, line)

    if audit is not None:
        audit.notice = _log_notice
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _timestamp,
            _exceptions(redact),
            _tee_and_render(audit, console is None, console),
        ],
        wrapper_class=LevelledLogger,
        # One write of the line and its newline, then a flush: the bytes `print` wrote in two.
        logger_factory=structlog.WriteLoggerFactory(file=_Console(stream, render)),  # type: ignore[arg-type]
        # Daemons configure once at start: caching the bound loggers saves a proxy lookup and a bind
        # on every log call (measured: a tenth of the Mind's CPU per routed call).
        cache_logger_on_first_use=True,
    )


def _timestamp(logger: object, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog's ISO UTC timestamp (`...Z`), of the time the line was logged (a line that waited
    for the end of the loop's turn carries it as `_logged_at`)."""
    at = event_dict.pop("_logged_at", None)
    now = datetime.datetime.now(datetime.UTC) if at is None else datetime.datetime.fromtimestamp(at, datetime.UTC)
    event_dict["timestamp"] = now.isoformat().replace("+00:00", "Z")
    return event_dict


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(component=name)


_NOTICE_LEVELS = {"log_writes_failing": "error", "log_writes_recovered": "warning"}
"""A sink that starts failing is an error (the audit trail or the log has a gap from then on); its
recovery a warning that says how many lines the gap holds."""


def _log_notice(event: str, fields: dict[str, Any]) -> None:
    """The audit file's trouble, told in the log."""
    getattr(structlog.get_logger(component="logs"), _NOTICE_LEVELS[event])(event, **fields)
