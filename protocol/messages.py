"""One pydantic model per message type (`extra="forbid"`, frozen), and the registry type -> model.

Validate at the edge, once: after `envelope.decode` the rest of the code trusts these values.
Strict scalar types (no "1" -> 1, no str -> bytes) so what a peer meant is what we act on.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.types import Strict

from protocol import limits
from protocol.codes import CancelReason, CancelStatus, ErrorCode, KillStage, RejectCode, TaskCancelStatus
from protocol.states import HAND_REPORTABLE, RUN_TERMINAL, RunState, TaskState

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
DataStream = Literal["stdin", "stdout", "stderr", "pty"]
StreamNumber = Annotated[int, Strict(), Field(ge=1, le=(1 << 32) - 1)]
"""A stream's number on one connection (`protocol/frames.py`)."""
"""A run's byte streams (DESIGN §11): `stdin` goes to the Hand; `stdout`, `stderr`, or for a
terminal run the one `pty` stream, come back."""
LabelValue = Annotated[str, Strict(), StringConstraints(pattern=limits.LABEL_VALUE_RE.pattern)]
Role = Literal["hand", "client"]
WallTime = Annotated[float, Field(allow_inf_nan=False)]
"""A wall-clock time (seconds since the epoch): finite, as the fast path's reader requires too."""
Seal = Annotated[str, Strict(), StringConstraints(pattern=r"^[0-9a-f]{32}$")]
"""A Mind's seal over an `rpc` (`mind.core.seal`): 128 bits of HMAC-SHA256, in hex."""
Window = Annotated[int, Strict(), Field(ge=limits.STREAM_WINDOW_MIN, le=limits.STREAM_WINDOW_MAX)]
StartOutcome = Literal["accepted", "duplicate", "rejected", "unknown"]


class Message(BaseModel):
    # defer_build: a model's validator is built the first time it is used, not at import. A client
    # command uses a handful of these ~50 models, and building them all cost more than the rest of
    # its work. Once built a model validates exactly as before; a daemon that wants no first-use cost
    # calls `build_all()` at start.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
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
    cgroups: Literal["v2", "hybrid", "v1", "none"] | None = None
    """How the Hand contains runs (DESIGN §20); None: a Hand from before cgroups."""
    limits: Annotated[list[Str], Field(max_length=16)] | None = None
    """The cgroup limits it can enforce (`memory`, `pids`, `cpus`)."""


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
    resume_window_s: Annotated[float, Field(ge=0, le=limits.RESUME_WINDOW_MAX_S)] = 0.0
    """How long the Mind keeps a run whose leg went away (DESIGN §15): a Hand keeps its foreground
    runs this long after its connection drops, and presents them (`runs_present`) when it is back.
    0: no continuity, a drop ends the runs (the rule before issue 22)."""
    tools: Annotated[list[Str], Field(max_length=256)] | None = None
    """A client's: the tool patterns its credential's scope allows (`["*"]`: any), so a client can
    show only what it may call (`mind mcp`'s `tools/list`). Informational: the Mind checks every
    request against the scope whatever the client shows."""
    run_ids: Id | None = None
    """A client's: the prefix of the run ids it may name on this connection (`Exec.run_id`,
    `protocol.ids.named_run`). Minted for this connection alone, so no client can name another's run."""


class Error(Message):
    """An error for the request named by the envelope `id`, or for the connection if `id` is null."""

    TYPE = "error"
    code: ErrorCode
    message: Text


# --- Mind <-> Hand: foreground runs ---------------------------------------------------------


class Pty(Message):
    """A terminal for the run: the child gets a pseudo-terminal as its controlling terminal."""

    TYPE = "pty"
    term: Annotated[str, Strict(), StringConstraints(max_length=64, pattern=r"^[A-Za-z0-9._+-]*$")] = "xterm"
    rows: Annotated[int, Strict(), Field(ge=1, le=10_000)] = 24
    cols: Annotated[int, Strict(), Field(ge=1, le=10_000)] = 80
    login: Bool = False
    """The command is the run's user's login shell, as `ssh host` starts it (`argv` is not sent)."""


class Streams(Message):
    """The run's bytes go as streams (`stream_data`, flow-controlled, never dropped) instead of
    progress. `stdin`: the client sends standard input as the `stdin` stream (without it the child
    reads /dev/null). `output_limit`: bytes per output stream delivered; the rest is cut."""

    TYPE = "streams"
    stdin: Bool = False
    pty: Pty | None = None
    output_limit: Annotated[int, Strict(), Field(ge=0, le=1 << 50)] = limits.OUTPUT_LIMIT_DEFAULT
    window: Window = limits.STREAM_WINDOW
    """Bytes each stream's sender may have unacknowledged, for every stream of the run (DESIGN
    §11b): a field of the opening, not a constant every peer assumes. The sender keeps that much
    for a resume and the Mind relays at most that much per stream."""


