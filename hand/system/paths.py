"""Confine every path a peer names to the Hand's root directory (DESIGN §9).

"The Hand's policy is final": whatever path the Mind sends, file tools and a command's `cwd` only
ever reach what lies under `--root` once symlinks are resolved. Rules, in order:
- a `..` component is refused outright, even when it would land back inside the root: a request
  that climbs is either a mistake or a probe, and refusing it is simpler to reason about than
  normalising it;
- a relative path is relative to the root; an absolute path must already be inside the root;
- symlinks are resolved and the result must still be inside the resolved root, so a link planted
  inside the root cannot point out of it (file or directory, dangling or not).

Error messages never contain the root's absolute path: they cross the wire (DESIGN §4).

Known limit: a symlink swapped in between this check and the tool's use (a TOCTOU race by someone
who can already write inside the root) is narrowed, not closed: the tools open the resolved path
with `O_NOFOLLOW` where they can.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from protocol.errors import MindhandError

_SHOWN_MAX = 80


class PathRefused(MindhandError):
    """The path is not one the Hand will touch. `message` is safe to send to the Mind."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def show(user_path: str) -> str:
    """How a caller's path appears in messages: relative paths quoted, absolute ones not at all."""
    if os.path.isabs(user_path):
        return "the absolute path"
    text = user_path if len(user_path) <= _SHOWN_MAX else user_path[:_SHOWN_MAX] + "..."
    return repr(text) if text.isprintable() else "(unprintable path)"


def resolve(root: Path | str, user_path: str) -> Path:
    """The real path `user_path` names under `root`, or `PathRefused`."""
    if not isinstance(user_path, str):
        raise PathRefused("a path must be a string")
    if user_path == "":
        raise PathRefused("a path must not be empty (use '.' for the root)")
    if "\x00" in user_path:
        raise PathRefused("a path must not contain NUL characters")
    shown = show(user_path)
    if ".." in user_path.split("/"):
        raise PathRefused(f"{shown} is refused: '..' components are not allowed")
    root_given, root_real = _roots(os.fspath(root))
    if os.path.isabs(user_path):
        lexical = Path(os.path.normpath(user_path))
        if not (lexical.is_relative_to(root_given) or lexical.is_relative_to(root_real)):
            raise PathRefused(f"{shown} is outside the root")
        candidate = lexical
    else:
        candidate = root_real / user_path
    real = Path(os.path.realpath(candidate))
    if not real.is_relative_to(root_real):
        raise PathRefused(f"{shown} leads outside the root through a symlink")
    return real


@functools.lru_cache(maxsize=16)
def _roots(root: str) -> tuple[Path, Path]:
    """The root as given and resolved, once per root: the Hand's root is fixed at start, and the
    resolution cost an lstat per component on every call. Safe if the root is later swapped for a
    symlink: every result must still lie under the root as it was resolved, or it is refused."""
    return Path(os.path.abspath(root)), Path(os.path.realpath(root))


def resolve_entry(root: Path | str, user_path: str) -> Path:
    """Like `resolve`, but the LAST component stays as named (its directory is resolved): what a
    write acts on. A symlink there stays a symlink, so `write_file` can see it and refuse it rather
    than write through it (or replace it). Every check of `resolve` applies to the full path too,
    so a link whose target leaves the root is still refused as such."""
    real = resolve(root, user_path)
    norm = os.path.normpath(user_path)
    name = os.path.basename(norm)
    if name in ("", ".", "/") or real == _roots(os.fspath(root))[1]:
        return real  # the root itself
    return resolve(root, os.path.dirname(norm) or ".") / name
