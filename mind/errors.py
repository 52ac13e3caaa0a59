"""The error every client call raises, in a module of its own so that the CLI's fast path
(`mind/client/blocking.py`) and the full Python client (`mind/client/aio.py`) raise the same class."""

from __future__ import annotations

from protocol.errors import MindhandError


class ClientError(MindhandError):
    """The call could not be made or answered (connection, auth, a refused request)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
