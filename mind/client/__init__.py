"""The library users import: `from mind.client import MindClient, ClientError, load_credential`
(`ClientError.code` is a `ClientCode`, or the Mind's own `protocol.codes.ErrorCode`).

The names are loaded on first use (PEP 562), so that the CLI's fast path, which imports
`mind.client.blocking`, does not pay for asyncio, websockets and pydantic through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mind.client.aio import MindClient
    from mind.client.credentials import load_credential
    from mind.client.run import RunFailed, RunHandle, StillRunning
    from mind.errors import ClientCode, ClientError

__all__ = ["ClientCode", "ClientError", "MindClient", "RunFailed", "RunHandle", "StillRunning", "load_credential"]

_WHERE = {
    "MindClient": "mind.client.aio",
    "RunHandle": "mind.client.run",
    "RunFailed": "mind.client.run",
    "StillRunning": "mind.client.run",
    "load_credential": "mind.client.credentials",
    "ClientError": "mind.errors",
    "ClientCode": "mind.errors",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'mind.client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(where), name)
