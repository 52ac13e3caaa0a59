"""The loop of one `mind exec` / `mind shell` run (mind/cli/exec.py parses and connects): one
blocking `Link` (mind/client/blocking.py says why: no asyncio, no pydantic) and one loop that waits
on the socket, the Ctrl-C wakeup and the status timer.
- The run's bytes are streams (mind/cli/streamio.py): our stdin is its stdin (unless `-n`), its
  stdout and stderr are ours, complete, in order and as they are produced, with flow control end
  to end. Where bytes could not be delivered (the Hand's output limit, a lost connection), stderr
  says which stream and from which offset, and the exit code is never 0 (122 if it would have been).
- Ctrl-C once requests a cancel (the Hand kills the whole tree) and keeps waiting for the
  authoritative end; a second Ctrl-C detaches (the cancel still proceeds).
- On a terminal (stderr), while the Hand has not started the command yet, or a cancel is pending, a
  status line appears after a second; it is erased before any output and at the end. Never with
  `--json`/`--events`, never when stderr is not a terminal.
- If the connection to the Mind is lost after the run was sent and the Mind keeps runs for a resume
  window (its `welcome` says; DESIGN §15), the run is not over: we reconnect (mind/client/reconnect.py:
  backoff with jitter, within the window counted from the last frame heard), authenticate afresh,
  `attach` with where each output stream stands, resend stdin from where the Hand stands, and go on.
  Ctrl-C and resizes during the outage wait and go once, in order, after `attached`. Past the window,
  or without one, the outcome is unknown here: 255.
- `mind attach RUN_ID` is the same loop started by an `attach` instead of an `exec`; `--detach` and
  `--wait` leave a run running unattended (`detach`) for a later `mind attach`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from mind.cli import exits
from mind.cli.escapes import Escape, EscapeFilter, help_text
from mind.cli.exits import (
    EXIT_CANCELLED,
    EXIT_INCOMPLETE,
    EXIT_LOST,
    EXIT_USAGE,
    die,
    exit_code_for,
)
from mind.cli.formatting import end_summary, event_line, explain, json_text, printable, stream_line
from mind.cli.hints import close_names, did_you_mean, shell_hint
from mind.cli.options import EXEC_TIMEOUT_S
from mind.cli.progress import Status, elapsed
from mind.cli.rejoin import Connect, Rejoin
from mind.cli.streamio import InputStream, OutputStream, StreamPrinter
from mind.cli.terminal import DEFAULT_SIZE, RawMode, WindowWatch, window_size
from mind.client import wire
from mind.client.blocking import Link
from mind.client.follow import (
    PROTOCOL,
    Action,
    AttachLater,
    Broken,
    Deliver,
    Ended,
    Follower,
    SendAck,
    SendStdin,
    Show,
    Took,
)
from mind.client.reconnect import Backoff
from mind.client.session import Failed, Routed
from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.codes import ErrorCode, RejectCode
from protocol.states import RunState

STATUS_AFTER_S = 1.0
STATUS_TICK_S = 0.25
NOT_STARTED = (None, RunState.ADMITTED, RunState.SENT)


SAME_WISH_S = 1.0
"""A second Ctrl-C this soon after the first, before its cancel was answered, is the same wish."""
ECHO_S = 0.1
"""A second SIGINT this soon after the first is the same delivery, answered or not: a press sent to
the process group reaches us twice within microseconds on an idle machine, but on a busy one the
sender may pause between the two, and a cancel on loopback is answered in a few milliseconds. No
hand presses twice this fast (a held key repeats after 250 ms or more)."""
LEAVE_ANSWER_S = 2.0
"""How long `~.` waits for the Mind to acknowledge its cancel before it hangs up anyway."""


class Interrupts:
    """Ctrl-C as a counter plus a wakeup of the link's `select` (`signal.set_wakeup_fd`), so the loop
    acts on it between frames rather than a KeyboardInterrupt landing in the middle of one."""

    def __init__(self, link: Link) -> None:
        self.count = 0
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, self._on_sigint)
        link.add_wakeup(self._r)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.count += 1

    @property
    def fd(self) -> int:
        return self._r

    def take(self) -> int:
        n, self.count = self.count, 0
        return n

    def restore(self, link: Link) -> None:
        """The loop is over: its outcome is decided (or the command is failing), and the process
        ends. A Ctrl-C from here on (the second of two presses, arriving as we exit) is ignored, as
        the fleet follower ignores it: under the handler that was there before it would raise a
        KeyboardInterrupt wherever the exit had got to, and the exit code would become death by
        SIGINT instead of the run's (tests/integration/test_exec.py, one Ctrl-C delivered twice)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.set_wakeup_fd(self._old_fd)
        link.remove_wakeup(self._r)
        os.close(self._r)
        os.close(self._w)


