"""The messages of `mind exec`'s fast path, read and built without pydantic.

`decode` is `protocol.envelope.decode` for the message types the fast path receives: the
same envelope checks (`protocol.envelope.unpack` and `check`: version, keys, seq and gen types),
then the payload checks of `wire_gen.INBOUND`, which `scripts/gen_wire.py` generates from
`protocol/messages.py` (mind/client/checks.py says how they relate to the models). Nothing here is
more permissive than the models: tests/mind/test_wire.py feeds both the same payloads (valid ones
from the models, and hypothesis-mutated ones) and fails if this accepts anything the model refuses
or reads a value differently.

`Handshake` is `protocol.auth.ClientHandshake` with its two messages built by `wire_gen` instead of
pydantic, so the transcript and both MAC checks stay that one implementation.
"""

from __future__ import annotations

from typing import Any

from mind.client.checks import REQUIRED, Invalid, Msg
from mind.client.wire_gen import (
    INBOUND,
    attach,
    cancel_run,
    detach,
    exec_,
    hello,
    proof,
    resize,
    stream_ack,
)
from protocol.auth import ClientHandshake
from protocol.codes import ErrorCode
from protocol.envelope import Envelope, check, unpack
from protocol.errors import ProtocolError

__all__ = [
    "INBOUND",
    "REQUIRED",
    "Handshake",
    "Invalid",
    "Msg",
    "attach",
    "cancel_run",
    "chunk",
    "detach",
    "decode",
    "exec_",
    "hello",
    "proof",
    "resize",
    "stream_ack",
    "stream_data",
]


def stream_data(run_id: str, stream: str, offset: int, data: bytes = b"", eof: bool = False) -> Msg:
    """A chunk to send: not an envelope but a data frame (`protocol/frames.py`), which
    `Channel.stamp` builds from these fields under the stream's number on the connection."""
    return Msg("stream_data", {"run_id": run_id, "stream": stream, "offset": offset, "data": data, "eof": eof})


def chunk(run_id: str, stream: str, offset: int, payload: memoryview, eof: bool) -> Msg:
    """A received data frame as the run's `stream_data` event (the header was checked by
    `protocol.frames.decode`; the names are the connection's own, from `stream_numbers`)."""
    return Msg(
        "stream_data", {"run_id": run_id, "stream": stream, "offset": offset, "data": bytes(payload), "eof": eof}
    )


def decode(data: object) -> Envelope[Any]:
    """Untrusted bytes -> an `Envelope` holding a validated `Msg`, or `ProtocolError` (as
    `protocol.envelope.decode`, for the types this path understands; any other type is refused)."""
    t, id_, seq, gen, p = check(unpack(data))
    validate = INBOUND.get(t)
    if validate is None:
        shown = t if len(t) <= 40 and t.isprintable() else "(unprintable)"
        raise ProtocolError(ErrorCode.UNEXPECTED_MESSAGE, f"a {shown!r} frame is not expected here")
    try:
        msg = validate(p)
    except Invalid as exc:
        where = exc.loc.rstrip(".") or "(payload)"
        raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"invalid {t} payload: {where}: {exc.why}") from None
    except RecursionError:
        raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"invalid {t} payload: nested too deeply") from None
    return Envelope(msg=msg, seq=seq, id=id_, gen=gen)


class Handshake(ClientHandshake):
    """`ClientHandshake` with its two messages built without pydantic (see protocol/auth.py)."""

    _hello_msg = staticmethod(hello)  # type: ignore[assignment]
    _proof_msg = staticmethod(proof)  # type: ignore[assignment]
