"""Pages of list replies: bounded in count and in encoded bytes (DESIGN §11).

A reply the Mind cannot send is worse than a short one: a frame over `limits.MAX_FRAME_BYTES` is
refused by the encoder, and a client waiting for it would wait for ever. So every list the Mind
sends is cut into pages that stay far below the frame limit whatever the items hold, and each page
says where the next one starts (`next_after`). Sizes are measured by the caller (the encoded size
of each item), so this module only counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

from protocol import limits

T = TypeVar("T")

PAGE_BYTES = 1 << 20
"""Encoded bytes of the items of one page, at most (one item alone may exceed it: a page always
holds at least one, so paging moves forward; every item the Mind lists is bounded far below the
frame limit)."""

PAGE_ITEMS = 1000
"""Items of one page, at most, whatever the request asked for."""


def page(items: Iterable[T], limit: int, size: Callable[[T], int], max_bytes: int = PAGE_BYTES) -> tuple[list[T], bool]:
    """The first items, at most `limit` (and `PAGE_ITEMS`) of them and `max_bytes` together, and
    whether any item is left after them."""
    limit = max(1, min(limit, PAGE_ITEMS))
    taken: list[T] = []
    used = 0
    for item in items:
        if len(taken) >= limit:
            return taken, True
        n = size(item)
        if taken and used + n > max_bytes:
            return taken, True
        taken.append(item)
        used += n
    return taken, False


def task_cursor(created_at: float, task_id: str) -> str:
    """The cursor after a task in the order of `task list` (newest first, then by id): its exact
    creation time and its id, so a page starts right after it even if it is gone meanwhile."""
    return f"{created_at!r}:{task_id}"


def parse_task_cursor(cursor: str) -> tuple[float, str] | None:
    """`(created_at, task_id)` of a cursor made by `task_cursor`; None if it is not one."""
    when, sep, task_id = cursor.partition(":")
    if not sep or not limits.ID_RE.match(task_id):
        return None
    try:
        created_at = float(when)
    except ValueError:
        return None
    if not math.isfinite(created_at):
        return None
    return created_at, task_id
