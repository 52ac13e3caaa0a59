"""How the `mind` command exits: the exit-code table, what each error code means for `--json`, and
`die`. One module, so `mind exec`, `mind call`, `mind cp` and `mind task` cannot disagree on a code."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

from mind.cli.formatting import printable
from mind.commandline import EXIT_USAGE as EXIT_USAGE

EXIT_TIMED_OUT = 124
EXIT_CANCELLED = 130
EXIT_REFUSED = 125
EXIT_BUDGET = 123
EXIT_INCOMPLETE = 122
"""The command ended with 0, but bytes of its output were not delivered (cut by the Hand's output
limit, or lost): never 0 when part of the output is missing."""
EXIT_LOST = 255
EXIT_WAIT_TIMEOUT = 121
"""`mind task wait --timeout D`, `mind exec --wait D`: D passed and the task or run had not ended (it
goes on: `mind attach RUN_ID` takes a run up again). Not 124, which is one that ended `timed_out`: a
script must tell "still running" from "killed at its deadline"."""
# EXIT_USAGE = 2 (bad usage) is imported above: the daemon's commands name it too (mind/commandline.py)

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
unreachable), 255 when the link did not come back within its retries, 130 on Ctrl-C, 2 on usage;
the gravest wins."""

EXIT_MEANINGS = {
    EXIT_REFUSED: "refused: nothing ran or was stored (Mind unreachable, authentication failed, Hand "
    "offline or unknown, bad request)",
    EXIT_LOST: "lost: the request was sent but its answer never came; nobody here knows how it ended",
    EXIT_WAIT_TIMEOUT: "still running: the wait ended before the run did (mind attach RUN_ID)",
    EXIT_USAGE: "bad command-line usage",
    1: "failed: the local operation did not complete",
}
"""What an error exit means, for `--json` output (README, exit codes)."""

JSON_ERRORS = False
"""Set for a `--json`/`--events` command (`mind.main`): every error exit also prints one JSON object
on stdout, so a script parses every outcome, not only the successful ones (issue 14)."""


def json_error(msg: str, code: int, kind: str | None = None) -> None:
    """`{"error", "code", "exit_code", "meaning"}` on stdout: `code` is the machine-readable cause
    (`unreachable`, `tls`, `auth_failed`, ...: `mind.errors.ClientCode`; null when there is none)."""
    import json

    print(json.dumps({"error": msg, "code": kind, "exit_code": code, "meaning": EXIT_MEANINGS.get(code)}), flush=True)


def die(msg: str, code: int = EXIT_REFUSED, kind: str | None = None) -> NoReturn:
    if JSON_ERRORS:
        json_error(msg, code, kind)
    print(f"mind: {printable(msg)}", file=sys.stderr)
    raise SystemExit(code)


def exit_code_for(end: Any) -> int:
    """A run's end as the exit code of `mind exec` / `mind call` (the table in mind/cli/main.py)."""
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
