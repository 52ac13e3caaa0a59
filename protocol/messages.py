"""One pydantic model per message type (`extra="forbid"`, frozen), and the registry type -> model.

Validate at the edge, once: after `envelope.decode` the rest of the code trusts these values.
Strict scalar types (no "1" -> 1, no str -> bytes) so what a peer meant is what we act on.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.types import Strict

from protocol import limits
from protocol.codes import CancelReason, CancelStatus, ErrorCode, KillStage, RejectCode
from protocol.states import HAND_REPORTABLE, RUN_TERMINAL, RunState

Str = Annotated[str, Strict(), StringConstraints(max_length=4096)]
Text = Annotated[str, Strict(), StringConstraints(max_length=16384)]
Int = Annotated[int, Strict()]
NonNeg = Annotated[int, Strict(), Field(ge=0)]
Bool = Annotated[bool, Strict()]
Bytes = Annotated[bytes, Strict()]
Label = Annotated[str, Strict(), StringConstraints(pattern=limits.LABEL_RE.pattern)]
Id = Annotated[str, Strict(), StringConstraints(pattern=limits.ID_RE.pattern)]
Nonce = Annotated[bytes, Strict(), Field(min_length=limits.NONCE_BYTES, max_length=limits.NONCE_BYTES)]
Mac = Annotated[bytes, Strict(), Field(min_length=limits.MAC_BYTES, max_length=limits.MAC_BYTES)]
TimeoutMs = Annotated[int, Strict(), Field(gt=0, le=limits.RUN_TIMEOUT_MAX_MS)]
Stream = Literal["stdout", "stderr"]
Role = Literal["hand", "client"]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    TYPE: ClassVar[str]


# --- handshake (DESIGN §9) -------------------------------------------------------------------


class HandClaims(Message):
    """What a Hand says about itself. Claims, not facts: shown to operators, never trusted."""

    TYPE = "hand_claims"
    hostname: Str
    platform: Str
    machine: Str
    python: Str
    version: Str


class Hello(Message):
    TYPE = "hello"
    role: Role
    label: Label
    nonce: Nonce
    claims: HandClaims | None = None


class Challenge(Message):
    TYPE = "challenge"
    mind_id: Id
    handshake_id: Id
    nonce: Nonce
    expires_in_ms: Annotated[int, Strict(), Field(gt=0, le=60_000)]


class Proof(Message):
    TYPE = "proof"
    handshake_id: Id
    mac: Mac


class Welcome(Message):
    TYPE = "welcome"
    gen: Annotated[int, Strict(), Field(ge=1)]
    mac: Mac
    """The Mind's proof that it knows the same secret (mutual authentication)."""
    ping_interval_s: Annotated[float, Field(gt=0, le=3600)]


class Error(Message):
    """An error for the request named by the envelope `id`, or for the connection if `id` is null."""

    TYPE = "error"
    code: ErrorCode
    message: Text


# --- Mind <-> Hand: foreground runs ---------------------------------------------------------


class Rpc(Message):
    """Run `tool` with `args`. `timeout_ms` is relative: the Hand enforces it on its own clock, so
    clock skew between machines can neither shorten nor stretch a deadline."""

    TYPE = "rpc"
    run_id: Id
    tool: Label
    args: dict[Str, Any]
    timeout_ms: TimeoutMs
    grace_ms: Annotated[int, Strict(), Field(ge=0, le=600_000)] | None = None


class Accepted(Message):
    """The Hand admitted the run (policy, paths, deadline passed) and registered it, so a cancel
    that follows on the same ordered stream always finds it."""

    TYPE = "accepted"
    run_id: Id


class Rejected(Message):
    TYPE = "rejected"
    run_id: Id
    code: RejectCode
    message: Text


class Started(Message):
    TYPE = "started"
    run_id: Id


class Progress(Message):
    """Observation only: may be dropped anywhere, never moves a state machine."""

    TYPE = "progress"
    run_id: Id
    stream: Stream
    offset: NonNeg
    """Byte offset of `data` in its stream, so a gap (dropped progress) is visible to the reader."""
    data: Annotated[bytes, Strict(), Field(min_length=1, max_length=limits.PROGRESS_CHUNK_MAX)]


