"""The audited events, one enum for both sides: a misspelt event is an AttributeError, not a line that
silently never reaches the audit file.

The audit file (`audit.jsonl`, 0600: the Mind's in its home, a Hand's in its state dir) receives every
log event named here, whatever the console's log level, and nothing else (`protocol.io.logs`). It holds
every admission decision and terminal state, every handshake, every scope refusal and credential change,
and what the operator changed while a daemon ran: who, hand, generation, tool, args digest, decision,
reason, time. Never raw arguments or secrets (digests, sizes and counts only).

A refusal is audited on the side that decides it: the Mind for scopes, unknown or offline Hands,
conflicting task ids and handshakes; the Hand for its policy, paths, caps and task quota.
"""

from enum import StrEnum


class AuditEvent(StrEnum):
    # --- admission decisions and terminal states ---
    RUN_ADMITTED = "run_admitted"
    """Mind: a client's run was recorded (then sent, or refused at once: see its `run_terminal`)."""
    RUN_ACCEPTED = "run_accepted"
    """Hand: a run passed every check and runs."""
    RUN_REJECTED = "run_rejected"
    """Hand: a run refused before anything ran (policy, unknown tool, paths, caps, duplicate), with `code`."""
    RUN_TERMINAL = "run_terminal"
    """Both: the one terminal state of a run (on the Mind, a refusal it decided is `state=rejected` here)."""
    TASK_QUEUED = "task_queued"
    """Hand: a background task committed to its database."""
    TASK_DUPLICATE = "task_duplicate"
    """Hand: a start with a known id and the same binding; nothing new ran."""
    TASK_START_DUPLICATE = "task_start_duplicate"
    """Mind: a start answered from its snapshot as a duplicate (the Hand had reported the task);
    nothing was sent to the Hand."""
    TASK_START_ASKED_AGAIN = "task_start_asked_again"
    """Mind: a start of an id the Hand never answered for, sent to the Hand again (it settles it)."""
    TASK_START_REJECTED = "task_start_rejected"
    """Both: a background start refused, with `code` (Mind: scope, unknown or offline hand, conflicting id;
    Hand: quota, policy, paths, caps, conflicting binding)."""
    TASK_START_ENDED = "task_start_ended"
    """Mind: what the client was told about a start the Hand decided (`outcome`, `reject_code`)."""
    TASK_TERMINAL = "task_terminal"
    """Hand: the one terminal state of a background task."""
    TASK_CANCEL_REQUESTED = "task_cancel_requested"
    TASK_CANCEL_RECORDED = "task_cancel_recorded"
    TASK_CANCEL_DELIVERED = "task_cancel_delivered"
    TASK_REMOVED = "task_removed"
    """Both: a finished task forgotten on request (`mind task rm`). Hand: its row and log removed
    (state, log bytes, args digest); Mind: its snapshot, with the client who asked."""
    # --- who got in, who did not, and who tried to act outside what they may do ---
    HANDSHAKE_OK = "handshake_ok"
    HANDSHAKE_FAILED = "handshake_failed"
    """Mind: a peer failed to authenticate (`code`: auth_failed, handshake_timeout, ...). Hand: the Mind
    failed verification (its certificate or pin, or its `welcome`)."""
    HANDSHAKE_REFUSED = "handshake_refused"
    """Mind: a connection refused before its handshake (`why`: rate_limited, busy)."""
    CREDENTIAL_CHANGED = "credential_changed"
    """Mind (local CLI): a credential added, rotated or revoked."""
    CREDENTIAL_CLOSED = "credential_closed"
    """Mind: a live connection closed because its credential was revoked or rotated."""
    DENIED_BY_SCOPE = "denied_by_scope"
    HAND_INPUT_WRONG_GENERATION = "hand_input_wrong_generation"
    HAND_INPUT_UNKNOWN_RUN = "hand_input_unknown_run"
    HAND_PRESENTED_UNSEALED = "hand_presented_unsealed"
    """A Hand presented runs no Mind of this database sent it as presented (no seal, or one that does
    not match): killed, never adopted; one line per presentation with the count."""
    TASK_UPDATE_FOREIGN = "task_update_foreign"
    TASK_UPDATE_UNSOLICITED = "task_update_unsolicited"
    """Mind: a Hand reported a task the Mind never asked it about (not adopted; issue 13)."""
    RECONCILE_FOREIGN_TASK = "reconcile_foreign_task"
    # --- who read what was recorded ---
    RECORDING_READ = "recording_read"
    """Mind: a recording listed, played or verified (`what`), by whom, allowed or not (DESIGN §19)."""
    # --- what the operator changed while it ran ---
    CONFIG_RELOADED = "config_reloaded"
    CONFIG_RELOAD_FAILED = "config_reload_failed"
    POLICY_RELOADED = "policy_reloaded"


AUDITED: frozenset[str] = frozenset(AuditEvent)
"""The values, for the log tee's membership test (a `StrEnum` member hashes as its value)."""
