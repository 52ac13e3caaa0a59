"""The Hand's foreground runs of one connection: `hand.aio.runs.RunTable`, synchronously.

Mirrored rule by rule from `hand/aio/runs.py` (keep in step): everything that refuses a run is decided
before `accepted`; the run is registered before `accepted` goes out, so a `cancel` that follows on
the ordered stream finds it; `RunControl(finish_on_cancel=False)` so the truth wins (a command that
exited on its own reports its exit even if a cancel raced it); the Hand's deadline kills the tree
and reports `timed_out`; progress is dropped past the caps and never sent after the result;
`cancel_all(connection_lost)` when the connection ends. The rules are called for real, from
`hand.core.runs`: the refusals in their one order (`refusal`), the run's budget and grace, the
progress caps (`progress_pieces`), how a process ended (`process_end`), a stopped run (`stopped`) and
the first terminal (`final`), the table's bookkeeping (`RunBook`: active and recent ids, closing,
the answer to a cancel); and `RunControl`, `check_active`. What is modelled by
hand is the glue: the order in which the shell performs them.

Streamed runs (`rpc.streams`) are modelled by the continuity variant (`sim.continuity_hand`, on
top of this class: the REAL `protocol.streams` endpoints, every byte checked); terminals are not
(tests/integration/test_terminals.py checks them with real processes).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
from sim.jobs import PROGRAM, JobSpec, VProcess
from sim.runtime import Cancelled, Fut, Proc, first_of

from hand.core.runs import RunBook, RunEnd, final, kill_grace, process_end, progress_pieces, run_limits, stopped
from hand.core.spawn import spawn_failure
from hand.system.process import ProcessOutcome
from hand.system.tools import Refusal
from protocol.codes import CancelReason, RejectCode
from protocol.control import Budget, RunAborted, RunControl, check_active
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
        self._book: RunBook[_Run] = RunBook(hand.recent)
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
        ctl = RunControl(Budget(run_limits(None)), deadline=self.now + rpc.timeout_ms / 1000, finish_on_cancel=False)
        run = _Run(rpc, ctl, spec, kill_grace(rpc.grace_ms, self.hand.kill_grace))
        self._book.active[rpc.run_id] = run  # before `accepted`: a following cancel finds it
        if self._idle.done:
            self._idle = Fut()
        self._send(Accepted(run_id=rpc.run_id))
        run.task = self.hand.loop.spawn(self._execute(run), f"run {rpc.run_id}")

    def _admit(self, rpc: Rpc) -> JobSpec:
        size = len(msgpack.packb(rpc.args, use_bin_type=True))
        refused = self._book.refusal(rpc.run_id, rpc.tool, args_size=size, allowed=self.hand.policy.allowed(rpc.tool))
        if refused is not None:
            raise Refusal(refused.code, refused.message)
        spec = JobSpec.from_args(rpc.args)
        if spec is None:
            raise Refusal(RejectCode.INVALID_REQUEST, "bad arguments")
        return spec

    # --- cancellation ---

    def on_cancel(self, cancel: Cancel) -> None:
        status = self._book.cancel_status(cancel.run_id)
        run = self._book.active.get(cancel.run_id)
        if run is not None:
            self._cancel(run, cancel.reason)
        self._send(CancelResult(run_id=cancel.run_id, status=status))

    def cancel_all(self, reason: CancelReason) -> None:
        for run in self._book.close(reason):
            self._cancel(run, reason)

    def _cancel(self, run: _Run, reason: CancelReason) -> None:
        run.ctl.cancel(reason, self.now)

    def wait_idle(self, timeout: float) -> Generator[Any, Any, bool]:
        if not self._book.active:
            return True
        yield first_of(self._idle, self.hand.loop.sleep(timeout, "wait_idle"))
        if not self._book.active:
            return True
        for run in list(self._book.active.values()):  # past the bound: the task is cancelled, reports what it knows
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
        stopped = run.ctl.cancellation.cancelled or run.ctl.lifecycle.done
        for offset, piece, sent in progress_pieces(run.offsets, stream, data, run.ctl.budget, stopped=stopped):
            if sent:
                self._send(Progress(run_id=run.rpc.run_id, stream=stream, offset=offset, data=piece))  # type: ignore[arg-type]
            else:
                run.dropped += 1

    # --- results ---

    def _from_process(self, run: _Run, out: ProcessOutcome) -> Result:
        end = process_end(
            killed=out.killed, exit_code=out.exit_code, signal=out.signal, cancel=run.ctl.cancellation.reason
        )
        return Result(
            run_id=run.rpc.run_id,
            state=end.state,
            reason=end.reason,
            exit_code=out.exit_code,
            signal=out.signal,
            stage=out.stage if out.killed else None,
        )

    def _failed(self, run: _Run, error: str, exit_code: int | None = None, reason: str = "tool failed") -> Result:
        return Result(run_id=run.rpc.run_id, state=RunState.FAILED, reason=reason, exit_code=exit_code, error=error)

    def _stopped(self, run: _Run) -> Result:
        end = stopped(run.ctl.lifecycle.termination, run.ctl.cancellation.reason)
        return Result(run_id=run.rpc.run_id, state=end.state, reason=end.reason)

    def _conclude(self, run: _Run, result: Result) -> None:
        """Record the one terminal, forget the run, send the one result."""
        if not self._book.end(run.rpc.run_id, run):
            return
        fact = final(run.ctl.lifecycle, RunEnd(result.state, result.reason), self.now)
        if fact is not None:
            result = result.model_copy(update={"state": fact.state, "reason": fact.reason})
        result = result.model_copy(update={"progress_dropped": run.dropped})
        if not self._book.active:
            self._idle.resolve(None)
        self.hand.world.checker.on_hand_run_end(self.hand.label, run.rpc.run_id, result.state)
        self._send(result)
