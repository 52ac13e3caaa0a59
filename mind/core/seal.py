"""What a Mind sent to a Hand, sealed so that a Mind that restarted can tell it from what a Hand makes up.

Why: after a restart the Mind remembers no foreground run, and the Hand presents the runs it still
holds (DESIGN §15) with their owner, tool and deadline. Taken on the Hand's word, any Hand
credential could present made-up runs "owned" by any client and fill that client's stream budget
(its every `exec` refused `quota_exceeded` while the fake Hand stays). So each `rpc` carries a seal:
an HMAC, under a key the Mind keeps in its store (one per database: every node of a shared database
verifies what another sent), over the Hand it went to and everything a presentation is adopted from
(run id, owner, tool, arguments' digest, timeout, grace, streams, and when it was sent). The Hand
echoes the seal and the time untouched; the Mind adopts a presented run only when the seal matches
what it presents, and sets the run's deadline and creation time from the sealed values, never from
the Hand's own say.

Pure: the key is given by the shell; an HMAC computes, it reads nothing.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgpack

from protocol.messages import PresentedRun, Streams

SEAL_HEX = 32
"""The seal's length in hex digits (128 bits of HMAC-SHA256: forging one takes 2^128 tries)."""


def _body(
    hand: str,
    run_id: str,
    owner: str,
    tool: str,
    digest: str,
    timeout_ms: int,
    grace_ms: int | None,
    spec: Streams | None,
    sealed_at: float,
) -> bytes:
    fields: list[Any] = [hand, run_id, owner, tool, digest, timeout_ms, grace_ms, None, float(sealed_at)]
    if spec is not None:
        fields[7] = spec.model_dump(mode="json")
    return bytes(msgpack.packb(fields, use_bin_type=True))


def seal(
    key: bytes,
    hand: str,
    run_id: str,
    owner: str,
    tool: str,
    digest: str,
    timeout_ms: int,
    grace_ms: int | None,
    spec: Streams | None,
    sealed_at: float,
) -> str:
    """The seal of one `rpc` as sent to `hand`."""
    body = _body(hand, run_id, owner, tool, digest, timeout_ms, grace_ms, spec, sealed_at)
    return hmac.new(key, body, hashlib.sha256).hexdigest()[:SEAL_HEX]


def unsealed(key: bytes, hand: str, p: PresentedRun) -> str | None:
    """Why the presentation `p` by `hand` is not what a Mind of this database sent it (the reason
    for the audit line), or None: every field a run is adopted from is as sealed."""
    if p.seal is None or p.sealed_at is None or p.timeout_ms is None:
        return "presented without the seal its rpc carried"
    if p.owner is None or p.tool is None or p.args_digest is None:
        return "presented without its owner, tool or digest"
    want = seal(key, hand, p.run_id, p.owner, p.tool, p.args_digest, p.timeout_ms, p.grace_ms, p.spec, p.sealed_at)
    if not hmac.compare_digest(want, p.seal):
        return "its seal does not match what it presents (not sent to this Hand as presented)"
    return None