class ExecSession(Rejoin):
    def __init__(self, link: Link, args: argparse.Namespace, connect: Connect | None = None) -> None:
        """`connect`: how to reach the Mind again after a cut (None: a cut ends the session)."""
        self.link = link
        self.args = args
        self.connect = connect
        self.status = Status(sys.stderr, enabled=not (args.json or args.events))
        self.printer = StreamPrinter()
        self.run_id: str | None = None
        self.answered = False
        """The Mind answered the run's `exec` (its first event came: the run exists, its streams are
        numbered on the link), or the run is one `mind attach` takes over. This client names its
        run, so the id is known before that."""
        self.state: RunState | None = None
        self.interrupts = 0
        self.first_interrupt = 0.0
        self.cancel_answered = False
        """The Mind answered the cancel a first Ctrl-C asked for: a second one now means detach."""
        self.cancel_wanted = False
        self.cancel_id: str | None = None
        self.t0 = time.monotonic()
        self.xid = ""
        """The envelope id the run's events come under on the current link (its exec or attach)."""
        self.live = False
        """The run's events flow on the current link: stdin, acknowledgements and resizes may go."""
        self.window = 0.0
        """The Mind's resume window, from the first link's welcome (0: a cut ends the session)."""
        self.outage: Backoff | None = None
        """Set while the link is down (or re-attaching): the pauses and the deadline."""
        self.hand_away: float | None = None
        """Wall-clock time the run's Hand went away, while the Mind waits for it."""
        self.detach_id: str | None = None
        self.redetach = False
        """A detach was cut in flight: the next `attached` is only to detach again."""
        self.wait_until: float | None = None
        """`--wait`: when to leave the run running and exit 121."""
        self.tool_args: dict[str, Any] = {}
        self.last_output = float("-inf")
        """When the command's output last arrived (the status line waits for a quiet moment)."""
        self.hand_names: Callable[[], list[str]] | None = None
        """The Hands this client may see (asked only after an `unknown_hand` refusal)."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.quiet = bool(args.json or args.events)
        self.attaching = bool(getattr(args, "attach", False))
        """`mind attach`: the run exists; its streams are known from `attached`."""
        self.attached_once = False
        """An `attached` came: the streams it named are made (once, whatever cuts follow)."""
        self.tty = bool(getattr(args, "tty", False))
        self.local_tty = self.tty and os.isatty(0)
        """A terminal run from a terminal: raw mode, the window size, `~` escapes."""
        self.outs: dict[str, OutputStream] = {}
        names: tuple[str, ...] = ()
        if self.attaching:
            pass  # made from the positions `attached` gives
        elif self.tty:  # a terminal has one output stream: stdout and stderr are one on the Hand
            names = ("pty",)
        else:
            names = ("stdout", "stderr")
        self.outs = {name: self._output(name, 0) for name in names}
        escapes = EscapeFilter() if self.local_tty else None
        no_stdin = (args.no_stdin and not self.tty) or self.attaching
        self.stdin = None if no_stdin else InputStream(0, escapes)
        self.follower = Follower(streams=names, stdin=not no_stdin, clock=time.monotonic)
        """The rules of following the run (mind/client/follow.py), as the library's: this loop
        performs what it says."""
        self.stdin_watched = False
        self.left = False
        self._interrupts: Interrupts | None = None

    def _output(self, name: str, start: int) -> OutputStream:
        fd = None if self.quiet else _fileno(sys.stderr, 2) if name == "stderr" else _fileno(sys.stdout, 1)
        return OutputStream(name, fd, self._wake_w, start=start)

    def run(self, tool: str, tool_args: dict[str, Any], timeout_ms: int, grace_ms: int | None) -> int:
        self.tool_args = tool_args
        # Per-state updates only when someone reads them: the status line needs to know when the
        # Hand accepted; without it the Mind sends just `admitted`, the output and the end.
        watch = bool(self.args.events or self.status.enabled)
        pty = None
        if self.tty:
            size = window_size(0) or window_size(1) or DEFAULT_SIZE
            pty = {
                "term": _term(),
                "rows": max(1, size.rows),
                "cols": max(1, size.cols),
                "login": bool(getattr(self.args, "login", False)),
            }
        streams = {"stdin": self.stdin is not None, "pty": pty, "output_limit": self._output_limit()}
        # Named here: a cut before the first answer is ridden out by attaching under this name, and
        # a run that does not watch hears its `stream_numbers` first, no `admitted` update.
        self.run_id = self.follower.run_id = self.link.name_run()
        msg = wire.exec_(
            run_id=self.run_id,
            hand=self.args.hand,
            tool=tool,
            args=tool_args,
            timeout_ms=timeout_ms,
            grace_ms=grace_ms,
            streams=streams,
            watch=watch,
        )
        wait = getattr(self.args, "wait", None)
        if wait is not None:
            self.wait_until = time.monotonic() + wait
        return self._drive(msg)

    def attach(self, run_id: str) -> int:
        """`mind attach RUN_ID`: take the run over from where its previous consumer acknowledged."""
        self.run_id = run_id
        self.answered = True  # (an existing run: what waits for its answer is gated on `live`)
        self.follower = Follower(run_id=run_id, clock=time.monotonic)
        return self._drive(wire.attach(run_id=run_id))

    def _drive(self, first: Any) -> int:
        self.window = self.link.resume_window
        interrupts = self._interrupts = Interrupts(self.link)
        self.link.add_wakeup(self._wake_r)
        raw = RawMode(0) if self.local_tty else None
        winch = WindowWatch(0) if self.local_tty else None
        try:
            if raw is not None and winch is not None:
                raw.enter()
                winch.__enter__()
            try:
                self.xid = self.link.start_run(first)
            except ClientError as exc:
                die(exc.message, kind=exc.code)
            self.live = not self.attaching
            self.t0 = time.monotonic()
            while True:
                sin = self.stdin
                busy = sin is not None and sin.always_ready and self.answered
                busy = busy and sin is not None and sin.wants_data(self.follower.stdin_credit())
                timeout = 0 if busy else STATUS_TICK_S if self.status.enabled else None
                timeout = self._bound(timeout, self.wait_until if self.live else None)
                if self.outage is not None:
                    timeout = self._bound(timeout, self.outage.deadline)
                try:
                    events = self.link.poll(timeout)
                except ClientError as exc:
                    code = self._cut(exc)
                    if code is not None:
                        return code
                    continue
                for ev in events:
                    code = self._on_event(ev, self.xid)
                    if code is not None:
                        return code
                if self.outage is not None and not self.live and time.monotonic() >= self.outage.deadline:
                    return self._gone()
                try:
                    self._pump()
                except ClientError as exc:
                    code = self._cut(exc)
                    if code is not None:
                        return code
                    continue
                if self.left:
                    return self._leave(raw)
                if winch is not None and self.answered and self.live:
                    now = winch.changed()
                    if now is not None and now.rows > 0 and now.cols > 0:
                        self._send_stream(wire.resize(run_id=self.run_id, rows=now.rows, cols=now.cols))
                n = interrupts.take()
                if n and self._on_interrupts(n):
                    return EXIT_CANCELLED
                if self.wait_until is not None and time.monotonic() >= self.wait_until and self.live:
                    if (code := self._still_running()) is not None:
                        return code
                self._tick()
        finally:
            if winch is not None:
                winch.__exit__(None, None, None)
            if raw is not None:
                raw.restore()
            interrupts.restore(self.link)
            self.link.remove_wakeup(self._wake_r)
            if self.stdin_watched:
                self.link.unwatch(0)

    @staticmethod
    def _bound(timeout: float | None, until: float | None) -> float | None:
        if until is None:
            return timeout
        left = max(0.0, until - time.monotonic())
        return left if timeout is None else min(timeout, left)

    def _output_limit(self) -> int:
        if self.args.output_limit is None:
            return limits.OUTPUT_LIMIT_DEFAULT
        from protocol.units import parse_size

        try:
            return parse_size(self.args.output_limit)
        except ValueError as exc:
            die(f"--output-limit: {exc}", EXIT_USAGE)

    # --- streams ---

    def _pump(self) -> None:
        """Acknowledge what our writers wrote; forward stdin while the Hand grants credit."""
        if not self.live:  # the link is down or the attachment not yet ours: all of it waits
            return
        f = self.follower
        for name, out in self.outs.items():
            if out.broken and not out.closed_sent:
                out.closed_sent = True
                self._act(f.reader_closed(name, out.consumed()))
            else:
                self._act(f.took(name, out.consumed()))
        sin = self.stdin
        if sin is None or not self.answered:
            return
        if sin.wants_data(f.stdin_credit()) and (sin.always_ready or self.link.ready(0)):
            for action in sin.read(f.stdin_credit()):
                if action is Escape.LEAVE:
                    self.left = True
                    return
                os.write(_fileno(sys.stderr, 2), help_text().encode())
        while (piece := sin.next_piece(f.stdin_credit())) is not None:
            self._act(f.send_stdin(piece))
        if sin.at_end() or f.stdin_closed:
            sin.done = True
            self._act(f.close_stdin())
        want = sin.wants_data(f.stdin_credit()) and not sin.always_ready
        if want and not self.stdin_watched:
            try:
                self.link.watch(0)
            except PermissionError:  # /dev/null and other files epoll refuses: they never block
                sin.always_ready = True
                want = False
        elif not want and self.stdin_watched:
            self.link.unwatch(0)
        self.stdin_watched = want

    def _leave(self, raw: RawMode | None) -> int:
        """`~.`: hang up, as ssh's `~.` (exit 255), and the run is cancelled at once. Closing the
        connection alone was a cut the Mind rides out for its resume window, the remote shell alive
        that long; so the cancel is asked first and its answer awaited (LEAVE_ANSWER_S at most), and
        the line said is what the Mind answered."""
        if raw is not None:
            raw.restore()
        said = f"run {self.run_id} may still run on hand {self.args.hand}: mind run get {self.run_id}"
        if self.answered and self.live:
            assert self.run_id is not None
            try:
                asked = self.link.request(wire.cancel_run(run_id=self.run_id), "cancel_run_result")
                said = self._cancel_answer(asked, said)
            except ClientError:
                pass  # the link is gone: the Mind's window decides, as the line says
        self.link.abort()
        self._say(f"mind: left the session with ~.; {said}")
        return EXIT_LOST

    def _cancel_answer(self, asked: str, said: str) -> str:
        """What the Mind answered `~.`'s cancel (the sentence to print), within LEAVE_ANSWER_S."""
        deadline = time.monotonic() + LEAVE_ANSWER_S
        while (left := deadline - time.monotonic()) > 0:
            for ev in self.link.poll(left):
                if ev.id != asked:
                    continue
                status = getattr(getattr(ev, "msg", None), "status", None)
                if status is None:
                    return said
                if status.value == "already_done":
                    return f"run {self.run_id} had already ended on hand {self.args.hand}"
                return f"run {self.run_id} is being cancelled on hand {self.args.hand} (its process tree is killed)"
        return said

    def _send_stream(self, msg: Any) -> None:
        self.link.send(msg, self.xid)

    def _act(self, actions: list[Action]) -> int | None:
        """Perform what the follower decided, in order: an exit code once the run is over here."""
        for a in actions:
            if isinstance(a, Deliver):
                self._deliver(a)
            elif isinstance(a, SendAck):
                assert self.run_id is not None
                self._send_stream(
                    wire.stream_ack(
                        run_id=self.run_id, stream=a.stream, offset=a.offset, closed=a.closed, window=a.window
                    )
                )
            elif isinstance(a, SendStdin):
                assert self.run_id is not None
                self._send_stream(
                    wire.stream_data(run_id=self.run_id, stream="stdin", offset=a.offset, data=a.data, eof=a.eof)
                )
            elif isinstance(a, Show):
                self._show(a.msg)
            elif isinstance(a, Took):
                code, go_on = self._on_attached(a.msg, a.first)
                if not go_on:
                    return code
            elif isinstance(a, Ended):
                return self._finish(a.end)
            elif isinstance(a, Broken):
                return self._refused(ClientError(ClientCode.PROTOCOL if a.code == PROTOCOL else a.code, a.message))
            elif isinstance(a, AttachLater):
                return self._cut(ClientError(ErrorCode.RESUME_PENDING, "not presented yet"), self._not_back())
        return None

    def _deliver(self, a: Deliver) -> None:
        if self.args.events and a.data:
            print(json.dumps(stream_line(a, self.run_id)), flush=True)
        if a.data or a.eof:
            self.status.clear()
            self.last_output = time.monotonic()
        out = self.outs.get(a.stream)
        if out is not None:
            out.feed(a.data)
        else:  # a stream nobody here writes: taken at once
            self._act(self.follower.took(a.stream, a.offset + len(a.data)))

    def _show(self, msg: Any) -> None:
        if msg.TYPE == "run_update":
            self.state = msg.state
            self._hand_away(msg.hand_away_since)
        elif msg.TYPE == "run_output" and not self.args.json and not self.args.events:
            self.status.clear()
            self.last_output = time.monotonic()
            self.printer.chunk(msg.stream, msg.offset, msg.data)

    def _stream_report(self, end: Any) -> bool:
        """After the end: wait for the writers, then say on stderr what was not delivered. True
        if every byte the command wrote reached us (and, when it says, matches its digest)."""
        for out in self.outs.values():
            out.finish()
        verdict = self.follower.delivery(end)
        for note in verdict.notes:
            self._say(f"mind: {note}")
        return verdict.complete

    # --- events ---

    def _on_event(self, ev: Routed, xid: str) -> int | None:
        """The exit code once the run is over (its end, a refusal, the connection lost), else None.
        The session core (mind/client/session.py) has already routed `ev` and checked that every
        event of the run names the same run."""
        if ev.id == self.cancel_id:
            if isinstance(ev, Failed) and not ev.lost:  # lost: the run's own event says so
                self._say(f"mind: cancel request failed: {printable(ev.error.message)}")
            self.cancel_answered = True
            return None
        if ev.id == self.detach_id:
            return self._detached(ev)
        if ev.id != xid:
            return None
        if isinstance(ev, Failed):
            if ev.lost:
                return self._cut(ev.error)
            return self._act(self.follower.on_error(ev.error.code, ev.error.message))
        msg = ev.msg
        if not self.answered:  # an `exec`'s first answer
            self.answered = True
            if self.run_id is None:  # (a Mind that offered no names)
                self.run_id = msg.run_id
            if getattr(self.args, "detach", False):
                return self._detach_now()
            self._send_cancel()
        if self.args.events and msg.TYPE in ("run_update", "run_output", "run_end"):
            print(json.dumps(event_line(msg)), flush=True)
        return self._act(self.follower.on_message(msg))

    def _suggest(self, end: Any) -> list[str]:
        if end.reject_code is not RejectCode.UNKNOWN_HAND or self.hand_names is None:
            return []
        return close_names(self.args.hand, self.hand_names())

    def _finish(self, end: Any) -> int:
        self.status.clear()
        close = self._suggest(end)
        streamed = end.stdout.sent is not None or self.answered and end.state is RunState.LOST
        if self.attaching and not self.outs:  # it had ended: what the Mind retained is all there is
            streamed = False
        complete = self._stream_report(end) if streamed else True
        if self.args.json:
            summary = end_summary(end)
            summary["stdout"] = json_text(end.stdout.data)
            summary["stderr"] = json_text(end.stderr.data)
            if streamed:
                got = self.follower.delivery(end).streams
                summary["delivered"] = {
                    name: {"bytes": got[name].bytes, "sha256": got[name].sha256, "complete": complete}
                    for name in self.outs
                    if name in got
                }
            if close:
                summary["did_you_mean"] = close
            print(json.dumps(summary))
        elif not self.args.events:
            if self.attaching and not self.outs:
                self._retained(end)
            elif not streamed:
                self.printer.finish("stdout", end.stdout)
                self.printer.finish("stderr", end.stderr)
            if not (end.signal == signal.SIGPIPE and any(out.broken for out in self.outs.values())):
                explain(end)  # (a SIGPIPE after our reader went away is `cmd | head` working as it should)
            if close:
                print(f"mind: {did_you_mean(close)}", file=sys.stderr)
            for line in self._hints(end):
                print(f"mind: {line}", file=sys.stderr)
        code = exit_code_for(end)
        return EXIT_INCOMPLETE if code == 0 and not complete else code

    def _retained(self, end: Any) -> None:
        """`mind attach` of a run that had ended: what the Mind retained of its output (its tails),
        from where its clients had taken it (`collected`): nothing printed twice, and the bytes
        neither taken nor retained said as gone."""
        taken = {p.stream: p.consumed for p in getattr(end, "collected", None) or ()}
        for name, f in (("stdout", sys.stdout.buffer), ("stderr", sys.stderr.buffer)):
            tail = getattr(end, name)
            start = tail.total - len(tail.data)
            have = taken.get(name, taken.get("pty", 0) if name == "stdout" else 0)
            if have > start:
                f.write(tail.data[have - start :])
            else:
                if have < start:
                    self._say(
                        f"mind: run {end.run_id} had ended; {start - have} bytes of its {name} were neither "
                        f"collected nor retained (the last {len(tail.data)} follow)"
                    )
                f.write(tail.data)
            f.flush()

    def _hints(self, end: Any) -> list[str]:
        """What to do about an end the user may not expect: their own deadline (ssh has none, so a
        long command killed after an hour must say by what), or a command that was shell syntax."""
        if end.state is RunState.TIMED_OUT:
            default = " (the default of mind exec)" if self.args.timeout == EXEC_TIMEOUT_S else ""
            return [
                f"killed because --timeout {self.args.timeout:g} s passed{default}; give a longer --timeout "
                f"SECONDS (at most {limits.RUN_TIMEOUT_MAX_MS // 1000}), or `mind task start` for a longer job"
            ]
        hint = shell_hint(self.tool_args, end.exit_code) if end.state is RunState.FAILED else None
        return [hint] if hint else []

    def _lost(self, exc: ClientError) -> int:
        """The connection ended before the run did. Refused if the Mind said why before admitting
        it; otherwise nobody here can know what ran: 255, as for a run that ended `lost`."""
        self.status.clear()
        if not self.answered and exc.code != ClientCode.CLOSED:
            die(exc.message, kind=exc.code)
        which = f"run {self.run_id}" if self.run_id else "the run"
        if not self.answered:
            which += " (not yet confirmed by the Mind)"
        print(f"mind: {printable(exc.message)}; the outcome of {which} is unknown", file=sys.stderr)
        if exits.JSON_ERRORS:
            exits.json_error(f"{exc.message}; the outcome of {which} is unknown", EXIT_LOST, exc.code)
        self._delivered()
        return EXIT_LOST

    def _delivered(self) -> None:
        for name, out in self.outs.items():
            out.finish(timeout=5.0)
            if got := self.follower.received(name):
                print(f"mind: {name}: delivered up to offset {got}", file=sys.stderr)

    # --- Ctrl-C ---

    def _on_interrupts(self, n: int) -> bool:
        """True when the user asked to detach (a second Ctrl-C). A second one before the first's
        cancel was answered and within SAME_WISH_S of it is the same wish delivered twice (SIGINT
        to the process group, as `timeout -s INT` and a terminal's Ctrl-C send it, reaches us and
        maybe a wrapper that passes it on): it was read as "detach", and the run left running.
        Within ECHO_S of the first it is the same delivery even once the cancel was answered."""
        now = time.monotonic()
        for _ in range(n):
            if self.interrupts and now - self.first_interrupt < (ECHO_S if self.cancel_answered else SAME_WISH_S):
                continue
            self.interrupts += 1
            if self.interrupts == 1:
                self.first_interrupt = now
                later = "; it goes to the Mind once it is back" if not self.live else ""
                self._say(f"\nmind: cancel requested{later} (Ctrl-C again to detach)")
                self.cancel_wanted = True
                self._send_cancel()
            else:
                self._say(f"mind: detached from run {self.run_id}; the cancel still proceeds on the Hand")
                return True
        return False

    def _send_cancel(self) -> None:
        """Once the run id is known (a Ctrl-C may come before `admitted` arrives)."""
        if not self.cancel_wanted or self.cancel_id is not None or not self.answered or not self.live:
            return  # (during an outage it waits for `attached`)
        try:
            self.cancel_id = self.link.request(wire.cancel_run(run_id=self.run_id), "cancel_run_result")
        except ClientError as exc:
            self._say(f"mind: cancel request failed: {exc.message}")

    # --- the status line ---

    def _tick(self) -> None:
        if not self.status.enabled:
            return
        now = time.monotonic()
        waited = now - self.t0
        hand = self.args.hand
        if self.outage is not None:
            left = max(0.0, self.outage.deadline - now)
            self.status.show(f"mind unreachable, reconnecting (up to {left:.0f} s)")
            return
        if self.hand_away is not None:
            left = max(0.0, self.window - (time.time() - self.hand_away))
            self.status.show(f"hand {hand} unreachable, waiting up to {left:.0f} s")
            return
        if waited < STATUS_AFTER_S:
            return
        if now - self.last_output < STATUS_AFTER_S:
            # The command is talking (after a Ctrl-C, its trap often is): its output is written by
            # the writer threads a moment after it arrives, so a status line shown now would end up
            # in front of it. The line comes back once the command has been quiet a while.
            self.status.clear()
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


def _term() -> str:
    term = os.environ.get("TERM", "") or "dumb"
    return term if len(term) <= 64 and all(c.isalnum() or c in "._+-" for c in term) else "xterm"


def _fileno(stream: Any, default: int) -> int:
    """The descriptor behind `sys.stdout`/`sys.stderr` (the process's own when it was replaced)."""
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return default
