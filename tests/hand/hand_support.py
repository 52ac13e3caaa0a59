"""Helpers for the Hand tests: bounded polling (never a sleep that hopes) and process liveness."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mind.testing.cluster import pid_alive  # noqa: F401 - re-exported for the hand tests


async def until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


async def stop_manager(manager: Any, jobs: list[asyncio.Task]) -> None:
    """Shut a test's TaskManager down, then cancel and await whatever it spawned that is left."""
    await manager.shutdown()
    for job in jobs:
        if not job.done():
            job.cancel()
    await asyncio.gather(*jobs, return_exceptions=True)
