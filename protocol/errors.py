"""The one exception decoding untrusted input may raise."""

from protocol.codes import ErrorCode


class ProtocolError(Exception):
    """A peer sent something we refuse. Carries a code and a sentence a user can act on.

    The connection layer turns it into an `error` frame and, for connection-level codes, a close.
    The message must never echo the offending bytes back (they may hold secrets or be huge).
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
