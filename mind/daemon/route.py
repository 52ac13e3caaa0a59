"""Routing between Mind nodes (DESIGN §16, issue 27 item 4): a client on this node asking for a
Hand another node holds is served through that node, over one authenticated node-to-node link per
peer node, at most one extra hop.

The node holding the Hand stays the run's authority (its registry, its endings, its claim): this
node only relays. It checks the client's scope first, then sends the request on the link with the
client named as its owner (`on_behalf_of`), and relays every answer under the request's envelope
id back to the client under the client's own id. The link authenticates with the node credential
(`mind.core.nodes.NODE_LABEL`, read from the shared database): the holding node believes the owner
named only because the link proved it is a node.

What is relayed: a run (`exec`, every tool call such as `read_file`), `run get`, `cancel` and
`attach` of a run relayed here, or of a run another live node holds (`Router.find` asks them).
A streamed run's data frames are forwarded as received, only their header's stream number
rewritten: the link's numbers (given by the holding node) to numbers of this node's
own on the client's connection, from `ROUTED_NUMBER_BASE` up, so they never meet the numbers the
registry gives the same connection for its local runs (it counts from 1). Flow control is the
holding node's: acknowledgements pass through both ways, so no bytes wait here beyond a window.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from mind.client.dial import Dial, open_connection
from mind.client.session import ClientSession
from mind.core.nodes import NODE_LABEL
from mind.daemon.peer import CLOSE_TRY_LATER, Peer, close_quietly
from mind.store.api import Credentials, Nodes
from protocol import frames
from protocol.auth import Credential
from protocol.codes import ErrorCode, RejectCode
from protocol.envelope import check, known_type, unpack, validate
from protocol.errors import MindhandError, ProtocolError
from protocol.ids import new_id
from protocol.messages import CancelRun, Detach, Error, GetRun, Message, RunInfo
from protocol.states import RUN_TERMINAL

log = structlog.get_logger(component="mind")

LINK_OPEN_TIMEOUT_S = 5.0
"""A peer node that has not welcomed the link by then is not reachable now: the client is told so."""
ROUTED_RUNS_MAX = 10_000
"""Runs relayed through this node remembered for `run get`/`cancel` (the oldest forgotten first)."""
ROUTED_NUMBER_BASE = 1 << 31
"""The first stream number this node gives a client for a relayed run's stream (above every number
its registry gives: those count from 1 per connection)."""
FORGET_HOLDER = frozenset({RejectCode.HAND_OFFLINE.value, RejectCode.UNKNOWN_HAND.value})
"""A relayed run refused with one of these: the Hand moved or left since it was looked up."""
LINK_CLOSED = (
    "the link to the Mind node holding this Hand closed; the run's fate is with that node "
    "(ask it: mind run get RUN_ID --mind ITS_URL)"
)


@dataclass
class Forward:
    """A relayed request waiting for its answers: to whom, under which id, for which owner."""

    peer: Peer
    client_id: str
    owner: str
    run: bool
    """An `exec`: answers until `run_end` (or `error`); otherwise one reply."""
    hand: str = ""
    numbers: list[tuple[int, int]] | None = None
    run_id: str | None = None
    """A streamed run's (link number, client number) pairs, dropped when it ends."""
    answer: asyncio.Future[Message | None] | None = None
    """A question of this node's own (`Router.ask`): its one reply goes here, not to the client
    (None: the link was lost)."""


@dataclass
class RoutedRun:
    link: Link
    hand: str
    owner: str


