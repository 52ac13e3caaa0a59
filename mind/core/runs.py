"""A foreground run as the registry holds it (`Run`), and the actions the registry hands its shell.

The rules live in `mind/core/registry.py`; this module is the record they act on and the vocabulary
of what they decide, kept apart so the rules read as rules. Pure, like every `core` room.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocol import limits
from protocol.codes import CancelReason
from protocol.control import Budget
from protocol.messages import Background, Exec, Message, Resize, RunEnd, RunExited, RunInfo, Streams
from protocol.states import RUN_TERMINAL, RunState
from protocol.streams import Relay

# --- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendToHand:
    hand: str
    gen: int
    msg: Message


@dataclass(frozen=True)
class SendToClient:
    client: str
    req_id: str
    msg: Message
    droppable: bool = False
    """Progress may be dropped when the client reads too slowly; state changes never are."""


@dataclass(frozen=True)
class FrameToHand:
    """A data frame to relay to the Hand (DESIGN §11b): the header fields, renumbered for the
    Hand's connection, and the payload as the buffer the client's frame arrived in, untouched
    (the Mind never decodes, validates or re-encodes stream bytes). `run_id` and `stream` name
    it for logs and the simulation only."""

    hand: str
    gen: int
    number: int
    offset: int
    eof: bool
    payload: memoryview | bytes
    run_id: str = ""
    stream: str = ""


@dataclass(frozen=True)
class FrameToClient:
    """A data frame to relay to the attached client (see `FrameToHand`)."""

    client: str
    number: int
    offset: int
    eof: bool
    payload: memoryview | bytes
    run_id: str = ""
    stream: str = ""


@dataclass(frozen=True)
class Log:
    event: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class PersistEnding:
    """A terminal the Mind decided by itself (`lost`, `timed_out`, `cancelled` at the window's end),
    or with a window a Hand's result (which the Hand forgets at the `result_ack` that follows):
    the shell writes it durably BEFORE performing the actions after it, which tell the client and
    the Hand. A Mind that crashes between the two then still knows the run ended, and kills the run
    when its Hand re-presents it instead of adopting it: first terminal wins, across a crash too."""

    run_id: str
    end: RunEnd
    owner: str = ""
    """Who may attach and read the ending after a restart."""
    cancel_reason: CancelReason | None = None
    """What the Hand is told when it presents the run (`cancel` with this reason)."""
    args_digest: str = ""


@dataclass(frozen=True)
class StartEnded:
    """The start run of a background task reached its terminal: the shell settles the snapshot
    (fresh on success, deleted on rejection, left stale for reconciliation otherwise)."""

    run_id: str
    hand: str
    end: RunEnd


Action = SendToHand | SendToClient | FrameToHand | FrameToClient | Log | StartEnded | PersistEnding


def relays_for(req: Exec) -> dict[str, Relay]:
    """The streams a run carries: output (`stdout`+`stderr`, or one `pty`), and `stdin` if asked."""
    return relays_for_spec(req.streams) if req.streams is not None else {}


def relays_for_spec(spec: Streams) -> dict[str, Relay]:
    names = ["pty"] if spec.pty is not None else ["stdout", "stderr"]
    if spec.stdin or spec.pty is not None:
        names.append("stdin")
    return {name: Relay(spec.window) for name in names}


@dataclass
class Run:
    run_id: str
    hand: str
    tool: str
    args_digest: str
    client: str | None
    req_id: str
    owner: str
    watch: bool
    timeout_ms: int
    grace_ms: int
    created_at: float
    mind_deadline: float
    created_wall: float
    state: RunState = RunState.ADMITTED
    gen: int | None = None
    cancel_reason: CancelReason | None = None
    budget: Budget = field(
        default_factory=lambda: Budget(
            {"progress_bytes": limits.PROGRESS_BYTES_MAX, "progress_events": limits.PROGRESS_EVENTS_MAX}
        )
    )
    dropped: int = 0
    background: Background | None = None
    relays: dict[str, Relay] = field(default_factory=dict)
    """A streamed run's byte streams as the Mind relays them, by name (DESIGN §11): the Mind
    forwards each chunk at once and checks that no sender exceeds the window its receiver granted,
    so it never holds more than one window per stream, whatever the reader's speed."""
    end: RunEnd | None = None
    ended_at: float | None = None
    ended_wall: float | None = None
    seq: int = 0
    """Admission order (1, 2, ...): where a page of history starts (`ListRuns.after`)."""
    value_not_retained: bool = False
    fleet: str | None = None
    """The fleet run this run is a member of (`Exec.fleet`, DESIGN §12)."""
    hand_away_since: float | None = None
    """Monotonic time the Hand's connection dropped, while the run waits for it (DESIGN §15)."""
    hand_away_wall: float | None = None
    client_away_since: float | None = None
    """Monotonic time the run was left unattended (client gone or detached)."""
    client_away_wall: float | None = None
    keep_until: float | None = None
    """A detached run's own end of waiting (`Detach.keep_s`), instead of the window's."""
    pending_resize: Resize | None = None
    """The last resize typed while the Hand was away: delivered once the Hand is back."""
    exited: RunExited | None = None
    """The Hand said the process ended while its output is still owed (`run_exited`)."""
    cancel_sent_at: float | None = None
    """When a `cancel` last went to the Hand (monotonic): its answer is awaited a bounded time."""

    @property
    def terminal(self) -> bool:
        return self.state in RUN_TERMINAL

    def info(self) -> RunInfo:
        return RunInfo(
            run_id=self.run_id,
            hand=self.hand,
            tool=self.tool,
            state=self.state,
            gen=self.gen,
            created_at=self.created_wall,
            ended_at=self.ended_wall,
            args_digest=self.args_digest,
            end=self.end,
            value_not_retained=self.value_not_retained,
            fleet=self.fleet,
            hand_away_since=self.hand_away_wall,
            client_away_since=self.client_away_wall,
            exited=self.exited if not self.terminal else None,
        )
