"""The Mind's recorder (DESIGN §19): what the relay passes, kept in the recordings store.

The registry's shell hands it each frame it relays (`output`, `input`), each resize, and the
run's notes as the registry logs them (`on_log`: attached, detached, a leg away, the end); the
rules of a recording (what is kept, its bound, its gaps, its chain) are `mind.core.recording`'s.
Every `FLUSH_S` one task seals a block of each recording and writes them all in one batch: a
node killed -9 loses at most that much of a recording in progress, and the recording then ends at
its last block, without its signed `end` (`verify` says so).

Never stalls the relay: the relay's side only appends references to the relayed buffers. When the
store falls behind (more than `BEHIND_BYTES` sealed and not yet written) new bytes are only counted
and the recording marks a gap (`behind`); when a write fails (a full disk, a database away) its
blocks keep their events but their bytes become a gap (`store`) and are written again with the
next flush, so the chain never skips a number; the failure is logged once, counted, and shown in
`mind status` until a write succeeds. With `--record-strict` both cancel the runs being recorded
(reason `recording_failed`) instead: for those who must not run what they cannot record.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from mind.core.recording import METADATA_TOOLS, Block, Mode, Recording, command_of, records
from mind.store.api import StoreUnavailable
from mind.store.recordings import Batch, Listing, Recordings
from protocol.codes import CancelReason
from protocol.messages import Exec, RunEnd

if TYPE_CHECKING:
    from mind.core.runs import Run

log = structlog.get_logger("mind.recorder")

FLUSH_S = 0.5
FLUSH_BYTES = 8 << 20
"""Bytes kept since the last flush that wake the writer before its time (a fast run)."""
PACK_BELOW = 16 << 20
"""Bytes waiting for the writer under which it compresses (above: stored raw, see `Batch.pack`)."""
BEHIND_BYTES = 64 << 20
"""Bytes kept and not yet written past which new bytes are counted instead of kept."""
PRUNE_EVERY_S = 3600.0
NOTES = {
    "run_attached": "attached",
    "run_detached": "detached",
    "run_client_away": "client_away",
    "run_hand_away": "hand_away",
    "run_rebound": "rebound",
    "run_attach_replaced": "attached",
}
"""The registry's log events a recording keeps, and the name it keeps them by."""


@dataclass
class Settings:
    mode: Mode = Mode.OFF
    max_bytes: int = 64 << 20
    strict: bool = False
    retention_s: float = 90 * 86400.0
    node: str = ""


def kind_of(tool: str, pty: bool) -> str:
    if pty:
        return "terminal"
    if tool == "forward":
        return "forward"
    return "copy" if tool in METADATA_TOOLS else "streams"