class Link:
    """One authenticated connection to a peer node, shared by every relayed request to it."""

    def __init__(self, router: Router, url: str) -> None:
        self.router = router
        self.url = url
        self.waiting: dict[str, Forward] = {}
        self._ws: ClientConnection | None = None
        self._session: ClientSession | None = None
        self._open = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self.numbers: dict[int, tuple[Forward, int]] = {}
        """Link stream number -> (the run's forward, its number on the client's connection)."""

    @property
    def ready(self) -> bool:
        """Open now: a request is written at once (`relay`), without a task to open it."""
        return self._ws is not None and self._session is not None and self._session.error is None

    async def _ensure(self) -> ClientSession:
        async with self._open:
            if self._ws is not None and self._session is not None and self._session.error is None:
                return self._session
            cred = await self.router.credential()
            ws, session, _ = await open_connection(
                Dial(self.url, cred, LINK_OPEN_TIMEOUT_S, None, None), LINK_OPEN_TIMEOUT_S
            )
            self._ws, self._session = ws, session
            self._reader = asyncio.get_running_loop().create_task(self._read(ws, session))
            log.info("node_link_open", url=self.url)
            return session

    async def forward(self, msg: Message, fwd: Forward) -> None:
        """`offer`, the client told `busy` if the peer node cannot be reached."""
        await self.offer(msg, fwd)

    def relay(self, msg: Message, fwd: Forward) -> None:
        """`forward` on a link that is `ready`: written before this returns (no task, no await)."""
        assert self._session is not None
        try:
            self._sent(self._session, msg, fwd)
        except (MindhandError, ConnectionClosed, OSError) as exc:
            self._failed(fwd, exc, True)

    def _sent(self, session: ClientSession, msg: Message, fwd: Forward) -> None:
        link_id = new_id("x")
        session.send(msg, link_id)
        self.waiting[link_id] = fwd
        named = getattr(msg, "run_id", None) if fwd.run else None
        if named is not None:  # a run its client named: known here before any answer (none may come until its end)
            fwd.run_id = named
            self.router.remember(named, RoutedRun(self, fwd.hand, fwd.owner))
        self._flush(session)

    async def offer(self, msg: Message, fwd: Forward, answer_failure: bool = True) -> bool:
        """Send `msg` (its owner named) on the link; its answers go to `fwd.peer`. A peer node that
        cannot be reached: False, and (`answer_failure`) the client gets `busy` with why (nothing
        was started)."""
        try:
            self._sent(await self._ensure(), msg, fwd)
            return True
        except (MindhandError, ConnectionClosed, OSError) as exc:
            self._failed(fwd, exc, answer_failure)
            return False

    def _failed(self, fwd: Forward, exc: Exception, answer_failure: bool) -> None:
        log.warning("node_link_failed", url=self.url, error=str(exc))
        self.router.forget(fwd.hand)
        if answer_failure:
            fwd.peer.outbox.put(
                Error(
                    code=ErrorCode.BUSY,
                    message=f"the Mind node holding this Hand ({self.url}) cannot be reached now; nothing was started",
                ),
                fwd.client_id,
            )

    def _flush(self, session: ClientSession) -> None:
        self._write(session.data_to_send())

    def _write(self, out: list[bytes]) -> None:
        """The link's frames, written now, in the order they are made (envelopes and stdin data
        frames alike): a queue and a writer task cost every relayed request a task switch (issue 27
        item 4). What the peer node has not read waits in the transport's buffer, as it waited in
        that queue; a link closing drops them, and its reader answers everyone waiting (`_lost`)."""
        ws = self._ws
        if ws is None or ws.protocol.state is not State.OPEN:
            return
        for frame in out:
            ws.protocol.send_binary(frame)
        ws.send_data()

    def send(self, msg: Message, request: bool = False) -> None:
        """An envelope: with no id (a client's `stream_ack` or `resize` of a relayed run), or a
        request of this node's whose answer nobody waits for (`request`)."""
        if self._session is not None and self._session.error is None:
            self._session.send(msg, new_id("x") if request else None)
            self._flush(self._session)

    def client_gone(self, peer: Peer, keep: bool) -> None:
        """The client of relayed runs left this node: its runs on the link are left as a client
        that leaves any Mind leaves them. With a resume window (`keep`) they are detached, kept
        there for the window (attach through the holding node takes them up); without, cancelled."""
        for link_id, fwd in list(self.waiting.items()):
            if fwd.peer is not peer:
                continue
            del self.waiting[link_id]
            if fwd.answer is not None:
                _settle(fwd.answer, None)
                continue
            self._ended(fwd)
            if fwd.run and fwd.run_id is not None:
                if keep:
                    self.send(Detach(run_id=fwd.run_id), request=True)
                else:
                    self.send(CancelRun(run_id=fwd.run_id, on_behalf_of=fwd.owner), request=True)

    def drop(self, answer: asyncio.Future[Message | None]) -> None:
        """Forget a question of this node's own whose answer is no longer awaited (`Router.ask`)."""
        for link_id, fwd in list(self.waiting.items()):
            if fwd.answer is answer:
                del self.waiting[link_id]

    def send_frame(self, number: int, offset: int, eof: bool, payload: memoryview | bytes) -> None:
        """A client's stdin chunk, on the link's number for its stream (the payload as it came)."""
        if self._session is not None and self._session.error is None:
            self._write([frames.header(number, offset, eof) + bytes(payload)])

    def _numbered(self, fwd: Forward, p: dict[str, Any]) -> dict[str, Any]:
        """The holding node's numbers for a relayed run's streams (a `stream_numbers` payload, as
        received), given numbers of this node's on the client's connection; both remembered until
        the run ends. Read unvalidated, so checked here as the model would: a bad one closes the link."""
        run_id = p.get("run_id")
        if not isinstance(run_id, str):
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, "invalid stream_numbers payload: run_id")
        mine: dict[str, Any] = {"run_id": run_id}
        fwd.numbers = fwd.numbers or []
        for stream in frames.STREAMS:
            theirs = mine[stream] = p.get(stream)
            if theirs is None:
                continue
            if type(theirs) is not int or not 1 <= theirs <= frames.NUMBER_MAX:
                raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"invalid stream_numbers payload: {stream}")
            ours = mine[stream] = self.router.number(fwd.peer)
            self.numbers[theirs] = (fwd, ours)
            fwd.numbers.append((theirs, ours))
            if stream == "stdin":
                self.router.stdin[(fwd.peer.conn_id, ours)] = (self, theirs)
        self.router.streamed[run_id] = (self, fwd.peer.conn_id)
        return mine

    def _lost(self, fwd: Forward) -> None:
        """The node holding `fwd`'s Hand is no longer reached through this link (it went away, or
        the Hand moved here). A run: with a resume window its Hand moves and presents it elsewhere
        (continuity, §15), so the client goes round as when a node loses its lease: its connection
        closed, it reconnects and re-attaches wherever the run is now. Otherwise `busy`, saying so."""
        self._ended(fwd)
        if fwd.answer is not None:
            _settle(fwd.answer, None)
            return
        if not self.router.connected(fwd.peer):
            return
        if fwd.run and self.router.keep:
            fwd.peer.outbox.close()
            self.router.spawn(close_quietly(fwd.peer.ws, CLOSE_TRY_LATER, "the node holding your run went away"))
        else:
            fwd.peer.outbox.put(Error(code=ErrorCode.BUSY, message=LINK_CLOSED), fwd.client_id)

    def moved(self, hand: str) -> None:
        """`hand` is no longer held by the node at the other end of this link: claimed by this
        node (its runs relayed through this link will be presented here; the old node may be
        frozen, the link not closed yet), or by a third node (the old node forgets them, DESIGN
        §16). Their clients go round (`_lost`)."""
        for link_id, fwd in list(self.waiting.items()):
            if fwd.run and fwd.hand == hand:
                del self.waiting[link_id]
                self._lost(fwd)

    def _ended(self, fwd: Forward) -> None:
        for theirs, ours in fwd.numbers or ():
            self.numbers.pop(theirs, None)
            self.router.stdin.pop((fwd.peer.conn_id, ours), None)

    async def _read(self, ws: ClientConnection, session: ClientSession) -> None:
        """Every frame the peer node sends on the link: each answer to the client waiting for it.

        An answer is routed on its envelope (`id`, `t`) and the few payload fields this node acts
        on, never built into a model: the client validates it, and nothing here trusts more than
        it reads (mitogen's rule: route on a small header, never unpickle a payload you only
        forward). A bad frame (its envelope, an unknown type, a field read here) closes the link."""
        try:
            async for data in ws:
                if frames.is_frame(data):  # a run's bytes: renumbered, the payload as received
                    number, offset, eof, payload = frames.decode(data)  # type: ignore[arg-type]
                    to = self.numbers.get(number)
                    if to is not None and self.router.connected(to[0].peer):
                        to[0].peer.outbox.put_frame(to[1], offset, eof, payload)
                    continue
                t, id_, seq, gen, p = check(unpack(data))
                session.accept_forwarded(seq, gen)  # its sequence and generation checked
                known_type(t)
                if t == "stream_data":  # a run's bytes come as data frames, never as an envelope
                    raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, "a stream_data envelope on a node link")
                if id_ is None or (fwd := self.waiting.get(id_)) is None:
                    continue
                if fwd.answer is not None:  # this node's own question (`Router.ask`): read here
                    del self.waiting[id_]
                    _settle(fwd.answer, validate(t, p))
                    continue
                if t == "stream_numbers":
                    p = self._numbered(fwd, p)
                if not fwd.run or t == "run_end" or t == "error":
                    del self.waiting[id_]
                    self._ended(fwd)
                    if p.get("reject_code") in FORGET_HOLDER:
                        self.router.forget(fwd.hand)  # it moved or left since: ask the database next time
                run_id, hand = p.get("run_id"), p.get("hand")
                if fwd.run and isinstance(run_id, str) and isinstance(hand, str):
                    fwd.run_id = run_id
                    self.router.remember(run_id, RoutedRun(self, hand, fwd.owner))
                if self.router.connected(fwd.peer):
                    fwd.peer.outbox.put_raw(t, p, fwd.client_id)
        except (ConnectionClosed, ProtocolError) as exc:
            log.warning("node_link_closed", url=self.url, error=str(exc))
        finally:
            if self._ws is ws:
                self._ws = self._session = None
            waiting, self.waiting = self.waiting, {}
            for fwd in waiting.values():
                self._lost(fwd)
            await ws.close()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()


