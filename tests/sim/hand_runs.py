"""The Hand's foreground runs of one connection: `hand.runs.RunTable`, synchronously.

Mirrored rule by rule from `hand/aio/runs.py` (keep in step): everything that refuses a run is decided
before `accepted`; the run is registered before `accepted` goes out, so a `cancel` that follows on
the ordered stream finds it; `RunControl(finish_on_cancel=False)` so the truth wins (a command that
exited on its own reports its exit even if a cancel raced it); the Hand's deadline kills the tree
and reports `timed_out`; progress is dropped past the caps and never sent after the result;
`cancel_all(connection_lost)` when the connection ends. Called for real: `RecentRuns`,
`RunControl`, `check_active`, `REASON_TO_STATE`, `_fits`.

Not modelled: streamed runs (`rpc.streams`: stdin, complete output, terminals). The simulated
clients ask for none; streams never move a state, their arithmetic is `protocol.streams`' (unit
and property tested) and the Mind's relay is the real registry's; tests/integration/test_streams.py
and test_terminals.py check them with real processes.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.jobs import PROGRAM, JobSpec, VProcess
from sim.runtime import Cancelled, Fut, Proc, first_of

from hand.aio.runs import PROGRESS_BYTES, PROGRESS_EVENTS, _fits
from hand.core.policy import KNOWN_TOOLS
from hand.core.spawn import spawn_failure
from hand.system.process import ProcessOutcome
from hand.system.tools import Refusal
from protocol import limits
from protocol.codes import CancelReason, CancelStatus, RejectCode
from protocol.control import REASON_TO_STATE, Budget, RunAborted, RunControl, check_active
from protocol.messages import Accepted, Cancel, CancelResult, Message, Progress, Rejected, Result, Rpc, Started
from protocol.states import RunState

if TYPE_CHECKING:
    from sim.hand_agent import HandProcess


@dataclass(eq=False)
class _Run:
    rpc: Rpc
    ctl: RunControl
    spec: JobSpec
    grace: float
    offsets: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    dropped: int = 0
    task: Proc | None = None


class HandRuns:
    def __init__(self, hand: HandProcess, send: Callable[[Message], None]) -> None:
        self.hand = hand
        self._send = send
        self._active: dict[str, _Run] = {}
        self._closing: CancelReason | None = None
        self._idle = Fut()
        self._idle.resolve(None)

    @property
    def now(self) -> float:
        return self.hand.clock.now

    # --- admission ---

    def on_rpc(self, rpc: Rpc) -> None:
        try:
            spec = self._admit(rpc)
        except Refusal as refusal:
            self._send(Rejected(run_id=rpc.run_id, code=refusal.code, message=refusal.message))
            return
        budget = Budget({PROGRESS_BYTES: limits.PROGRESS_BYTES_MAX, PROGRESS_EVENTS: limits.PROGRESS_EVENTS_MAX})
        ctl = RunControl(budget, deadline=self.now + rpc.timeout_ms / 1000, finish_on_cancel=False)
        kill_grace = self.hand.kill_grace
        grace = kill_grace if rpc.grace_ms is None else min(rpc.grace_ms / 1000, kill_grace)
        run = _Run(rpc, ctl, spec, grace)
        self._active[rpc.run_id] = run  # before `accepted`: a following cancel finds it
        if self._idle.done:
            self._idle = Fut()
        self._send(Accepted(run_id=rpc.run_id))
        run.task = self.hand.loop.spawn(self._execute(run), f"run {rpc.run_id}")

    def _admit(self, rpc: Rpc) -> JobSpec:
        if rpc.run_id in self._active or rpc.run_id in self.hand.recent:
            raise Refusal(RejectCode.DUPLICATE_RUN, f"run {rpc.run_id} is already known to this hand")
        if self._closing is not None:
            raise Refusal(RejectCode.SHUTTING_DOWN, "this hand is shutting down")
        if rpc.tool not in KNOWN_TOOLS:
            raise Refusal(RejectCode.UNKNOWN_TOOL, f"this hand has no tool {rpc.tool!r}")
        if not self.hand.policy.allowed(rpc.tool):
            raise Refusal(RejectCode.DENIED_BY_POLICY, f"tool {rpc.tool!r} is denied by this hand's policy")
        spec = JobSpec.from_args(rpc.args)
        if spec is None:
            raise Refusal(RejectCode.INVALID_REQUEST, "bad arguments")
        return spec

    # --- cancellation ---

    def on_cancel(self, cancel: Cancel) -> None:
        run = self._active.get(cancel.run_id)
        if run is not None:
            self._send(CancelResult(run_id=cancel.run_id, status=CancelStatus.CANCEL_REQUESTED))
            self._cancel(run, cancel.reason)
        elif cancel.run_id in self.hand.recent:
            self._send(CancelResult(run_id=cancel.run_id, status=CancelStatus.ALREADY_DONE))
        else:
            self._send(CancelResult(run_id=cancel.run_id, status=CancelStatus.UNKNOWN_RUN))

    def cancel_all(self, reason: CancelReason) -> None:
        self._closing = self._closing or reason
        for run in list(self._active.values()):
            self._cancel(run, reason)

    def _cancel(self, run: _Run, reason: CancelReason) -> None:
        run.ctl.cancel(reason, self.now)

    def wait_idle(self, timeout: float) -> Generator[Any, Any, bool]:
        if not self._active:
            return True
        yield first_of(self._idle, self.hand.loop.sleep(timeout, "wait_idle"))
        if not self._active:
            return True
        for run in list(self._active.values()):  # past the bound: the task is cancelled, reports what it knows
            if run.task is not None:
                run.task.cancel()
        return False

    # --- execution ---

    def _execute(self, run: _Run) -> Generator[Any, Any, None]:
        assert run.ctl.deadline is not None
        timer = self.hand.loop.call_at(
            run.ctl.deadline, lambda: self._cancel(run, CancelReason.DEADLINE_EXCEEDED), label="run_deadline"
        )
        try:
            result = yield from self._outcome(run)
        except Cancelled:  # our owner stopped waiting: report what we know, then end
            timer.cancel()
            self._conclude(run, self._stopped(run))
            raise
        timer.cancel()
        self._conclude(run, result)

    def _outcome(self, run: _Run) -> Generator[Any, Any, Result]:
        try:
            check_active(run.ctl, self.now)
        except RunAborted:
            return self._stopped(run)
        self._send(Started(run_id=run.rpc.run_id))
        proc = VProcess(
            self.hand.machine,
            run.spec,
            (self.hand.label, "run", run.rpc.run_id),
            grace=run.grace,
            on_output=lambda stream, data: self._progress(run, stream, data),
        )
        unregister = run.ctl.cancellation.on_cancel(lambda _reason: proc.kill())
        try:
            out = yield from proc.run()
        except OSError as exc:
            unregister()
            how = spawn_failure(exc, PROGRAM)
            return self._failed(run, how.error, how.exit_code, how.reason)
        unregister()
        return self._from_process(run, out)

    def _progress(self, run: _Run, stream: str, data: bytes) -> None:
        if not self.hand.loop.alive:
            return  # an orphan of a crashed Hand writes into a dead pipe
        base = run.offsets[stream]
        run.offsets[stream] = base + len(data)
        if run.ctl.cancellation.cancelled or run.ctl.lifecycle.done or not _fits(run.ctl.budget, len(data)):
            run.dropped += 1
            return
        self._send(Progress(run_id=run.rpc.run_id, stream=stream, offset=base, data=data))  # type: ignore[arg-type]

    # --- results ---

    def _from_process(self, run: _Run, out: ProcessOutcome) -> Result:
        reason = run.ctl.cancellation.reason
        if out.killed and reason is not None:
            state, why = REASON_TO_STATE[reason], reason.value
        elif out.exit_code == 0:
            state, why = RunState.SUCCEEDED, ""
        else:
            state = RunState.FAILED
            why = f"exit status {out.exit_code}" if out.exit_code is not None else f"killed by signal {out.signal}"
        return Result(
            run_id=run.rpc.run_id,
            state=state,
            reason=why,
            exit_code=out.exit_code,
            signal=out.signal,
            stage=out.stage if out.killed else None,
        )

    def _failed(self, run: _Run, error: str, exit_code: int | None = None, reason: str = "tool failed") -> Result:
        return Result(run_id=run.rpc.run_id, state=RunState.FAILED, reason=reason, exit_code=exit_code, error=error)

    def _stopped(self, run: _Run) -> Result:
        term = run.ctl.lifecycle.termination
        reason = run.ctl.cancellation.reason or CancelReason.SHUTDOWN
        state = term.state if term is not None else REASON_TO_STATE[reason]
        return Result(run_id=run.rpc.run_id, state=state, reason=reason.value)

    def _conclude(self, run: _Run, result: Result) -> None:
        """Record the one terminal, forget the run, send the one result."""
        if self._active.get(run.rpc.run_id) is not run:
            return
        if not run.ctl.lifecycle.finish(result.state, result.reason or result.state.value, self.now):
            term = run.ctl.lifecycle.termination
            assert term is not None
            if term.state != result.state:
                result = result.model_copy(update={"state": term.state, "reason": term.reason})
        result = result.model_copy(update={"progress_dropped": run.dropped})
        del self._active[run.rpc.run_id]
        self.hand.recent.add(run.rpc.run_id)
        if not self._active:
            self._idle.resolve(None)
        self.hand.world.checker.on_hand_run_end(self.hand.label, run.rpc.run_id, result.state)
        self._send(result)
