"""The messages of `mind exec`'s fast path, validated without pydantic.

`protocol/messages.py` is the contract; importing pydantic and building its models costs about as
much as a whole `ssh host true`. The fast path receives only seven message types, so this module
checks those payloads by hand, field by field, with the same rules: strict types (no "1" -> 1, no
bool for int), the same string patterns and lengths, the same bounds, enums by value, `extra` fields
refused, missing ones defaulted, and the same model-level rules (a `run_end` is terminal). Nothing
here is more permissive than the models: tests/mind/test_wire.py feeds both the same payloads
(valid ones from the models, and hypothesis-mutated ones) and fails if this accepts anything the
model refuses, reads a value differently, or drifts from the model's field list.

Envelope framing (version, keys, seq, gen) is not repeated: `protocol.envelope.unpack` and `check`
do it for both paths.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from protocol import limits
from protocol.codes import CancelStatus, ErrorCode, KillStage, RejectCode
from protocol.envelope import Envelope, check, unpack
from protocol.errors import ProtocolError
from protocol.states import RUN_TERMINAL, RunState

REQUIRED = object()


class Invalid(Exception):
    def __init__(self, loc: str, why: str) -> None:
        self.loc, self.why = loc, why


class Msg:
    """A message as read-only attributes, standing in for the pydantic model of the same `TYPE`
    (`Channel.stamp` needs only `TYPE` and `model_dump`)."""

    __slots__ = ("TYPE", "_fields")

    def __init__(self, type_: str, fields: dict[str, Any]) -> None:
        object.__setattr__(self, "TYPE", type_)
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self.TYPE} is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Msg) and (self.TYPE, self._fields) == (other.TYPE, other._fields)

    def __repr__(self) -> str:
        return f"Msg({self.TYPE!r}, {sorted(self._fields)})"  # field names only: values may be secrets

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {k: v.model_dump(mode) if isinstance(v, Msg) else v for k, v in self._fields.items()}


# --- field checks: value -> value as the model would hold it, or Invalid ------------------------

Check = Callable[[Any], Any]


def strict_str(max_len: int | None = None, pattern: re.Pattern[str] | None = None) -> Check:
    def check_str(v: Any) -> Any:
        if not isinstance(v, str):
            raise Invalid("", "must be a string")
        if max_len is not None and len(v) > max_len:
            raise Invalid("", f"must be at most {max_len} characters")
        # fullmatch: the models' patterns end in `$`, which pydantic (Rust regex) never lets match
        # before a trailing newline, and Python's `re.match` would
        if pattern is not None and not pattern.fullmatch(v):
            raise Invalid("", "does not match the required pattern")
        return v

    return check_str


def strict_int(ge: int | None = None, gt: int | None = None, le: int | None = None) -> Check:
    def check_int(v: Any) -> Any:
        if not isinstance(v, int) or isinstance(v, bool):
            raise Invalid("", "must be an integer")
        if (ge is not None and v < ge) or (gt is not None and v <= gt) or (le is not None and v > le):
            raise Invalid("", "is out of range")
        return v

    return check_int


def number(gt: float, le: float) -> Check:
    """A float field; ints are taken as floats (as the model does). Strings are refused: stricter
    than pydantic's lax mode, and the Mind never sends them."""

    def check_number(v: Any) -> Any:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise Invalid("", "must be a number")
        if not (v > gt and v <= le):  # NaN fails both
            raise Invalid("", "is out of range")
        return float(v)

    return check_number


def strict_bool(v: Any) -> Any:
    if not isinstance(v, bool):
        raise Invalid("", "must be a boolean")
    return v


def strict_bytes(min_len: int = 0, max_len: int | None = None) -> Check:
    def check_bytes(v: Any) -> Any:
        if not isinstance(v, bytes):
            raise Invalid("", "must be bytes")
        if len(v) < min_len or (max_len is not None and len(v) > max_len):
            raise Invalid("", "has the wrong length")
        return v

    return check_bytes


def enum(cls: type) -> Check:
    values = {m.value: m for m in cls}  # type: ignore[attr-defined]

    def check_enum(v: Any) -> Any:
        if isinstance(v, str) and v in values:
            return values[v]
        raise Invalid("", f"must be one of {', '.join(values)}")

    return check_enum


def literal(*allowed: str) -> Check:
    def check_literal(v: Any) -> Any:
        if isinstance(v, str) and v in allowed:
            return v
        raise Invalid("", f"must be one of {', '.join(allowed)}")

    return check_literal


def optional(inner: Check) -> Check:
    def check_optional(v: Any) -> Any:
        return None if v is None else inner(v)

    return check_optional


def any_value(v: Any) -> Any:
    return v


Fields = dict[str, tuple[Check, Any]]