class Router:
    """This node's links to its peers and the runs relayed through them."""

    def __init__(
        self,
        nodes: Nodes,
        credentials: Credentials,
        clients: dict[str, Peer],
        lease: float,
        keep: bool,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self.keep = keep
        """The Mind has a resume window: relayed runs outlive their client's or their node's leaving."""
        self.spawn = spawn
        self.nodes = nodes
        self._store = credentials
        self._clients = clients
        self.lease = lease
        self.links: dict[str, Link] = {}
        self.runs: OrderedDict[str, RoutedRun] = OrderedDict()
        self.stdin: dict[tuple[str, int], tuple[Link, int]] = {}
        """(client connection, its stdin number) -> (the link, the number there)."""
        self.streamed: OrderedDict[str, tuple[Link, str]] = OrderedDict()
        """A relayed streamed run -> its link and the client connection that started it (whose
        acknowledgements and resizes go to the link)."""
        self._numbers: dict[str, int] = {}
        self.cache: dict[str, str] = {}
        """Hand -> the URL of the node holding it, as last asked (see `holder`)."""

    async def credential(self) -> Credential:
        """The node credential, read (or made, once per database) when a link opens: a rotation
        by an operator is followed at the next link."""
        from mind.store.credentials import StoreError

        store = self._store
        secret = await store.secret("client", NODE_LABEL)
        if secret is None:
            try:
                secret = (await store.add("client", NODE_LABEL)).secret
            except StoreError:  # another node made it first
                secret = await store.secret("client", NODE_LABEL)
        if secret is None:
            raise MindhandError("the node credential vanished; try again")
        return Credential("client", NODE_LABEL, secret)

    async def holder(self, hand: str) -> Link | None:
        """The link to the live node holding `hand`, or None (no other live node holds it). The
        answer is kept while this node hears every claim (LISTEN is up: a claim of the Hand by any
        node forgets it, `forget`); while it polls instead, the database is asked each time. A
        node that no longer holds the Hand when asked answers `hand_offline` itself (a relayed
        request is never relayed again), and the answer is forgotten then too."""
        url = self.cache.get(hand) if self.nodes.listening else None
        if url is None:
            url = await self.nodes.route(hand, self.lease)
            if url is None:
                return None
            if self.nodes.listening:
                self.cache[hand] = url
        return self.link(url)

    def cached(self, hand: str) -> Link | None:
        """`holder` as the cache answers it (two dict lookups), or None: not known without asking
        the database (then `holder`, awaited, asks it)."""
        url = self.cache.get(hand) if self.nodes.listening else None
        return self.links.get(url) if url is not None else None

    async def find(self, peer: Peer, run_id: str, owner: str) -> tuple[RoutedRun, RunInfo] | None:
        """The node holding a run neither held nor relayed here (started through another node,
        its client here since): each other live node is asked `get_run` for `owner`, in turn, and
        the first that answers with the run live is its authority (the run's Hand is on it); none
        has it live, the first that holds its ending is (the Hand moved there and the run ended
        before its client came back: an attach there gets its real ending, DESIGN §16).
        Remembered as a relayed run, so its `run get`, cancel and attach go there; its answer
        (fresh) is returned with it, so a `run get` is served from it. None: no live node has it
        for this owner (another client's run is not found, never revealed).

        Why ask instead of writing each run's Hand to the database at admission: that write would
        cost every run a round trip (or a batch) to serve the rare client that moved mid-run; the
        question costs one round trip per live node only when such a client asks."""
        try:
            nodes = await self.nodes.peers(self.lease)
        except MindhandError as exc:
            log.warning("node_peers_unavailable", error=str(exc))
            return None
        ended: tuple[str, RunInfo] | None = None
        for _, url in nodes:
            got = await self.ask(peer, url, GetRun(run_id=run_id, on_behalf_of=owner), owner)
            if not isinstance(got, RunInfo) or got.run_id != run_id:
                continue
            if got.state in RUN_TERMINAL:
                ended = ended or (url, got)
                continue
            return self._found(run_id, url, got, owner)
        if ended is not None:
            return self._found(run_id, *ended, owner)
        return None

    def _found(self, run_id: str, url: str, got: RunInfo, owner: str) -> tuple[RoutedRun, RunInfo]:
        routed = RoutedRun(self.link(url), got.hand, owner)
        self.remember(run_id, routed)
        return routed, got

    def link(self, url: str) -> Link:
        link = self.links.get(url)
        if link is None:
            link = self.links[url] = Link(self, url)
        return link

    async def ask(self, peer: Peer, url: str, question: Message, owner: str) -> Message | None:
        """One question of this node's own to the node at `url` (for `peer`'s request), its one
        answer; None if that node cannot be reached or has not answered within
        `LINK_OPEN_TIMEOUT_S` in all (opening the link included): a frozen node costs that bound,
        never more."""
        link = self.link(url)
        answer: asyncio.Future[Message | None] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(LINK_OPEN_TIMEOUT_S):
                if not await link.offer(question, Forward(peer, "", owner, False, answer=answer), answer_failure=False):
                    return None
                return await answer
        except TimeoutError:
            log.warning("node_question_unanswered", url=url, type=question.TYPE)
            return None
        finally:
            link.drop(answer)

    def remember(self, run_id: str, routed: RoutedRun) -> None:
        self.runs[run_id] = routed
        self.runs.move_to_end(run_id)
        while len(self.runs) > ROUTED_RUNS_MAX:
            self.runs.popitem(last=False)
        while len(self.streamed) > ROUTED_RUNS_MAX:
            self.streamed.popitem(last=False)

    def number(self, peer: Peer) -> int:
        n = self._numbers.get(peer.conn_id, ROUTED_NUMBER_BASE)
        self._numbers[peer.conn_id] = n + 1
        return n

    def from_client_frame(self, peer: Peer, number: int, offset: int, eof: bool, payload: memoryview) -> None:
        """A client's data frame on a relayed run's stdin: to the link. A number of a run that has
        ended (or never was) is a late frame: dropped."""
        to = self.stdin.get((peer.conn_id, number))
        if to is not None:
            to[0].send_frame(to[1], offset, eof, payload)

    def from_client_stream(self, peer: Peer, msg: Message) -> bool:
        """A client's `stream_ack`/`resize` of a relayed run it started: to the link. False: not one."""
        run_id = getattr(msg, "run_id", None)
        via = self.streamed.get(run_id) if isinstance(run_id, str) else None
        if via is None or via[1] != peer.conn_id:
            return False
        via[0].send(msg)
        return True

    def client_gone(self, peer: Peer, keep: bool) -> None:
        """A client connection closed: its relayed runs left on their nodes as `Link.client_gone` says."""
        self._numbers.pop(peer.conn_id, None)
        for link in self.links.values():
            link.client_gone(peer, keep)

    def forget(self, hand: str) -> None:
        """A claim of `hand` was heard (or a relayed request found it gone): ask the database next."""
        self.cache.pop(hand, None)

    def hand_here(self, hand: str) -> None:
        self.forget(hand)
        for link in self.links.values():
            link.moved(hand)

    def hand_moved(self, hand: str) -> None:
        """Another node claimed `hand` (heard, not made here). The node a run of it was relayed to
        hands it over when it hears that claim (forgotten there, its attachment through the link
        never answered again), so a client of such a run on a link to any node but the new holder
        goes round now and re-attaches where the run is (DESIGN §16). The new holder's URL is
        asked only when a relayed run of the Hand is in flight here."""
        if any(f.run and f.hand == hand for link in self.links.values() for f in link.waiting.values()):
            self.spawn(self._moved(hand))

    async def _moved(self, hand: str) -> None:
        try:
            url = await self.nodes.route(hand, self.lease)
        except MindhandError as exc:  # unknown: every link's runs of it go round
            log.warning("node_route_unavailable", hand=hand, error=str(exc))
            url = None
        for link in list(self.links.values()):
            if link.url != url:
                link.moved(hand)

    def connected(self, peer: Peer) -> bool:
        return self._clients.get(peer.conn_id) is peer

    async def close(self) -> None:
        for link in self.links.values():
            await link.close()


def _settle(answer: asyncio.Future[Message | None], msg: Message | None) -> None:
    if not answer.done():
        answer.set_result(msg)
