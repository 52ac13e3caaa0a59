"""structlog setup shared by the daemons and the CLI: console on a TTY, JSON lines otherwise.

Bind `hand`, `gen`, `run_id`, `task_id`; never log raw tool arguments, secrets or output (digests,
sizes and counts only).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Literal

import structlog

LogFormat = Literal["auto", "console", "json"]

AUDIT_EVENTS = frozenset(
    {
        # admission decisions and terminal states, both sides
        "run_admitted", "run_terminal", "run_accepted", "run_rejected",
        "task_queued", "task_rejected", "task_duplicate", "task_terminal", "task_start_ended",
        "task_cancel_requested", "task_cancel_recorded", "task_cancel_delivered",
        # who got in, who did not, and who tried to act outside what they may do
        "handshake_ok", "handshake_failed", "handshake_refused", "credential_changed", "credential_closed",
        "denied_by_scope", "hand_input_wrong_generation", "hand_input_unknown_run", "task_update_foreign",
        "reconcile_foreign_task",
    }
)


class AuditLog:
    """Append-only JSON lines (0600): every admission decision and terminal state, with who, hand,
    generation, tool, args digest, decision, reason and time. Fed from the same log events as the
    console, so it can never carry more than they do: never raw arguments or secrets."""

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.chmod(self.path, 0o600)

    def write(self, record: dict) -> None:
        os.write(self._fd, (_json(record) + "\n").encode())  # one write per line: O_APPEND keeps it whole

    def close(self) -> None:
        os.close(self._fd)


def _json(event_dict: dict) -> str:
    return json.dumps(event_dict, default=str, separators=(",", ":"))


def _tee_and_render(audit: AuditLog | None, min_level: int, json_console: bool, console_renderer):
    """The last processor: writes audit events whatever the console level (the bound logger lets
    INFO through for that reason), drops what the console's level filters out, and renders. With a
    JSON console an audited event is encoded once for both."""

    def processor(logger, method, event_dict):
        line: str | None = None
        if audit is not None and event_dict.get("event") in AUDIT_EVENTS:
            line = _json(event_dict)
            os.write(audit._fd, (line + "\n").encode())  # one write per line: O_APPEND keeps it whole
        level_no = _LEVELS.get(method)
        if level_no is not None and level_no < min_level:
            raise structlog.DropEvent
        if json_console:
            return line if line is not None else _json(event_dict)
        return console_renderer(logger, method, event_dict)

    return processor


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
           "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL}


def configure(fmt: LogFormat = "auto", level: str = "info", stream=None, audit: AuditLog | None = None) -> None:
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    console = structlog.dev.ConsoleRenderer(colors=stream.isatty()) if fmt == "console" else None
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} (use debug, info, warning, error)")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _tee_and_render(audit, numeric, console is None, console),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min(numeric, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        # Daemons configure once at start: caching the bound loggers saves a proxy lookup and a bind
        # on every log call (measured: a tenth of the Mind's CPU per routed call).
        cache_logger_on_first_use=True,
    )


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(component=name)
