"""The building blocks of the fast path's payload checks: strict field checks and `Msg`, no pydantic.

`protocol/messages.py` is the contract; importing pydantic and building its models costs about as
much as a whole `ssh host true`. So `mind exec` reads the few message types it receives with these
small checks instead, composed into one check per message type by `mind/client/wire_gen.py`, which
`scripts/gen_wire.py` writes from the models' own validation schemas (so the two cannot drift:
`scripts/gen_wire.py --check` fails when they differ).

Each check keeps the model's rule or is stricter, never more permissive: strict types (no "1" -> 1,
no bool for int), the same string patterns and lengths, the same bounds, enums by value, extra
fields refused, missing ones defaulted. Model-level validators are Python code the generator cannot
translate; each has its hand-written twin in `RULES`, and the generator records the validator's
source digest so that a change to it fails `--check` until someone looks at the twin.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from protocol.errors import MindhandError
from protocol.states import RUN_TERMINAL

REQUIRED = object()


class Invalid(MindhandError):
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
        return {k: _dump(v, mode) for k, v in self._fields.items()}


def _dump(v: Any, mode: str) -> Any:
    if isinstance(v, Msg):
        return v.model_dump(mode)
    if type(v) is list:
        return [_dump(x, mode) for x in v]
    return v


# --- field checks: value -> value as the model would hold it, or Invalid ------------------------

Check = Callable[[Any], Any]


def strict_str(min_len: int = 0, max_len: int | None = None, pattern: re.Pattern[str] | None = None) -> Check:
    def check_str(v: Any) -> Any:
        if not isinstance(v, str):
            raise Invalid("", "must be a string")
        if len(v) < min_len or (max_len is not None and len(v) > max_len):
            raise Invalid("", "has the wrong length")
        # fullmatch: the models' patterns end in `$`, which pydantic (Rust regex) never lets match
        # before a trailing newline, and Python's `re.match` would; for any pattern a full match is
        # also a match, so this is never more permissive than pydantic's search
        if pattern is not None and not pattern.fullmatch(v):
            raise Invalid("", "does not match the required pattern")
        return v

    return check_str


def strict_int(ge: int | None = None, gt: int | None = None, le: int | None = None, lt: int | None = None) -> Check:
    def check_int(v: Any) -> Any:
        if not isinstance(v, int) or isinstance(v, bool):
            raise Invalid("", "must be an integer")
        if (
            (ge is not None and v < ge)
            or (gt is not None and v <= gt)
            or (le is not None and v > le)
            or (lt is not None and v >= lt)
        ):
            raise Invalid("", "is out of range")
        return v

    return check_int


def number(ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None) -> Check:
    """A float field; ints are taken as floats (as the model does). Strings and bools are refused
    (stricter than pydantic's lax mode: the Mind never sends them), and so are NaN and infinities."""

    def check_number(v: Any) -> Any:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise Invalid("", "must be a number")
        try:
            f = float(v)
        except OverflowError:  # an int beyond any float
            raise Invalid("", "is out of range") from None
        if not (f - f == 0.0):  # NaN and +-inf
            raise Invalid("", "must be finite")
        if (
            (ge is not None and not f >= ge)
            or (gt is not None and not f > gt)
            or (le is not None and not f <= le)
            or (lt is not None and not f < lt)
        ):
            raise Invalid("", "is out of range")
        return f

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


def list_of(inner: Check, min_len: int = 0, max_len: int | None = None) -> Check:
    """A list (msgpack's arrays; stricter than pydantic, which also takes tuples and sets)."""

    def check_list(v: Any) -> Any:
        if type(v) is not list:
            raise Invalid("", "must be a list")
        if len(v) < min_len or (max_len is not None and len(v) > max_len):
            raise Invalid("", f"must have between {min_len} and {max_len} items")
        out = []
        for i, item in enumerate(v):
            try:
                out.append(inner(item))
            except Invalid as exc:
                raise Invalid(f"{i}.{exc.loc}" if exc.loc else str(i), exc.why) from None
        return out

    return check_list


class Factory:
    """A default made fresh for each message (pydantic's `default_factory`): a list field's `[]`."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


Fields = dict[str, tuple[Check, Any]]
Rule = Callable[[dict[str, Any]], "str | None"]


def model(type_: str, fields: Fields, rule: Rule | None = None) -> Check:
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
            elif type(default) is Factory:
                out[name] = default.make()
            else:
                out[name] = default
        if rule is not None and (why := rule(out)) is not None:
            raise Invalid("", why)
        return Msg(type_, out)

    check_model.fields = fields  # type: ignore[attr-defined]  # for the drift test
    return check_model


# --- the models' own validators, by qualified name (the generator refuses a validator not here) ---


def _run_end_terminal(f: dict[str, Any]) -> str | None:
    return None if f["state"] in RUN_TERMINAL else f"run_end needs a terminal state, not {f['state'].value}"


def _stream_data_not_empty(f: dict[str, Any]) -> str | None:
    return None if f["data"] or f["eof"] else "a stream chunk carries data or the end of the stream"


def _stream_position_ordered(f: dict[str, Any]) -> str | None:
    return "consumed cannot be past offset" if f["consumed"] > f["offset"] else None


RULES: dict[str, Rule] = {
    "StreamPosition._ordered": _stream_position_ordered,
    "RunEnd._terminal": _run_end_terminal,
    "StreamData._not_empty": _stream_data_not_empty,
}
