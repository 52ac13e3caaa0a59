"""The foreground run table of one connection: admission, cancellation, the result of each run
(the command itself runs in `hand.aio.activerun`; the rules are `hand.core.runs`').

Per run, on the ordered stream: `rpc` -> `rejected`, or `accepted` -> `started` -> `progress`* ->
exactly one `result`; a quick file call (a small read, done inline) answers with its `result` alone,
which the Mind takes as the acceptance too. `cancel` -> `cancel_result` (a request, not an outcome: the `result` says how
the run really ended).

Rules this module keeps, each from DESIGN §3-§6:
- Everything that can refuse a run (duplicate id, closing, a full state disk, unknown tool, size,
  policy, terminal, then arguments and paths) is decided before `accepted`, in the order a
  background start is refused in too (`hand.core.runs.refusal`), and a refused run runs nothing.
- A run is registered synchronously in `on_rpc`, before any await, so a `cancel` that follows the
  `rpc` on the ordered stream always finds it.
- The Hand enforces the deadline on its own monotonic clock: it kills the tree, `timed_out`.
- The truth wins: `RunControl(finish_on_cancel=False)`; the run finishes with what actually
  happened. A command that exited on its own before a kill landed reports its real exit, even if a
  cancel was requested; a killed command reports the state its cancel reason maps to.
- File tools run to completion in a thread (a thread cannot be interrupted, and a write that
  happened must not be reported as cancelled); their result is the truth too.
- CPU seconds are a budget (seed 000, `hand.aio.activerun`). A process the kernel killed for its
  per-process CPU limit (SIGXCPU, or SIGKILL at the hard limit) is `budget_exhausted` too.
- An exception in one run never kills the agent: it becomes `result(failed, error=sanitised)`.
- Raw arguments never reach a log: only their SHA-256 digest.
- Continuity (DESIGN §15): the table can outlive its connection. With the Mind's resume window
  above 0, a cut (`on_cut`) leaves the runs running (their output held, as for a slow reader) and
  their results kept until `result_ack`; on the next connection the table is presented
  (`present`), each output stream resends what the client lacks on `stream_resume`, and the kept
  results go out again. With window 0 none of this happens: the table ends with its connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgpack
import structlog

from hand.aio import copyrun, forwardrun
from hand.aio.activerun import ActiveRun, KeptResult, cpu_limit
from hand.aio.metrics import HandMetrics
from hand.aio.streams import RunStreams, capped_spec
from hand.core.cpu import CPU_SECONDS
from hand.core.policy import ToolPolicy
from hand.core.runs import (
    OUT_OF_MEMORY,
    RecentRuns,
    RunBook,
    RunEnd,
    final,
    kill_grace,
    oom_error,
    process_end,
    run_limits,
    stopped,
    stream_refusal,
)
from hand.core.sanitize import Sanitizer
from hand.core.spawn import spawn_failure
from hand.system.process import DEFAULT_GRACE_S, ProcessOutcome
from hand.system.pty import PtyOutcome, login_shell
from hand.system.sandbox import Sandbox
from hand.system.tools import (
    DEFAULT_SANDBOX,
    FileCall,
    Prepared,
    ProcessSpec,
    Refusal,
    StreamCall,
    ToolFailed,
    prepare,
)
from protocol.audit import AuditEvent
from protocol.codes import CancelReason, RejectCode
from protocol.control import Budget, RunAborted, RunControl, check_active
from protocol.digest import args_digest
from protocol.errors import ProtocolError
from protocol.messages import (
    RUNS_PRESENT_MAX,
    Accepted,
    Cancel,
    CancelResult,
    Message,
    OutputTail,
    Rejected,
    Resize,
    Result,
    Rpc,
    RunsPresent,
    Started,
    StreamAck,
    StreamData,
    StreamResume,
)
from protocol.states import RunState

Send = Callable[[Message], None]
"""Stamp and queue one frame, in order, without blocking. Dropped silently once the connection is
gone (nobody can receive it; the Mind marks the run `lost`)."""
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class RunTable:
    def __init__(
        self,
        *,
        root: Path,
        policy: ToolPolicy,
        send: Send | None,
        spawn: Spawn,
        sanitize: Sanitizer | None = None,
        recent: RecentRuns | None = None,
        kill_grace: float = DEFAULT_GRACE_S,
        log: Any = None,
        sandbox: Sandbox = DEFAULT_SANDBOX,
        metrics: HandMetrics | None = None,
        state_free: Callable[[], int | None] | None = None,
    ) -> None:
        self._root = root
        self._state_free = state_free
        """The bytes free on the state disk now (`hand.system.disk.free_bytes`), asked at every
        admission: a start the audit file could not record is refused (`disk_full`)."""
        self._sandbox = sandbox
        self._metrics = metrics or HandMetrics()
        self._policy = policy
        self._send_to = send
        """Where frames go: the current connection's writer, or None while there is none."""
        self._spawn = spawn
        self._sanitize = sanitize or Sanitizer(root)
        self._kill_grace = kill_grace
        self._log = log if log is not None else structlog.get_logger(component="hand")
        self._book: RunBook[ActiveRun] = RunBook(recent if recent is not None else RecentRuns())
        self._idle = asyncio.Event()
        self._idle.set()
        self.window = 0.0
        """The resume window of the last `welcome`: above 0, results are kept until acknowledged."""
        self._kept: OrderedDict[str, KeptResult] = OrderedDict()

    def _send(self, msg: Message) -> None:
        """Stamp and queue one frame on the current connection; nowhere while there is none (the
        run's output stays in its streams, a result stays kept: both go out after the next welcome)."""
        if self._send_to is not None:
            self._send_to(msg)

    # --- admission ------------------------------------------------------------------------------

    def on_rpc(self, rpc: Rpc) -> None:
        log = self._log.bind(run_id=rpc.run_id, tool=rpc.tool)
        try:
            packed = msgpack.packb(rpc.args, use_bin_type=True)
            digest = args_digest(rpc.tool, rpc.args)
            prepared = self._admit(rpc, len(packed))
        except Refusal as refusal:
            self._reject(rpc, refusal.code, refusal.message, log)
            return
        except Exception as exc:  # a bug must refuse one run, not kill the agent
            log.exception("run_admission_failed")
            self._reject(rpc, RejectCode.INTERNAL_ERROR, f"internal error: {exc}", log)
            return
        loop = asyncio.get_running_loop()
        budget = Budget(run_limits(cpu_limit(prepared)))
        ctl = RunControl(budget, deadline=loop.time() + rpc.timeout_ms / 1000, finish_on_cancel=False)
        run = ActiveRun(rpc, ctl, prepared, kill_grace(rpc.grace_ms, self._kill_grace), digest, log)
        if rpc.streams is not None and isinstance(prepared, (ProcessSpec, StreamCall)):
            cap = None if isinstance(prepared, StreamCall) else self._sandbox.max_output_bytes  # a copy: its file
            grow = isinstance(prepared, StreamCall) and prepared.kind == "put"  # a copy's part file
            run.streams = RunStreams(rpc.run_id, capped_spec(rpc.streams, cap), self._send, log, grow_stdin=grow)
        self._book.active[rpc.run_id] = run  # before any await: a following cancel finds it
        self._metrics.run_started(rpc.run_id)
        self._idle.clear()
        if _answered_at_once(prepared, rpc):
            # Its result is the next frame on the ordered stream, and implies the acceptance: no
            # `accepted` frame, no task, no thread (issue 25: a call near the relay's cost).
            log.info(AuditEvent.RUN_ACCEPTED, args_digest=digest, timeout_ms=rpc.timeout_ms)
            self._conclude(run, self._at_once(run))
            return
        self._send(Accepted(run_id=rpc.run_id))
        log.info(AuditEvent.RUN_ACCEPTED, args_digest=digest, timeout_ms=rpc.timeout_ms)
        try:
            run.task = self._spawn(self._execute(run))
        except Exception as exc:  # e.g. the connection's task group is closing
            log.exception("run_spawn_failed")
            self._conclude(run, self._failed(run, f"internal error: {exc}"))

    def _admit(self, rpc: Rpc, args_size: int) -> Prepared:
        """The rules of `hand.core.runs` (one order, the sentences a background start reads too),
        then the tool's arguments and paths (`prepare`), then the streams the tool needs."""
        streams = rpc.streams
        pty = streams.pty if streams is not None else None
        refused = self._book.refusal(
            rpc.run_id,
            rpc.tool,
            args_size=args_size,
            allowed=self._policy.allowed(rpc.tool),
            no_pty=self._policy.why_no_pty(rpc.tool) if pty is not None else None,
            state_free=self._state_free() if self._state_free is not None else None,
        )
        if refused is not None:
            raise Refusal(refused.code, refused.message)
        login = pty is not None and pty.login
        args = {**rpc.args, "argv": ["login-shell"]} if login and rpc.tool == "exec" else rpc.args
        prepared = prepare(rpc.tool, args, self._root, self._sandbox)  # arguments, paths, limits
        if isinstance(prepared, StreamCall):
            refused = stream_refusal(
                rpc.tool,
                wants_stdin=prepared.kind in ("put", "forward", "claim"),
                streams=streams is not None,
                pty=pty is not None,
                stdin=streams is not None and streams.stdin,
            )
            if refused is not None:
                raise Refusal(refused.code, refused.message)
        if login and isinstance(prepared, ProcessSpec):
            program, argv = login_shell(prepared.run_as)
            prepared = dataclasses.replace(prepared, argv=tuple(argv), executable=program)
        return prepared

    def _reject(self, rpc: Rpc, code: RejectCode, message: str, log: Any) -> None:
        shown = self._sanitize(message)
        self._send(Rejected(run_id=rpc.run_id, code=code, message=shown))
        log.info(AuditEvent.RUN_REJECTED, code=code.value, reason=shown)
        self._metrics.runs_rejected.labels(code.value).inc()

    # --- cancellation ---------------------------------------------------------------------------

    def on_cancel(self, cancel: Cancel) -> None:
        status = self._book.cancel_status(cancel.run_id)
        run = self._book.active.get(cancel.run_id)
        if run is not None:
            run.told_to_stop = True
            self._cancel(run, cancel.reason)  # first: the SIGTERM goes out before any frame or log
            if run.streams is not None:  # ended by the Mind while held: no resume will come for it
                run.streams.forsake()
        self._send(CancelResult(run_id=cancel.run_id, status=status))
        if run is not None:
            run.log.info("run_cancel_requested", reason=cancel.reason.value)
        kept = self._kept.get(cancel.run_id)
        if kept is not None and not kept.sent:  # it ended in the cut: the Mind wants the truth now
            kept.run.told_to_stop = True
            self._deliver(kept)

    # --- streams --------------------------------------------------------------------------------

    def on_stream(self, msg: StreamData | StreamAck) -> None:
        """stdin from the client, or its acknowledgement of output, for a streamed run."""
        run = self._book.active.get(msg.run_id)
        if run is None and isinstance(msg, StreamAck):
            kept = self._kept.get(msg.run_id)  # ended, its output maybe not all acknowledged yet
            run = kept.run if kept is not None else None
        if run is None or run.streams is None:
            return  # the run ended: whatever it still gets is of no use
        if isinstance(msg, StreamData):
            if msg.stream == "stdin":
                run.streams.on_stdin(msg)
        elif msg.stream != "stdin":
            run.streams.on_ack(msg)

    def on_resize(self, msg: Resize) -> None:
        """A terminal run's window changed (runs without a terminal ignore it)."""
        run = self._book.active.get(msg.run_id)
        if run is not None and run.streams is not None:
            run.streams.on_resize(msg.rows, msg.cols)

    # --- continuity (DESIGN §15) ---------------------------------------------------------------

    def on_cut(self) -> None:
        """The connection dropped and the Mind keeps runs for a window: the runs go on, every
        output stream is held until the Mind says where its client stands, nothing is sent."""
        self._send_to = None
        for run in self._book.active.values():
            if run.streams is not None:
                run.streams.cut()
        for kept in self._kept.values():
            kept.sent = False
            if kept.run.streams is not None:
                kept.run.streams.cut()

    def present(self) -> RunsPresent:
        """Every live run and every result not acknowledged, for `runs_present`: the first frame
        after `welcome` on a new connection (an empty one says "this Hand holds nothing")."""
        now = asyncio.get_running_loop().time()
        runs = [run.presented(now) for run in self._book.active.values()]
        runs += [kept.presented() for kept in self._kept.values()]
        if len(runs) > RUNS_PRESENT_MAX:  # unreachable within the bounds below; never an unsendable frame
            self._log.error("runs_present_truncated", runs=len(runs), max=RUNS_PRESENT_MAX)
            runs = runs[:RUNS_PRESENT_MAX]
        return RunsPresent(runs=runs)

    @property
    def holding(self) -> int:
        """Runs live or with a result not acknowledged: what a cut leaves waiting."""
        return len(self._book.active) + len(self._kept)

    def rewire(self, send: Send) -> None:
        """A new connection (after `runs_present` is queued on it): frames go there from now on,
        and the kept results whose streams need no resume go out again."""
        self._send_to = send
        for kept in list(self._kept.values()):
            if not kept.sent and not kept.held:
                self._deliver(kept)

    def on_resume(self, msg: StreamResume) -> None:
        """`stream_resume` from the Mind: the output stream resends what the client lacks; a kept
        result whose streams are all resumed goes out after them."""
        run = self._book.active.get(msg.run_id)
        kept = self._kept.get(msg.run_id) if run is None else None
        if kept is not None:
            run = kept.run
        if run is None or run.streams is None:
            self._log.info("stream_resume_unknown", run_id=msg.run_id, stream=msg.stream)
            return
        run.streams.on_resume(msg)
        if kept is not None and not kept.sent and not kept.held:
            self._deliver(kept)

    def on_result_ack(self, run_id: str) -> None:
        """The Mind took the result: it is let go (with its streams' kept bytes)."""
        self._kept.pop(run_id, None)

    def expire(self, reason: CancelReason = CancelReason.CONNECTION_LOST) -> None:
        """No Mind came back within the window (or the Hand stops while cut off): cancel every run
        (tree killed), let go of their held output and forget their results (nobody is left to
        take them). The table serves no connection any more."""
        self._send_to = None
        self.window = 0.0
        self._kept.clear()
        self.cancel_all(reason)

    def _keep(self, run: ActiveRun, result: Result) -> KeptResult:
        kept = KeptResult(run, result)
        self._kept[run.rpc.run_id] = kept
        while len(self._kept) + len(self._book.active) > RUNS_PRESENT_MAX and self._kept:
            old_id, _old = self._kept.popitem(last=False)
            self._log.warning("result_forgotten", run_id=old_id, why="too many results not acknowledged")
        return kept

    def _deliver(self, kept: KeptResult) -> None:
        kept.sent = self._send_to is not None
        try:
            self._send(kept.result)
        except ProtocolError as exc:  # e.g. the value does not fit in a frame
            kept.run.log.warning("run_result_unsendable", code=exc.code.value)
            kept.result = self._failed(kept.run, "the result was too large to send").model_copy(
                update={"duration_ms": kept.result.duration_ms, "progress_dropped": kept.run.dropped}
            )
            self._send(kept.result)
        except Exception:
            kept.run.log.exception("run_result_send_failed")

    def knows(self, run_id: str) -> bool:
        """This table has taken the run in (it is active, or recently finished)."""
        return self._book.knows(run_id)

    def cancel_all(self, reason: CancelReason) -> None:
        """Cancel every run and refuse new ones (`shutdown`, `connection_lost`). Output held for a
        resume that cannot come any more is let go after the kill (`RunStreams.forsake`)."""
        for run in self._book.close(reason):
            self._cancel(run, reason)
            if run.streams is not None:
                run.streams.forsake()

    def _cancel(self, run: ActiveRun, reason: CancelReason) -> None:
        try:
            run.ctl.cancel(reason, asyncio.get_running_loop().time())
        except Exception:  # a failing kill callback must not stop the others
            run.log.exception("run_cancel_callback_failed")

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no run is active. Past `timeout`, cancel the tasks still running (they report
        and end at once) and return False."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
            return True
        except TimeoutError:
            for run in list(self._book.active.values()):
                if run.task is not None:
                    run.task.cancel()
            return False

    # --- execution ------------------------------------------------------------------------------

    async def _execute(self, run: ActiveRun) -> None:
        loop = asyncio.get_running_loop()
        assert run.ctl.deadline is not None
        timer = loop.call_at(run.ctl.deadline, self._cancel, run, CancelReason.DEADLINE_EXCEEDED)
        try:
            result = await self._outcome(run)
        except asyncio.CancelledError:
            # Our owner stopped waiting (shutdown bound passed): report what we know, then end.
            self._conclude(run, self._stopped(run))
            raise
        finally:
            timer.cancel()
        self._conclude(run, result)

    def _at_once(self, run: ActiveRun) -> Result:
        """A quick file call (`_answered_at_once`) run inline, its outcome the truth as in `_outcome`."""
        assert isinstance(run.prepared, FileCall)
        now = asyncio.get_running_loop().time
        started = now()
        try:
            check_active(run.ctl, started)
        except RunAborted:
            return self._stopped(run)
        try:
            value = run.prepared.call()
            return Result(
                run_id=run.rpc.run_id, state=RunState.SUCCEEDED, value=value, duration_ms=_ms(now() - started)
            )
        except ToolFailed as exc:
            return self._failed(run, str(exc), now() - started)
        except OSError as exc:
            return self._failed(run, f"cannot start {run.rpc.tool}: {exc.strerror or exc}", now() - started)
        except Exception as exc:  # one run's bug must not kill the agent
            run.log.exception("run_crashed")
            return self._failed(run, f"internal error: {type(exc).__name__}: {exc}", now() - started)

    async def _outcome(self, run: ActiveRun) -> Result:
        loop = asyncio.get_running_loop()
        try:
            check_active(run.ctl, loop.time())
        except RunAborted:
            return self._stopped(run)
        if isinstance(run.prepared, ProcessSpec):
            # A process has a start worth reporting (spawned, or not); a file call has only an end.
            self._send(Started(run_id=run.rpc.run_id))
            run.started = True
        started = loop.time()
        try:
            if isinstance(run.prepared, ProcessSpec):
                return self._from_process(run, await run.run_process(run.prepared, self._send, self._metrics))
            if isinstance(run.prepared, StreamCall):
                assert run.streams is not None
                drive = forwardrun.drive if run.prepared.kind in forwardrun.KINDS else copyrun.drive
                try:
                    value = await drive(run.prepared, run.streams, run.ctl)
                except copyrun.Interrupted:
                    return self._stopped(run)
                finally:
                    run.streams.abandon()
                return Result(
                    run_id=run.rpc.run_id, state=RunState.SUCCEEDED, value=value, duration_ms=_ms(loop.time() - started)
                )
            assert isinstance(run.prepared, FileCall)
            call = run.prepared
            if call.executor is not None:  # the run's user's threads (`--run-as`)
                value = await loop.run_in_executor(call.executor, call.call)
            else:
                value = call.call() if call.quick else await asyncio.to_thread(call.call)
            return Result(
                run_id=run.rpc.run_id,
                state=RunState.SUCCEEDED,
                value=value,
                duration_ms=_ms(loop.time() - started),
            )
        except ToolFailed as exc:
            return self._failed(run, str(exc), loop.time() - started)
        except OSError as exc:  # the command could not start: 127 / 126 as a shell says, if it is the program's
            if not isinstance(run.prepared, ProcessSpec):
                return self._failed(run, f"cannot start {run.rpc.tool}: {exc.strerror or exc}", loop.time() - started)
            how = spawn_failure(exc, run.prepared.argv[0])
            return self._failed(run, how.error, loop.time() - started, how.exit_code, how.reason)
        except Exception as exc:  # one run's bug must not kill the agent
            run.log.exception("run_crashed")
            return self._failed(run, f"internal error: {type(exc).__name__}: {exc}", loop.time() - started)

    # --- results --------------------------------------------------------------------------------

    def _from_process(self, run: ActiveRun, out: ProcessOutcome | PtyOutcome) -> Result:
        stdout = OutputTail(data=out.stdout.data, total=out.stdout.total)
        stderr = OutputTail(data=out.stderr.data, total=out.stderr.total)
        if run.streams is not None:
            stdout, stderr = run.streams.tails(stdout, stderr)
        end = process_end(
            killed=out.killed,
            exit_code=out.exit_code,
            signal=out.signal,
            cancel=run.ctl.cancellation.reason,
            cpu_seconds=run.ctl.budget.limit(CPU_SECONDS),
            cpu_used=run.ctl.budget.used(CPU_SECONDS),
            oom_kills=(run.usage.oom_kills or 0) if run.usage is not None else 0,
        )
        return Result(
            run_id=run.rpc.run_id,
            state=end.state,
            reason=end.reason,
            exit_code=out.exit_code,
            signal=out.signal,
            stage=out.stage if out.killed else None,
            stdout=stdout,
            stderr=stderr,
            truncated=out.stdout.truncated or out.stderr.truncated,
            duration_ms=_ms(out.duration),
            error=oom_error(run.memory_limit) if end.reason == OUT_OF_MEMORY else None,
            usage=run.usage,
            kill="cgroup" if out.contained else "process_group",
        )

    def _failed(
        self,
        run: ActiveRun,
        error: str,
        duration: float = 0.0,
        exit_code: int | None = None,
        reason: str = "tool failed",
    ) -> Result:
        return Result(
            run_id=run.rpc.run_id,
            state=RunState.FAILED,
            reason=reason,
            exit_code=exit_code,
            error=self._sanitize(error),
            duration_ms=_ms(duration),
        )

    def _stopped(self, run: ActiveRun) -> Result:
        """The run was stopped before (or instead of) producing an outcome."""
        end = stopped(run.ctl.lifecycle.termination, run.ctl.cancellation.reason)
        return Result(run_id=run.rpc.run_id, state=end.state, reason=end.reason)

    def _conclude(self, run: ActiveRun, result: Result) -> None:
        """Record the one terminal, forget the run, send the one result. Synchronous, so a cancel
        sees the run either active or already done, never in between."""
        if not self._book.end(run.rpc.run_id, run):
            return  # already concluded
        fact = final(run.ctl.lifecycle, RunEnd(result.state, result.reason), asyncio.get_running_loop().time())
        if fact is not None:  # a deadline or budget set the terminal first: it is what happened
            result = result.model_copy(update={"state": fact.state, "reason": fact.reason})
        result = result.model_copy(update={"progress_dropped": run.dropped})
        self._metrics.run_finished(run.rpc.run_id, result.state.value)
        if not self._book.active:
            self._idle.set()
        kept = self._keep(run, result) if self.window > 0 else KeptResult(run, result)
        if not kept.held:  # else it follows its streams' resume (`on_resume`)
            self._deliver(kept)
        run.log.info(
            AuditEvent.RUN_TERMINAL,
            state=result.state.value,
            exit_code=result.exit_code,
            signal=result.signal,
            stage=result.stage.value if result.stage else None,
            duration_ms=result.duration_ms,
            progress_dropped=run.dropped,
            args_digest=run.digest,
        )


def _answered_at_once(prepared: Prepared, rpc: Rpc) -> bool:
    """A file call known to be small (`FileCall.quick`: inline, no thread) on the loop's own
    identity, without streams: it ends before anything else can happen to it (a `cancel` behind
    it on the ordered stream finds it ended), so its `result` is sent at once, with no `accepted`
    before it: the Mind takes the result of a run it sent as its acceptance too."""
    return isinstance(prepared, FileCall) and prepared.quick and prepared.executor is None and rpc.streams is None


def _ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))
