"""A Hand that keeps its foreground runs across a dropped connection (DESIGN §15), synchronously.

The model of `hand.aio.runs.RunTable` and `hand.aio.agent.Agent` with a window (`tests/sim/mirrors.py`
names these classes; keep them in step). The rules are:
- the run table belongs to the Hand process, not to one connection: a connection that drops leaves
  every run running (`on_cut`); if no connection has been welcomed `window` seconds later the Hand
  kills them itself (`connection_lost`) and forgets their results (`RunTable.expire`);
- a result is kept until the Mind answers `result_ack`;
- after each `welcome` the first frame is `runs_present` (every run it holds: started or not, its
  stream positions, a result pending, its owner, tool, time left, grace and streams as opened),
  then every kept result whose streams need no resume (`rewire`);
- streams are the REAL endpoints: each output stream an `Outgoing` (credit, the bytes kept until
  acknowledged, `resume`), stdin an `Incoming` (order, paced acknowledgements, `resume_point`).
  After a cut every output stream is held until the Mind's `stream_resume` for it, which resends
  exactly what it names, and a streamed run's result follows its streams (or goes at once when the
  Mind sends `cancel`). With a window the result waits until the output is not only sent but
  acknowledged (the variant `continuity-result-before-ack` sends it once the end is sent, as
  `hand/aio/streams.py` did before main's ca28fd7: the checker shows the tail a client away at
  that moment loses).
- an upload's stdin (`put` in its arguments: what `mind cp` sends, a copy's part file on the Hand)
  grows its window as `hand/aio/runs.py` has it (`grow_stdin`): the REAL `WindowTuner`, on the
  virtual clock. Its part file takes the bytes a piece at a time (`WRITE_PIECE` every
  `WRITE_S`), so acknowledgements go a quarter window at a time and a cut can find bytes
  received and not yet written. Each time the window changes the world hears of it
  (`stdin_window_changed`): a cut just after a halving, while the limit granted under the larger
  window still stands, is the one that stalled copies before main's 13554b4.
Everything else (admission, deadlines, the first terminal) is `HandRuns`, i.e. the shipped rules.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.hand_agent import HandConn, HandProcess
from sim.hand_runs import HandRuns
from sim.jobs import PROGRAM
from sim.network import Link
from sim.runtime import Fut, first_of
from sim.stream_jobs import StreamJob

from hand.core.spawn import spawn_failure
from protocol.codes import CancelReason
from protocol.control import RunAborted, check_active
from protocol.digest import args_digest
from protocol.errors import ProtocolError
from protocol.messages import (
    Cancel,
    Message,
    PresentedRun,
    Resize,
    Result,
    ResultAck,
    Rpc,
    RunsPresent,
    Started,
    StreamAck,
    StreamData,
    StreamPosition,
    StreamResume,
    TaskCancel,
    TaskInventory,
    TaskStatus,
)
from protocol.streams import Incoming, Outgoing, WindowTuner

if TYPE_CHECKING:
    from sim.simulation import HandSlot, World

SIM_CHUNK = 16 << 10
"""Output is cut into chunks of at most this (the wire allows 256 KiB): several frames per window."""
WRITE_PIECE = 16 << 10
"""What an upload's part file takes at once: a quarter of the opening window (one acknowledgement)."""
WRITE_S = 0.005
"""How long writing a piece takes: a few MB/s, slower than most windows' bytes arrive at once."""


@dataclass(eq=False)
class OutStream:
    name: str
    out: Any  # protocol.streams.Outgoing
    pending: bytearray = field(default_factory=bytearray)
    """Read from the child, not yet sent (no credit, or no connection): the pipe, in effect."""
    ended: bool = False
    """The child's side of the pipe ended."""
    awaiting: bool = False
    """Held since a cut until the Mind's `stream_resume` says where the client stands."""


@dataclass(eq=False)
class RunStreams:
    run_id: str
    window: int
    outs: dict[str, OutStream]
    stdin: Any  # protocol.streams.Incoming | None
    job: StreamJob | None = None
    early: list[tuple[int, bytes, bool]] = field(default_factory=list)
    flushed: Fut = field(default_factory=Fut)
    abandoned: bool = False
    """The run ended without its output delivered (cancelled, failed to start)."""
    told_to_stop: bool = False
    """The Mind sent `cancel` for it: its result goes out without waiting for a resume."""
    unwritten: int = 0
    """An upload's stdin received and not yet written to its part file (`_write`)."""
    unwritten_eof: bool = False
    """The end of an upload's stdin came after `unwritten`."""
    writing: bool = False


