"""Every code a peer can send, as enums: a typo is an import error, not a silent mismatch."""

from enum import StrEnum


class ErrorCode(StrEnum):
    """Connection-level errors: the frame or the peer is wrong, not one run."""

    MALFORMED_FRAME = "malformed_frame"
    FRAME_TOO_LARGE = "frame_too_large"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_PAYLOAD = "invalid_payload"
    VERSION_MISMATCH = "version_mismatch"
    SEQ_VIOLATION = "seq_violation"
    GEN_MISMATCH = "gen_mismatch"
    UNEXPECTED_MESSAGE = "unexpected_message"
    AUTH_FAILED = "auth_failed"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    REPLACED = "replaced"
    REVOKED = "revoked"
    SHUTDOWN = "shutdown"
    INTERNAL_ERROR = "internal_error"
    # request-level errors a client can get back for one request
    UNKNOWN_RUN = "unknown_run"
    UNKNOWN_TASK = "unknown_task"
    HAND_OFFLINE = "hand_offline"
    HAND_TIMEOUT = "hand_timeout"
    NOT_ALLOWED = "not_allowed"
    DENIED_BY_SCOPE = "denied_by_scope"
    RATE_LIMITED = "rate_limited"
    BUSY = "busy"
    RESUME_PENDING = "resume_pending"
    """`attach` named a run this Mind does not hold yet, within its resume window after a start:
    the Mind restarted and the run's Hand may still present it. Ask again (backing off) until the
    window the `welcome` announced has passed; after it, `unknown_run` is the answer."""
    NO_STREAM_LOG = "no_stream_log"
    """`task_logs` named a stream of a task logged before the Hand kept stdout and stderr apart:
    only its combined log exists (ask without `stream`)."""


class RejectCode(StrEnum):
    """Why a run was refused before anything ran (`rejected`)."""

    INVALID_REQUEST = "invalid_request"
    UNKNOWN_TOOL = "unknown_tool"
    DENIED_BY_POLICY = "denied_by_policy"
    DENIED_BY_SCOPE = "denied_by_scope"
    PATH_OUTSIDE_ROOT = "path_outside_root"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    DUPLICATE_RUN = "duplicate_run"
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    QUOTA_EXCEEDED = "quota_exceeded"
    HAND_OFFLINE = "hand_offline"
    UNKNOWN_HAND = "unknown_hand"
    SHUTTING_DOWN = "shutting_down"
    DISK_FULL = "disk_full"
    """The Hand's state disk has no room for what a start must write first (its audit lines, a
    task's row and log): refused at once, nothing ran or was stored. A run that cannot be audited
    does not run; once there is room again, the same start is accepted."""
    INTERNAL_ERROR = "internal_error"


class CancelReason(StrEnum):
    """Why a run must stop (DESIGN §6). First reason wins."""

    USER_REQUESTED = "user_requested"
    CLIENT_DISCONNECTED = "client_disconnected"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    BUDGET_EXHAUSTED = "budget_exhausted"
    SHUTDOWN = "shutdown"
    INTERNAL_FAILURE = "internal_failure"
    CONNECTION_LOST = "connection_lost"
    """The Hand lost the connection that carried a foreground run: nobody can receive its result."""
    RECORDING_FAILED = "recording_failed"
    """`mind serve --record-strict`: the Mind could not keep the run's recording (DESIGN §19)."""


class CancelStatus(StrEnum):
    """The answer to a cancel request. A request is not an outcome: see the run's terminal state."""

    CANCEL_REQUESTED = "cancel_requested"
    ALREADY_DONE = "already_done"
    UNKNOWN_RUN = "unknown_run"


class TaskCancelStatus(StrEnum):
    """The answer to a task cancel. `pending_delivery`: the Hand is offline; the Mind recorded the
    request and delivers it in the reconciliation pass after the Hand reconnects."""

    CANCEL_REQUESTED = "cancel_requested"
    ALREADY_DONE = "already_done"
    UNKNOWN_TASK = "unknown_task"
    PENDING_DELIVERY = "pending_delivery"


class KillStage(StrEnum):
    """Which signal ended a killed process tree."""

    TERM = "term"
    KILL = "kill"
