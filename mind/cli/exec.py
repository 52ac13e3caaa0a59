"""`mind exec`: run a command on a Hand and behave as if it ran here (bytes, exit code, Ctrl-C).

This is the CLI's fast path: one blocking `Link` (mind/client/blocking.py says why: no asyncio, no pydantic)
and one loop that waits on the socket, the Ctrl-C wakeup and the status timer.
- Output is written as it streams; gaps left by dropped progress are marked and the result's tail
  completes what the stream missed (`_StreamPrinter`).
- Ctrl-C once requests a cancel (the Hand kills the whole tree) and keeps waiting for the
  authoritative end; a second Ctrl-C detaches (the cancel still proceeds).
- On a terminal (stderr), while the Hand has not started the command yet, or a cancel is pending, a
  status line appears after a second; it is erased before any output and at the end. Never with
  `--json`/`--events`, never when stderr is not a terminal.
- If the connection to the Mind is lost after the run was sent, the outcome is unknown: 255.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from mind.cli.connection import connection_params
from mind.cli.output import (
    EXIT_CANCELLED,
    EXIT_LOST,
    EXIT_USAGE,
    _explain,
    _StreamPrinter,
    _text,
    die,
    end_summary,
    exit_code_for,
    tool_args_from,
)
from mind.cli.progress import Status, elapsed
from mind.client import wire
from mind.client.blocking import Link
from mind.client.credentials import load_credential
from mind.client.session import Failed, Routed, RunEnded
from mind.errors import ClientError
from protocol import limits
from protocol.states import RunState

STATUS_AFTER_S = 1.0
STATUS_TICK_S = 0.25
NOT_STARTED = (None, RunState.ADMITTED, RunState.SENT)


def check_args(args: argparse.Namespace) -> tuple[str, dict[str, Any], int, int | None]:
    """Usage errors before any connection, with a sentence instead of a validation dump."""
    if args.timeout <= 0:
        die("--timeout must be positive", EXIT_USAGE)
    timeout_ms = max(1, int(args.timeout * 1000))
    if timeout_ms > limits.RUN_TIMEOUT_MAX_MS:
        die(f"--timeout is at most {limits.RUN_TIMEOUT_MAX_MS // 1000} seconds (24 h)", EXIT_USAGE)
    grace_ms = None
    if args.grace is not None:
        grace_ms = int(args.grace * 1000)
        if not 0 <= grace_ms <= 600_000:
            die("--grace must be between 0 and 600 seconds", EXIT_USAGE)
    if not limits.LABEL_RE.fullmatch(args.hand):
        die("--hand wants a Hand's name: 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)", EXIT_USAGE)
    tool, tool_args = tool_args_from(args)
    return tool, tool_args, timeout_ms, grace_ms


def run(args: argparse.Namespace) -> int:
    tool, tool_args, timeout_ms, grace_ms = check_args(args)
    url, cred_path, ca, pin = connection_params(args)
    try:
        link = Link.connect(url, load_credential(cred_path), ca=ca, pin=pin)
    except ClientError as exc:
        die(exc.message)
    session = ExecSession(link, args)
    try:
        return session.run(tool, tool_args, timeout_ms, grace_ms)
    except BrokenPipeError:  # our stdout's reader went away (`| head`): stop like a piped command does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        session.status.clear()
        link.close()


class _Interrupts:
    """Ctrl-C as a counter plus a wakeup of the link's `select` (`signal.set_wakeup_fd`), so the loop
    acts on it between frames rather than a KeyboardInterrupt landing in the middle of one."""

    def __init__(self, link: Link) -> None:
        self.count = 0
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._old = signal.signal(signal.SIGINT, self._on_sigint)
        link.add_wakeup(self._r)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.count += 1

    def take(self) -> int:
        n, self.count = self.count, 0
        return n

    def restore(self, link: Link) -> None:
        signal.signal(signal.SIGINT, self._old)
        signal.set_wakeup_fd(self._old_fd)
        link.remove_wakeup(self._r)
        os.close(self._r)
        os.close(self._w)


class ExecSession:
    def __init__(self, link: Link, args: argparse.Namespace) -> None:
        self.link = link
        self.args = args
        self.status = Status(sys.stderr, enabled=not (args.json or args.events))
        self.printer = _StreamPrinter()
        self.run_id: str | None = None
        self.state: RunState | None = None
        self.interrupts = 0
        self.cancel_wanted = False
        self.cancel_id: str | None = None
        self.t0 = time.monotonic()

    def run(self, tool: str, tool_args: dict[str, Any], timeout_ms: int, grace_ms: int | None) -> int:
        # Per-state updates only when someone reads them: the status line needs to know when the
        # Hand accepted; without it the Mind sends just `admitted`, the output and the end.
        watch = bool(self.args.events or self.status.enabled)
        msg = wire.exec_(
            hand=self.args.hand, tool=tool, args=tool_args, timeout_ms=timeout_ms, grace_ms=grace_ms, watch=watch
        )
        interrupts = _Interrupts(self.link)
        try:
            try:
                xid = self.link.start_run(msg)
            except ClientError as exc:
                die(exc.message)
            self.t0 = time.monotonic()
            while True:
                try:
                    events = self.link.poll(STATUS_TICK_S if self.status.enabled else None)
                except ClientError as exc:
                    return self._lost(exc)
                for ev in events:
                    code = self._on_event(ev, xid)
                    if code is not None:
                        return code
                n = interrupts.take()
                if n and self._on_interrupts(n):
                    return EXIT_CANCELLED
                self._tick()
        finally:
            interrupts.restore(self.link)

    # --- events ---

    def _on_event(self, ev: Routed, xid: str) -> int | None:
        """The exit code once the run is over (its end, a refusal, the connection lost), else None.
        The session core (mind/client/session.py) has already routed `ev` and checked that every
        event of the run names the same run."""
        if ev.id == self.cancel_id:
            if isinstance(ev, Failed) and not ev.lost:  # lost: the run's own event says so
                self._say(f"mind: cancel request failed: {ev.error.message}")
            return None
        if ev.id != xid:
            return None
        if isinstance(ev, Failed):
            if ev.lost:
                return self._lost(ev.error)
            self.status.clear()
            die(ev.error.message)
        msg = ev.msg
        if self.run_id is None:
            self.run_id = msg.run_id
            self._send_cancel()
        if self.args.events:
            print(json.dumps(_event_line(msg)), flush=True)
        if msg.TYPE == "run_update":
            self.state = msg.state
        elif msg.TYPE == "run_output":
            if not self.args.json and not self.args.events:
                self.status.clear()
                self.printer.chunk(msg.stream, msg.offset, msg.data)
        elif isinstance(ev, RunEnded):
            return self._finish(msg)
        return None

    def _finish(self, end: Any) -> int:
        self.status.clear()
        if self.args.json:
            summary = end_summary(end)
            summary["stdout"] = _text(end.stdout.data)
            summary["stderr"] = _text(end.stderr.data)
            print(json.dumps(summary))
        elif not self.args.events:
            self.printer.finish("stdout", end.stdout)
            self.printer.finish("stderr", end.stderr)
            _explain(end)
        return exit_code_for(end)

    def _lost(self, exc: ClientError) -> int:
        """The connection ended before the run did. Refused if the Mind said why before admitting
        it; otherwise nobody here can know what ran: 255, as for a run that ended `lost`."""
        self.status.clear()
        if self.run_id is None and exc.code != "closed":
            die(exc.message)
        which = f"run {self.run_id}" if self.run_id else "the run (not yet confirmed by the Mind)"
        print(f"mind: {exc.message}; the outcome of {which} is unknown", file=sys.stderr)
        return EXIT_LOST

    # --- Ctrl-C ---

    def _on_interrupts(self, n: int) -> bool:
        """True when the user asked to detach (a second Ctrl-C)."""
        for _ in range(n):
            self.interrupts += 1
            if self.interrupts == 1:
                self._say("\nmind: cancel requested (Ctrl-C again to detach)")
                self.cancel_wanted = True
                self._send_cancel()
            else:
                self._say(f"mind: detached from run {self.run_id}; the cancel still proceeds on the Hand")
                return True
        return False

    def _send_cancel(self) -> None:
        """Once the run id is known (a Ctrl-C may come before `admitted` arrives)."""
        if not self.cancel_wanted or self.cancel_id is not None or self.run_id is None:
            return
        try:
            self.cancel_id = self.link.request(wire.cancel_run(run_id=self.run_id), "cancel_run_result")
        except ClientError as exc:
            self._say(f"mind: cancel request failed: {exc.message}")

    # --- the status line ---

    def _tick(self) -> None:
        if not self.status.enabled:
            return
        waited = time.monotonic() - self.t0
        hand = self.args.hand
        if waited < STATUS_AFTER_S:
            return
        if self.cancel_wanted:
            text = f"cancel requested; waiting for hand {hand} to stop the command... {elapsed(waited)} (Ctrl-C again to detach)"
        elif self.state in NOT_STARTED:
            text = f"waiting for hand {hand} to accept... {elapsed(waited)}"
        elif self.state is RunState.ACCEPTED:
            text = f"hand {hand} accepted; waiting for the command to start... {elapsed(waited)}"
        else:  # running: its silence is the command's own
            self.status.clear()
            return
        self.status.show(text)

    def _say(self, line: str) -> None:
        self.status.clear()
        print(line, file=sys.stderr, flush=True)


def _event_line(ev: Any) -> dict[str, Any]:
    if ev.TYPE == "run_update":
        return {"event": "state", "run_id": ev.run_id, "state": ev.state.value, "gen": ev.gen}
    if ev.TYPE == "run_output":
        return {
            "event": "output",
            "run_id": ev.run_id,
            "stream": ev.stream,
            "offset": ev.offset,
            "data": _text(ev.data),
        }
    return {"event": "end", **end_summary(ev), "stdout": _text(ev.stdout.data), "stderr": _text(ev.stderr.data)}
