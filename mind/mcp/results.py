"""What a tool call answers, shaped for a model: the run's state and exit code always present, stdout
and stderr apart, each bounded (a head and a tail with a marker naming the byte offsets to page from
with `read_output`), and `isError` for anything but `succeeded`. Pure: no I/O, no clock.

A model reads every byte it is given and pays for it; a command's output can be gigabytes. So a
result shows at most `SHOW_BYTES` of each stream, split between its first and its last bytes (an
error is usually at the end, what the command was doing at the start), and says exactly which bytes
it left out and how to ask for them. Offsets count bytes of the stream, never characters, so a page
asked for by a marker's offset is the byte after the head, whatever the encoding.

A marker names only an offset that can still be read. The server keeps the first `HEAD_KEEP` bytes
of each stream and a window of its last ones; what fell out between them is gone, and a marker says
so (which bytes, exactly) and names the first byte after them, never an offset whose page would
silently start somewhere else. A `read_output` asked for a gone offset says the same.
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
follows (the Mind keeps no output: only the last 4 KiB of each stream in the run's end), and its
first `HEAD_KEEP`. Less when the byte budget of the runs followed is spent (mind/mcp/budget.py)."""
WINDOW_FLOOR = (64 << 10) - HEAD_KEEP
"""A stream's window may always hold this much, budget spent or not: a run's last lines (where an
error is) stay readable whatever the other runs print. Two streams' floors and heads fit in the
`RUN_FLOOR` every running run holds in the budget."""
TERMINAL = frozenset(s.value for s in RUN_TERMINAL)
READ_MAX = 256 << 10
"""The most one `read_output` page returns."""


def text(data: bytes) -> str:
    """Bytes as text for a model: UTF-8, with anything undecodable replaced (offsets stay in bytes)."""
    return data.decode("utf-8", "replace")


