"""What the rooms of the daemon need of the Mind that owns them (`mind.daemon.server.Mind`).

The server builds its rooms (the door, the connections, the dispatch, the views, the task service,
the HTTP answers) and hands each of them itself; each room sees it through `Host`, a Protocol, so
no room imports the server that imports it (the layering test counts every import, so a cycle
would fail it). What a room changes on the Mind is named here, never reached for by a private name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from mind.core.registry import Action, RunRegistry
    from mind.daemon.metrics import MindMetrics
    from mind.daemon.peer import Peer
    from mind.daemon.recorder import Recorder
    from mind.daemon.route import Router
    from mind.store.api import Credentials, History, Snapshots
    from mind.store.recordings import Recordings
    from protocol.messages import Message, NodeInfo

try:
    from importlib.metadata import version as _v

    VERSION = _v("mindhand")
except Exception:  # running from a source tree that is not installed
    VERSION = "unknown"
"""The version `mind status` and `/healthz` report: the installed distribution's."""

T = TypeVar("T")


@dataclass
class MindConfig:
    home: Path
    host: str = "127.0.0.1"
    port: int = 7470
    ping_interval: float = 10.0
    ping_timeout: float = 10.0
    tick_interval: float = 0.25
    retain_runs: int = 10_000
    resume_window: float = 0.0
    """Seconds a run may be unattended on either leg before the seed's rule fires (DESIGN §15);
    `mind serve` defaults to 60, this record to 0 (the rules before continuity)."""
    keep_max: float = 3600.0
    """The longest a detached run is kept (`mind exec --detach --keep`)."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    database: str | None = None
    """A postgresql:// URL: one node of many on a shared database (DESIGN §16); None: the home's SQLite."""
    node_lease: float = 10.0
    """With a database: how long this node acts after its last successful heartbeat (`mind.core.nodes`)."""
    node_name: str | None = None
    """With a database: this node's name (default: host name and port)."""
    node_url: str | None = None
    """With a database: where other nodes reach this one (default: its listen URL; DESIGN §16)."""
    record: str = "off"
    """`off`, `pty` or `all` (DESIGN §19); `mind serve` defaults to `pty`, this record to off."""
    record_max_bytes: int = 64 << 20
    record_strict: bool = False
    record_retention: float = 90 * 86400.0
    record_key: str | None = None
    record_dir: Path | None = None
    max_pending_handshakes: int = 1024
    auth_fail_limit: int = 10
    auth_fail_window: float = 60.0


class NodeLink(Protocol):
    """This node's lease and claims on a shared database, as the door and connections use them
    (`mind.daemon.nodes.NodeShell`)."""

    def refusal(self) -> str | None: ...
    def live(self) -> bool: ...
    async def claim(self, hand: str, secret: bytes) -> int | None: ...
    def acts(self, hand: str, gen: int) -> bool: ...
    def released(self, hand: str, gen: int) -> None: ...
    async def holders(self) -> dict[str, str]: ...
    async def node_infos(self) -> list[NodeInfo]: ...

    @property
    def name(self) -> str: ...


class Host(Protocol):
    """The Mind as its rooms see it: its settings, stores and their threads, the connection table,
    the run registry, the metrics, and the few things every room does through it."""

    cfg: MindConfig
    mind_id: str
    started: float
    """Wall-clock time the Mind started (uptime for `status` and `/healthz`)."""
    hands: dict[str, Peer]
    """The live connection of each Hand."""
    clients: dict[str, Peer]
    """Every client connection, by connection id."""
    last_seen: dict[str, float]
    """When each Hand's last connection ended (`mind hands` for an offline Hand)."""
    registry: RunRegistry
    snapshots: Snapshots
    store: Credentials
    history: History | None
    """Finished runs' metadata in the shared database (PostgreSQL), None on SQLite."""
    metrics: MindMetrics
    recordings: Recordings | None
    """The recordings store (DESIGN §19), open while the Mind runs."""
    recording_key: bytes | None
    """The key that signs recordings (never in a database)."""
    recorder: Recorder | None
    epoch: int
    """The credential table's epoch the last sweep saw (`Mind.check_credentials`)."""
    large_frames: bool
    """A large frame came in since the last tick: the ticker gives its freed memory back (`heap`)."""
    router: Router | None
    """On a shared database, once it listens: its links to the other nodes (`mind.daemon.route`)."""

    @property
    def nodes(self) -> NodeLink | None:
        """On a shared database: this node's lease and claims; None on SQLite (one Mind)."""
        ...

    async def db(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...
    async def creds(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...
    async def ask(self, peer: Peer, msg: Message, timeout: float = ...) -> Message: ...
    def deny(self, peer: Peer, what: str, **fields: Any) -> str: ...
    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...
    def perform(self, actions: list[Action]) -> None: ...
