"""What a tool call answers, shaped for a model: the run's state and exit code always present, stdout
and stderr apart, each bounded (a head and a tail with a marker naming the byte offsets to page from
with `read_output`), and `isError` for anything but `succeeded`. Pure: no I/O, no clock.

A model reads every byte it is given and pays for it; a command's output can be gigabytes. So a
result shows at most `SHOW_BYTES` of each stream, split between its first and its last bytes (an
error is usually at the end, what the command was doing at the start), and says exactly which bytes
it left out and how to ask for them. Offsets count bytes of the stream, never characters, so a page
asked for by a marker's offset is the byte after the head, whatever the encoding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from protocol.states import RUN_TERMINAL

SHOW_BYTES = 8 << 10
"""Of each stream, a result shows at most this much: half from its start, half from its end."""
HEAD_KEEP = SHOW_BYTES // 2
"""The first bytes of each stream are kept apart from the sliding window: a result's head."""
RETAIN_BYTES = 4 << 20
"""`read_output` can page through the last this-many bytes of each stream of a run this server
follows (the Mind keeps no output: only the last 4 KiB of each stream in the run's end)."""
TERMINAL = frozenset(s.value for s in RUN_TERMINAL)
READ_MAX = 256 << 10
"""The most one `read_output` page returns."""


def text(data: bytes) -> str:
    """Bytes as text for a model: UTF-8, with anything undecodable replaced (offsets stay in bytes)."""
    return data.decode("utf-8", "replace")


@dataclass
class Retained:
    """One output stream of a followed run: the first `HEAD_KEEP` bytes, and a sliding window of the
    last `cap` bytes (`base` is the stream offset of the window's first byte)."""

    cap: int = RETAIN_BYTES
    total: int = 0
    base: int = 0
    head: bytes = b""
    window: bytearray = field(default_factory=bytearray)

    def append(self, data: bytes) -> None:
        if len(self.head) < HEAD_KEEP:
            self.head += data[: HEAD_KEEP - len(self.head)]
        self.window += data
        self.total += len(data)
        over = len(self.window) - self.cap
        if over > 0:
            del self.window[:over]
            self.base += over

    def view(self) -> StreamView:
        return StreamView(total=self.total, head=self.head, tail=bytes(self.window[-HEAD_KEEP:]))

    def read(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """From `offset` (or the first byte still retained, if it is older): (start, data)."""
        start = min(max(offset, self.base), self.total)
        lo = start - self.base
        return start, bytes(self.window[lo : lo + max_bytes])


@dataclass(frozen=True)
class StreamView:
    """What is known of one stream: its size, its first bytes and its last bytes."""

    total: int
    head: bytes
    tail: bytes

    @staticmethod
    def of_tail(total: int, tail: bytes) -> StreamView:
        """Only the last bytes are known (a run's end as the Mind retains it): the head is what of
        them falls at the stream's start."""
        start = total - len(tail)
        return StreamView(total=total, head=tail[: max(0, HEAD_KEEP - start)] if start == 0 else b"", tail=tail)


def render(view: StreamView, run_id: str, stream: str, limit: int = SHOW_BYTES) -> str:
    """The stream bounded for a model; a marker names the bytes left out and how to page them."""
    total = view.total
    tail_start = total - len(view.tail)
    if len(view.head) >= tail_start:  # head and tail meet: the whole stream is known
        whole = view.head[:tail_start] + view.tail
        if total <= limit:
            return text(whole)
        head, tail = whole[: limit // 2], whole[-(limit // 2) :]
    else:
        head, tail = view.head[: limit // 2], view.tail[-(limit // 2) :]
    gap_from, gap_to = len(head), total - len(tail)
    marker = (
        f"\n[... {gap_to - gap_from} bytes not shown (bytes {gap_from} to {gap_to} of {total}): "
        f'read_output(run="{run_id}", stream="{stream}", offset={gap_from}) ...]\n'
    )
    return text(head) + marker + text(tail)


def run_result(
    *,
    run_id: str,
    hand: str,
    state: str,
    stdout: StreamView,
    stderr: StreamView,
    exit_code: int | None = None,
    signal: int | None = None,
    reason: str = "",
    error: str | None = None,
    reject_code: str | None = None,
    value: Any = None,
    limit: int = SHOW_BYTES,
) -> dict[str, Any]:
    """A run as a tool's structured result (ended or still running); each stream shows at most
    `limit` bytes (a fleet's answer gives each Hand a share)."""
    out: dict[str, Any] = {"run": run_id, "hand": hand, "state": state, "exit_code": exit_code}
    if signal is not None:
        out["signal"] = signal
    if reject_code:
        out["code"] = reject_code
    if reason:
        out["reason"] = reason
    if error:
        out["error"] = error
    out["stdout"] = render(stdout, run_id, "stdout", limit)
    out["stderr"] = render(stderr, run_id, "stderr", limit)
    out["stdout_bytes"] = stdout.total
    out["stderr_bytes"] = stderr.total
    if value is not None:
        out["value"] = value
    if state not in TERMINAL:
        out["still_running"] = True
        out["next"] = (
            f'The run goes on (it was not stopped). run_get(run="{run_id}", wait_s=30) waits for its end; '
            f'read_output(run="{run_id}", stream="stdout", offset={stdout.total}) reads output as it comes; '
            f'cancel(run="{run_id}") stops it.'
        )
    return out


def is_error(result: dict[str, Any]) -> bool:
    """`isError`: anything but a run that succeeded, except one still running (nothing failed)."""
    if result.get("still_running"):
        return False
    return result.get("state") != "succeeded"


def error_result(code: str, message: str) -> dict[str, Any]:
    """A refusal or failure as a tool error: the mindhand code and a sentence a model can act on."""
    return {"state": "error", "code": code, "error": message}


def as_text(result: dict[str, Any]) -> str:
    """The structured result as the one text block every MCP client shows its model."""
    return json.dumps(result, ensure_ascii=False, indent=1, default=str)
