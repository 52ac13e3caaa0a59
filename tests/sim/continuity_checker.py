"""The continuity invariants (issue 22, must-hold 7; DESIGN §15), checked while the simulation runs.

Beside `sim.checker` (which still checks every rule of §3, §5, §7 and §8):
- first terminal wins, across a Mind crash too: a foreground run's every terminal, in any life of
  the Mind, is its first one; an ending the Mind persisted is never followed by another;
- generations fence: a Hand's stream bytes are relayed only from the generation the run is bound
  to now (sent on, re-bound by `runs_present`, or adopted on);
- `lost` only when nobody can know: never while a live Hand still holds the run, unless the
  Mind's window for that Hand ran out;
- no byte lost or duplicated: every chunk a client or a command takes is the one produced (or
  typed) at that offset; order and contiguity are the endpoints' own checks (`Incoming` refuses
  a gap or overlap; a client's follower, `mind.client.follow.Follower`, marks the stream broken,
  and any refusal or broken stream here is a violation); a run whose command exited by itself
  with its output not abandoned ends with every byte at the client, and stdin ends exactly where
  the client closed it;
- memory: what each sender keeps (`Outgoing.kept`: the Hand's output, the client's stdin) and
  what the Mind relays unacknowledged never exceeds the stream's window;
- a client hears one `run_end` per run, agreeing with the registry, and nothing for a run on a
  connection told it was `replaced`;
- the owner learns how its run ended, across a Mind crash too: an attach is answered "unknown run"
  only for a run no life of the Mind ever ended (or one refused before it ran);
- a stream owed progress makes it (`stream_stalled`): bytes a sender has sent (within the credit
  it was granted: its endpoint sends no further), or its end, reach the receiver within `STALL_S`
  while nothing is cut: the client attached on a flowing link the Mind holds it on, the run bound
  to the Hand's current connection, flowing, presented and known to the Mind. For stdin the
  client's `Outgoing` against the Hand's `Incoming`, for output the other way. A run that cannot
  move (the Mind refuses every chunk past a limit the Hand never granted, as before main's
  13554b4) would otherwise end by its deadline as if it were slow, and every other invariant hold.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from sim.stream_jobs import pattern

from mind.core.runs import Log, PersistEnding
from protocol.limits import STREAM_WINDOW_GROWN_MAX
from protocol.messages import Error, RunEnd, RunsPresent
from protocol.states import RunState

if TYPE_CHECKING:
    from sim.continuity_hand import RunStreams
    from sim.stream_clients import ClientRun, Continuity, StreamClient

STALL_S = 30.0
"""How long bytes already sent may take to arrive while nothing is cut. A frame waits at most
`max_latency_s` past a latency fault's delay (up to 8 s on a Hand's link, 3 s on a client's) per
hop, and a Hand's reader may wait a second or two on its disk; after a cut the resume adds a round
trip. A stalled stream stays stalled until its run's deadline (an upload's: minutes)."""


class ContinuityChecker:
    def __init__(self, ext: Continuity) -> None:
        self.ext = ext
        self.world = ext.world
        self.notes: Counter[str] = self.world.checker.notes
        self.first_end: dict[str, tuple[int, RunState]] = {}
        """run id -> (life of the Mind, its first terminal)."""
        self.admitted: set[str] = set()
        """Runs some life of the Mind admitted (a run a client named may never have reached it)."""
        self.attached_unadmitted: set[str] = set()
        """Names an `attach` asked for before any life of the Mind had admitted them: the run's `exec`
        was lost in a cut, or is still on its way on an older connection (it may start after)."""
        self.persisted: dict[str, RunState] = {}
        self.client_runs: dict[str, tuple[StreamClient, ClientRun, int]] = {}
        """run id -> (its client, the client's run, the Mind's life that admitted it)."""
        self.unattended_end: set[str] = set()
        """Runs that ended with no client attached (their `run_end` told to nobody)."""
        self.full: set[tuple[str, str]] = set()
        self.jobs: dict[str, Any] = {}
        """run id -> the Hand's streams of it (`sim.continuity_hand.RunStreams`)."""
        self.owed: dict[tuple[str, str], tuple[tuple[Any, ...], float]] = {}
        """(run id, stream) with bytes sent and not received -> (what must stay the same for it
        to count as stalled: the Mind's life, the attachment, the Hand's connection, the bytes
        received; since when it has)."""

    def fail(self, invariant: str, detail: str) -> None:
        self.world.checker.fail(invariant, detail)

    # --- the Mind ------------------------------------------------------------------------------

    def on_persist(self, life: int, a: PersistEnding) -> None:
        self.notes[f"persisted:{a.end.state.value}"] += 1
        first = self.first_end.get(a.run_id)
        if first is not None and first[1] is not a.end.state:
            self.fail(
                "first terminal wins", f"{a.run_id} persisted {a.end.state} after life {first[0]} ended it {first[1]}"
            )
        self.persisted[a.run_id] = a.end.state

    def on_mind_log(self, life: int, log: Log) -> None:
        if log.event == "run_admitted":
            self.admitted.add(log.fields["run_id"])
        if log.event == "run_adopted":
            self.notes["adopted"] += 1
        elif log.event == "run_rebound":
            self.notes["rebound"] += 1
        elif log.event == "run_presented_after_end":
            self.notes["presented_after_end"] += 1
        if log.event != "run_terminal":
            return
        run_id = log.fields["run_id"]
        if not run_id.startswith(("r", "k")):  # minted by the Mind, or named by a client (`k<conn>.<n>`)
            return  # a task's start run: its id may be started again (the task's rules hold it)
        state = RunState(log.fields["state"])
        first = self.first_end.setdefault(run_id, (life, state))
        if first[1] is not state:
            kind = "persisted" if run_id in self.persisted else "reported"
            self.fail(
                "first terminal wins",
                f"{run_id} ended {state} in life {life}; life {first[0]} had ended it {first[1]} ({kind})",
            )
        if first[0] != life:
            self.notes["ended_again_after_crash"] += 1
        run = self.world.mind.registry.get(run_id) if self.world.mind is not None else None
        if run is not None and run.client is None:
            self.unattended_end.add(run_id)
        if state is RunState.LOST:
            self._lost(run_id)

    def _lost(self, run_id: str) -> None:
        """`lost` only when nobody can know: the run's Hand no longer holds it (it restarted, or
        never got it), or the Mind's window for its Hand ran out."""
        w = self.world
        run = w.mind.registry.get(run_id) if w.mind is not None else None
        if run is None or run.background is not None:
            return
        away = run.hand_away_since
        if away is not None and w.clock.now >= away + w.window - 1e-9:
            self.notes["lost:window"] += 1
            return
        slot = w.hands.get(run.hand)
        kept = getattr(slot.proc, "kept", None) if slot is not None else None
        if kept is not None and (run_id in kept._book.active or run_id in kept.unacked):
            why = run.end.reason if run.end is not None else "?"
            self.fail("lost only when nobody can know", f"{run_id} lost ({why}) while {run.hand} holds it")
        self.notes["lost:hand_lost_it"] += 1

    def on_presented(self, hand: str, gen: int, msg: RunsPresent) -> None:
        self.notes["runs_present"] += 1
        self.notes["presented_runs"] += len(msg.runs)
        self.notes["presented_result_pending"] += sum(1 for p in msg.runs if p.result_pending)

    def on_stream_forwarded(self, life: int, run_id: str, gen: int) -> None:
        bound = self.world.checker.sent_gen.get((life, run_id))
        if bound != gen:
            self.fail("generations fence", f"stream of {run_id} from gen{gen} relayed; the run is on gen{bound}")

    # --- bytes ---------------------------------------------------------------------------------

    def on_job(self, st: Any) -> None:
        self.jobs[st.run_id] = st

    def on_client_run(self, c: StreamClient, run: ClientRun) -> None:
        life = self.world.mind.life if self.world.mind is not None else -1
        self.client_runs[run.run_id] = (c, run, life)
        self.notes["stream_runs"] += 1
        if run.follower.stdin is not None:
            self.notes["stream_runs_with_stdin"] += 1

    def on_client_output(self, c: StreamClient, run_id: str, stream: str, offset: int, data: bytes) -> None:
        if data != pattern(run_id, stream, offset, len(data)):
            self.fail("no byte lost or duplicated", f"{c.name} got other bytes of {run_id} {stream} at {offset}")
        self.notes["bytes_to_clients"] += len(data)

    def on_child_stdin(self, run_id: str, offset: int, data: bytes) -> None:
        if data != pattern(run_id, "stdin", offset, len(data)):
            self.fail("no byte lost or duplicated", f"the command of {run_id} read other stdin bytes at {offset}")
        self.notes["bytes_to_commands"] += len(data)

    def on_child_stdin_end(self, run_id: str, offset: int) -> None:
        known = self.client_runs.get(run_id)
        if known is not None and offset != known[1].stdin_total:
            self.fail("no byte lost or duplicated", f"stdin of {run_id} ended at {offset} of {known[1].stdin_total}")

    # --- clients -------------------------------------------------------------------------------

    def on_client_end(self, c: StreamClient, run: ClientRun, end: RunEnd) -> None:
        if run.ends > 1:
            self.fail("one run_end per run per client", f"{c.name} got {run.ends} for {run.run_id}")
        first = self.first_end.get(run.run_id)
        if first is None or first[1] is not end.state:
            self.fail("run_end agrees with the registry", f"{c.name} got {end.state} for {run.run_id}, first {first}")
        self.notes[f"client_end:{end.state.value}"] += 1
        st = self.jobs.get(run.run_id)
        exited = end.state is RunState.SUCCEEDED or (
            end.state is RunState.FAILED and end.exit_code is not None and end.signal is None
        )
        if st is None or st.abandoned or not exited:
            return
        for name, out in run.follower.outs.items():
            inc = out.rx
            produced = st.job.produced[name]
            if inc.offset != produced:  # (its end may have gone to a client away: the bytes did not)
                self.fail(
                    "no byte lost or duplicated",
                    f"{c.name} ended {run.run_id} ({end.state.value}) with {inc.offset} of {produced} {name} bytes",
                )
        self.notes["complete_outputs"] += 1

    def on_client_lost_run(self, c: StreamClient, run: ClientRun, msg: Error) -> None:
        known = self.client_runs.get(run.run_id)
        life = self.world.mind.life if self.world.mind is not None else -1
        if run.run_id in self.attached_unadmitted:
            # a run the client named, whose `exec` the Mind had not read when the attach came (a
            # cut took it, or it is late on an older connection): `unknown_run` is the truth then,
            # and the client says the run's fate is unknown here, never how it ended
            self.notes["named_exec_lost_in_a_cut"] += 1
        elif known is not None and known[2] == life:
            self.fail("attach finds its run", f"{c.name} attaching {run.run_id}: {msg.code.value} {msg.message}")
        first = self.first_end.get(run.run_id)
        if first is not None:
            # Every ending of a run that reached its Hand is durable (the Mind's own, and with a
            # window the Hand's results): a crash cannot make its owner's run unknown. A refused
            # run never ran; its `run_end` lost in a cut before a crash is the one thing forgotten.
            if first[1] is not RunState.REJECTED:
                self.fail(
                    "the owner learns how its run ended",
                    f"{c.name} attaching {run.run_id} in life {life}: {msg.code.value}; life {first[0]} ended it {first[1]}",
                )
            self.notes["owner_missed_refusal_across_crash"] += 1
        self.notes["client_run_unknown"] += 1

    # --- after every event, and once settled ---------------------------------------------------

    def after_event(self) -> None:
        w = self.world
        for slot in w.hands.values():
            kept = getattr(slot.proc, "kept", None)
            if kept is None:
                continue
            for st in kept.streams.values():
                for o in st.outs.values():
                    granted = o.out.granted  # the window, or one granted before a shrink
                    if o.out.kept > granted or granted > max(st.window, STREAM_WINDOW_GROWN_MAX):
                        self.fail("memory: a sender keeps at most its window", f"{slot.label} {st.run_id} {o.name}")
                    if o.out.window > st.window:
                        self.notes["window_grown"] += 1
                    if o.out.kept == granted and (st.run_id, o.name) not in self.full:
                        self.full.add((st.run_id, o.name))  # the credit rule stopped it there
                        self.notes["hand_sender_full"] += 1
        for c in self.ext.clients:
            for run in c.runs.values():
                stdin = run.follower.stdin
                if stdin is not None and (
                    stdin.kept > stdin.granted or stdin.granted > max(stdin.sender.window, STREAM_WINDOW_GROWN_MAX)
                ):
                    self.fail("memory: a sender keeps at most its window", f"{c.name} stdin of {run.run_id}")
        if w.mind is not None:
            for r in w.mind.registry.active():
                for name, relay in r.relays.items():
                    granted = relay.limit - relay.acked
                    if relay.in_flight > granted or granted > max(relay.window, STREAM_WINDOW_GROWN_MAX):
                        self.fail("memory: the relay holds at most a window", f"{r.run_id} {name}")

        self._liveness()

    def _liveness(self) -> None:
        """A stream owed progress makes it (module docstring): bytes sent and not received while
        both ends are connected and attached, with nothing received for `STALL_S`, stalled."""
        w = self.world
        now = w.clock.now
        owed: dict[tuple[str, str], tuple[tuple[Any, ...], float]] = {}
        for c in self.ext.clients:
            for run in c.runs.values():
                if run.end is not None or run.gave_up:
                    continue
                legs = self._connected(run)
                if legs is None:
                    continue
                mark, st = legs
                for stream, sent, got in self._unreceived(run, st):
                    key = (run.run_id, stream)
                    was = self.owed.get(key)
                    since = was[1] if was is not None and was[0] == (*mark, got) else now
                    owed[key] = ((*mark, got), since)
                    if now - since > STALL_S:
                        self.fail(
                            "stream_stalled",
                            f"{run.run_id} {stream}: {sent} bytes sent, {got} received, nothing more for "
                            f"{now - since:.1f} s with {c.name} attached and {mark[2]} gen{mark[3]} connected",
                        )
        self.owed = owed

    def _connected(self, run: ClientRun) -> tuple[tuple[Any, ...], RunStreams] | None:
        """(the Mind's life, the client's connection, the Hand, its generation) and the Hand's
        streams of `run`, if nothing stands between them now: the client attached on an open,
        flowing link the Mind holds the run on; the run bound to the Hand's current connection,
        open, flowing, presented and the one the Mind holds for it. None otherwise."""
        w, link = self.world, run.link
        mind = w.mind
        if mind is None or link is None or not (link.open and link.flowing and run.follower.ready):
            return None
        r = mind.registry.get(run.run_id)
        if r is None or r.terminal or r.gen is None or r.hand_away_since is not None:
            return None
        conn = mind.client_links.get(link)  # type: ignore[attr-defined]
        slot = w.hands.get(r.hand)
        proc = slot.proc if slot is not None else None
        peer = mind.hands.get(r.hand)
        if conn is None or r.client != conn or proc is None or proc.conn is None or peer is None:
            return None
        hand_link = proc.conn.link
        if peer.link is not hand_link or hand_link.gen != r.gen or not (hand_link.open and hand_link.flowing):
            return None
        kept = getattr(proc, "kept", None)
        st = kept.streams.get(run.run_id) if kept is not None and proc.connected else None  # type: ignore[attr-defined]
        return ((mind.life, conn, r.hand, r.gen), st) if st is not None else None

    @staticmethod
    def _unreceived(run: ClientRun, st: RunStreams) -> list[tuple[str, int, int]]:
        """(stream, sent, received) of each stream whose sender sent bytes, or its end, that its
        receiver does not have."""
        out: list[tuple[str, int, int]] = []
        f = run.follower
        if f.stdin is not None and st.stdin is not None:
            rx = st.stdin.receiver
            if f.stdin.offset > rx.offset or (f.stdin.eof and not rx.eof):
                out.append(("stdin", f.stdin.offset, rx.offset))
        for name, o in st.outs.items():
            follow = f.outs.get(name)
            if follow is None or follow.gap is not None:
                continue  # (a broken stream is a violation of its own)
            rx = follow.rx.receiver
            if o.out.offset > rx.offset or (o.out.eof and not rx.eof):
                out.append((name, o.out.offset, rx.offset))
        return out

    def reconciled(self, phase: str) -> None:
        for c in self.ext.clients:
            if c.link is None:
                continue
            for run in c.runs.values():
                if run.end is None and not run.gave_up:
                    self.fail("every run a client waits for ends", f"[{phase}] {c.name} {run.run_id}")
