"""Digests that stand in for raw tool arguments wherever something is logged or stored.

Raw arguments never enter logs, snapshots, task rows or audit records (DESIGN §3); these digests do.
Both sides compute them the same way, so a Mind snapshot and a Hand row of one task agree.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack


def _canonical(value: Any) -> Any:
    """Maps with sorted keys, recursively: `{"a":1,"b":2}` and `{"b":2,"a":1}` are one call."""
    if isinstance(value, dict):
        return [[k, _canonical(value[k])] for k in sorted(value, key=lambda k: (type(k).__name__, k))]
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _sha(value: Any) -> str:
    return hashlib.sha256(msgpack.packb(_canonical(value), use_bin_type=True)).hexdigest()


def args_digest(tool: str, args: dict[str, Any]) -> str:
    return _sha(["args", tool, args])


def binding_digest(tool: str, args: dict[str, Any], max_runtime_ms: int) -> str:
    """What makes two starts with the same task id "the same task": the tool, its arguments and its
    options. A duplicate start with the same binding returns the existing task and runs nothing;
    another binding is a `conflicting_duplicate`."""
    return _sha(["binding", tool, args, max_runtime_ms])
