"""Fleet runs from Python (DESIGN §12): `mc.exec_many(selector, tool, args, ...)`.

```python
async with await MindClient.connect(url, cred) as mc:
    fleet = mc.exec_many("role=web", "exec", {"argv": ["uptime"]}, max_concurrency="10%", max_errors=2)
    async for ev in fleet:            # FleetEvent: per-Hand events, then one `aggregate`
        if ev.kind == "output":
            print(ev.hand, ev.msg.stream, ev.msg.data)
    print(fleet.aggregate.exit_code, fleet.aggregate.counts, fleet.results["web1"].state)
```
`await fleet.wait()` does the same without looking at the events.

The asyncio shell around the pure plan (mind/core/fleet.py): the selection comes from the Mind
(`select_hands`: its names and labels, within the client's scope), every member is an ordinary
`exec` run on the one connection (its own terminal state, generation fencing, `lost` when its
Hand drops) tagged with the fleet id, and the aggregate is derived from the members' ends only.
Each member's events pass through a small bounded queue, so a consumer that reads slowly slows
the runs' output (stream credit) instead of filling memory.

Events (`FleetEvent.kind`):
  `selected`          once, first: `fleet.selection` holds the Hands (nothing ran yet)
  `start`             a member run was sent to `hand`
  `named`             its run's id is known (`fleet.results[hand].run_id`; the client names every
                      run, so this follows `start` at once, before the Mind answers)
  `state` / `output`  the member's `RunUpdate` / `StreamData` (or `RunOutput`), as `msg`
  `cancel_requested`  a cancel was sent for `hand` (Ctrl-C, `--fail-fast`); its end follows
  `end`               the member's authoritative `RunEnd` (`msg`), or an end the plan decided
                      (`state` is `not_started`, `hand_offline` or `undeliverable`; `msg` None)
  `aggregate`         last: `fleet.aggregate`
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from mind.core import fleet as plan_core
from mind.errors import ClientCode, ClientError
from protocol import limits
from protocol.codes import RejectCode
from protocol.messages import RunEnd, RunOutput, RunUpdate, SelectedHand, StreamData
from protocol.states import RunState

RunEvent = RunUpdate | RunOutput | StreamData | RunEnd
"""(as `mind.client.aio.RunEvent`: this module does not import aio, which imports it)"""
ONLINE_POLL_S = 0.5
"""How often a fleet with offline Hands inside a delivery window asks the Mind who connected."""


@dataclass
class FleetEvent:
    kind: str
    hand: str | None = None
    msg: Any = None
    state: str | None = None


@dataclass
class HandResult:
    """One selected Hand's outcome: its run's end, or the end the plan gave it without a run."""

    hand: str
    state: str
    run_id: str | None = None
    end: RunEnd | None = None
    bytes: dict[str, int] = field(default_factory=dict)
    """Bytes received per output stream."""

    @property
    def exit_code(self) -> int | None:
        return self.end.exit_code if self.end is not None else None


class EmptySelection(ClientError):
    def __init__(self, selector: str) -> None:
        super().__init__(ClientCode.EMPTY_SELECTION, f"no Hand matches {selector!r} (within this client's scope)")
        self.selector = selector


class FleetRun:
    """One fleet run: iterate it once for its events; `aggregate` and `results` are filled as it
    goes (complete after the `aggregate` event)."""

    def __init__(
        self,
        client: Any,
        # (a `mind.client.aio.MindClient`; not imported: aio imports this module)
        selector: str,
        tool: str,
        args: dict[str, Any],
        *,
        max_concurrency: str | int = plan_core.DEFAULT_MAX_CONCURRENCY,
        max_errors: str | int = plan_core.DEFAULT_MAX_ERRORS,
        deliver_within: float | None = None,
        fail_fast: bool = False,
        timeout: float = limits.RUN_TIMEOUT_DEFAULT_S,
        grace: float | None = None,
        stream: bool | None = None,
        watch: bool = False,
        output_limit: int = limits.OUTPUT_LIMIT_DEFAULT,
        fleet_id: str | None = None,
        selection: list[SelectedHand] | None = None,
    ) -> None:
        self.client = client
        self.selector = selector
        self.tool = tool
        self.args = args
        self.max_concurrency = str(max_concurrency)
        self.max_errors = str(max_errors)
        self.deliver_within = deliver_within
        self.fail_fast = fail_fast
        self.timeout = timeout
        self.grace = grace
        self.stream = stream
        self.watch = watch
        self.output_limit = output_limit
        self.fleet_id = fleet_id
        """Minted by the Mind for this client when the run starts (`open_fleet`), unless given."""
        self.selection: list[SelectedHand] | None = selection
        self.results: dict[str, HandResult] = {}
        self.aggregate: plan_core.Aggregate | None = None
        self.plan: plan_core.FleetPlan | None = None
        self._handles: dict[str, Any] = {}
        """Hand -> its run's `RunHandle`."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancels: set[asyncio.Task[None]] = set()
        self._queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue(maxsize=64)
        self._interrupt = asyncio.Event()
        self._lost: ClientError | None = None
        self._iterated = False

    # --- control ---

    def cancel(self) -> None:
        """As Ctrl-C: cancel every run in flight, start no more; the ends still arrive."""
        self._interrupt.set()

    def handle(self, hand: str) -> Any:
        """`hand`'s run (its `RunHandle`) once it was started, else None: to detach it, or to cancel
        that one run alone."""
        return self._handles.get(hand)

    async def wait(self) -> plan_core.Aggregate:
        async for _ in self:
            pass
        assert self.aggregate is not None
        return self.aggregate

    # --- the driver ---

    def __aiter__(self) -> AsyncIterator[FleetEvent]:
        if self._iterated:
            raise ClientError(ClientCode.INVALID_REQUEST, "a fleet run can be iterated once")
        self._iterated = True
        return self._run()

    async def _run(self) -> AsyncIterator[FleetEvent]:
        if self.fleet_id is None:
            self.fleet_id = await self.client.open_fleet()
        if self.selection is None:
            self.selection = await self.client.select_hands(self.selector)
        if not self.selection:
            raise EmptySelection(self.selector)
        total = len(self.selection)
        try:
            concurrency = plan_core.resolve_concurrency(self.max_concurrency, total)
            errors = plan_core.resolve_errors(self.max_errors, total)
        except plan_core.LimitError as exc:
            raise ClientError(ClientCode.INVALID_REQUEST, str(exc)) from None
        plan = self.plan = plan_core.FleetPlan(
            [(h.name, h.connected) for h in self.selection],
            max_concurrency=concurrency,
            max_errors=errors,
            deliver_within=self.deliver_within,
            fail_fast=self.fail_fast,
            now=time.monotonic(),
        )
        yield FleetEvent("selected")
        pending: list[plan_core.Action] = plan.next(time.monotonic())
        interrupted_seen = False
        try:
            while True:
                for ev in await self._perform(pending):
                    yield ev
                pending = []
                if plan.done:
                    break
                if self._interrupt.is_set() and not interrupted_seen:
                    interrupted_seen = True
                    pending = plan.interrupt(time.monotonic())
                    continue
                item = await self._next_item(plan, watch_interrupt=not interrupted_seen)
                now = time.monotonic()
                if item is None:  # a timer: delivery windows, or who connected
                    pending = plan.next(now)
                    if plan.offline() and not plan.stopped:
                        pending += await self._poll_online(plan, now)
                    continue
                kind, hand, payload = item
                if kind == "event":
                    ev = self._on_event(hand, payload)
                    if isinstance(payload, RunEnd):
                        assert ev.state is not None
                        pending = plan.on_end(hand, ev.state, now)
                        if hand not in plan.ends:  # gone since the selection: wait for it (delivery window)
                            self.results[hand] = HandResult(hand, "pending")
                            ev = FleetEvent("state", hand, None, "waiting_for_hand")
                    yield ev
                elif kind == "named":
                    yield FleetEvent("named", hand)
                elif kind == "failed":
                    failure: ClientError = payload
                    cut = failure.code is ClientCode.CLOSED
                    if failure.code is ClientCode.PROTOCOL or (cut and not self.client.riding_out):
                        # the connection is gone for good: every run with it
                        self._lost = self._lost or failure
                        if not plan.abandoned:
                            pending = plan.abandon(now)
                        continue
                    if hand not in plan.in_flight:
                        continue
                    r = self.results.setdefault(hand, HandResult(hand, RunState.LOST.value))
                    # refused before admission (an `error` reply): nothing ran; after it, or a start
                    # cut before its answer while the client rides the cut out (the others go on
                    # re-attached), nobody knows
                    r.state = RunState.LOST.value if r.run_id is not None or cut else RunState.REJECTED.value
                    yield FleetEvent("end", hand, None, r.state)
                    pending = plan.on_end(hand, r.state, now)
        finally:
            for t in self._tasks.values():
                t.cancel()
        self.aggregate = plan.aggregate()
        yield FleetEvent("aggregate")

    async def _next_item(self, plan: plan_core.FleetPlan, watch_interrupt: bool) -> tuple[str, str, Any] | None:
        """The next member event, or None when a timer is due (or, if `watch_interrupt`, a cancel
        was asked for: once it has been acted on it is not watched again, or this would spin)."""
        wait: float | None = None
        deadline = plan.deadline()
        if deadline is not None:
            wait = max(0.0, min(deadline - time.monotonic(), ONLINE_POLL_S))
        getter = asyncio.ensure_future(self._queue.get())
        waiting: set[asyncio.Future[Any]] = {getter}
        stopper = asyncio.ensure_future(self._interrupt.wait()) if watch_interrupt else None
        if stopper is not None:
            waiting.add(stopper)
        try:
            done, _ = await asyncio.wait(waiting, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if stopper is not None:
                stopper.cancel()
        if getter in done:
            return getter.result()
        getter.cancel()
        try:
            await getter
        except asyncio.CancelledError:
            pass
        else:  # it completed while being cancelled: keep the item
            return getter.result()
        return None

    async def _poll_online(self, plan: plan_core.FleetPlan, now: float) -> list[plan_core.Action]:
        """Ask who of the offline members connected: by name, not as a selector, so any number
        of offline Hands costs the Mind one lookup each (issue 23: past ~455 names the selector
        this used to build was too long, and the fleet died with a traceback)."""
        acts: list[plan_core.Action] = []
        offline = plan.offline()
        try:
            found = await self.client.which_connected(offline)
        except ClientError:
            return acts
        for name in sorted(found):
            if name in offline:
                acts += plan.on_online(name, now)
        return acts

    async def _perform(self, acts: list[plan_core.Action]) -> list[FleetEvent]:
        out: list[FleetEvent] = []
        for a in acts:
            if isinstance(a, plan_core.Start):
                self.results[a.hand] = HandResult(a.hand, "pending")
                self._tasks[a.hand] = asyncio.get_running_loop().create_task(self._member(a.hand))
                out.append(FleetEvent("start", a.hand))
            elif isinstance(a, plan_core.Skip):
                self.results[a.hand] = HandResult(a.hand, a.state)
                out.append(FleetEvent("end", a.hand, None, a.state))
            elif isinstance(a, plan_core.Cancel):
                out.append(FleetEvent("cancel_requested", a.hand))
                t = asyncio.get_running_loop().create_task(self._cancel(a.hand))
                self._cancels.add(t)
                t.add_done_callback(self._cancels.discard)
        return out

    async def _cancel(self, hand: str) -> None:
        """Ask the Mind to cancel `hand`'s run (once its id is known); the run's end says how."""
        for _ in range(200):
            h = self._handles.get(hand)
            if h is not None:
                break
            await asyncio.sleep(0.01)
        else:
            return
        try:
            await h.cancel()
        except ClientError:
            pass  # ended already, or the connection went: the run's own end says so

    async def _member(self, hand: str) -> None:
        try:
            handle = await self.client.start(
                hand,
                self.tool,
                self.args,
                self.timeout,
                self.grace,
                watch=self.watch,
                stream=self.stream,
                output_limit=self.output_limit,
                fleet=self.fleet_id,
            )
            self._handles[hand] = handle
            if handle.run_id is not None:  # named by the client: known now, before any answer
                self.results.setdefault(hand, HandResult(hand, "pending")).run_id = handle.run_id
                await self._queue.put(("named", hand, handle.run_id))
            async for ev in handle.events():
                await self._queue.put(("event", hand, ev))
        except ClientError as exc:
            await self._queue.put(("failed", hand, exc))

    def _on_event(self, hand: str, ev: RunEvent) -> FleetEvent:
        r = self.results.setdefault(hand, HandResult(hand, "pending"))
        if r.run_id is None:
            r.run_id = getattr(ev, "run_id", None)
        if isinstance(ev, RunEnd):
            r.end = ev
            r.state = ev.state.value
            if ev.state is RunState.REJECTED and ev.reject_code is RejectCode.HAND_OFFLINE:
                r.state = plan_core.HAND_OFFLINE
            return FleetEvent("end", hand, ev, r.state)
        if isinstance(ev, StreamData):
            if ev.data:
                r.bytes[ev.stream] = r.bytes.get(ev.stream, 0) + len(ev.data)
            return FleetEvent("output", hand, ev)
        if isinstance(ev, RunOutput):
            r.bytes[ev.stream] = r.bytes.get(ev.stream, 0) + len(ev.data)
            return FleetEvent("output", hand, ev)
        return FleetEvent("state", hand, ev, ev.state.value)
