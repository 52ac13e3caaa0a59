"""What `mind exec` does when its link to the Mind breaks while the run is its own, and how it
leaves a run on purpose (DESIGN §15): the part of mind/cli/execloop.py's `ExecSession` that is about
continuity, kept apart so that the loop reads as the loop.

- A cut with the Mind's resume window above 0 (its `welcome` says) is an outage, not an ending: one
  notice ("mind unreachable, reconnecting (up to N s)", a status line on a terminal), then new
  connections paced by `mind.client.reconnect.Backoff` within the window counted from the last frame
  heard, each authenticated afresh with the same credential, then `attach` with where each output
  stream stands (`Incoming.resume_point`): the Mind rewinds its relay there and the Hand resends
  exactly what we lack. `attached` says where the Hand's leg of stdin stands; we resend from there
  (`Outgoing.resume`), so no byte typed or piped is lost or doubled.
- Nothing of the run goes out while the link is down: a Ctrl-C is counted and its cancel sent once
  after `attached` (a second Ctrl-C still stops waiting), a resize is read after `attached`, keys
  wait in the local terminal.
- `resume_pending` (the Mind has not got the run back from its Hand yet): keep trying within the
  window. `replaced`: another `mind attach` took the run; this one exits 255 (it cannot know the
  end). Past the window: 255 with the truth and `mind run get RUN_ID`.
- `--detach` / `--wait`: `detach` leaves the run running unattended for a later `mind attach`,
  after acknowledging what was written, so the next consumer starts exactly after it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from mind.cli import exits
from mind.cli.exits import EXIT_CANCELLED, EXIT_LOST, EXIT_WAIT_TIMEOUT, die
from mind.cli.formatting import printable
from mind.cli.progress import Status
from mind.cli.streamio import InputStream, OutputStream
from mind.client import wire
from mind.client.blocking import Link
from mind.client.follow import Action, Follower
from mind.client.reconnect import PERMANENT, Backoff
from mind.client.session import Failed, Reply, Routed
from mind.errors import ClientCode, ClientError
from protocol.codes import ErrorCode
from protocol.states import RunState


class Interrupted(Protocol):
    """Ctrl-C as the loop counts it (mind/cli/execloop.py `Interrupts`): a count, and a wakeup fd."""

    @property
    def fd(self) -> int: ...

    def take(self) -> int: ...


Connect = Callable[[float], Link]
"""A new authenticated link to the same Mind with the same credential, opened within a timeout."""

DETACH_REPLY_S = 5.0


class Rejoin:
    """The continuity half of `ExecSession` (a base class: the state is the session's own)."""

    link: Link
    args: argparse.Namespace
    connect: Connect | None
    status: Status
    run_id: str | None
    state: RunState | None
    xid: str
    live: bool
    window: float
    outage: Backoff | None
    hand_away: float | None
    detach_id: str | None
    redetach: bool
    wait_until: float | None
    cancel_id: str | None
    quiet: bool
    attaching: bool
    attached_once: bool
    follower: Follower
    left: bool
    outs: dict[str, OutputStream]
    stdin: InputStream | None
    stdin_watched: bool
    _interrupts: Interrupted | None
    _wake_r: int

    if TYPE_CHECKING:  # what the loop (mind/cli/execloop.py) provides

        def _lost(self, exc: ClientError) -> int: ...
        def _delivered(self) -> None: ...
        def _output(self, name: str, start: int) -> OutputStream: ...
        def _send_stream(self, msg: Any) -> None: ...
        def _send_cancel(self) -> None: ...
        def _act(self, actions: list[Action]) -> int | None: ...
        def _on_interrupts(self, n: int) -> bool: ...
        def _say(self, line: str) -> None: ...

    def _cut(self, exc: ClientError, why: str = "mind unreachable, reconnecting") -> int | None:
        """The link ended while the run is ours. With a resume window, reconnect and `attach`
        (None: the loop goes on with the new link); without one, or past it, the exit code."""
        if self.run_id is None or self.connect is None or self.window <= 0 or self.left:
            return self._lost(exc)
        if self.detach_id is not None or exc.code in PERMANENT:  # leaving anyway, or no coming back
            return self._lost(exc)
        if self.outage is None:
            self.outage = Backoff(self.link.last_heard + self.window)
            left = max(0.0, self.outage.deadline - time.monotonic())
            self._notice(f"{why} (up to {left:.0f} s)")
        self.live = False
        self.follower.on_cut()
        self._drop_link()
        outage = self.outage
        while True:
            if (code := self._outage_interrupts()) is not None:
                return code
            now = time.monotonic()
            if outage.left(now) <= 0:
                return self._gone()
            self._sleep(outage.pause(now))
            if (code := self._outage_interrupts()) is not None:
                return code
            left = outage.left(time.monotonic())
            if left <= 0:
                return self._gone()
            try:
                link = self.connect(min(10.0, left))
            except ClientError as refused:
                if refused.code in PERMANENT:  # trying again cannot help: say why now
                    return self._lost(refused)
                continue  # not yet: the next try after a longer pause
            self._take_link(link)
            for name, out in self.outs.items():  # what our writers took counts, acknowledged or not
                self.follower.took(name, out.consumed())
            positions = [
                {"stream": name, "offset": offset, "consumed": consumed, "window": window}
                for name, offset, consumed, window in self.follower.resume_points()
            ]
            try:
                self.xid = link.start_run(wire.attach(run_id=self.run_id, streams=positions))
            except ClientError:
                self._drop_link()
                continue
            return None  # `attached` (or the run's end, or a refusal) comes through the loop

    def _drop_link(self) -> None:
        self.link.abort()
        if self._interrupts is not None:
            self.link.remove_wakeup(self._interrupts.fd)
        self.link.remove_wakeup(self._wake_r)
        if self.stdin_watched:
            self.link.unwatch(0)
            self.stdin_watched = False

    def _take_link(self, link: Link) -> None:
        self.link = link
        if self._interrupts is not None:
            link.add_wakeup(self._interrupts.fd)
        link.add_wakeup(self._wake_r)

    def _sleep(self, seconds: float) -> None:
        """A pause of the outage, cut short by Ctrl-C (its wakeup fd)."""
        import select

        fds = [self._interrupts.fd] if self._interrupts is not None else []
        if seconds > 0:
            select.select(fds, [], [], seconds)
        for fd in fds:
            try:
                while os.read(fd, 512):
                    pass
            except (BlockingIOError, InterruptedError):
                pass

    def _outage_interrupts(self) -> int | None:
        """Ctrl-C while the link is down: the first is kept for `attached`; a second stops waiting."""
        n = self._interrupts.take() if self._interrupts is not None else 0
        if n and self._on_interrupts(n):
            return EXIT_CANCELLED
        return None

    def _on_attached(self, msg: Any, first: bool) -> tuple[int | None, bool]:
        """The run is ours again (or, for `mind attach`, for the first time): output resumes where
        each stream stands and what waited during the outage (a cancel, a resize) goes now, once.
        (The follower resends stdin from where the Hand's leg stands, and at `mind attach`'s first
        attachment closes a stdin nobody here can feed: the actions after this one.) Returns the
        exit code and whether the loop goes on with the follower's next actions."""
        # `mind attach`'s first `attached`, also when its first ask was told `resume_pending` (a
        # Mind that restarted, its Hand not back yet) and so met an outage: before, that case made
        # no output stream, dropped every chunk unacknowledged and waited for ever
        self.attached_once = True
        if first:
            self.args.hand = msg.hand
            for p in msg.streams:
                if p.stream != "stdin":
                    self.outs[p.stream] = self._output(p.stream, p.offset)
            if self.args.json:
                streams = {p.stream: {"offset": p.offset, "consumed": p.consumed} for p in msg.streams}
                print(
                    json.dumps({"attached": msg.run_id, "hand": msg.hand, "state": msg.state.value, "streams": streams})
                )
                sys.stdout.flush()
        self.state = msg.state
        self.live = True
        if self.redetach:  # taken up again only to finish the detach the cut interrupted
            self.redetach = False
            self.outage = None
            return self._send_detach(), False
        if self.outage is not None:
            self.outage = None
            self.status.clear()
            if not self.status.enabled and not self.quiet:
                self._say(f"mind: reconnected; run {self.run_id} goes on")
        self.cancel_id = None  # a cancel sent before the cut may not have arrived: asking again is harmless
        self._send_cancel()
        self._hand_away(msg.hand_away_since)
        return None, True

    def _not_back(self) -> str:
        return f"run {self.run_id} is not back on the mind yet, asking again"

    def _hand_away(self, since: float | None) -> None:
        if since == self.hand_away:
            return
        hand = self.args.hand
        if since is not None:
            left = max(0.0, self.window - (time.time() - since))
            self._notice(f"hand {hand} unreachable, waiting up to {left:.0f} s")
        elif self.hand_away is not None:
            self._notice(f"hand {hand} is back")
        self.hand_away = since

    def _notice(self, text: str) -> None:
        """Once on stderr, or as the status line on a terminal."""
        if self.status.enabled:
            self.status.show(text, force=True)
        elif not self.quiet or exits.JSON_ERRORS:
            self._say(f"mind: {text}")

    def _refused(self, error: ClientError) -> int | None:
        """The Mind answered the run's request with an error (or a newer attachment took it)."""
        self.status.clear()
        if error.code == ErrorCode.REPLACED:
            self._say(f"mind: {printable(error.message)}; exit {EXIT_LOST}")
            if exits.JSON_ERRORS:
                exits.json_error(error.message, EXIT_LOST, error.code)
            return EXIT_LOST
        if error.code == ErrorCode.RESUME_PENDING and self.window > 0:
            # the Mind (restarted) has not got the run back from its Hand yet: ask again, within the window
            self.live = False
            return self._cut(error, self._not_back())
        if self.outage is not None:  # re-attaching after a cut
            why = f"cannot re-attach to run {self.run_id}: {error.message}; its fate: mind run get {self.run_id}"
            self._say(f"mind: {printable(why)}")
            if exits.JSON_ERRORS:
                exits.json_error(why, EXIT_LOST, error.code)
            return EXIT_LOST
        die(error.message, kind=error.code)

    def _gone(self) -> int:
        """Past the window: the Mind has applied the seed's rule by now; what it was is not known here."""
        self.status.clear()
        why = (
            "mind unreachable for longer than the resume window; "
            f"the run's fate is unknown here: mind run get {self.run_id}"
        )
        print(f"mind: {why}", file=sys.stderr, flush=True)
        if exits.JSON_ERRORS:
            exits.json_error(why, EXIT_LOST, ClientCode.CLOSED)
        self._delivered()
        return EXIT_LOST

    # --- detach, wait ---

    def _detach_now(self) -> int | None:
        """`--detach`: the run is admitted; say its id and leave it running unattended."""
        assert self.run_id is not None
        if not self.args.json:  # (with --json: one object once the Mind said how long it keeps it)
            print(self.run_id, flush=True)
        return self._send_detach()

    def _still_running(self) -> int | None:
        """`--wait`: the time passed and the run goes on. What we wrote is acknowledged first, so a
        `mind attach` resumes exactly after it."""
        for name, out in self.outs.items():
            out.finish()
            self._act(self.follower.took(name, out.consumed()))
        self._act(self.follower.ack_all())
        self.wait_until = None
        return self._send_detach()

    def _send_detach(self) -> int | None:
        """Ask the Mind to keep the run unattended and say so. A link that fails (or goes silent)
        with the detach in flight is a cut like any other: within the window the run is taken up
        again on a new connection and detached there (`redetach`, done at its `attached`); the
        outcome was "unknown" (255) after a 6.5 s blackhole of the client's leg. None: the loop
        goes on with the new link."""
        assert self.run_id is not None
        keep = getattr(self.args, "keep", None)
        try:
            self.detach_id = self.link.request(wire.detach(run_id=self.run_id, keep_s=keep), "detached")
        except ClientError as exc:
            return self._detach_again(exc)
        self.live = False  # nothing more of the run is ours
        self.wait_until = None
        deadline = time.monotonic() + DETACH_REPLY_S
        while True:
            try:
                events = self.link.poll(max(0.0, deadline - time.monotonic()))
            except ClientError as exc:
                return self._detach_again(exc)
            for ev in events:
                if ev.id == self.detach_id:
                    if isinstance(ev, Failed) and ev.lost:
                        return self._detach_again(ev.error)
                    return self._detached(ev)
            if time.monotonic() >= deadline:
                return self._detach_again(ClientError(ClientCode.CLOSED, "the Mind did not answer the detach"))

    def _detach_again(self, exc: ClientError) -> int | None:
        self.detach_id = None
        self.redetach = True
        return self._cut(exc, "the connection dropped while detaching; reconnecting to detach")

    def _detached(self, ev: Routed) -> int:
        self.status.clear()
        if isinstance(ev, Failed):
            if ev.lost:
                return self._lost(ev.error)
            die(f"detach: {ev.error.message}", kind=ev.error.code)
        keep = ev.msg.keep_s if isinstance(ev, Reply) else 0
        if getattr(self.args, "detach", False):
            if self.args.json:
                print(json.dumps({"run_id": self.run_id, "detached": True, "keep_s": keep}), flush=True)
            elif not self.quiet:
                print(
                    f"mind: run {self.run_id} left running, kept {keep:g} s unattended: mind attach {self.run_id}",
                    file=sys.stderr,
                )
            return 0
        print(f"still running: mind attach {self.run_id}", file=sys.stderr, flush=True)
        if self.args.json:
            print(json.dumps({"still_running": self.run_id, "keep_s": keep}), flush=True)
        return EXIT_WAIT_TIMEOUT
