"""What the daemon needs of its stores, as one async interface with two engines (DESIGN §16).

The SQLite engine (`mind.store.sqlite`) is the embedded default: today's files in the Mind's home,
today's synchronous classes, each call run on the store's own thread so the loop never waits on a
disk. The PostgreSQL engine (`mind.store.postgres`) is the system of record shared by many Mind
nodes (`mind serve --database postgresql://...`): asyncpg on the loop itself, every statement under
a timeout. The snapshot and ending operations are scripts written once (`mind.store.scripts`) over
a port each engine implements; the rows both write are encoded once (`mind.store.rows`). The
daemon only ever awaits these methods, so it cannot tell the two apart, and one test suite
(tests/mind/test_store_engines.py) holds both to the same answers.

A store that cannot answer (the database went away, a statement timed out) raises
`StoreUnavailable`: the request that needed it gets an error frame with that sentence, the
daemon goes on (never a crash, never a stalled loop).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from protocol.errors import MindhandError

if TYPE_CHECKING:  # types only: the local admin commands import this module without the message models
    from mind.core.snapshots import Plan, Snapshot
    from mind.store.credential_rows import CredentialRow
    from mind.store.recordings import Recordings
    from mind.store.rows import Ending
    from protocol.auth import Credential
    from protocol.messages import RunInfo, TaskInfo
    from protocol.states import TaskState

Calls = list[tuple[str, tuple[Any, ...], str | None]]
"""A batch of snapshot-store calls: (method name, its arguments, the Hand to mark stale after it)."""
Results = list[tuple[bool, Any]]


class StoreUnavailable(MindhandError):
    """The shared database did not answer in time or is gone: the message says which and where."""


STORE_UNAVAILABLE_MESSAGE = (
    "this Mind cannot reach its database right now; nothing was started: try again (or another Mind node)"
)
"""What a peer is told when its handshake or request needed the database and it was away (the
operator's log has the database's own words)."""


class NotLive(StoreUnavailable):
    """This node's lease on the shared database passed (`mind.core.nodes`): it claims no Hand and
    starts nothing until a heartbeat succeeds again."""


class Fenced(StoreUnavailable):
    """A write about a Hand carried a claim that is no longer the Hand's current one: another node
    claimed it since. Nothing was written; the shell closes its stale connection (`mind.core.nodes`).
    A `StoreUnavailable` to every caller that does not look closer: the request that needed the
    write is answered as one the database could not take, and the daemon goes on."""

    def __init__(self, hand: str, claim: int) -> None:
        super().__init__(f"hand {hand!r} is held by a newer claim than {claim}: nothing was written")
        self.hand = hand
        self.claim = claim


class SchemaTooNew(MindhandError):
    """The database was migrated by a newer Mind than this one: refused at start, never written."""


class Credentials(Protocol):
    """Credentials, scopes, labels, generations, the admin row and the change epoch."""

    async def mind_id(self) -> str: ...
    async def seal_key(self) -> bytes: ...
    async def epoch(self) -> int: ...
    async def add(
        self, role: str, label: str, scope: str | None = None, labels: dict[str, str] | None = None
    ) -> Credential: ...
    async def rotate(self, role: str, label: str) -> Credential | None: ...
    async def scope(self, role: str, label: str) -> str | None: ...
    async def set_labels(
        self, role: str, label: str, set_: dict[str, str], remove: list[str]
    ) -> dict[str, str] | None: ...
    async def revoke(self, role: str, label: str) -> bool: ...
    async def secret(self, role: str, label: str) -> bytes | None: ...
    async def next_generation(self, role: str, label: str) -> int: ...
    async def touch(self, role: str, label: str) -> None: ...
    async def list(self, role: str) -> list[CredentialRow]: ...
    async def close(self) -> None: ...


class Snapshots(Protocol):
    """Task snapshots (`mind.core.snapshots` decides, the engine applies in one transaction)."""

    async def get(self, task_id: str) -> Snapshot | None: ...
    async def insert_new(self, snap: Snapshot) -> Snapshot | None: ...
    async def delete(self, task_id: str) -> None: ...
    async def remove(self, task_id: str, hand: str) -> Snapshot | None: ...
    async def report(
        self, hand: str, info: TaskInfo, now: float, adopt: bool = True
    ) -> tuple[Snapshot | None, str]: ...
    async def retry_start(self, snap: Snapshot) -> Snapshot | None: ...
    async def finish_start(self, task_id: str) -> Snapshot | None: ...
    async def set_cancel_pending(self, task_id: str, reason: str) -> Snapshot | None: ...
    async def clear_cancel_pending(self, task_id: str) -> None: ...
    async def mark_hand_stale(self, hand: str) -> int: ...
    async def mark_all_stale(self) -> int: ...
    async def list(
        self,
        hand: str | None = None,
        state: TaskState | None = None,
        limit: int = 1000,
        after: tuple[float, str] | None = None,
    ) -> list[Snapshot]: ...
    async def counts_by_state(self) -> dict[str, int]: ...
    async def counts_visible(self, visible: Callable[[str, str], bool]) -> tuple[dict[str, int], int]: ...
    async def count_stale(self) -> int: ...
    async def reconcile(
        self,
        hand: str,
        hand_rows: dict[str, TaskInfo],
        now: float,
        synced_since: float | None = None,
        quota: int | None = None,
    ) -> Plan: ...
    async def batch(self, calls: Calls) -> Results:
        """Many calls `(method name, args, hand)` in order, each its own transaction, each followed
        by `mark_hand_stale(hand)` when `hand` is given: one thread hop for all of them on SQLite
        (the measured cost at hundreds of starts/s), plain awaits on PostgreSQL. Each result is
        `(True, value)` or `(False, exception)`."""
        ...

    async def close(self) -> None: ...


class Endings(Protocol):
    """The durable endings of DESIGN §15 and this node's life record.

    `put_many_now` is the SQLite engine's write on the loop (one transaction for every ending of a
    turn of the loop, before the actions that tell anyone); an engine over the network has none
    (`None`) and the daemon awaits `put_many` before it performs the actions that follow the
    endings (`Mind.perform`, `mind.daemon.grouped.HeldActions`)."""

    put_many_now: Callable[[list[Ending]], None] | None

    async def put(self, ending: Ending) -> None: ...
    async def put_many(self, endings: list[Ending]) -> None: ...
    async def load(self, window: float, now: float | None = None) -> list[Ending]: ...
    async def begin_life(self) -> bool: ...
    async def end_life(self, live_runs: int) -> None: ...
    async def close(self) -> None: ...


class History(Protocol):
    """Finished runs' metadata shared by the nodes of a database (none on SQLite: one Mind's memory)."""

    async def put_many(self, runs: list[tuple[str, RunInfo]]) -> None: ...
    async def get(self, run_id: str) -> tuple[str, RunInfo] | None: ...


class Fence(Protocol):
    claims: dict[str, int]
    on_fenced: Callable[[str, int], None] | None
    active: bool


class Nodes(Protocol):
    """Ownership and liveness of a node among many (PostgreSQL only; `mind.core.nodes` decides).

    `fence` is the claim this node holds each Hand by, kept by the shell: the writes about a Hand
    (its snapshots' reports and reconciliations, its runs' endings and history) are conditional on
    it and raise `Fenced` (or, for history, skip the row) when another node claimed it since."""

    name: str
    listening: bool
    """The LISTEN connection is up (NOTIFYs arrive); when down the shell polls."""

    @property
    def fence(self) -> Fence: ...
    async def heartbeat(self, timeout: float = ...) -> None: ...
    async def claim(self, hand: str, lease: float) -> int: ...
    async def welcome(
        self, hand: str, lease: float, secret: bytes, since: float
    ) -> tuple[int, list[Ending]] | None: ...
    async def listen(self, on_claim: Callable[[str, int, str], None], on_credentials: Callable[[], None]) -> None: ...
    async def release(self, hand: str, claim: int) -> None: ...
    async def endings_of(self, hand: str, since: float) -> list[Ending]: ...
    async def holders(self) -> dict[str, tuple[str, int, float]]: ...
    async def nodes(self) -> list[tuple[str, bool, float]]: ...
    async def advertise(self, url: str) -> None: ...
    async def route(self, hand: str, lease: float) -> str | None: ...
    async def peers(self, lease: float) -> list[tuple[str, str]]: ...
    async def held_elsewhere(self, hands: list[str], lease: float) -> set[str]: ...


class Stores(Protocol):
    """One engine's three stores, opened together (`mind.store.engines.open_stores`)."""

    engine: str
    """"sqlite" or "postgresql" (`mind status`, logs)."""

    @property
    def credentials(self) -> Credentials: ...
    @property
    def snapshots(self) -> Snapshots: ...
    @property
    def endings(self) -> Endings: ...
    @property
    def history(self) -> History | None: ...
    @property
    def nodes(self) -> Nodes | None: ...

    def open_recordings(self, key: bytes, where: Path | None = None) -> Recordings:
        """This engine's recordings (DESIGN §19), their heads signed with `key`: opened apart, and
        closed by whoever opened them."""
        ...

    async def close(self) -> None: ...
