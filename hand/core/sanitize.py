"""Error text that crosses the wire is sanitised (DESIGN §4, §9).

The Mind, its clients and their logs must not learn the Hand machine's layout or secrets from an
error message: the root becomes `.` (so `./sub/file` still tells the caller which of *its* paths
failed), any other absolute path becomes `<path>`, known secrets become `<redacted>`, control
characters are replaced, and the text is capped so one error cannot flood a frame or a log line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

MAX_CHARS = 500

_DELIMS = r"""\s'"`:,;()\[\]{}<>|="""
_ABSOLUTE = re.compile(rf"(?<![\w.~/-])/[^{_DELIMS}]+")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class Sanitizer:
    def __init__(
        self, root: Path | str, secrets: Iterable[str] = (), limit: int = MAX_CHARS, other_paths: bool = True
    ) -> None:
        """`other_paths=False` keeps absolute paths outside the root: for the Hand's own logged
        tracebacks, whose frames name source files, and which must still lose the root and secrets."""
        forms = {os.path.abspath(root), os.path.realpath(root)}
        forms = {f.rstrip("/") for f in forms} - {""}  # a root of "/" is left to the generic rule
        self._root: re.Pattern[str] | None = None
        if forms:
            alternatives = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
            self._root = re.compile(rf"(?<![\w.~/-])(?:{alternatives})(?=[/{_DELIMS}]|$)")
        self._secrets = sorted((s for s in secrets if s), key=len, reverse=True)
        self._limit = limit
        self._other_paths = other_paths

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        if self._root is not None:
            text = self._root.sub(".", text)
        if self._other_paths:
            text = _ABSOLUTE.sub("<path>", text)
        text = _CONTROL.sub("?", text)
        if len(text) > self._limit:
            text = text[: self._limit - 3] + "..."
        return text
