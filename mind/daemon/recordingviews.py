"""`mind recordings`, `mind play` and `mind recordings verify` as the Mind answers them (DESIGN §19).

Who may read: a client reads its own runs' recordings; a credential with the `recordings` scope
(and the admin) those of the Hands its scope names (`Scope.may_read_recording`). A recording one
may not read is answered exactly as one that does not exist, so its existence does not leak.
Every read is audited (`recording_read`: who, which run, what), refused ones too.

The recordings are read from the store, not from memory: any node of a shared database answers
for any recording, and a recording in progress is read as far as its last flush.
"""

from __future__ import annotations

from typing import Any

import structlog

from mind.core import recording
from mind.core.paging import task_cursor
from mind.core.runlist import parse_cursor
from mind.daemon.host import Host
from mind.daemon.peer import Peer
from mind.store.recordings import PAGE_BYTES, Listing, Recordings
from protocol.audit import AuditEvent
from protocol.codes import ErrorCode
from protocol.messages import (
    Error,
    GetRecording,
    ListRecordings,
    RecordingBlock,
    RecordingCheck,
    RecordingInfo,
    RecordingList,
    RecordingPage,
    VerifyRecordings,
    VerifyResult,
)

log = structlog.get_logger("mind.recordings")

VERIFY_ALL_MAX = 10_000
"""Recordings one `verify --all` checks at most (newest first); the answer says when it stopped."""


def info_of(x: Listing) -> RecordingInfo:
    return RecordingInfo.model_validate(x.to_dict())


class RecordingViews:
    def __init__(self, mind: Host) -> None:
        self.mind = mind

    @property
    def store(self) -> Recordings | None:
        return self.mind.recordings

    def _unknown(self, peer: Peer, id_: str, run_id: str) -> None:
        """A recording that does not exist and one this client may not read get the same answer:
        `denied_by_scope`, and the same words. Only a client that may read every recording (the
        admin) is told `unknown_run`: to it, nothing is hidden."""
        scope = peer.scope
        everything = scope.recordings and scope.hands == ("*",)
        code = ErrorCode.UNKNOWN_RUN if everything else ErrorCode.DENIED_BY_SCOPE
        peer.outbox.put(Error(code=code, message=f"no recording of run {run_id} that you may read"), id_)

    def _may(self, peer: Peer, x: Listing | None) -> bool:
        return x is not None and peer.scope.may_read_recording(x.hand, x.client, peer.ident.label)

    async def list(self, peer: Peer, id_: str, msg: ListRecordings) -> None:
        assert self.store is not None
        before = None
        if msg.after is not None:
            before = parse_cursor(msg.after)
            if before is None:
                peer.outbox.put(
                    Error(code=ErrorCode.INVALID_PAYLOAD, message="after: not a cursor of recording_list"), id_
                )
                return
        items: list[RecordingInfo] = []
        more = False
        scanned = 0
        while len(items) < msg.limit and scanned < 20 * msg.limit:
            rows = await self.store.find(msg.hand, msg.client, msg.since, msg.limit, before)
            scanned += len(rows)
            for x in rows:
                before = (x.started, x.run_id)
                if self._may(peer, x):
                    items.append(info_of(x))
                    if len(items) == msg.limit:
                        break
            if len(rows) < msg.limit:
                break
        else:
            more = True
        if len(items) == msg.limit:
            more = True
        next_after = task_cursor(items[-1].started, items[-1].run_id) if more and items else None
        log.info(AuditEvent.RECORDING_READ, client=peer.ident.label, what="list", count=len(items))
        peer.outbox.put(RecordingList(items=items, next_after=next_after), id_)

    async def get(self, peer: Peer, id_: str, msg: GetRecording) -> None:
        assert self.store is not None
        x = await self.store.listing(msg.run_id)
        if x is None and self.mind.recorder is not None:
            x = self.mind.recorder.listing(msg.run_id)
        allowed = self._may(peer, x)
        if msg.after == -1 or not allowed:  # a page of a play is one read, audited once at its start
            log.info(
                AuditEvent.RECORDING_READ, client=peer.ident.label, what="play", run_id=msg.run_id, allowed=allowed
            )
        if not allowed or x is None:
            self._unknown(peer, id_, msg.run_id)
            return
        blocks = await self.store.blocks(msg.run_id, msg.after, PAGE_BYTES)
        last = blocks[-1].seq if blocks else msg.after
        more = bool(blocks) and last < await self.store.last_seq(msg.run_id)
        page = RecordingPage(
            info=info_of(x),
            blocks=[
                RecordingBlock(seq=b.seq, t=b.t, data=b.data, compressed=b.compressed, head=b.head, mac=b.mac)
                for b in blocks
            ],
            more=more,
        )
        peer.outbox.put(page, id_)

    async def verify(self, peer: Peer, id_: str, msg: VerifyRecordings) -> None:
        assert self.store is not None
        if msg.run_id is not None:
            x = await self.store.listing(msg.run_id)
            if not self._may(peer, x):
                log.info(
                    AuditEvent.RECORDING_READ, client=peer.ident.label, what="verify", run_id=msg.run_id, allowed=False
                )
                self._unknown(peer, id_, msg.run_id)
                return
            assert x is not None
            listings = [x]
        else:
            listings = []
            before = None
            while len(listings) < VERIFY_ALL_MAX:
                rows = await self.store.find(None, None, None, 500, before)
                listings += [x for x in rows if self._may(peer, x)]
                if len(rows) < 500:
                    break
                before = (rows[-1].started, rows[-1].run_id)
        items = []
        for x in listings:
            items.append(await self._check(x))
        log.info(
            AuditEvent.RECORDING_READ,
            client=peer.ident.label,
            what="verify",
            count=len(items),
            broken=sum(1 for c in items if not c.ok),
        )
        peer.outbox.put(VerifyResult(items=items), id_)

    async def _check(self, x: Listing) -> RecordingCheck:
        assert self.store is not None
        blocks: list[recording.Stored] = []
        after = -1
        while True:
            page = await self.store.blocks(x.run_id, after)
            if not page:
                break
            blocks += page
            after = page[-1].seq
        listing: dict[str, Any] = {"hand": x.hand, "client": x.client, "tool": x.tool}
        if x.state is not None:
            listing.update(state=x.state, exit_code=x.exit_code)
        c = recording.verify(x.run_id, blocks, self.mind.recording_key, listing)
        return RecordingCheck(
            run_id=x.run_id, ok=c.ok, problem=c.problem, at=c.at, blocks=c.blocks, complete=c.complete
        )