class StreamData(Message):
    """`data` at byte `offset` of one stream of run `run_id`; `eof` closes that direction.

    Not an envelope on the wire: a chunk travels as a binary data frame (`protocol/frames.py`,
    a header naming the stream by its number on the connection, then the raw bytes). The ends
    hand this model to their code (and to users of the Python client); the Mind never builds one."""

    TYPE = "stream_data"
    run_id: Id
    stream: DataStream
    offset: NonNeg
    data: Annotated[bytes, Strict(), Field(max_length=limits.STREAM_CHUNK_MAX)] = b""
    eof: Bool = False

    @model_validator(mode="after")
    def _not_empty(self) -> StreamData:
        if not self.data and not self.eof:
            raise ValueError("a stream chunk carries data or the end of the stream")
        return self


class StreamNumbers(Message):
    """The numbers the streams of run `run_id` have on this connection from now on (Mind -> Hand
    before the `rpc` or a re-bind's `stream_resume`; Mind -> client, under the run's request id,
    before its first `run_update` or its `attached`). Data frames name their stream by this number
    (`protocol/frames.py`); it dies with the run or the connection."""

    TYPE = "stream_numbers"
    run_id: Id
    stdin: StreamNumber | None = None
    stdout: StreamNumber | None = None
    stderr: StreamNumber | None = None
    pty: StreamNumber | None = None


class StreamAck(Message):
    """The receiver consumed everything of the stream before `offset` (the sender's credit).
    `closed`: the receiver will take nothing more (its reader went away: a closed pipe). `window`:
    the receiver changed the stream's window, from this acknowledgement on (`protocol.streams`;
    the Mind may lower a growth to the client's budget as it forwards it)."""

    TYPE = "stream_ack"
    run_id: Id
    stream: DataStream
    offset: NonNeg
    closed: Bool = False
    window: Window | None = None


class StreamPosition(Message):
    """Where one stream stands for a resume (DESIGN §15). From a receiver: it holds every byte
    before `offset` and consumed those before `consumed` (the sender resends from `offset`). From a
    sender presenting its run: it sent up to `offset` and was acknowledged up to `consumed`, under
    `window` if its receiver had changed the opening's (a Mind adopting the run relays within it)."""

    TYPE = "stream_position"
    stream: DataStream
    offset: NonNeg
    consumed: NonNeg
    window: Window | None = None

    @model_validator(mode="after")
    def _ordered(self) -> StreamPosition:
        if self.consumed > self.offset:
            raise ValueError("consumed cannot be past offset")
        return self


class StreamResume(Message):
    """To a stream's sender after a cut: resend from `offset` (the receiver has everything before
    it); `consumed` acknowledges what the receiver consumed (an acknowledgement the cut may have
    lost). The sender refuses an offset outside what it kept (`protocol.streams.Outgoing.resume`).
    `window`: the window the receiver grants as of `consumed`, which an acknowledgement the cut
    lost may have changed (a sender that resumed under the window it last heard overran a receiver
    that had halved it meanwhile, and the stream stopped)."""

    TYPE = "stream_resume"
    run_id: Id
    stream: DataStream
    offset: NonNeg
    consumed: NonNeg
    window: Window | None = None


class Resize(Message):
    """The client's terminal changed size: the pty run's window follows."""

    TYPE = "resize"
    run_id: Id
    rows: Annotated[int, Strict(), Field(ge=1, le=10_000)]
    cols: Annotated[int, Strict(), Field(ge=1, le=10_000)]


class Rpc(Message):
    """Run `tool` with `args`. `timeout_ms` is relative: the Hand enforces it on its own clock, so
    clock skew between machines can neither shorten nor stretch a deadline."""

    TYPE = "rpc"
    run_id: Id
    tool: Label
    args: dict[Str, Any]
    timeout_ms: TimeoutMs
    grace_ms: Annotated[int, Strict(), Field(ge=0, le=600_000)] | None = None
    streams: Streams | None = None
    """Set when the run's bytes travel as streams (the client is attached and reads them)."""
    background: Background | None = None
    """Set for the start run of a background task: `task_id == run_id`. The run succeeds once the
    Hand has durably accepted the task (row committed); `timeout_ms` bounds only that admission,
    never the task, whose own limit is `background.max_runtime_ms`."""
    owner: Label | None = None
    """The client identity the run belongs to (DESIGN §15). The Hand keeps it with the run and
    presents it after a cut, so a Mind that restarted (and remembers nothing) gives the run back to
    its owner and to nobody else. Never used by the Hand to decide anything."""
    seal: Seal | None = None
    """The Mind's seal over what a presentation of this run is adopted from (`mind.core.seal`):
    the Hand keeps it with the run and presents it untouched; it cannot make one."""
    sealed_at: WallTime | None = None
    """When the Mind sent the run (its wall clock, sealed): an adopted run's creation time."""


