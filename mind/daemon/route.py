"""Routing between Mind nodes (DESIGN §16, issue 27 item 4): a client on this node asking for a
Hand another node holds is served through that node, over one authenticated node-to-node link per
peer node, at most one extra hop.

The node holding the Hand stays the run's authority (its registry, its endings, its claim): this
node only relays. It checks the client's scope first, then sends the request on the link with the
client named as its owner (`on_behalf_of`), and relays every answer under the request's envelope
id back to the client under the client's own id. The link authenticates with the node credential
(`mind.core.nodes.NODE_LABEL`, read from the shared database): the holding node believes the owner
named only because the link proved it is a node.

What is relayed: a run without streams (`exec` with progress, every tool call such as
`read_file`), `run get` and `cancel` of a run relayed here. A streamed run (`mind exec`'s data
frames) is not relayed yet: its client is told which node to reach (DESIGN §16, next).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

import structlog
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from mind.client.dial import Dial, open_connection
from mind.client.session import ClientSession
from mind.core.nodes import NODE_LABEL
from mind.daemon.peer import Peer
from mind.store.api import Credentials, Nodes
from protocol import frames
from protocol.auth import Credential
from protocol.codes import ErrorCode
from protocol.envelope import decode as decode_envelope
from protocol.errors import MindhandError, ProtocolError
from protocol.ids import new_id
from protocol.messages import Error, Message

log = structlog.get_logger(component="mind")

LINK_OPEN_TIMEOUT_S = 5.0
"""A peer node that has not welcomed the link by then is not reachable now: the client is told so."""
ROUTED_RUNS_MAX = 10_000
"""Runs relayed through this node remembered for `run get`/`cancel` (the oldest forgotten first)."""
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
        self._send = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None

    async def _ensure(self) -> tuple[ClientConnection, ClientSession]:
        async with self._open:
            if self._ws is not None and self._session is not None and self._session.error is None:
                return self._ws, self._session
            cred = await self.router.credential()
            ws, session, _ = await open_connection(
                Dial(self.url, cred, LINK_OPEN_TIMEOUT_S, None, None), LINK_OPEN_TIMEOUT_S
            )
            self._ws, self._session = ws, session
            self._reader = asyncio.get_running_loop().create_task(self._read(ws, session))
            log.info("node_link_open", url=self.url)
            return ws, session

    async def forward(self, msg: Message, fwd: Forward) -> None:
        """Send `msg` (its owner named) on the link; its answers go to `fwd.peer`. A peer node that
        cannot be reached: the client gets `busy` with why (nothing was started)."""
        try:
            ws, session = await self._ensure()
            link_id = new_id("x")
            self.waiting[link_id] = fwd
            async with self._send:
                session.send(msg, link_id)
                for frame in session.data_to_send():
                    await ws.send(frame)
        except (MindhandError, ConnectionClosed, OSError) as exc:
            log.warning("node_link_failed", url=self.url, error=str(exc))
            fwd.peer.outbox.put(
                Error(
                    code=ErrorCode.BUSY,
                    message=f"the Mind node holding this Hand ({self.url}) cannot be reached now; nothing was started",
                ),
                fwd.client_id,
            )

    async def _read(self, ws: ClientConnection, session: ClientSession) -> None:
        """Every frame the peer node sends on the link: each answer to the client waiting for it."""
        try:
            async for data in ws:
                if frames.is_frame(data):
                    continue  # no streamed run is relayed (yet): none is ever started on a link
                env = decode_envelope(data)
                session.receive_frame(env)  # its sequence checked
                if session.error is not None:
                    break
                if env.id is None or (fwd := self.waiting.get(env.id)) is None:
                    continue
                msg = env.msg
                if not fwd.run or msg.TYPE in ("run_end", "error"):
                    del self.waiting[env.id]
                run_id, hand = getattr(msg, "run_id", None), getattr(msg, "hand", None)
                if fwd.run and isinstance(run_id, str) and isinstance(hand, str):
                    self.router.remember(run_id, RoutedRun(self, hand, fwd.owner))
                if self.router.connected(fwd.peer):
                    fwd.peer.outbox.put(msg, fwd.client_id)
        except (ConnectionClosed, ProtocolError) as exc:
            log.warning("node_link_closed", url=self.url, error=str(exc))
        finally:
            if self._ws is ws:
                self._ws = self._session = None
            waiting, self.waiting = self.waiting, {}
            for fwd in waiting.values():
                if self.router.connected(fwd.peer):
                    fwd.peer.outbox.put(Error(code=ErrorCode.BUSY, message=LINK_CLOSED), fwd.client_id)
            await ws.close()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()


class Router:
    """This node's links to its peers and the runs relayed through them."""

    def __init__(self, nodes: Nodes, credentials: Credentials, clients: dict[str, Peer], lease: float) -> None:
        self.nodes = nodes
        self._store = credentials
        self._clients = clients
        self.lease = lease
        self.links: dict[str, Link] = {}
        self.runs: OrderedDict[str, RoutedRun] = OrderedDict()

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
        """The link to the live node holding `hand`, or None (no other live node holds it)."""
        url = await self.nodes.route(hand, self.lease)
        if url is None:
            return None
        link = self.links.get(url)
        if link is None:
            link = self.links[url] = Link(self, url)
        return link

    def remember(self, run_id: str, routed: RoutedRun) -> None:
        self.runs[run_id] = routed
        self.runs.move_to_end(run_id)
        while len(self.runs) > ROUTED_RUNS_MAX:
            self.runs.popitem(last=False)

    def connected(self, peer: Peer) -> bool:
        return self._clients.get(peer.conn_id) is peer

    async def close(self) -> None:
        for link in self.links.values():
            await link.close()