class KeptRuns(HandRuns):
    """`HandRuns` held by the Hand process, with streams, kept results and presentation."""

    result_waits_for_ack = True

    def __init__(self, hand: ContinuityHand) -> None:
        super().__init__(hand, self._out)
        self.chand = hand
        self.streams: dict[str, RunStreams] = {}
        self.records: dict[str, Any] = {}
        """run id -> the run (HandRuns' record), kept until its result is acknowledged."""
        self.unacked: dict[str, Result] = {}
        self.unsent: set[str] = set()
        """Kept results not sent on this connection (held behind their streams' resume)."""
        self.started: set[str] = set()
        self.expired = False
        """The window passed with no Mind: results are forgotten until the next `welcome`."""

    # --- sending ---

    def _out(self, msg: Message) -> None:
        if isinstance(msg, Result):
            if self.expired:  # nobody is left to take it (`RunTable.expire`)
                self._forget(msg.run_id)
                return
            self.unacked[msg.run_id] = msg
            if self._held(msg.run_id) or not self.chand.connected:  # it follows its streams' resume,
                self.unsent.add(msg.run_id)  # or the next connection (`RunTable._conclude`, `_deliver`)
                return
        elif isinstance(msg, Started):
            self.started.add(msg.run_id)
        self.chand.send_now(msg)

    def _held(self, run_id: str) -> bool:
        """`KeptResult.held`: its output waits for a resume, unless the Mind told it to stop."""
        st = self.streams.get(run_id)
        return st is not None and not st.told_to_stop and any(o.awaiting for o in st.outs.values())

    def _deliver_if_free(self, run_id: str, told_to_stop: bool = False) -> None:
        if run_id in self.unsent and (told_to_stop or not self._held(run_id)) and self.chand.connected:
            self.unsent.discard(run_id)
            self.chand.send_now(self.unacked[run_id])

    def _forget(self, run_id: str) -> None:
        self.unacked.pop(run_id, None)
        self.unsent.discard(run_id)
        self.records.pop(run_id, None)
        self.streams.pop(run_id, None)
        self.started.discard(run_id)

    def on_cut(self) -> None:
        """`RunTable.on_cut`: every output stream is held until its `stream_resume`, and every
        kept result waits to be sent again."""
        for st in self.streams.values():
            for o in st.outs.values():
                o.awaiting = True
        self.unsent |= set(self.unacked)

    def on_cancel(self, cancel: Any) -> None:
        """`RunTable.on_cancel`: a run ended by the Mind while held is let go of (no resume will
        come: what waits for credit is not sent); a result kept from the cut goes out at once."""
        st = self.streams.get(cancel.run_id)
        if st is not None:
            st.told_to_stop = True
            if cancel.run_id in self._book.active and any(o.awaiting for o in st.outs.values()):
                self._abandon(st)
        super().on_cancel(cancel)
        self._deliver_if_free(cancel.run_id, told_to_stop=True)

    # --- admission ---

    def on_rpc(self, rpc: Rpc) -> None:
        known = self._book.knows(rpc.run_id)
        if not known and rpc.streams is not None:
            spec = rpc.streams
            names = ("stdout", "stderr")
            window = spec.window
            self.streams[rpc.run_id] = RunStreams(
                rpc.run_id,
                window,
                {n: OutStream(n, Outgoing(window)) for n in names},
                self._stdin(rpc, window) if spec.stdin else None,
            )
        super().on_rpc(rpc)
        run = self._book.active.get(rpc.run_id)
        if run is not None:
            self.records[rpc.run_id] = run
        elif not known:
            self.streams.pop(rpc.run_id, None)

    def _stdin(self, rpc: Rpc, window: int) -> Incoming:
        """`RunStreams`' stdin: an upload's grows as the link needs (`grow_stdin`, a copy's part
        file), a command's pipe keeps the opening window (its kernel buffer would pass for a fast
        reader)."""
        clock = self.chand.clock
        tuner = WindowTuner(lambda: clock.now, window) if rpc.args.get("put") else None
        return Incoming(window, tuner=tuner)

    # --- execution ---

    def _outcome(self, run: Any) -> Generator[Any, Any, Result]:
        """`HandRuns._outcome` with a streamed job, and every byte owed sent (and, with a window,
        acknowledged) before the result."""
        st = self.streams.get(run.rpc.run_id)
        if st is None:
            return (yield from super()._outcome(run))
        try:
            check_active(run.ctl, self.now)
        except RunAborted:
            self._abandon(st)
            return self._stopped(run)
        self._send(Started(run_id=run.rpc.run_id))
        args = run.rpc.args
        proc = StreamJob(
            self.hand.machine,
            run.spec,
            (self.hand.label, "run", run.rpc.run_id),
            grace=run.grace,
            on_output=lambda stream, data: self._on_output(st, stream, data),
            run_id=run.rpc.run_id,
            size=int(args.get("sz", 1024)),
            reads_stdin=st.stdin is not None,
        )
        st.job = proc
        self.chand.world.ext.checker.on_job(st)
        early, st.early = st.early, []
        for offset, data, eof in early:
            self._feed(st, offset, data, eof)
        unregister = run.ctl.cancellation.on_cancel(lambda _reason: proc.kill())
        try:
            out = yield from proc.run()
        except OSError as exc:
            unregister()
            self._abandon(st)
            how = spawn_failure(exc, PROGRAM)
            return self._failed(run, how.error, how.exit_code, how.reason)
        unregister()
        for o in st.outs.values():
            o.ended = True
        self._flush(st)
        if not st.flushed.done:
            stop = Fut()
            unreg = run.ctl.cancellation.on_cancel(lambda _reason: stop.resolve(None))
            yield first_of(st.flushed, stop)
            unreg()
        if not st.flushed.done:
            self._abandon(st)
        return self._from_process(run, out)

    def _conclude(self, run: Any, result: Result) -> None:
        st = self.streams.get(run.rpc.run_id)
        if st is not None and st.job is None:
            self._abandon(st)
        super()._conclude(run, result)

    def _abandon(self, st: RunStreams) -> None:
        """The run ends without its output delivered: what waits for credit is not sent."""
        st.abandoned = True
        for o in st.outs.values():
            o.pending.clear()
            o.ended = True
        self._flush(st, abandoned=True)

    def _on_output(self, st: RunStreams, stream: str, data: bytes) -> None:
        if not self.hand.loop.alive:
            return  # an orphan of a crashed Hand writes into a dead pipe
        o = st.outs[stream]
        if o.ended:
            return
        o.pending += data
        self._flush(st)

    def _flush(self, st: RunStreams, abandoned: bool = False) -> None:
        if self.chand.connected:
            for o in st.outs.values():
                out = o.out
                if o.awaiting:
                    continue
                while o.pending and out.credit() > 0:
                    n = min(len(o.pending), out.credit())
                    data = bytes(o.pending[:n])
                    del o.pending[:n]
                    for offset, piece, _ in out.send(data, SIM_CHUNK):
                        self.chand.send_now(StreamData(run_id=st.run_id, stream=o.name, offset=offset, data=piece))  # type: ignore[arg-type]
                if o.ended and not o.pending and not out.eof:
                    offset, _, _ = out.close()
                    self.chand.send_now(StreamData(run_id=st.run_id, stream=o.name, offset=offset, eof=True))  # type: ignore[arg-type]
        if st.flushed.done:
            return
        done = all(o.out.eof for o in st.outs.values())
        if done and self.result_waits_for_ack and not abandoned:
            done = all(o.out.drained for o in st.outs.values())
        if done:
            st.flushed.resolve(None)

    # --- streams from the Mind ---

    def on_stream(self, msg: StreamData | StreamAck | StreamResume | Resize) -> None:
        st = self.streams.get(msg.run_id)
        if st is None or isinstance(msg, Resize):
            return
        check = self.chand.world.ext.checker  # type: ignore[union-attr]
        try:
            if isinstance(msg, StreamData):
                if msg.stream != "stdin" or st.stdin is None:
                    return
                if not st.stdin.on_data(msg.offset, len(msg.data), msg.eof):
                    return  # a repeat after a resume
                if st.job is None:
                    st.early.append((msg.offset, msg.data, msg.eof))
                else:
                    self._feed(st, msg.offset, msg.data, msg.eof)
                return
            o = st.outs.get(msg.stream)
            if o is None:
                return
            if isinstance(msg, StreamAck):
                o.out.on_ack(msg.offset, msg.window)
            else:
                for offset, piece, eof in o.out.resume(msg.offset, msg.consumed, msg.window):
                    self.chand.send_now(
                        StreamData(run_id=st.run_id, stream=o.name, offset=offset, data=piece, eof=eof)  # type: ignore[arg-type]
                    )
                o.awaiting = False
        except ProtocolError as exc:
            check.fail("no byte lost or duplicated", f"hand {self.hand.label} {msg.TYPE} {msg.run_id}: {exc.message}")
        self._flush(st)
        if isinstance(msg, StreamResume):
            self._deliver_if_free(msg.run_id)

    def _feed(self, st: RunStreams, offset: int, data: bytes, eof: bool) -> None:
        """The child reads its stdin at once (while it lives): consumed, acknowledged as paced.
        An upload's part file takes it a piece at a time (`_write`)."""
        job = st.job
        if job is None or not job.alive:
            return  # a dead child's pipe: nothing consumed, nothing acknowledged
        check = self.chand.world.ext.checker  # type: ignore[union-attr]
        if data:
            check.on_child_stdin(st.run_id, offset, data)
        if st.stdin.receiver.tuner is not None:
            st.unwritten += len(data)
            st.unwritten_eof = st.unwritten_eof or eof
            if not st.writing:
                st.writing = True
                self.hand.loop.call_at(self.now, lambda: self._write(st), label="part_file")
            return
        self._consumed(st, len(data), eof)

    def _write(self, st: RunStreams) -> None:
        """The next piece of an upload's stdin written to its part file, then the next."""
        job = st.job
        if job is None or not job.alive:
            st.writing = False
            return
        n = min(WRITE_PIECE, st.unwritten)
        st.unwritten -= n
        self._consumed(st, n, st.unwritten_eof and not st.unwritten)
        st.writing = st.unwritten > 0
        if st.writing:
            self.hand.loop.call_at(self.now + WRITE_S, lambda: self._write(st), label="part_file")

    def _consumed(self, st: RunStreams, n: int, eof: bool) -> None:
        """`n` more bytes of stdin consumed (and its end, if `eof`): acknowledged as paced."""
        st.stdin.consume(n)
        ack = st.stdin.ack_due()
        if ack is not None:
            told = st.stdin.receiver.announced
            window = st.stdin.changed_window()
            self.chand.send_now(StreamAck(run_id=st.run_id, stream="stdin", offset=ack, window=window))
            if window is not None:
                self.chand.world.ext.stdin_window_changed(self.hand.label, st.run_id, told, window)  # type: ignore[union-attr]
        if eof and st.job is not None:
            self.chand.world.ext.checker.on_child_stdin_end(st.run_id, st.stdin.offset)  # type: ignore[union-attr]
            st.job.stdin_end()

    # --- results and presentation ---

    def on_result_ack(self, run_id: str) -> None:
        if run_id in self.unacked:
            self._forget(run_id)

    def present(self) -> RunsPresent:
        runs: list[PresentedRun] = []
        for run_id, run in self.records.items():
            if run_id not in self._book.active and run_id not in self.unacked:
                continue
            rpc: Rpc = run.rpc
            st = self.streams.get(run_id)
            positions: list[StreamPosition] = []
            if st is not None:
                for o in st.outs.values():
                    granted = o.out.granted if o.out.granted != st.window else None
                    positions.append(
                        StreamPosition(stream=o.name, offset=o.out.offset, consumed=o.out.acked, window=granted)  # type: ignore[arg-type]
                    )
                if st.stdin is not None:
                    offset, consumed = st.stdin.resume_point()
                    granted = st.stdin.granted if st.stdin.granted != st.window else None
                    positions.append(StreamPosition(stream="stdin", offset=offset, consumed=consumed, window=granted))
            deadline = run.ctl.deadline if run.ctl.deadline is not None else self.now
            runs.append(
                PresentedRun(
                    run_id=run_id,
                    started=run_id in self.started,
                    streams=positions,
                    result_pending=run_id in self.unacked,
                    owner=rpc.owner,
                    tool=rpc.tool,
                    remaining_ms=max(0, int((deadline - self.now) * 1000)),
                    grace_ms=rpc.grace_ms,
                    spec=rpc.streams,
                    args_digest=args_digest(rpc.tool, rpc.args),
                    timeout_ms=rpc.timeout_ms,
                    seal=rpc.seal,
                    sealed_at=rpc.sealed_at,
                )
            )
        return RunsPresent(runs=runs)

    def after_present(self) -> None:
        """`RunTable.rewire`: the kept results whose streams need no resume go out again."""
        self.expired = False
        for run_id in list(self.unsent):
            self._deliver_if_free(run_id)
        for st in list(self.streams.values()):
            self._flush(st)

    def window_over(self) -> None:
        """`RunTable.expire`: no Mind came back within the window: the Hand kills its runs itself,
        lets go of their held output and forgets their results (nobody is left to take them)."""
        self.expired = True
        for run_id in list(self.unacked):
            self._forget(run_id)
        for run in list(self._book.active.values()):
            self.chand.world.ext.checker.notes["hand_window_kill"] += 1  # type: ignore[union-attr]
            st = self.streams.get(run.rpc.run_id)
            if st is not None:
                self._abandon(st)
            self._cancel(run, CancelReason.CONNECTION_LOST)

    def crashed(self) -> None:
        """The Hand process died: its children's stdin pipes close."""
        for st in self.streams.values():
            if st.job is not None and st.job.alive:
                st.job.stdin_end()