class OutputTail(Message):
    """The last bytes of one stream, with the stream's total size: `total - len(data)` is where
    the tail starts."""

    TYPE = "output_tail"
    data: Annotated[bytes, Strict(), Field(max_length=limits.OUTPUT_TAIL_MAX)] = b""
    total: NonNeg = 0


class Result(Message):
    TYPE = "result"
    run_id: Id
    state: RunState
    reason: Str = ""
    exit_code: Int | None = None
    signal: Int | None = None
    stage: KillStage | None = None
    stdout: OutputTail = OutputTail()
    stderr: OutputTail = OutputTail()
    truncated: Bool = False
    progress_dropped: NonNeg = 0
    value: Any = None
    error: Text | None = None
    duration_ms: NonNeg = 0

    @model_validator(mode="after")
    def _hand_reportable(self) -> "Result":
        if self.state not in HAND_REPORTABLE:
            raise ValueError(f"a result cannot carry state {self.state.value}")
        return self


class Cancel(Message):
    TYPE = "cancel"
    run_id: Id
    reason: CancelReason


class CancelResult(Message):
    TYPE = "cancel_result"
    run_id: Id
    status: CancelStatus


# --- client <-> Mind -----------------------------------------------------------------------


class Exec(Message):
    """Run a tool on a Hand and stream its events back under this request's envelope `id`."""

    TYPE = "exec"
    hand: Label
    tool: Label
    args: dict[Str, Any]
    timeout_ms: TimeoutMs
    grace_ms: Annotated[int, Strict(), Field(ge=0, le=600_000)] | None = None


class RunUpdate(Message):
    """A state change of a run the client is waiting on (not terminal: see `RunEnd`)."""

    TYPE = "run_update"
    run_id: Id
    hand: Label
    state: RunState
    gen: Int | None = None


class RunOutput(Message):
    TYPE = "run_output"
    run_id: Id
    stream: Stream
    offset: NonNeg
    data: Annotated[bytes, Strict(), Field(min_length=1, max_length=limits.PROGRESS_CHUNK_MAX)]


class RunEnd(Message):
    """The authoritative end of a run, exactly once."""

    TYPE = "run_end"
    run_id: Id
    hand: Label
    tool: Label
    state: RunState
    reason: Str = ""
    reject_code: RejectCode | None = None
    exit_code: Int | None = None
    signal: Int | None = None
    stage: KillStage | None = None
    stdout: OutputTail = OutputTail()
    stderr: OutputTail = OutputTail()
    truncated: Bool = False
    progress_dropped: NonNeg = 0
    value: Any = None
    error: Text | None = None
    duration_ms: NonNeg = 0

    @model_validator(mode="after")
    def _terminal(self) -> "RunEnd":
        if self.state not in RUN_TERMINAL:
            raise ValueError(f"run_end needs a terminal state, not {self.state.value}")
        return self


class CancelRun(Message):
    TYPE = "cancel_run"
    run_id: Id


class CancelRunResult(Message):
    TYPE = "cancel_run_result"
    run_id: Id
    status: CancelStatus
    state: RunState


class ListHands(Message):
    TYPE = "list_hands"


class HandInfo(Message):
    TYPE = "hand_info"
    name: Label
    connected: Bool
    generation: NonNeg
    since: float | None = None
    """Wall-clock time the current connection was welcomed (or the last one ended)."""
    claims: HandClaims | None = None
    running: NonNeg = 0


class HandsList(Message):
    TYPE = "hands_list"
    hands: list[HandInfo]


class GetRun(Message):
    TYPE = "get_run"
    run_id: Id


class RunInfo(Message):
    TYPE = "run_info"
    run_id: Id
    hand: Label
    tool: Label
    state: RunState
    gen: Int | None = None
    created_at: float
    ended_at: float | None = None
    args_digest: Str
    end: RunEnd | None = None


MESSAGE_TYPES: dict[str, type[Message]] = {
    m.TYPE: m
    for m in (
        Hello,
        Challenge,
        Proof,
        Welcome,
        Error,
        Rpc,
        Accepted,
        Rejected,
        Started,
        Progress,
        Result,
        Cancel,
        CancelResult,
        Exec,
        RunUpdate,
        RunOutput,
        RunEnd,
        CancelRun,
        CancelRunResult,
        ListHands,
        HandsList,
        GetRun,
        RunInfo,
    )
}

HANDSHAKE_TYPES = frozenset({"hello", "challenge", "proof", "welcome", "error"})
