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
EXIT_WAIT_TIMEOUT = 121
"""`mind task wait --timeout D`: D passed and the task had not ended (it goes on). Not 124, which is
a task that ended `timed_out`: a script must tell "still running" from "killed at its deadline"."""
EXIT_USAGE = 2

# Fleet runs (`mind exec --hands`; README "Fleet runs"). The numbers are decided in mind/core/fleet.py
# (the plan's aggregate); repeated here so this table is whole without importing it on the fast path
# (tests/mind/test_fleet_plan.py checks they agree).
EXIT_FLEET_UNREACHED = 118
"""Every run that started succeeded, but some Hands were never reached (hand_offline, undeliverable)."""
EXIT_FLEET_FAILED = 120
"""Some Hands' runs did not succeed (failed, timed_out, lost, ...), within the error budget."""
EXIT_FLEET_BUDGET = 119
"""The error budget was spent (or --fail-fast tripped) and some Hands were not started."""
EXIT_COPY_FAILED = 1
"""`mind cp` (mind/cli/cp.py): a copy failed (no such file, permission denied, disk full on the Hand,
sha256 mismatch, a special file or an outside symlink not copied). `mind cp` also exits 125 when a
copy was refused (policy, path outside the root, over the Hand's max_upload_bytes, Mind
unreachable), 255 when the link did not come back within its retries, 2 on usage; the gravest wins."""


def printable(text: object) -> str:
    """`text` safe for a terminal: every control character (C0, DEL, C1) becomes a visible escape
    (`\\x1b`, `\\n`), so a Hand's claim or reason cannot move the cursor, retitle the window or hide
    itself (issue 13). Only for human output: JSON output is escaped by `json.dumps` already."""
    s = str(text)
    if all(" " <= c < "\x7f" or c > "\x9f" for c in s):
        return s
    return "".join(c if " " <= c < "\x7f" or c > "\x9f" else repr(c)[1:-1] for c in s)


EXIT_MEANINGS = {
    EXIT_REFUSED: "refused: nothing ran or was stored (Mind unreachable, authentication failed, Hand "
    "offline or unknown, bad request)",
    EXIT_LOST: "lost: the request was sent but its answer never came; nobody here knows how it ended",
    EXIT_USAGE: "bad command-line usage",
    1: "failed: the local operation did not complete",
}
"""What an error exit means, for `--json` output (README, exit codes)."""

JSON_ERRORS = False
"""Set for a `--json`/`--events` command (`mind.main`): every error exit also prints one JSON object
on stdout, so a script parses every outcome, not only the successful ones (issue 14)."""


def json_error(msg: str, code: int, kind: str | None = None) -> None:
    """`{"error", "code", "exit_code", "meaning"}` on stdout: `code` is the machine-readable cause
    (`unreachable`, `tls`, `auth_failed`, ...; null when there is none)."""
    import json

    print(json.dumps({"error": msg, "code": kind, "exit_code": code, "meaning": EXIT_MEANINGS.get(code)}), flush=True)


def die(msg: str, code: int = EXIT_REFUSED, kind: str | None = None) -> NoReturn:
    if JSON_ERRORS:
        json_error(msg, code, kind)
    print(f"mind: {printable(msg)}", file=sys.stderr)
    raise SystemExit(code)


def close_names(name: str, names: Any) -> list[str]:
    """Known names close to a mistyped one, as a mistyped config key gets (`protocol.io.settings`):
    difflib, the three closest."""
    import difflib

    return difflib.get_close_matches(name, sorted(set(names) - {name}), n=3, cutoff=0.6)


def did_you_mean(names: list[str]) -> str:
    return "did you mean " + " or ".join(repr(n) for n in names) + "?"


async def hand_suggestions(client: Any, name: str) -> list[str]:
    """For an `unknown_hand` refusal: close names among the Hands this client may see. The Mind lists
    only the Hands within the client's scope, so a hint never names one outside it (issue 14). Best
    effort: a failing list gives no hint, never another error."""
    from mind.errors import ClientError

    try:
        return close_names(name, [h.name for h in await client.hands()])
    except ClientError:
        return []


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


def task_exit_code(state: Any, exit_code: int | None, signal: int | None) -> int | None:
    """A task's outcome as an exit code (`mind task wait`, `mind task logs --follow`), by the table
    of `mind exec` (`exit_code_for`): the task states are the run states of the same name, so a
    script cannot tell a task's code from a run's. None while the task has not ended."""
    from types import SimpleNamespace

    from protocol.states import TASK_TERMINAL, RunState

    if state not in TASK_TERMINAL:
        return None
    return exit_code_for(SimpleNamespace(state=RunState(state.value), exit_code=exit_code, signal=signal))


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