class Recorder:
    def __init__(
        self,
        settings: Settings,
        store: Recordings,
        cancel: Callable[[str, CancelReason], None],
        count_gap: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.settings = settings
        self.store = store
        self._cancel = cancel
        self._count_gap = count_gap
        self.live: dict[str, Recording] = {}
        self._listings: dict[str, Listing] = {}
        self._begun: list[Listing] = []
        self._updated: dict[str, Listing] = {}
        self._retry: list[Block] = []
        self._queued = 0
        """Stream bytes kept and not yet written."""
        self._wake = asyncio.Event()
        self._since_flush = 0
        self.failing: str | None = None
        """The store's last error while writes fail; None when they succeed."""
        self.failing_since: float | None = None

    @property
    def on(self) -> bool:
        return self.settings.mode is not Mode.OFF

    # --- the relay's side (on the loop, never waits) ---

    def begin(self, run: Run, req: Exec, owner: str) -> None:
        """A run was admitted: recorded if `--record` says so, its start noted."""
        pty = req.streams.pty if req.streams is not None else None
        if run.terminal or not records(self.settings.mode, req.tool, pty is not None, background=False):
            return
        now, wall = time.monotonic(), time.time()
        streams = req.tool not in METADATA_TOOLS and req.streams is not None
        rec = Recording(run.run_id, now, self.settings.max_bytes, streams=streams)
        command = command_of(req.tool, req.args)
        start = {
            "run_id": run.run_id,
            "hand": req.hand,
            "client": owner,
            "tool": req.tool,
            "command": command,
            "started": wall,
            "node": self.settings.node,
            "mode": self.settings.mode.value,
        }
        if pty is not None:
            start["term"] = pty.term
        rec.note("start", start, now)
        if pty is not None:
            rec.on_resize(pty.cols, pty.rows, now)
        self.live[run.run_id] = rec
        listing = Listing(run.run_id, req.hand, owner, req.tool, kind_of(req.tool, pty is not None), command, wall)
        listing.node = self.settings.node
        self._listings[run.run_id] = listing
        self._begun.append(listing)

    def output(self, run_id: str, stream: str, payload: memoryview | bytes) -> None:
        rec = self.live.get(run_id)
        if rec is not None:
            before = rec.recorded
            rec.on_output(stream, payload, time.monotonic(), self._queued > BEHIND_BYTES)
            self._kept(rec.recorded - before)

    def input(self, run_id: str, payload: memoryview | bytes) -> None:
        rec = self.live.get(run_id)
        if rec is not None:
            before = rec.recorded
            rec.on_input(payload, time.monotonic(), self.settings.mode is Mode.ALL, self._queued > BEHIND_BYTES)
            self._kept(rec.recorded - before)

    def _kept(self, n: int) -> None:
        if n:
            self._queued += n
            self._since_flush += n
            if self._since_flush >= FLUSH_BYTES:
                self._wake.set()

    def resize(self, run_id: str, cols: int, rows: int) -> None:
        rec = self.live.get(run_id)
        if rec is not None:
            rec.on_resize(cols, rows, time.monotonic())

    def on_log(self, event: str, fields: dict[str, Any], run: Run | None) -> None:
        """A registry log event about a recorded run: a note, its end (`run_terminal`), the run
        leaving for another node (`run_handed_over`), or a run this node adopted (`run_adopted`)."""
        run_id = fields.get("run_id")
        rec = self.live.get(run_id) if isinstance(run_id, str) else None
        if rec is None:
            if event == "run_adopted" and run is not None:
                self.adopt(run)
            return
        now = time.monotonic()
        name = NOTES.get(event)
        if event == "run_handed_over":
            rec.note("moved", {"claim": fields.get("claim")}, now)
            rec.release(now)
        elif name is not None:
            rec.note(name, {k: v for k, v in fields.items() if k in ("client", "keep_s", "window_s", "from_gen")}, now)
        elif event == "run_terminal" and run is not None and run.end is not None:
            self.end(rec, run.end, time.time(), now)

    def adopt(self, run: Run) -> None:
        """A run this node did not admit (its Hand moved here from another node, or this Mind
        restarted): its recording goes on where the store has it (`_resume` at the next flush),
        or starts here if none was kept."""
        pty = "pty" in run.relays
        if not records(self.settings.mode, run.tool, pty, background=run.background is not None):
            return
        now = time.monotonic()
        rec = Recording(
            run.run_id, now, self.settings.max_bytes, streams=run.tool not in METADATA_TOOLS and bool(run.relays)
        )
        rec.continued = True
        rec.note("resumed", {"node": self.settings.node}, now)
        self.live[run.run_id] = rec
        self._listings[run.run_id] = Listing(
            run.run_id, run.hand, run.owner, run.tool, kind_of(run.tool, pty), {}, run.created_wall, self.settings.node
        )

    async def _resume(self, rec: Recording) -> None:
        """A continued recording's place in the store (see `Recording.resume`); none stored: it
        starts here, with what this node knows of the run (not its command: the Hand never
        presents its arguments)."""
        listing = self._listings[rec.run_id]
        stored = await self.store.listing(rec.run_id)
        last = await self.store.last_seq(rec.run_id) if stored is not None else -1
        if stored is None or last < 0:
            start = {"run_id": rec.run_id, "hand": listing.hand, "client": listing.client, "tool": listing.tool}
            rec.pending.insert(0, [0, "m", "start", {**start, "started": listing.started, "node": listing.node}])
            self._begun.append(listing)
            rec.resume(0, 0, rec.started - max(0.0, time.time() - listing.started))
            return
        stored.node = self.settings.node
        stored.ended, stored.state, stored.exit_code = (
            listing.ended,
            listing.state,
            listing.exit_code,
        )  # it may have ended meanwhile
        self._listings[rec.run_id] = stored
        rec.resume(last + 1, stored.bytes, rec.started - max(0.0, time.time() - stored.started))

    def end(self, rec: Recording, end: RunEnd, wall: float, now: float) -> None:
        fields: dict[str, Any] = {
            "state": end.state.value,
            "exit_code": end.exit_code,
            "signal": end.signal,
            "reason": end.reason,
            "ended": wall,
        }
        if not rec.streams and isinstance(end.value, dict):  # a copy's digest and size, as the Hand gave them
            fields["value"] = {k: v for k, v in end.value.items() if k in ("sha256", "size", "bytes", "files")}
        rec.end(fields, now)
        listing = self._listings.get(rec.run_id)
        if listing is not None:
            listing.ended, listing.state, listing.exit_code = wall, end.state.value, end.exit_code

    def listing(self, run_id: str) -> Listing | None:
        """A recording this node is making, before its first flush wrote its listing (`mind play
        --follow` right after a start finds it, with no blocks yet)."""
        return self._listings.get(run_id)

    # --- the writer's side ---

    def _seal(self) -> Batch:
        now = time.monotonic()
        batch = Batch(begun=self._begun, blocks=self._retry, pack=self._queued < PACK_BELOW)
        self._begun, self._retry = [], []
        self._since_flush = 0
        for run_id, rec in list(self.live.items()):
            if rec.continued:  # its place in the store is not known yet: sealed at a later flush
                continue
            blocks = rec.seal(now)
            batch.blocks += blocks
            listing = self._listings.get(run_id)
            if listing is not None and (blocks or rec.ended):
                listing.bytes, listing.blocks, listing.gaps = rec.recorded, rec.seq, rec.gaps
                self._updated[run_id] = listing
            if rec.ended or rec.released:
                del self.live[run_id]
                self._listings.pop(run_id, None)
        batch.updated = list(self._updated.values())
        self._updated = {}
        return batch

    async def flush(self) -> None:
        """Seal and write one batch; on failure, keep what must be written again (see the module)."""
        for rec in [r for r in self.live.values() if r.continued]:
            await self._resume(rec)
        batch = self._seal()
        if not batch:
            return
        queued = sum(b.nbytes for b in batch.blocks)
        try:
            await self.store.write(batch)
        except (OSError, sqlite3.Error, StoreUnavailable) as exc:
            self._failed(batch, str(exc))
        else:
            if self.failing is not None:
                log.warning("recording_store_back", after_s=round(time.time() - (self.failing_since or 0), 1))
            self.failing = self.failing_since = None
        finally:
            self._queued = max(0, self._queued - queued)
        if self._queued > BEHIND_BYTES and self.settings.strict:
            self._strict("the recording store fell behind")

    def _failed(self, batch: Batch, why: str) -> None:
        if self.failing is None:
            log.error("recording_store_failed", error=why, blocks=len(batch.blocks), runs=len(self.live))
            self.failing_since = time.time()
        self.failing = why
        self._begun = batch.begun + self._begun
        lost = 0
        for b in batch.blocks:
            kept, dropped, gaps = [], 0, 0
            for e in b.events:
                if e[1] in ("o", "i"):
                    n = len(e[-1])
                    dropped += n
                    gaps += 1
                    kept.append([e[0], "g", e[2] if e[1] == "o" else "stdin", n, "store"])
                else:
                    kept.append(e)
            for e in kept:  # the end, if this block holds it, counts what is kept now
                if e[1] == "m" and e[2] == "end":
                    e[3] = {**e[3], "recorded": e[3]["recorded"] - dropped, "gaps": e[3]["gaps"] + gaps}
            rec = self.live.get(b.run_id)
            if rec is not None:
                rec.recorded -= dropped
                rec.gaps += gaps
            listing = next((x for x in batch.updated if x.run_id == b.run_id), None)
            if listing is not None:
                listing.bytes, listing.gaps = listing.bytes - dropped, listing.gaps + gaps
            lost += dropped
            self._retry.append(Block(b.run_id, b.seq, b.t, kept, 0, b.last))
        for x in batch.updated:
            self._updated.setdefault(x.run_id, x)
        if lost:
            self._count_gap(lost)
        if self.settings.strict:
            self._strict(f"the recording store failed: {why}")

    def _strict(self, why: str) -> None:
        """`--record-strict`: the runs being recorded are cancelled, with the reason in the log."""
        runs = [r for r, rec in self.live.items() if not rec.ended]
        if runs:
            log.error("recording_strict_cancel", runs=len(runs), why=why)
        for run_id in runs:
            self._cancel(run_id, CancelReason.RECORDING_FAILED)

    def status(self) -> str:
        if not self.on:
            return "off"
        what = f"{self.settings.mode.value}, {len(self.live)} in progress"
        if self.failing is not None:
            since = time.strftime("%H:%M:%S", time.localtime(self.failing_since or 0))
            return f"{what}; FAILING since {since}: {self.failing}"
        return f"{what}; keeping up"

    async def run(self) -> None:
        """The flush loop, and the retention's pruning (owned by the server's task group)."""
        last_prune = 0.0
        while True:
            try:
                async with asyncio.timeout(FLUSH_S):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.flush()
                if time.monotonic() - last_prune > PRUNE_EVERY_S:
                    last_prune = time.monotonic()
                    n = await self.store.prune(time.time() - self.settings.retention_s)
                    if n:
                        log.info("recordings_pruned", count=n, retention_s=self.settings.retention_s)
            except (OSError, sqlite3.Error, StoreUnavailable) as exc:
                log.error("recordings_prune_failed", error=str(exc))

    async def close(self) -> None:
        """At a clean stop: what is sealed is written (the runs go on on their Hands; a recording
        stays open and ends at its last block, as after a crash)."""
        try:
            async with asyncio.timeout(5.0):
                await self.flush()
        except TimeoutError:
            log.error("recordings_not_flushed", runs=len(self.live))
