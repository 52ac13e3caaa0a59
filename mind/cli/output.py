"""What the `mind` command prints and how it exits: the exit-code table, end summaries, tables and
times. One module, so `mind exec`, `mind call` and `mind task` cannot disagree on a code."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

EXIT_TIMED_OUT = 124
EXIT_CANCELLED = 130
EXIT_REFUSED = 125
EXIT_BUDGET = 123
EXIT_INCOMPLETE = 122
"""The command ended with 0, but bytes of its output were not delivered (cut by the Hand's output
limit, or lost): never 0 when part of the output is missing."""
EXIT_LOST = 255
EXIT_USAGE = 2


def printable(text: object) -> str:
    """`text` safe for a terminal: every control character (C0, DEL, C1) becomes a visible escape
    (`\\x1b`, `\\n`), so a Hand's claim or reason cannot move the cursor, retitle the window or hide
    itself (issue 13). Only for human output: JSON output is escaped by `json.dumps` already."""
    s = str(text)
    if all(" " <= c < "\x7f" or c > "\x9f" for c in s):
        return s
    return "".join(c if " " <= c < "\x7f" or c > "\x9f" else repr(c)[1:-1] for c in s)


def die(msg: str, code: int = EXIT_REFUSED) -> NoReturn:
    print(f"mind: {printable(msg)}", file=sys.stderr)
    raise SystemExit(code)


def exit_code_for(end: Any) -> int:
    from protocol.states import RunState

    s = end.state
    if s in (RunState.SUCCEEDED, RunState.FAILED):
        if end.exit_code is not None:
            return end.exit_code
        if end.signal is not None:
            return 128 + end.signal
        return 0 if s is RunState.SUCCEEDED else 1
    return {
        RunState.TIMED_OUT: EXIT_TIMED_OUT,
        RunState.CANCELLED: EXIT_CANCELLED,
        RunState.REJECTED: EXIT_REFUSED,
        RunState.LOST: EXIT_LOST,
        RunState.BUDGET_EXHAUSTED: EXIT_BUDGET,
    }.get(s, 1)


def _text(b: bytes) -> Any:
    try:
        return b.decode()
    except UnicodeDecodeError:
        import base64

        return {"base64": base64.b64encode(b).decode()}


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return _text(bytes(v))
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def end_summary(end: Any) -> dict[str, Any]:
    return {
        "run_id": end.run_id,
        "hand": end.hand,
        "tool": end.tool,
        "state": end.state.value,
        "reason": end.reason,
        "reject_code": end.reject_code.value if end.reject_code else None,
        "exit_code": end.exit_code,
        "signal": end.signal,
        "stage": end.stage.value if end.stage else None,
        "progress_dropped": end.progress_dropped,
        "truncated": end.truncated,
        "duration_ms": end.duration_ms,
        "error": end.error,
    }


class _StreamPrinter:
    """Writes streamed output live, marks gaps left by dropped progress, and completes the output
    from the result's tail so the user always sees how the command ended."""

    def __init__(self) -> None:
        self.upto = {"stdout": 0, "stderr": 0}
        self.out = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}

    def chunk(self, stream: str, offset: int, data: bytes) -> None:
        if offset < self.upto[stream]:
            data = data[self.upto[stream] - offset :]
            offset = self.upto[stream]
            if not data:
                return
        if offset > self.upto[stream]:
            self._gap(stream, offset - self.upto[stream])
        f = self.out[stream]
        f.write(data)
        f.flush()
        self.upto[stream] = offset + len(data)

    def _gap(self, stream: str, n: int) -> None:
        sys.stderr.buffer.write(f"\n[mindhand: {n} bytes of {stream} not shown: progress cap]\n".encode())
        sys.stderr.buffer.flush()

    def finish(self, stream: str, tail: Any) -> None:
        total, data = tail.total, tail.data
        if self.upto[stream] >= total or not data:
            return
        self.chunk(stream, total - len(data), data)


def _explain(end: Any) -> None:
    """One line on stderr for any end that is not the command's own exit, and for a program that
    could not start (127 / 126: the OS's message, as a shell prints it)."""
    from protocol.states import RunState

    s = end.state
    if s is RunState.SUCCEEDED or (s is RunState.FAILED and end.exit_code is not None and not end.error):
        return
    detail = end.error or end.reason
    code = f" ({end.reject_code.value})" if end.reject_code else ""
    stage = f", stopped by SIG{end.stage.value.upper()}" if end.stage else ""
    print(f"mind: run {end.run_id} {s.value}{code}{stage}: {printable(detail)}", file=sys.stderr)


# --- formatting ----------------------------------------------------------------------------


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
        lim["address_space"] = _size(args.memory)
    if lim:
        tool_args["limits"] = lim
    return ("shell" if args.shell is not None else "exec"), tool_args


def _size(text: str) -> int:
    from protocol.units import positive_size

    try:
        return positive_size(text)
    except ValueError as exc:
        die(str(exc), EXIT_USAGE)


def _ts(t: float | None) -> str:
    if not t:
        return "-"
    import datetime

    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _table(headers: list[str], rows: list[list[str]]) -> None:
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
