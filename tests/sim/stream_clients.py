"""The continuity variant's clients: each over a link of its own, with streamed runs (DESIGN §15).

A `StreamClient` is one client identity (the owner of its runs) living through connections: it
asks for streamed runs (stdout and stderr; stdin for some, typed as fast as credit allows), and
when its link goes (a cut, a blackhole its keepalive gives up on, a Mind crash) it comes back
after a while picked per outage (well within the window, at its edge, past it, or never) and
re-attaches every run it holds, giving its resume point on each output stream; stdin resumes from
where the Mind says. Now and then it opens a second connection and re-attaches there while the
first is still open (two attachments at once: the first is told `replaced`).

Its rules of following a run are the REAL ones: each run is a `mind.client.follow.Follower`, the
one `mind exec`, `mind attach` and the library (`RunHandle`) drive (its endpoints: `Incoming` per
output stream, `Outgoing` for stdin; its resume points, its stdin resend, its verdict on a refusal).
The simulation feeds it every frame of the run's current attachment, tells it of each cut, and
performs the actions it returns on the run's link; every chunk it delivers is checked against what
the command produced at that offset, and a stream it finds broken (a gap, an overrun, a stdin
resume it cannot place) is a violation.

Some runs are uploads (`mind cp` to the Hand): a few windows of stdin sent as fast as credit
allows, whose window the Hand's receiver grows and halves (`sim.continuity_hand`); now and then the
Hand's link is cut just after a halving (`stdin_window_changed`), while the limit granted under the
larger window still stands.

`Continuity` is what the variant adds to the `World`: these clients, their links (delivered by
the world's scheduler like the Hands'), the client leg's faults, and the continuity checker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.clients import pick
from sim.continuity_checker import ContinuityChecker
from sim.jobs import JobSpec
from sim.network import Direction, Frame, Link
from sim.stream_jobs import pattern, stream_args

from mind.client.follow import (
    Action,
    AttachLater,
    Broken,
    Credit,
    Deliver,
    Ended,
    Follower,
    SendAck,
    SendStdin,
    Took,
)
from mind.core.runs import PersistEnding
from mind.testing.vocabulary import Fault
from protocol.messages import (
    Attach,
    Attached,
    CancelRun,
    CancelRunResult,
    Detach,
    Detached,
    Error,
    Exec,
    Message,
    Replaced,
    RunEnd,
    RunOutput,
    RunUpdate,
    StreamAck,
    StreamData,
    StreamNumbers,
    StreamPosition,
    StreamResume,
    Streams,
)

if TYPE_CHECKING:
    from sim.simulation import World

WINDOW = 64 << 10
"""Every stream's window (`Streams.window`, its minimum): outputs of a few hundred KiB fill it."""
TYPING_S = 0.3
TYPING_BURST = 4000
UPLOAD_SHARE = 0.15
"""Of the runs a client asks for, the share that are uploads."""
UPLOAD_SIZES = (512 << 10, 1 << 20, 2 << 20)
"""An upload's stdin: enough windows for the Hand's tuner to measure one, double it, measure the
doubled one and halve it when it bought nothing."""
CUT_AFTER_HALVING = 0.5
"""How often a halving of an upload's window is followed at once by a cut of its Hand's link."""
RUN_EVENTS = (Attached, RunUpdate, RunOutput, RunEnd, StreamData, StreamAck, StreamResume, StreamNumbers)
"""What the Mind sends under a run's request id, for its follower (`replaced` the client handles:
it may take the run back; `detached` and a cancel's answer are answers to requests of its own)."""


class ClientLink(Link):
    """A client's connection to the Mind (`up`: client -> Mind, `down`: Mind -> client)."""

    def __init__(self, client: StreamClient, gen: int, now: float) -> None:
        super().__init__(client.name, gen, now)
        self.client = client
        self.conn: str | None = None
        self.replaced: set[str] = set()
        """Runs this connection was told it no longer holds."""


