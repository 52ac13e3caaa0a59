"""The error every client call raises, in a module of its own so that the CLI's fast path
(`mind/client/blocking.py`) and the full Python client (`mind/client/aio.py`) raise the same class,
and the codes it carries."""

from __future__ import annotations

from enum import StrEnum

from protocol.codes import ErrorCode
from protocol.errors import MindhandError


class ClientCode(StrEnum):
    """Why a call failed, as decided on this side of the wire (the Mind's own reasons are
    `protocol.codes.ErrorCode`, passed through as they came). String-valued: `--json` output and a
    script comparing `exc.code == "closed"` see the same text as before it was an enum."""

    UNREACHABLE = "unreachable"
    """No connection: refused, no route, name not found, timed out connecting."""
    TLS = "tls"
    """The Mind's certificate failed verification (CA, name, pin)."""
    CONFIG = "config"
    """Our own configuration: no URL, an unreadable or malformed credential file, a bad URL."""
    CLOSED = "closed"
    """The connection ended (or failed) after it was made: what was in flight has no answer."""
    PROTOCOL = "protocol"
    """The Mind sent something this client cannot accept (a broken frame, a reply of the wrong kind)."""
    INVALID_REQUEST = "invalid_request"
    """The call was refused here before anything was sent (bad arguments)."""
    EMPTY_SELECTION = "empty_selection"
    """A fleet selector matched no Hand within this client's scope (`mc.exec_many`)."""
    # a run's or a copy's end (`RunFailed`, `CopyError`): the run states of the same name
    REJECTED = "rejected"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"
    BUDGET_EXHAUSTED = "budget_exhausted"
    MISMATCH = "mismatch"
    """A copy's bytes did not match their digest."""
    LOCAL = "local"
    """A copy failed on this machine's side (a local file unreadable or unwritable)."""


Code = ClientCode | ErrorCode
"""What `ClientError.code` holds: ours, or the Mind's."""


class ClientError(MindhandError):
    """The call could not be made or answered (connection, auth, a refused request)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
