"""Streamed commands for the continuity simulation: what a run's bytes are, and a job that has them.

The bytes of every stream are a pure function of (run id, stream, offset) (`pattern`), so every
receiver can check each chunk it takes against what the command produced (or the client typed)
at that offset without anyone keeping a copy: a byte lost shows as a gap, a byte duplicated as a
repeat, a byte misplaced as a mismatch.

`StreamJob` is a `VProcess` whose output chunks are `size` bytes of its `pattern`, and which, when
it reads stdin, exits only once its stdin has ended (as `sha256sum` does) or its pipe is gone (the
Hand that held it died: the write end of a pipe closes with its process).
"""

from __future__ import annotations

import zlib
from typing import Any

from sim.jobs import JobSpec, VProcess

BLOCK = 251
"""A prime period: a chunk shifted by any offset that is not a multiple of it differs."""


def _block(run_id: str, stream: str) -> bytes:
    seed = zlib.crc32(f"{run_id}/{stream}".encode())
    one = bytes((seed + i * 7 + (i * i) % 13) & 0xFF for i in range(BLOCK))
    return one * 2


_BLOCKS: dict[tuple[str, str], bytes] = {}


def pattern(run_id: str, stream: str, offset: int, n: int) -> bytes:
    """The `n` bytes of `stream` of run `run_id` at `offset`."""
    key = (run_id, stream)
    block = _BLOCKS.get(key)
    if block is None:
        if len(_BLOCKS) > 4096:
            _BLOCKS.clear()
        block = _BLOCKS[key] = _block(run_id, stream)
    out = bytearray()
    while n > 0:
        start = offset % BLOCK
        take = min(n, BLOCK)
        out += block[start : start + take]
        offset += take
        n -= take
    return bytes(out)


def stream_args(spec: JobSpec, size: int, stdin: int, upload: bool = False) -> dict[str, Any]:
    """Tool arguments of a streamed job: `size` bytes per output chunk, `stdin` bytes it reads
    (0: it reads none); `upload`: its stdin is a copy's (`mind cp`), whose window the Hand grows."""
    args = {**spec.args(), "sz": size, "in": stdin}
    return {**args, "put": True} if upload else args


class StreamJob(VProcess):
    """A streamed command: `chunks` output chunks of `size` bytes (stdout, every third on stderr),
    and, if it reads stdin, no exit before the end of its input."""

    def __init__(self, *args: Any, run_id: str, size: int, reads_stdin: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_id = run_id
        self.size = size
        self.reads_stdin = reads_stdin
        self.produced = {"stdout": 0, "stderr": 0}
        self.stdin_ended = False
        self._exit_pending: int | None = None

    def stdin_end(self) -> None:
        """End of input: read to the end, or the pipe's writer died."""
        self.stdin_ended = True
        if self._exit_pending is not None:
            rc, self._exit_pending = self._exit_pending, None
            super()._die(rc, None)

    def _die(self, exit_code: int | None, signal: int | None) -> None:
        if signal is None and self.reads_stdin and not self.stdin_ended and self.alive:
            self._exit_pending = exit_code  # done with its work, still reading its input
            return
        super()._die(exit_code, signal)

    def _emit(self, i: int) -> None:
        if not self.alive or self.on_output is None:
            return
        stream = "stderr" if i % 3 == 2 else "stdout"
        data = pattern(self.run_id, stream, self.produced[stream], self.size)
        self.produced[stream] += len(data)
        self.on_output(stream, data)
