"""Reading a credential file for a client (the Python client and the CLI share it)."""

from __future__ import annotations

import os
from pathlib import Path

from mind.errors import ClientCode, ClientError
from protocol.auth import Credential


def load_credential(path: str | os.PathLike[str]) -> Credential:
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except OSError as exc:
        raise ClientError(ClientCode.CONFIG, f"cannot read credential file {p}: {exc.strerror}") from None
    try:
        return Credential.parse(text)
    except ValueError as exc:
        raise ClientError(ClientCode.CONFIG, f"bad credential file {p}: {exc}") from None