def model(type_: str, fields: Fields, rule: Callable[[dict[str, Any]], str | None] | None = None) -> Check:
    """A payload map -> `Msg`: unknown keys refused, missing keys defaulted (or refused)."""

    def check_model(v: Any) -> Any:
        if not isinstance(v, dict):
            raise Invalid("", "must be a map")
        for key in v:
            if key not in fields:
                raise Invalid(key if isinstance(key, str) else "(field)", "extra fields are not permitted")
        out: dict[str, Any] = {}
        for name, (check_field, default) in fields.items():
            if name in v:
                try:
                    out[name] = check_field(v[name])
                except Invalid as exc:
                    raise Invalid(f"{name}.{exc.loc}" if exc.loc else name, exc.why) from None
            elif default is REQUIRED:
                raise Invalid(name, "field required")
            else:
                out[name] = default
        if rule is not None and (why := rule(out)) is not None:
            raise Invalid("", why)
        return Msg(type_, out)

    check_model.fields = fields  # type: ignore[attr-defined]  # for the drift test
    return check_model


# --- the mirrored models (keep in step with protocol/messages.py; the tests check it) ----------

Str = strict_str(4096)
Text = strict_str(16384)
Int = strict_int()
NonNeg = strict_int(ge=0)
Label = strict_str(pattern=limits.LABEL_RE)
Id = strict_str(pattern=limits.ID_RE)
Nonce = strict_bytes(limits.NONCE_BYTES, limits.NONCE_BYTES)
Mac = strict_bytes(limits.MAC_BYTES, limits.MAC_BYTES)

EMPTY_TAIL = Msg("output_tail", {"data": b"", "total": 0})
OutputTail = model(
    "output_tail",
    {
        "data": (strict_bytes(max_len=limits.OUTPUT_TAIL_MAX), b""),
        "total": (NonNeg, 0),
    },
)

OUTCOME: Fields = {
    "run_id": (Id, REQUIRED),
    "state": (enum(RunState), REQUIRED),
    "reason": (Str, ""),
    "exit_code": (optional(Int), None),
    "signal": (optional(Int), None),
    "stage": (optional(enum(KillStage)), None),
    "stdout": (OutputTail, EMPTY_TAIL),
    "stderr": (OutputTail, EMPTY_TAIL),
    "truncated": (strict_bool, False),
    "progress_dropped": (NonNeg, 0),
    "value": (any_value, None),
    "error": (optional(Text), None),
    "duration_ms": (NonNeg, 0),
}


def _terminal(f: dict[str, Any]) -> str | None:
    return None if f["state"] in RUN_TERMINAL else f"run_end needs a terminal state, not {f['state'].value}"


INBOUND: dict[str, Check] = {
    "challenge": model(
        "challenge",
        {
            "mind_id": (Id, REQUIRED),
            "handshake_id": (Id, REQUIRED),
            "nonce": (Nonce, REQUIRED),
            "expires_in_ms": (strict_int(gt=0, le=60_000), REQUIRED),
        },
    ),
    "welcome": model(
        "welcome",
        {
            "gen": (strict_int(ge=1), REQUIRED),
            "mac": (Mac, REQUIRED),
            "ping_interval_s": (number(gt=0, le=3600), REQUIRED),
        },
    ),
    "error": model(
        "error",
        {
            "code": (enum(ErrorCode), REQUIRED),
            "message": (Text, REQUIRED),
        },
    ),
    "run_update": model(
        "run_update",
        {
            "run_id": (Id, REQUIRED),
            "hand": (Label, REQUIRED),
            "state": (enum(RunState), REQUIRED),
            "gen": (optional(Int), None),
        },
    ),
    "run_output": model(
        "run_output",
        {
            "run_id": (Id, REQUIRED),
            "stream": (literal("stdout", "stderr"), REQUIRED),
            "offset": (NonNeg, REQUIRED),
            "data": (strict_bytes(1, limits.PROGRESS_CHUNK_MAX), REQUIRED),
        },
    ),
    "run_end": model(
        "run_end",
        {
            **OUTCOME,
            "hand": (Label, REQUIRED),
            "tool": (Label, REQUIRED),
            "reject_code": (optional(enum(RejectCode)), None),
        },
        rule=_terminal,
    ),
    "cancel_run_result": model(
        "cancel_run_result",
        {
            "run_id": (Id, REQUIRED),
            "status": (enum(CancelStatus), REQUIRED),
            "state": (enum(RunState), REQUIRED),
        },
    ),
}


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


# --- what the fast path sends (field order and values as the models' `model_dump`) -------------


def hello(role: str, label: str, nonce: bytes, claims: None = None) -> Msg:
    return Msg("hello", {"role": role, "label": label, "nonce": nonce, "claims": claims})


def proof(handshake_id: str, mac: bytes) -> Msg:
    return Msg("proof", {"handshake_id": handshake_id, "mac": mac})


def exec_(hand: str, tool: str, args: dict[str, Any], timeout_ms: int, grace_ms: int | None, watch: bool) -> Msg:
    return Msg(
        "exec",
        {"hand": hand, "tool": tool, "args": args, "timeout_ms": timeout_ms, "grace_ms": grace_ms, "watch": watch},
    )


def cancel_run(run_id: str) -> Msg:
    return Msg("cancel_run", {"run_id": run_id})