class Background(Message):
    TYPE = "background"
    max_runtime_ms: Annotated[int, Strict(), Field(gt=0, le=limits.MAX_RUNTIME_MAX_MS)]


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
    sent: NonNeg | None = None
    """For a streamed run: bytes sent as the stream (less than `total` when the output limit cut it)."""
    sha256: Annotated[str, Strict(), StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    """For a streamed run: the sha256 of those `sent` bytes, to check what arrived end to end."""


Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
KillMode = Literal["cgroup", "process_group"]
"""How a run's processes were contained and killed (DESIGN §20): its own cgroup (nothing escapes),
or its process group (descendants that left it may survive)."""


class Usage(Message):
    """What a run's cgroup counted (DESIGN §20); a figure this host cannot count is None."""

    TYPE = "usage"
    cpu_user_s: Seconds | None = None
    cpu_system_s: Seconds | None = None
    memory_peak: NonNeg | None = None
    """Bytes: the most the run's processes used together."""
    pids_peak: NonNeg | None = None
    oom_kills: NonNeg | None = None
    """Processes the kernel killed for the run's memory limit."""
    throttled_s: Seconds | None = None
    """Time the run was held back by its CPU share."""


class Outcome(Message):
    """How a run ended: what the Hand reports (`result`) and what the client is told (`run_end`)."""

    TYPE = "outcome"
    run_id: Id
    state: RunState
    reason: Str = ""
    exit_code: Int | None = None
    signal: Int | None = None
    stage: KillStage | None = None
    stdout: OutputTail = OutputTail.model_construct()  # == OutputTail(), without building it at import
    stderr: OutputTail = OutputTail.model_construct()
    truncated: Bool = False
    progress_dropped: NonNeg = 0
    value: Any = None
    error: Text | None = None
    duration_ms: NonNeg = 0
    usage: Usage | None = None
    """A process run's: what it used (where its cgroup counted it)."""
    kill: KillMode | None = None
    """A process run's: how its processes were contained, so how sure its kill was."""


OUTCOME_FIELDS = tuple(Outcome.model_fields)


class Result(Outcome):
    TYPE = "result"

    @model_validator(mode="after")
    def _hand_reportable(self) -> Result:
        if self.state not in HAND_REPORTABLE:
            raise ValueError(f"a result cannot carry state {self.state.value}")
        return self


class ResultAck(Message):
    """Mind -> Hand: the Mind has taken the run's result (first terminal wins on its side). With a
    resume window a Hand keeps a result until this comes, and presents it again after a cut."""

    TYPE = "result_ack"
    run_id: Id


class PresentedRun(Message):
    """One foreground run a Hand still holds, presented on its new connection (DESIGN §15)."""

    TYPE = "presented_run"
    run_id: Id
    started: Bool = False
    """The process started (the Mind may have missed `started` in the cut)."""
    streams: Annotated[list[StreamPosition], Field(max_length=4)] = Field(default_factory=list)
    """Each stream of the run: output as sent and acknowledged, `stdin` as received and consumed."""
    result_pending: Bool = False
    """The run ended and its result is not acknowledged yet: the Hand sends it again after this."""
    owner: Label | None = None
    """`Rpc.owner` as the run was sent: a Mind that restarted adopts the run for this client only."""
    tool: Label | None = None
    remaining_ms: NonNeg | None = None
    """Milliseconds until the Hand's own deadline for the run (0: passed): a Mind that restarted
    sets its deadline from it (plus the grace and its slack), as it would have at admission."""
    grace_ms: Annotated[int, Strict(), Field(ge=0, le=600_000)] | None = None
    spec: Streams | None = None
    """The run's streams as opened (`Rpc.streams`): which relays a Mind that restarted rebuilds."""
    args_digest: Str | None = None
    """The digest of the run's tool and arguments (never the arguments), for its history."""
    timeout_ms: TimeoutMs | None = None
    """`Rpc.timeout_ms` as sent: the bound on `remaining_ms` a Mind that restarted accepts."""
    seal: Seal | None = None
    sealed_at: WallTime | None = None
    """`Rpc.seal` and `Rpc.sealed_at` as the run was sent: without a seal that matches what is
    presented, a Mind that restarted kills the run instead of adopting it."""


RUNS_PRESENT_MAX = 10_000


class RunsPresent(Message):
    """Hand -> Mind, first thing after `welcome` on a new generation when the Mind announced a
    resume window: the foreground runs the Hand still holds. The Mind re-binds those it holds as
    non-terminal, has the Hand kill those it ended or does not know, and ends `lost` the runs the
    Hand had and does not present (it restarted)."""

    TYPE = "runs_present"
    runs: Annotated[list[PresentedRun], Field(max_length=RUNS_PRESENT_MAX)] = Field(default_factory=list)


class Cancel(Message):
    TYPE = "cancel"
    run_id: Id
    reason: CancelReason


class CancelResult(Message):
    TYPE = "cancel_result"
    run_id: Id
    status: CancelStatus


# --- Mind <-> Hand: background tasks (the Hand's database is the truth) -------------------------


Digest = Annotated[str, Strict(), StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class TaskInfo(Message):
    """One row of the Hand's task database, as the Hand reports it. Never the raw arguments."""

    TYPE = "task_info"
    task_id: Id
    tool: Label
    state: TaskState
    version: Annotated[int, Strict(), Field(ge=1)]
    """Bumped by the Hand on every change of the row: the Mind applies a report only if it is newer
    than what it holds, so pushes, replies and inventory pages can arrive in any order."""
    args_digest: Digest
    binding_digest: Digest
    max_runtime_ms: Annotated[int, Strict(), Field(gt=0, le=limits.MAX_RUNTIME_MAX_MS)]
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: Int | None = None
    signal: Int | None = None
    stage: KillStage | None = None
    reason: Str = ""
    error: Text | None = None
    log_bytes: NonNeg = 0
    truncated: Bool = False
    uncommitted: Text | None = None
    """Set while the task has ended but the Hand could not commit its outcome yet (a full disk):
    how it ended. `state` stays the committed one until the commit lands (then a new version)."""
    usage: Usage | None = None
    """An ended task's: what it used (where its cgroup counted it)."""


class TaskStartValue(Message):
    """The `value` of a successful background start run (sent as a plain map inside `Result`)."""

    TYPE = "task_start_value"
    task: TaskInfo
    duplicate: Bool = False
    """True when the same task (same id and binding) already existed: nothing new was run."""


class TaskStatus(Message):
    """Mind -> Hand: what is the state of this task? Answered with `task_info` or `error`."""

    TYPE = "task_status"
    task_id: Id


class TaskLogs(Message):
    """Read a task's log by byte offset, one page of at most 64 KiB (Mind -> Hand, client -> Mind)."""

    TYPE = "task_logs"
    task_id: Id
    offset: NonNeg = 0
    limit: Annotated[int, Strict(), Field(gt=0, le=limits.TASK_LOG_PAGE_MAX)] = limits.TASK_LOG_PAGE_MAX
    stream: Stream | None = None
    """None: the combined log, both streams in arrival order. `stdout` / `stderr`: that stream's own
    file; `offset` then counts that stream's bytes and the page's `log_bytes`, `truncated` and `eof`
    are that stream's (error `no_stream_log` for a task logged before streams were kept apart)."""
    on_behalf_of: Label | None = None
    """Client -> Mind only, set only by a Mind node relaying (as `Exec.on_behalf_of`); never sent
    to a Hand."""


class TaskLogPage(Message):
    TYPE = "task_log_page"
    task_id: Id
    offset: NonNeg
    data: Annotated[bytes, Strict(), Field(max_length=limits.TASK_LOG_PAGE_MAX)]
    next_offset: NonNeg
    log_bytes: NonNeg
    state: TaskState
    truncated: Bool = False
    eof: Bool
    """No byte past `next_offset` exists now and the task is terminal: nothing more will come."""

    @model_validator(mode="after")
    def _offsets(self) -> TaskLogPage:
        if self.next_offset != self.offset + len(self.data):
            raise ValueError("next_offset must be offset + len(data)")
        return self


class TaskCancel(Message):
    """Mind -> Hand: cancel a task. Answered with `task_cancel_result`."""

    TYPE = "task_cancel"
    task_id: Id
    reason: CancelReason


class TaskCancelResult(Message):
    TYPE = "task_cancel_result"
    task_id: Id
    status: TaskCancelStatus
    task: TaskInfo | None = None


class TaskRemove(Message):
    """Mind -> Hand: forget a finished task, its row and its log files (`mind task rm`), so it no
    longer counts against the Hand's retention quota. Answered with the removed task's `task_info`
    (as it was: what is gone), or an `error`: `unknown_task`, or `not_allowed` while it has not
    ended (a task is cancelled first, never removed running)."""

    TYPE = "task_remove"
    task_id: Id


class TaskUpdate(Message):
    """Hand -> Mind push on each task transition, best effort (the database is the truth)."""

    TYPE = "task_update"
    task: TaskInfo


class TaskInventory(Message):
    """Mind -> Hand: one page of the Hand's tasks, ordered by task id, after `after`."""

    TYPE = "task_inventory"
    after: Id | None = None
    limit: Annotated[int, Strict(), Field(gt=0, le=1000)] = 500


class TaskInventoryPage(Message):
    TYPE = "task_inventory_page"
    tasks: Annotated[list[TaskInfo], Field(max_length=1000)]
    next_after: Id | None = None
    """Pass as `after` for the next page; None when this was the last page."""


# --- client <-> Mind -----------------------------------------------------------------------


class Exec(Message):
    """Run a tool on a Hand and stream its events back under this request's envelope `id`."""

    TYPE = "exec"
    hand: Label
    tool: Label
    args: dict[Str, Any]
    timeout_ms: TimeoutMs
    grace_ms: Annotated[int, Strict(), Field(ge=0, le=600_000)] | None = None
    streams: Streams | None = None
    """Stream the run's bytes (stdin, complete output, or a terminal) instead of progress."""
    watch: Bool = True
    """Send every state change as a `run_update`. Without it the client gets only the first one
    (`admitted`, which names the run id; none for a run whose client named it, `run_id`), the
    output and the end: three frames fewer per call."""
    fleet: Id | None = None
    """The fleet run this run is a member of (DESIGN §12): recorded in the run's history, so
    `mind runs --fleet ID` lists the members. Changes nothing else about the run. The id must be
    one the Mind minted for this client (`fleet_open`): a run tagged with another's is refused."""
    on_behalf_of: Label | None = None
    """Set only by a Mind node relaying a client's request to the node holding the Hand (DESIGN
    §16): the client the request is made for, whose scope the relaying node checked. Any sender
    but a Mind node's own credential naming it is refused (`denied_by_scope`)."""
    run_id: Id | None = None
    """The run's id, named by the client (DESIGN §4, "Named runs"): `<welcome.run_ids>.<n>`, `n`
    larger than any the connection named before. A run that names its id and neither watches nor
    streams gets no `admitted` update: its `run_end` is the only frame of a call. Anything else is
    refused (`invalid_payload`) and nothing is started. Relayed by a node: as that node checked it."""


class RunUpdate(Message):
    """A state change of a run the client is waiting on (not terminal: see `RunEnd`)."""

    TYPE = "run_update"
    run_id: Id
    hand: Label
    state: RunState
    gen: Int | None = None
    hand_away_since: WallTime | None = None
    """Set while the run's Hand is away (wall-clock time it went): the run waits for it up to the
    Mind's resume window (DESIGN §15). An update with it unset after one with it set: the Hand is back."""


class RunOutput(Message):
    TYPE = "run_output"
    run_id: Id
    stream: Stream
    offset: NonNeg
    data: Annotated[bytes, Strict(), Field(min_length=1, max_length=limits.PROGRESS_CHUNK_MAX)]


class RunEnd(Outcome):
    """The authoritative end of a run, exactly once."""

    TYPE = "run_end"
    hand: Label
    tool: Label
    reject_code: RejectCode | None = None
    collected: Annotated[list[StreamPosition], Field(max_length=4)] | None = None
    """A streamed run's output as its clients had acknowledged it when it ended, per stream (set on
    the end the Mind retains): an attach after the end prints only what follows, never bytes a
    previous consumer already took (`--wait 1s > f; attach >> f` duplicated the last 4 KiB)."""

    @model_validator(mode="after")
    def _terminal(self) -> RunEnd:
        if self.state not in RUN_TERMINAL:
            raise ValueError(f"run_end needs a terminal state, not {self.state.value}")
        return self


class Attach(Message):
    """Client -> Mind: take over run `run_id` (DESIGN §15). Only the run's owner may; the newest
    attachment wins (the previous one is told `replaced`). `streams`: where this client stands on
    each output stream it still holds (a client that lived through a cut); a stream not named
    starts from what the previous consumer acknowledged. Answered with `attached` (or the retained
    `run_end` of a run that has ended)."""

    TYPE = "attach"
    run_id: Id
    streams: Annotated[list[StreamPosition], Field(max_length=4)] = Field(default_factory=list)
    on_behalf_of: Label | None = None
    """Set only by a Mind node relaying a client's attach to the node holding the run (DESIGN
    §16): the client attaching, who must be the run's owner there. Refused from anyone else."""


class Attached(Message):
    """The attachment is this client's now: the run's state, each stream's position (output: where
    the Hand resends from; `stdin`: where this client resends from), and which leg is away."""

    TYPE = "attached"
    run_id: Id
    hand: Label
    state: RunState
    streams: Annotated[list[StreamPosition], Field(max_length=4)] = Field(default_factory=list)
    hand_away_since: WallTime | None = None


class Replaced(Message):
    """Mind -> the previous attachment of a run: a newer attachment of the same owner took it; this
    one gets nothing more of the run."""

    TYPE = "replaced"
    run_id: Id


class Detach(Message):
    """Client -> Mind: leave run `run_id` running unattended, kept for the resume window or `keep_s`
    (capped by the Mind). Answered with `detached`."""

    TYPE = "detach"
    run_id: Id
    keep_s: Annotated[float, Field(gt=0, le=limits.RESUME_WINDOW_MAX_S)] | None = None


class Detached(Message):
    TYPE = "detached"
    run_id: Id
    keep_s: Annotated[float, Field(ge=0, le=limits.RESUME_WINDOW_MAX_S)]
    """How long the Mind keeps the run unattended (the window, or the `keep_s` granted)."""


class CancelRun(Message):
    TYPE = "cancel_run"
    run_id: Id
    on_behalf_of: Label | None = None
    """Set only by a Mind node relaying a client's request to the node holding the Hand (DESIGN
    §16): the client the request is made for, whose scope the relaying node checked. Any sender
    but a Mind node's own credential naming it is refused (`denied_by_scope`)."""


class CancelRunResult(Message):
    TYPE = "cancel_run_result"
    run_id: Id
    status: CancelStatus
    state: RunState


Cursor = Annotated[str, Strict(), StringConstraints(min_length=1, max_length=256)]
"""Where the next page of a list starts: the `next_after` of the previous page, passed back as given."""

PAGE_LIMIT_MAX = 10_000


class ListHands(Message):
    """The Hands the Mind knows, by name, one page at a time (the Mind also bounds a page in bytes)."""

    TYPE = "list_hands"
    after: Cursor | None = None
    limit: Annotated[int, Strict(), Field(gt=0, le=PAGE_LIMIT_MAX)] = 1000


class HandInfo(Message):
    TYPE = "hand_info"
    name: Label
    connected: Bool
    generation: NonNeg
    since: float | None = None
    """Wall-clock time the current connection was welcomed (or the last one ended)."""
    claims: HandClaims | None = None
    running: NonNeg = 0
    labels: dict[Label, LabelValue] = Field(default_factory=dict)
    """What the operator said about this Hand on the Mind (`mind hand label`): the Mind's facts,
    which fleet selectors match; never the Hand's own claims."""
    node: Str | None = None
    """With Mind nodes sharing a database: the node that holds the Hand (None: one Mind, or not held)."""


class NodeInfo(Message):
    """One Mind node of a shared database, as `mind status` shows it (DESIGN §16)."""

    TYPE = "node_info"
    name: Str
    live: Bool
    """Its heartbeat is younger than the answering node's lease."""
    running: Bool
    """It has not stopped cleanly (a killed node stays `running` and goes not `live`)."""
    heartbeat_age_s: float
    """Seconds since its last heartbeat, on the database's clock."""
    hands: NonNeg = 0
    """Hands it holds."""


class SelectHands(Message):
    """Which Hands a fleet selector names (DESIGN §12), resolved by the Mind over its credential
    table and labels, and only among the Hands in the client's scope."""

    TYPE = "select_hands"
    selector: Annotated[str, Strict(), StringConstraints(min_length=1, max_length=4096)]
    after: Cursor | None = None
    limit: Annotated[int, Strict(), Field(gt=0, le=PAGE_LIMIT_MAX)] = PAGE_LIMIT_MAX


class SelectedHand(Message):
    TYPE = "selected_hand"
    name: Label
    connected: Bool
    generation: NonNeg
    labels: dict[Label, LabelValue] = Field(default_factory=dict)


class HandsSelected(Message):
    TYPE = "hands_selected"
    hands: list[SelectedHand]
    next_after: Cursor | None = None
    """More Hands match: ask again with this as `after`. None: this was the last page."""


class WhichConnected(Message):
    """Which of these Hands are connected now (issue 23): the question a fleet's delivery window
    asks about its offline members. Not a selector (nothing is matched, each name is one lookup),
    within the client's scope like every other answer; a client asks in pages of `names`."""

    TYPE = "which_connected"
    names: Annotated[list[Label], Field(min_length=1, max_length=1000)]


class ConnectedNames(Message):
    TYPE = "connected_names"
    names: list[Label]
    """The names asked about that are connected now (and in the client's scope)."""


class FleetOpen(Message):
    """Ask the Mind for a fleet id (DESIGN §12, issue 23 attack 11): it mints the id and binds it
    to this client's credential, so only its owner can tag runs as members (`Exec.fleet`)."""

    TYPE = "fleet_open"


class FleetOpened(Message):
    TYPE = "fleet_opened"
    fleet: Id


class HandsList(Message):
    TYPE = "hands_list"
    hands: list[HandInfo]
    next_after: Cursor | None = None
    """More Hands follow: ask again with this as `after`. None: this was the last page."""


class GetRun(Message):
    TYPE = "get_run"
    run_id: Id
    on_behalf_of: Label | None = None
    """Set only by a Mind node relaying a client's request to the node holding the Hand (DESIGN
    §16): the client the request is made for, whose scope the relaying node checked. Any sender
    but a Mind node's own credential naming it is refused (`denied_by_scope`)."""


class RunExited(Message):
    """Hand -> Mind: the run's process ended, and its output is still owed to a reader (its result
    follows once that output is delivered, or the run is stopped). Without it a detached run whose
    command had exited showed `running` until someone attached: now the Mind knows, and says so."""

    TYPE = "run_exited"
    run_id: Id
    exit_code: Int | None = None
    signal: Int | None = None

    @property
    def state(self) -> RunState:
        """What the run's end will say, as far as the process decides it."""
        return RunState.SUCCEEDED if self.exit_code == 0 else RunState.FAILED


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
    value_not_retained: Bool = False
    """The run's value (a tool's result: `read_file` data, a listing) went to the waiting client in
    its `run_end` and was not kept: the Mind retains run metadata, never payloads (`end.value` is
    None here even though the run had one)."""
    fleet: Id | None = None
    """The fleet run it belongs to (`Exec.fleet`), if any."""
    hand_away_since: WallTime | None = None
    """Wall-clock time the Hand's connection dropped while the run waits for it (DESIGN §15)."""
    client_away_since: WallTime | None = None
    """Wall-clock time the run was left unattended (its client went away or detached)."""
    node: Str | None = None
    """With Mind nodes sharing a database: the node whose registry this run is in, its authority
    (`mind runs` lists every live node's, DESIGN §16). None: one Mind."""
    exited: RunExited | None = None
    """The process ended with its output not yet collected (`state` stays the run's: it is over
    when that output is delivered, `mind attach`); shown as the state it will end in."""


class TaskStart(Message):
    """Client -> Mind: start a background task. Answered with `task_start_result`."""

    TYPE = "task_start"
    hand: Label
    task_id: Id | None = None
    """Name the task to make retries safe: the same id and binding returns the existing task."""
    tool: Label
    args: dict[Str, Any]
    max_runtime_ms: Annotated[int, Strict(), Field(gt=0, le=limits.MAX_RUNTIME_MAX_MS)]
    on_behalf_of: Label | None = None
    """Set only by a Mind node relaying a client's request to the node holding the Hand (DESIGN
    §16), as `Exec.on_behalf_of`."""


class TaskView(Message):
    """What the Mind knows of a task: the Hand's last report plus how fresh it is."""

    TYPE = "task_view"
    hand: Label
    task: TaskInfo | None = None
    """None only while the start is in flight and the Hand has not reported yet."""
    task_id: Id
    state: TaskState
    stale: Bool
    last_synced_at: float | None = None
    cancel_pending: Bool = False
    created_at: float
    reason: Str = ""
    """Why the Mind itself decided the state, when it did (`lost`: unknown to hand)."""


class TaskStartResult(Message):
    TYPE = "task_start_result"
    task_id: Id
    hand: Label
    outcome: StartOutcome
    """`unknown`: the start was sent but no answer came (connection lost, deadline): the task may or
    may not exist; `task get` after the Hand reconnects tells."""
    reject_code: RejectCode | None = None
    message: Text = ""
    view: TaskView | None = None


class TaskGet(Message):
    TYPE = "task_get"
    task_id: Id
    on_behalf_of: Label | None = None
    """Set only by a Mind node relaying a client's request to the node holding the Hand (DESIGN
    §16), as `Exec.on_behalf_of`."""


class TaskCancelRequest(Message):
    TYPE = "task_cancel_request"
    task_id: Id
    on_behalf_of: Label | None = None
    """Set only by a Mind node relaying a client's request to the node holding the Hand (DESIGN
    §16), as `Exec.on_behalf_of`."""


class TaskCancelReply(Message):
    TYPE = "task_cancel_reply"
    task_id: Id
    status: TaskCancelStatus
    view: TaskView | None = None


class TaskRemoveRequest(Message):
    """Client -> Mind: remove a finished task (`mind task rm`): its Hand's row and log first (the
    authority), then the Mind's snapshot; audited on both. Answered with `task_removed`, or an
    `error`: `unknown_task`, `not_allowed` (not ended yet, or its start still in flight),
    `hand_offline` (the row and the log live on the Hand: it must be connected)."""

    TYPE = "task_remove_request"
    task_id: Id
    on_behalf_of: Label | None = None
    """Set only by a Mind node relaying a client's request to the node holding the Hand (DESIGN
    §16), as `Exec.on_behalf_of`."""


class TaskRemoved(Message):
    TYPE = "task_removed"
    task_id: Id
    hand: Label
    task: TaskInfo | None = None
    """The task as its Hand had it when it was removed; None when the Hand no longer had it
    (forgotten by retention, or an earlier removal whose answer was lost): only the Mind's snapshot
    was left to remove."""


class TaskList(Message):
    TYPE = "task_list"
    hand: Label | None = None
    state: TaskState | None = None
    limit: Annotated[int, Strict(), Field(gt=0, le=PAGE_LIMIT_MAX)] = 1000
    after: Cursor | None = None
    """Newest first, one page at a time: the `next_after` of the previous page."""


class TaskListResult(Message):
    TYPE = "task_list_result"
    tasks: list[TaskView]
    next_after: Cursor | None = None
    """More tasks may match: ask again with this as `after`. None: this was the last page."""


class ListRuns(Message):
    """Foreground run history the Mind retains (newest first)."""

    TYPE = "list_runs"
    hand: Label | None = None
    state: RunState | None = None
    since: float | None = None
    """Wall-clock time: only runs created at or after it."""
    limit: Annotated[int, Strict(), Field(gt=0, le=PAGE_LIMIT_MAX)] = 100
    """At most this many runs in this page (the Mind may send fewer: it also bounds a page in bytes)."""
    after: Cursor | None = None
    """The `next_after` of the previous page: the runs admitted before those already listed."""
    fleet: Id | None = None
    """Only the members of this fleet run."""
    unattended: Bool = False
    """Only runs still going with a leg away: detached or left by their client, or waiting for their
    Hand (DESIGN §15; `mind runs --unattended`)."""
    on_behalf_of: Label | None = None
    """Set only by a Mind node asking a peer node for its runs of a client (DESIGN §16): that node's
    own runs only, under the client's scope. Any sender but a Mind node's own credential naming it
    is refused (`denied_by_scope`)."""


class RunList(Message):
    TYPE = "run_list"
    runs: list[RunInfo]
    next_after: Cursor | None = None
    """More runs may match: ask again with this as `after`. None: this was the last page."""
    missing_nodes: Annotated[list[Str], Field(max_length=1024)] = Field(default_factory=list)
    """With Mind nodes sharing a database: the live nodes that did not answer in time, by name. Their
    runs are not in this page, so the listing is partial (DESIGN §16). Empty: every live node's runs
    are here."""


class GetStatus(Message):
    TYPE = "get_status"


class StatusReply(Message):
    """One screen of what the Mind is doing: its lists are bounded (the totals say how much more
    there is; `mind hands` and `mind runs` page through all of it)."""

    TYPE = "status_reply"
    version: Str
    mind_id: Id
    uptime_s: float
    hands: list[HandInfo]
    active_runs: list[RunInfo]
    recent_failures: list[RunInfo]
    task_counts: dict[Str, NonNeg]
    stale_snapshots: NonNeg
    retained_runs: NonNeg
    hands_total: NonNeg | None = None
    """How many Hands there are (`hands` may show fewer: the connected ones first); None from a Mind
    that sent them all."""
    hands_connected: NonNeg | None = None
    active_runs_total: NonNeg | None = None
    """How many runs are active (`active_runs` shows the newest); None from a Mind that sent them all."""
    node: Str | None = None
    """The node that answered (Mind nodes sharing a database); None: one Mind."""
    nodes: list[NodeInfo] | None = None
    """Every node of the shared database with its heartbeat age; None: one Mind."""
    recording: Str | None = None
    """What this node records and whether its store keeps up (`off`; `pty, keeping up`; `all,
    failing since ...: <the store's words>`); None from a Mind that has no recorder."""


# --- recordings (DESIGN §19) ---


class RecordingInfo(Message):
    """A recording's listing: what it is of and how it ended (None while it goes on, or when the
    node recording it stopped first). `mind recordings verify` compares it with the signed record."""

    TYPE = "recording_info"
    run_id: Id
    hand: Label
    client: Str
    tool: Label
    kind: Str
    """`terminal`, `streams`, `copy` or `forward`."""
    command: dict[Str, Any]
    started: WallTime
    node: Str = ""
    ended: WallTime | None = None
    state: Str | None = None
    exit_code: Int | None = None
    bytes: NonNeg = 0
    blocks: NonNeg = 0
    gaps: NonNeg = 0


class ListRecordings(Message):
    """The recordings this client may read, newest first."""

    TYPE = "list_recordings"
    hand: Label | None = None
    client: Label | None = None
    since: WallTime | None = None
    limit: Annotated[int, Strict(), Field(gt=0, le=PAGE_LIMIT_MAX)] = 100
    after: Cursor | None = None


class RecordingList(Message):
    TYPE = "recording_list"
    items: list[RecordingInfo]
    next_after: Cursor | None = None


class GetRecording(Message):
    """A page of a recording's blocks after block `after` (-1: from the first), as stored."""

    TYPE = "get_recording"
    run_id: Id
    after: Annotated[int, Strict(), Field(ge=-1)] = -1


class RecordingBlock(Message):
    TYPE = "recording_block"
    seq: NonNeg
    t: NonNeg
    data: Bytes
    compressed: Bool
    head: Bytes
    mac: Bytes


class RecordingPage(Message):
    """`more`: further blocks are stored already (ask again at once); otherwise the recording has
    no more yet (`info.ended` unset: it may still grow, `mind play --follow` asks again later)."""

    TYPE = "recording_page"
    info: RecordingInfo
    blocks: list[RecordingBlock]
    more: Bool = False


class VerifyRecordings(Message):
    """Check recordings against the Mind's key: one (`run_id`), or every one this client may read."""

    TYPE = "verify_recordings"
    run_id: Id | None = None


class RecordingCheck(Message):
    TYPE = "recording_check"
    run_id: Id
    ok: Bool
    problem: Text = ""
    at: NonNeg | None = None
    """The first block that does not check."""
    blocks: NonNeg = 0
    complete: Bool = False
    """The recording holds the run's signed end."""


class VerifyResult(Message):
    TYPE = "verify_result"
    items: list[RecordingCheck]


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
        StreamNumbers,
        StreamAck,
        Resize,
        Result,
        Cancel,
        CancelResult,
        ResultAck,
        StreamPosition,
        StreamResume,
        PresentedRun,
        RunsPresent,
        RunExited,
        Attach,
        Attached,
        Replaced,
        Detach,
        Detached,
        Exec,
        RunUpdate,
        RunOutput,
        RunEnd,
        CancelRun,
        CancelRunResult,
        ListHands,
        HandsList,
        SelectHands,
        SelectedHand,
        HandsSelected,
        WhichConnected,
        ConnectedNames,
        FleetOpen,
        FleetOpened,
        GetRun,
        RunInfo,
        TaskStatus,
        TaskInfo,
        TaskLogs,
        TaskLogPage,
        TaskCancel,
        TaskCancelResult,
        TaskUpdate,
        TaskInventory,
        TaskInventoryPage,
        TaskStart,
        TaskStartResult,
        TaskView,
        TaskGet,
        TaskCancelRequest,
        TaskCancelReply,
        TaskRemove,
        TaskRemoveRequest,
        TaskRemoved,
        TaskList,
        TaskListResult,
        ListRuns,
        RunList,
        GetStatus,
        StatusReply,
        RecordingInfo,
        ListRecordings,
        RecordingList,
        GetRecording,
        RecordingBlock,
        RecordingPage,
        VerifyRecordings,
        RecordingCheck,
        VerifyResult,
    )
}


def build_all() -> None:
    """Build every model's validator now (they are otherwise built on first use). Forward
    references (`Rpc.background`) resolve here at the latest."""
    for model in [v for v in globals().values() if isinstance(v, type) and issubclass(v, Message) and v is not Message]:
        model.model_rebuild()


HANDSHAKE_TYPES = frozenset({"hello", "challenge", "proof", "welcome", "error"})