class ContinuityConn(HandConn):
    def __init__(self, hand: ContinuityHand, link: Link) -> None:
        super().__init__(hand, link)
        self.runs = hand.kept  # type: ignore[assignment]
        self.presented = False


class ContinuityHand(HandProcess):
    """`HandProcess` whose foreground runs outlive a connection for the Mind's window."""

    runs_cls: type[KeptRuns] = KeptRuns

    def __init__(self, world: World, slot: HandSlot) -> None:
        super().__init__(world, slot)
        self.window = world.window
        self.kept = self.runs_cls(self)
        self._away_epoch = 0

    @property
    def connected(self) -> bool:
        conn = self.conn
        return conn is not None and conn.wire_open and getattr(conn, "presented", False)

    def send_now(self, msg: Message) -> None:
        if self.connected:
            assert self.conn is not None
            self.conn.send(msg)

    def make_conn(self, link: Link) -> HandConn:
        return ContinuityConn(self, link)

    def _session(self, link: Link) -> Generator[Any, Any, float]:
        conn = self.make_conn(link)
        assert isinstance(conn, ContinuityConn)
        self.conn = conn
        welcomed = self.clock.now
        self._away_epoch += 1  # a Mind came back: the window's kill is off
        conn.send(self.kept.present())  # the first frame after welcome
        conn.presented = True
        self.kept.after_present()
        self.tasks.attach(conn.send)
        reader = self.loop.spawn(self._read_loop(conn), f"reader gen{link.gen}", transient=False)
        yield conn.closed
        reader.cancel()
        conn.wire_open = False
        self.tasks.attach(None)
        self.conn = None
        self.kept.on_cut()
        self._away_epoch += 1
        epoch = self._away_epoch
        self.loop.call_at(self.clock.now + self.window, lambda: self._window_over(epoch), label="hand_window")
        return self.clock.now - welcomed

    def _window_over(self, epoch: int) -> None:
        if epoch == self._away_epoch and self.conn is None:
            self.kept.window_over()

    def _read_loop(self, conn: HandConn) -> Generator[Any, Any, None]:
        runs = self.kept
        while True:
            frame = conn.inbox.popleft() if conn.inbox else (yield conn.recv())
            msg = frame.msg
            if isinstance(msg, Rpc) and msg.background is not None:
                yield from self.tasks.on_start(msg, conn.send)
            elif isinstance(msg, Rpc):
                runs.on_rpc(msg)
            elif isinstance(msg, (TaskStatus, TaskCancel, TaskInventory)):
                reply = yield from self.tasks.answer(msg)
                conn.send(reply, frame.env_id)
            elif isinstance(msg, Cancel):
                if self.cancel_waits_for_starts:
                    yield from self.tasks.settle()
                runs.on_cancel(msg)
            elif isinstance(msg, ResultAck):
                runs.on_result_ack(msg.run_id)
            elif isinstance(msg, (StreamData, StreamAck, StreamResume, Resize)):
                runs.on_stream(msg)
            else:
                raise AssertionError(f"a mind may not send {msg.TYPE} to a hand")

    def busy(self) -> bool:
        return super().busy() or bool(self.kept.unacked)


class ResultBeforeAck(KeptRuns):
    """As `hand/aio/streams.py` ships: the result follows once every output stream's end is SENT."""

    result_waits_for_ack = False


class HandResultBeforeAck(ContinuityHand):
    runs_cls = ResultBeforeAck