@dataclass
class Retained:
    """One output stream of a followed run: the first `HEAD_KEEP` bytes, and a sliding window of the
    last `cap` bytes (`base` is the stream offset of the window's first byte). Readable: bytes 0 to
    `len(head)` and `base` to `total`; anything between is gone (`gone`)."""

    cap: int = RETAIN_BYTES
    total: int = 0
    base: int = 0
    head: bytes = b""
    window: bytearray = field(default_factory=bytearray)

    @property
    def held(self) -> int:
        """Bytes this stream holds in memory (what the budget counts)."""
        return len(self.head) + len(self.window)

    def growth(self, n: int) -> int:
        """How much `held` grows if `n` more bytes come and the window may grow."""
        head = min(n, max(0, HEAD_KEEP - len(self.head)))
        return head + min(len(self.window) + n, self.cap) - len(self.window)

    def append(self, data: bytes, grow: bool = True) -> None:
        """Keep `data`. With `grow` false (the budget is spent) the window slides at the size it
        has (or `WINDOW_FLOOR`, which is always allowed) instead of growing to `cap`."""
        if len(self.head) < HEAD_KEEP:
            self.head += data[: HEAD_KEEP - len(self.head)]
        limit = self.cap if grow else min(self.cap, max(WINDOW_FLOOR, len(self.window)))
        self.total += len(data)
        if len(data) >= limit:  # the chunk alone fills the window: no need to copy the rest first
            self.window = bytearray(data[len(data) - limit :])
        else:
            self.window += data
            over = len(self.window) - limit
            if over > 0:
                del self.window[:over]
        self.base = self.total - len(self.window)

    def gone(self) -> tuple[int, int] | None:
        """The bytes no longer kept, `(from, to)`: between the head and the window; None if none."""
        return (len(self.head), self.base) if self.base > len(self.head) else None

    def view(self) -> StreamView:
        return StreamView(total=self.total, head=self.head, tail=bytes(self.window[-HEAD_KEEP:]), kept_from=self.base)

    def read(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """From `offset`: (start, data). `start` is `offset` unless that byte is gone (then the first
        byte kept after it: the caller says so, with `gone`) or past the end (then `total`)."""
        if offset < self.base and offset < len(self.head):  # in the head, before the window
            data = self.head[offset : min(len(self.head), self.base, offset + max_bytes)]
            if offset + len(data) == self.base:  # the head meets the window: go on in it
                data += bytes(self.window[: max_bytes - len(data)])
            return offset, data
        start = min(max(offset, self.base), self.total)
        lo = start - self.base
        return start, bytes(self.window[lo : lo + max_bytes])


@dataclass(frozen=True)
class StreamView:
    """What is known of one stream: its size, its first bytes, its last bytes, and from which offset
    on it can still be read (`kept_from`; before it, only `head`)."""

    total: int
    head: bytes
    tail: bytes
    kept_from: int = 0

    @staticmethod
    def of_tail(total: int, tail: bytes) -> StreamView:
        """Only the last bytes are known (a run's end as the Mind retains it): the head is what of
        them falls at the stream's start."""
        start = total - len(tail)
        head = tail[: max(0, HEAD_KEEP - start)] if start == 0 else b""
        return StreamView(total=total, head=head, tail=tail, kept_from=start)


def render(view: StreamView, run_id: str, stream: str, limit: int = SHOW_BYTES) -> str:
    """The stream bounded for a model; a marker names the bytes left out, which of them are gone,
    and the offset to page from (only one that can be read)."""
    total = view.total
    tail_start = total - len(view.tail)
    if len(view.head) >= tail_start:  # head and tail meet: the whole stream is known
        whole = view.head[:tail_start] + view.tail
        if total <= limit:
            return text(whole)
        head, tail = whole[: limit // 2], whole[-(limit // 2) :]
    else:
        head, tail = view.head[: limit // 2], view.tail[-(limit // 2) :]
    return text(head) + marker(view, run_id, stream, len(head), total - len(tail)) + text(tail)


def marker(view: StreamView, run_id: str, stream: str, gap_from: int, gap_to: int) -> str:
    """The line standing for bytes `gap_from` to `gap_to`: how many, which are gone (neither in the
    head kept nor in the window), and a `read_output` call from an offset that can be read."""
    shown = f"\n[... {gap_to - gap_from} bytes not shown (bytes {gap_from} to {gap_to} of {view.total})"
    lost_from, lost_to = max(gap_from, len(view.head)), min(gap_to, view.kept_from)
    call = 'read_output(run="{}", stream="{}", offset={})'
    if lost_from >= lost_to:  # nothing gone: the gap pages from its first byte
        return f"{shown}: {call.format(run_id, stream, gap_from)} ...]\n"
    gone = f"bytes {lost_from} to {lost_to} are no longer kept"
    if lost_from == gap_from and lost_to == gap_to:  # all of it gone: nothing to page
        return f"{shown}; {gone} ...]\n"
    start = gap_from if gap_from < lost_from else lost_to  # the head's rest first, else after the loss
    return f"{shown}; {gone}: {call.format(run_id, stream, start)} ...]\n"


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
    usage: dict[str, Any] | None = None,
    kill: str | None = None,
    limit: int = SHOW_BYTES,
) -> dict[str, Any]:
    """A run as a tool's structured result (ended or still running); each stream shows at most
    `limit` bytes (a fleet's answer gives each Hand a share). `usage`: what an ended process run used
    (its cgroup's figures, unknown ones left out); `kill`: how its processes were contained
    (`cgroup`, or `process_group`: descendants that left the group may have survived its kill)."""
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
    if usage:
        out["usage"] = usage
    if kill is not None:
        out["kill"] = kill
    if state not in TERMINAL:
        out["still_running"] = True
        out["next"] = (
            f'The run goes on (it was not stopped). run_get(run="{run_id}", wait_s=30) waits for its end; '
            f'read_output(run="{run_id}", stream="stdout", offset={stdout.total}) reads output as it comes; '
            f'cancel(run="{run_id}") stops it.'
        )
    return out


def is_error(result: dict[str, Any]) -> bool:
    """`isError`: anything but a run that succeeded with all its output, except one still running
    (nothing failed)."""
    if result.get("still_running"):
        return False
    return result.get("state") != "succeeded" or result.get("complete") is False


def error_result(code: str, message: str) -> dict[str, Any]:
    """A refusal or failure as a tool error: the mindhand code and a sentence a model can act on."""
    return {"state": "error", "code": code, "error": message}


def as_text(result: dict[str, Any]) -> str:
    """The structured result as the one text block every MCP client shows its model."""
    return json.dumps(result, ensure_ascii=False, indent=1, default=str)