@dataclass(eq=False)
class ClientRun:
    run_id: str
    follower: Follower
    """The run as the shipped clients follow it (mind/client/follow.py): its streams, its stdin."""
    stdin_total: int
    link: ClientLink | None = None
    """The connection the run is attached on (None: not attached)."""
    attaching: str | None = None
    """The request id of an `attach` not yet answered, and the connection it went on."""
    attach_link: ClientLink | None = None
    end: RunEnd | None = None
    paced: bool = False
    """A person typing (a burst every `TYPING_S`) rather than a pipe (as fast as credit allows)."""
    retrying: bool = False
    """An attach the Mind asked to repeat (`resume_pending`) is due again."""
    gave_up: bool = False
    """The client will not come back for it (it chose "never")."""
    ends: int = 0


@dataclass(eq=False)
class StreamClient:
    name: str
    link: ClientLink | None = None
    runs: dict[str, ClientRun] = field(default_factory=dict)
    execs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """req id -> what was asked (its run id comes with the first `run_update`)."""
    returning: bool = False


class Continuity:
    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = world.rng
        self.clients = [StreamClient(f"s{i}") for i in range(2)]
        self.client_links: list[ClientLink] = []
        self.disk: dict[str, PersistEnding] = {}
        """The Mind's durable endings (`mind/store/endings.py`): they survive its crashes."""
        self.checker = ContinuityChecker(self)
        self._gen = 0
        self.return_after: float | str | None = None
        """Scripted scenarios: how long every client stays away after losing its link ("never":
        it does not come back); None: picked per outage."""

    # --- the world's hooks -------------------------------------------------------------------

    def owns(self, link: Link) -> bool:
        return isinstance(link, ClientLink)

    def links(self) -> list[ClientLink]:
        if any(not lk.open for lk in self.client_links):
            self.client_links = [lk for lk in self.client_links if lk.open]
        return self.client_links

    def boot(self) -> None:
        for c in self.clients:
            self.connect(c)

    def receiver_ready(self, link: Link, d: Direction) -> bool:
        mind = self.world.mind
        if d is link.up:
            return mind is not None and link in mind.client_links  # type: ignore[attr-defined]
        assert isinstance(link, ClientLink)
        return link.open

    def deliver(self, link: Link, d: Direction, frame: Frame, within_step: bool) -> str:
        assert isinstance(link, ClientLink)
        w = self.world
        arrow = "->" if d is link.down else "<-"
        desc = f"deliver mind {arrow} {link.client.name} ({link.conn}): {frame.msg.TYPE} {getattr(frame.msg, 'run_id', '')}"
        if within_step and w.tracer is not None:
            w.tracer.note(desc)
        if d is link.up:
            w.mind.on_client_frame(link, frame.env_id, frame.msg)  # type: ignore[union-attr]
        else:
            self.on_frame(link.client, link, frame.env_id, frame.msg)
        return desc

    def notice_mind(self, link: Link) -> None:
        mind = self.world.mind
        if mind is not None:
            mind.client_link_ended(link)  # type: ignore[attr-defined]

    def notice_client(self, link: Link) -> None:
        assert isinstance(link, ClientLink)
        c = link.client
        left = []
        for run in c.runs.values():
            if run.link is link:
                run.link = None
                left.append(run)
            if run.attach_link is link:
                run.attaching = run.attach_link = None
                left.append(run)
        for run in left:
            run.follower.on_cut()
            self._type(c, run)  # the user goes on typing through the outage
        if c.link is link:
            c.link = None
            self._plan_return(c)
        elif c.link is not None:  # an older connection: its runs move to the newer one
            for run in left:
                if run.end is None and not run.gave_up and run.attaching is None:
                    self.attach(c, run)

    def to_client(self, conn: str, req_id: str, msg: Message) -> bool:
        mind = self.world.mind
        return mind is not None and bool(mind.send_to_client(conn, req_id, msg))  # type: ignore[attr-defined]

    def persist(self, life: int, a: PersistEnding) -> None:
        self.checker.on_persist(life, a)
        self.disk[a.run_id] = a

    def on_mind_crash(self) -> None:
        w = self.world
        for link in self.links():
            w.close_link(link, "mind crashed", None, w.rng.uniform(0, 0.2))

    def on_hand_crash(self, proc: Any) -> None:
        kept = getattr(proc, "kept", None)
        if kept is not None:
            kept.crashed()

    def heal(self) -> None:
        for link in self.client_links:
            link.down.delay = link.up.delay = 0.0
            if not link.flowing:
                self.world.faults.resume(link, link.blackhole_epoch)

    def busy(self) -> list[str]:
        out = []
        for slot in self.world.hands.values():
            kept = getattr(slot.proc, "kept", None)
            if kept is not None and kept.unacked:
                out.append(f"{slot.label} results unacknowledged {sorted(kept.unacked)}")
        for link in self.links():
            if link.in_flight():
                out.append(repr(link))
        for c in self.clients:
            if c.returning:
                out.append(f"{c.name} returning")
            if c.link is not None and not c.link.open:
                out.append(f"{c.name} has not noticed {c.link.conn} closed")
            for run in c.runs.values():
                if run.attaching is not None or run.retrying:
                    out.append(f"{c.name} attaching {run.run_id}")
        return out

    # --- connections -------------------------------------------------------------------------

    def connect(self, c: StreamClient) -> ClientLink | None:
        mind = self.world.mind
        if mind is None:
            return None
        self._gen += 1
        link = ClientLink(c, self._gen, self.world.clock.now)
        link.conn = mind.client_connected(link)  # type: ignore[attr-defined]
        self.client_links.append(link)
        c.link = link
        return link

    def _plan_return(self, c: StreamClient) -> None:
        """The client noticed its link went: it comes back after a while, or never."""
        w, window = self.world, self.world.window
        delay: float | None
        if self.return_after is not None:
            delay = None if self.return_after == "never" else float(self.return_after)
        else:
            when = pick(self.rng, (("soon", 30), ("half", 20), ("edge", 15), ("late", 10), ("never", 10)))
            delay = {
                "soon": self.rng.choice((0.05, 0.5, 2.0)),
                "half": window * 0.5,
                "edge": window + self.rng.uniform(-0.3, 0.3),
                "late": window * 1.5,
            }.get(when)
            self.checker.notes[f"client_return:{when}"] += 1
        if delay is None:
            for run in c.runs.values():
                run.gave_up = True
            return
        c.returning = True
        w.clock.at(w.clock.now + delay, lambda: self._return(c), label="client_return")

    def _return(self, c: StreamClient) -> None:
        c.returning = False
        if c.link is not None:
            return
        if self.connect(c) is None:  # the Mind is down: try again shortly
            c.returning = True
            w = self.world
            w.clock.at(w.clock.now + self.rng.choice((0.5, 2.0)), lambda: self._return(c), label="client_return")
            return
        self._attach_all(c)

    def _attach_all(self, c: StreamClient) -> None:
        for run in c.runs.values():
            if run.end is None and not run.gave_up:
                self.attach(c, run)

    def attach(self, c: StreamClient, run: ClientRun) -> None:
        link = c.link
        if link is None:
            return
        positions = [
            StreamPosition(stream=name, offset=offset, consumed=consumed, window=window)  # type: ignore[arg-type]
            for name, offset, consumed, window in run.follower.resume_points()
        ]
        req = self.world.next_id("q")
        run.attaching, run.attach_link = req, link
        run.link = None
        self.checker.notes["attach"] += 1
        self._send(link, Attach(run_id=run.run_id, streams=positions), req)

    def _send(self, link: ClientLink, msg: Message, req_id: str | None = None) -> None:
        link.send(link.up, msg, req_id, self.world.clock.now)

    # --- what a client does --------------------------------------------------------------------

    def act(self) -> str:
        c = self.rng.choice(self.clients)
        if c.link is None:
            if c.returning:
                return f"sclient:waiting {c.name}"
            if self.connect(c) is None:
                return f"sclient:offline {c.name}"
            return f"sclient:connect {c.name}"
        mine = [r for r in c.runs.values() if r.end is None and not r.gave_up]
        kind = pick(
            self.rng,
            (("exec", 50), ("cancel", 8 if mine else 0), ("second", 8 if mine else 0), ("detach", 6 if mine else 0)),
        )
        if kind == "exec":
            return f"sclient:exec {c.name} {self._exec(c, c.link)}"
        run = self.rng.choice(mine)
        if kind == "cancel":
            self._send(c.link, CancelRun(run_id=run.run_id), self.world.next_id("q"))
            return f"sclient:cancel {c.name} {run.run_id}"
        if kind == "detach":
            if run.link is not c.link or run.attaching is not None:
                return f"sclient:none {c.name}"
            keep = self.rng.choice((None, 2.0, 3 * self.world.window))
            self._send(c.link, Detach(run_id=run.run_id, keep_s=keep), self.world.next_id("q"))
            return f"sclient:detach {c.name} {run.run_id} keep {keep}"
        # two attachments at once: a new connection takes every run while the old one is open
        old = c.link
        if self.connect(c) is None:
            return f"sclient:offline {c.name}"
        self._attach_all(c)
        w = self.world
        w.clock.at(
            w.clock.now + self.rng.choice((0.0, 0.5, 3.0)),
            lambda: w.close_link(old, "client left", w.rng.uniform(0, 0.1), 0.0),
            label="client_close",
        )
        return f"sclient:second {c.name}"

    def _exec(self, c: StreamClient, link: ClientLink) -> str:
        rng = self.rng
        spec = JobSpec(
            duration=rng.choice((0.5, 2.0, 6.0, 20.0)),
            rc=rng.choice((0, 0, 0, 1)),
            chunks=rng.randint(0, 8),
            term=rng.random() < 0.8,
            nostart=rng.random() < 0.02,
        )
        hand = rng.choice(self.world.config.hands)
        upload = rng.random() < UPLOAD_SHARE
        self.exec(
            c,
            hand,
            spec,
            size=rng.choice((1000, 9000, 40_000)),
            stdin=rng.choice(UPLOAD_SIZES) if upload else rng.choice((0, 0, 0, 5000, 150_000)),
            upload=upload,
            timeout_ms=rng.choice((120_000, 300_000)) if upload else rng.choice((5000, 30_000, 120_000)),
            grace_ms=rng.choice((None, 200, 1000)),
        )
        return hand

    def exec(
        self,
        c: StreamClient,
        hand: str,
        spec: JobSpec,
        *,
        size: int,
        stdin: int = 0,
        upload: bool = False,
        timeout_ms: int = 60_000,
        grace_ms: int | None = None,
    ) -> str:
        """Ask for a streamed run (`chunks` of `size` bytes of output, `stdin` bytes of input,
        sent as fast as credit allows if it is an `upload`); returns the request id. Every other
        request names its run, as the shipped clients do: the run is the client's from the send
        (a cut before any answer is ridden out by attaching under the name) and hears no
        `admitted`. The others learn the id from their first `run_update`, as an older client.
        Chosen by the request's number, not the generator, so each seed draws what it drew."""
        link = c.link
        assert link is not None
        req = self.world.next_id("q")
        named = f"{link.conn}.{req[1:]}" if req[-1] in "02468" else None
        msg = Exec(
            hand=hand,
            tool="exec",
            args=stream_args(spec, size, stdin, upload),
            timeout_ms=timeout_ms,
            grace_ms=grace_ms,
            streams=Streams(stdin=stdin > 0, window=WINDOW),
            run_id=named,
            watch=named is None,
        )
        self._send(link, msg, req)
        if named is None:
            c.execs[req] = {"stdin": stdin, "upload": upload}
        else:
            self._new_run(c, link, named, stdin, upload)
        return req

    def inject_fault(self) -> str:
        """A fault of the client leg (the fault proxy in front of the Mind for clients)."""
        w, rng = self.world, self.rng
        links = [lk for lk in self.links() if lk.open]
        if not links:
            return "fault:none"
        link = rng.choice(links)
        kind = pick(rng, ((Fault.CUT, 50), (Fault.BLACKHOLE, 30), (Fault.LATENCY, 20)))
        now = w.clock.now
        if kind == Fault.CUT:
            w.close_link(link, "cut", rng.uniform(0, 0.2), rng.uniform(0, 0.2))
        elif kind == Fault.BLACKHOLE:
            if not link.flowing:
                return "fault:none"
            link.flowing = False
            link.blackhole_epoch += 1
            epoch, k = link.blackhole_epoch, w.config.keepalive_s
            f = w.faults
            w.clock.at(now + rng.choice((2.0, 8.0, 15.0, 45.0)), lambda: f.resume(link, epoch), label="fault")
            w.clock.at(now + k * rng.uniform(1, 1.5), lambda: f.keepalive(link, epoch, "mind"), label="fault")
            w.clock.at(now + k * rng.uniform(1, 1.5), lambda: f.keepalive(link, epoch, "hand"), label="fault")
        else:
            d = rng.choice((link.down, link.up))
            d.delay = rng.choice((0.2, 1.0, 3.0))
            w.clock.at(now + rng.choice((1.0, 5.0, 20.0)), lambda: setattr(d, "delay", 0.0), label="fault")
        return f"fault:{kind} client {link.client.name} ({link.conn})"

    def stdin_window_changed(self, hand: str, run_id: str, told: int, window: int) -> None:
        """An upload's receiver on `hand` changed its window from `told` (0: none since a resume).
        After a halving the limit granted under the larger window stands for a few
        acknowledgements (a limit never moves back): more than the window is granted. Half the
        time the Hand's link is cut right then, before or after the halving reaches the Mind; its
        presentation then states that limit (what stalled copies before main's 13554b4)."""
        if not told or window == told:
            return
        if window > told:
            self.checker.notes["stdin_window:grown"] += 1
            return
        self.checker.notes["stdin_window:halved"] += 1
        w, rng = self.world, self.rng
        link = w.link_of(hand)
        if link is None or w.step_no >= w.steps or rng.random() >= CUT_AFTER_HALVING:
            return  # (not once the faults are over: the quiesce phase heals, it does not cut)

        def cut() -> None:
            if link.open:
                self.checker.notes["stdin_window:cut_after_halving"] += 1
                w.close_link(link, "cut after a halving", rng.uniform(0, 0.2), rng.uniform(0, 0.2))

        w.clock.at(w.clock.now + rng.choice((0.0, 0.02, 0.1)), cut, label="fault")

    # --- what a client hears -------------------------------------------------------------------

    def on_frame(self, c: StreamClient, link: ClientLink, req_id: str | None, msg: Message) -> None:
        run_id = getattr(msg, "run_id", None)
        if run_id is not None and run_id in link.replaced and not isinstance(msg, CancelRunResult):
            self.checker.fail("nothing after replaced", f"{c.name} ({link.conn}) got {msg.TYPE} for {run_id}")
        if isinstance(msg, RunUpdate) and req_id in c.execs:
            asked = c.execs.pop(req_id)
            self._new_run(c, link, msg, asked["stdin"], asked["upload"])
            return
        if run_id is None and isinstance(msg, Error):  # an answer to an attach names no run
            run_id = next((r.run_id for r in c.runs.values() if r.attaching == req_id), None)
        run = c.runs.get(run_id) if run_id is not None else None
        if isinstance(msg, Replaced):
            self._replaced(c, link, run, msg)
            return
        if run is None:
            return
        if req_id is not None and req_id == run.attaching:
            if link is not c.link:
                return
            run.attaching = None
            if isinstance(msg, Error):
                self._attach_refused(c, run, msg)
                return
            run.link = link
        if run.link is not link:
            return  # an attachment this run has left
        if isinstance(msg, Detached):
            self._detached(c, run, msg.keep_s)
        elif isinstance(msg, RUN_EVENTS):
            self._follow(c, run, msg)

    def _follow(self, c: StreamClient, run: ClientRun, msg: Message) -> None:
        """One event of the run's current attachment, through its follower."""
        f = run.follower
        if isinstance(msg, StreamData) and msg.stream not in f.outs:
            self.checker.fail("no byte lost or duplicated", f"{c.name} got {msg.stream} of {run.run_id}")
        if isinstance(msg, StreamAck) and msg.stream == "stdin" and f.stdin is not None and msg.offset > f.stdin.offset:
            # (the follower opens no credit for it; the Mind must never have relayed it)
            self.checker.fail(
                "no byte lost or duplicated",
                f"{c.name} stdin ack of {run.run_id}: offset {msg.offset} of a stream sent up to {f.stdin.offset}",
            )
        resumes = (
            f.stdin is not None
            and not f.stdin_closed
            and (
                (isinstance(msg, StreamResume) and msg.stream == "stdin")
                or (isinstance(msg, Attached) and any(p.stream == "stdin" for p in msg.streams))
            )
        )
        actions = f.on_message(msg)
        self._check(c, run, msg)
        if resumes:
            self.checker.notes["stdin_resumed"] += 1
        if isinstance(msg, StreamData) and not any(isinstance(a, Deliver) for a in actions):
            self.checker.notes["client_repeat_dropped"] += 1  # a chunk in flight before a resume, and its resent copy
        self._act(c, run, actions, msg)

    def _check(self, c: StreamClient, run: ClientRun, msg: Message) -> None:
        """A stream the follower found broken (the Mind broke its rules) is a violation here."""
        f = run.follower
        for name, out in f.outs.items():
            if out.gap is not None:
                what = (
                    f": the Mind sent a chunk at offset {msg.offset} ({len(msg.data)} bytes{', eof' if msg.eof else ''})"
                    if isinstance(msg, StreamData) and msg.stream == name
                    else ""
                )
                self.checker.fail(
                    "no byte lost or duplicated", f"{c.name} {name} of {run.run_id} broke at offset {out.gap}{what}"
                )
        if f.stdin_broken is not None:
            self.checker.fail("no byte lost or duplicated", f"{c.name} {run.run_id}: {f.stdin_broken}")

    def _act(self, c: StreamClient, run: ClientRun, actions: list[Action], msg: Message | None = None) -> None:
        """Perform what the follower returned, in order."""
        for a in actions:
            if isinstance(a, Deliver):
                if a.data:
                    self.checker.on_client_output(c, run.run_id, a.stream, a.offset, a.data)
                self._act(c, run, run.follower.consume(a.stream, len(a.data)))
            elif isinstance(a, SendAck):
                ack = StreamAck(run_id=run.run_id, stream=a.stream, offset=a.offset, closed=a.closed, window=a.window)  # type: ignore[arg-type]
                self._send(self._attachment(run), ack)
            elif isinstance(a, SendStdin):
                data = StreamData(run_id=run.run_id, stream="stdin", offset=a.offset, data=a.data, eof=a.eof)
                self._send(self._attachment(run), data)
            elif isinstance(a, Took):
                self.checker.notes["attached"] += 1
            elif isinstance(a, Credit):
                self._type(c, run)
            elif isinstance(a, Ended):
                run.ends += 1
                self.checker.on_client_end(c, run, a.end)
                run.end = a.end
                run.link = None
            elif isinstance(a, AttachLater):
                self._attach_later(c, run)
            elif isinstance(a, Broken):
                if not isinstance(msg, Error):  # events the follower cannot place on its run
                    self.checker.fail("the client follows its run", f"{c.name} {run.run_id}: {a.message}")
                    return
                self.checker.on_client_lost_run(c, run, msg)
                run.gave_up = True

    @staticmethod
    def _attachment(run: ClientRun) -> ClientLink:
        """The link the follower sends on: it sends only while attached (else it keeps, and the
        next attachment's positions say it)."""
        assert run.link is not None and run.follower.ready, f"{run.run_id}: sent while not attached"
        return run.link

    def _new_run(self, c: StreamClient, link: ClientLink, first: RunUpdate | str, stdin: int, upload: bool) -> None:
        """The client's run: from its send if it named it (`first` is the name), else from its first
        event, which names it."""
        clock = self.world.clock
        named = first if isinstance(first, str) else None
        follower = Follower(
            window=WINDOW, streams=("stdout", "stderr"), stdin=stdin > 0, clock=lambda: clock.now, named=named
        )
        if not isinstance(first, str):
            follower.on_message(first)  # an exec's follower: its first event names the run
        run = ClientRun(follower.run_id or "", follower, stdin, link=link)
        c.runs[run.run_id] = run
        self.checker.on_client_run(c, run)
        if follower.stdin is not None and not upload and self.rng.random() < 0.5:
            run.paced = True
            self._typing(c, run)
        if c.link is not None and link is not c.link:  # asked on a connection it has left since
            self.attach(c, run)
            return
        self._type(c, run)

    def _replaced(self, c: StreamClient, link: ClientLink, run: ClientRun | None, msg: Replaced) -> None:
        """`replaced` is this client's own to handle, not its follower's: a follower told it stops
        following for good (another client of the identity took the run), while here the newer
        attachment may be the client's own older connection's (its attach arrived last)."""
        link.replaced.add(msg.run_id)
        self.checker.notes["replaced"] += 1
        if run is None or run.link is not link:
            return
        run.link = None
        run.follower.on_cut()  # this attachment is gone; what was received and sent is kept
        if link is c.link and run.end is None and run.attaching is None:
            # its own older connection's attach arrived last and took the run: take it back
            self.checker.notes["replaced_current"] += 1
            link.replaced.discard(msg.run_id)
            self.attach(c, run)

    def _detached(self, c: StreamClient, run: ClientRun, keep: float) -> None:
        """`mind exec --detach`: the run goes on unattended; the owner comes back for it within
        what the Mind keeps it, or after (it then finds its ending), or never."""
        run.link = None
        run.follower.on_cut()  # not attached any more: the next attachment says where to go on from
        w = self.world
        after = pick(self.rng, (("within", 50), ("after", 30), ("never", 20)))
        self.checker.notes[f"detached:{after}"] += 1
        if after == "never":
            run.gave_up = True
            return
        run.retrying = True

        def back() -> None:
            run.retrying = False
            if c.link is not None and run.end is None and run.attaching is None and run.link is None:
                self.attach(c, run)

        delay = keep * 0.5 if after == "within" else keep + 1.0
        w.clock.at(w.clock.now + delay, back, label="client_reattach")

    def _attach_refused(self, c: StreamClient, run: ClientRun, msg: Error) -> None:
        self.checker.notes[f"attach_refused:{msg.code.value}"] += 1
        self._act(c, run, run.follower.on_error(msg.code, msg.message), msg)

    def _attach_later(self, c: StreamClient, run: ClientRun) -> None:
        """`resume_pending`: the Mind restarted and its Hand has not presented yet."""
        w = self.world
        run.retrying = True

        def again() -> None:
            run.retrying = False
            if c.link is not None and run.end is None and run.attaching is None:
                self.attach(c, run)

        w.clock.at(w.clock.now + 1.0, again, label="client_reattach")

    # --- stdin ---------------------------------------------------------------------------------

    @staticmethod
    def _typed_all(run: ClientRun) -> bool:
        f = run.follower
        return f.stdin is None or run.end is not None or run.gave_up or f.stdin.eof or f.stdin_closed

    def _type(self, c: StreamClient, run: ClientRun) -> None:
        """Type stdin as fast as credit allows, then its end (`cat file | mind exec ...`). While
        the run is not attached (an outage, an attach not yet answered) the follower keeps what is
        typed and sends it with the resend the next attachment asks for: once, in order."""
        if self._typed_all(run):
            return
        f = run.follower
        out = f.stdin
        assert out is not None
        left = run.stdin_total - out.offset
        n = min(left, f.stdin_credit(), TYPING_BURST if run.paced else left)
        if n > 0:
            if not f.ready:
                self.checker.notes["stdin_typed_while_away"] += n
            self._act(c, run, f.send_stdin(pattern(run.run_id, "stdin", out.offset, n)))
        if out.offset == run.stdin_total:
            self._act(c, run, f.close_stdin())

    def _typing(self, c: StreamClient, run: ClientRun) -> None:
        """The next burst a person types, on and on until the end of input or of the run."""
        if self._typed_all(run):
            return
        w = self.world

        def burst() -> None:
            self._type(c, run)
            self._typing(c, run)

        w.clock.at(w.clock.now + TYPING_S, burst, label="typing")
