"""`Frozen`: a small immutable record, the part of `@dataclass(frozen=True)` that `Envelope` and
`Credential` use: equality and hash over the fields, a repr, assignment refused, copy and pickle.

Why not `dataclasses`: importing it (and `inspect` with it) is about a tenth of a whole `mind exec`,
whose fast path needs these two classes and nothing else from it. Subclasses list their fields in
`__slots__` (in `__init__` order) and set them with `object.__setattr__`.
"""

from __future__ import annotations

from typing import Any


class Frozen:
    __slots__: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__qualname__}({fields})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._values())
