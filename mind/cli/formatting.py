"""What the `mind` command prints for a person or a script: text made safe for a terminal, tables,
times, a run's end as a JSON object and as the one line that explains it."""

from __future__ import annotations

import sys
from typing import Any

# the daemon's commands print these too, so they live below both sides (mind/commandline.py)
from mind.commandline import printable as printable
from mind.commandline import table as table
from mind.commandline import timestamp as timestamp


def json_text(b: bytes) -> Any:
    """Bytes for a JSON document: the text when they are UTF-8, else `{"base64": ...}`."""
    try:
        return b.decode()
    except UnicodeDecodeError:
        import base64

        return {"base64": base64.b64encode(b).decode()}


def jsonable(v: Any) -> Any:
    """A model dump with bytes in it, ready for `json.dumps` (bytes by `json_text`)."""
    if isinstance(v, (bytes, bytearray)):
        return json_text(bytes(v))
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


OUT_OF_MEMORY = "out_of_memory"
"""The reason of a run (or task) the kernel killed for its memory limit (`--memory`): the Hand's
(hand/core/runs.py), ending `failed` with the `error` naming the limit."""

KILLS = {
    "cgroup": "cgroup",
    "process_group": "process group (descendants that left it may survive)",
}
"""A run's `kill`, how its processes were contained (so how sure its kill was), for a person."""


def byte_size(n: float) -> str:
    """Bytes for a person: `512 B`, `64.0 MiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def usage_text(usage: Any) -> str | None:
    """What a run used, in one line (`cpu 0.04s user 0.11s sys, memory peak 64.0 MiB, pids peak 10,
    oom kills 1`); a figure the Hand could not count is left out, and so are OOM kills and throttling
    that did not happen. None: nothing counted."""
    if usage is None:
        return None
    parts = []
    cpu = [f"{v:.2f}s {what}" for v, what in ((usage.cpu_user_s, "user"), (usage.cpu_system_s, "sys")) if v is not None]
    if cpu:
        parts.append("cpu " + " ".join(cpu))
    if usage.memory_peak is not None:
        parts.append(f"memory peak {byte_size(usage.memory_peak)}")
    if usage.pids_peak is not None:
        parts.append(f"pids peak {usage.pids_peak}")
    if usage.oom_kills:  # 0 is the usual case: said only when it happened
        parts.append(f"oom kills {usage.oom_kills}")
    if usage.throttled_s:
        parts.append(f"throttled {usage.throttled_s:.2f}s")
    return ", ".join(parts) or None


def kill_text(kill: str | None) -> str | None:
    """A run's `kill` for a person (None: not said, a run that was no process or a Hand from before)."""
    return None if kill is None else KILLS.get(kill, printable(kill))


def end_summary(end: Any) -> dict[str, Any]:
    usage = getattr(end, "usage", None)
    return {
        "run_id": end.run_id,
        "hand": end.hand,
        "tool": end.tool,
        "state": end.state.value,
        "reason": end.reason,
        "reject_code": end.reject_code.value if end.reject_code else None,
        "exit_code": end.exit_code,
        "signal": end.signal,
        "stage": end.stage.value if end.stage else None,
        "progress_dropped": end.progress_dropped,
        "truncated": end.truncated,
        "duration_ms": end.duration_ms,
        "error": end.error,
        "usage": usage.model_dump(mode="json") if usage is not None else None,
        "kill": getattr(end, "kill", None),
    }


def explain(end: Any) -> None:
    """One line on stderr for any end that is not the command's own exit, for a program that could
    not start (127 / 126: the OS's message, as a shell prints it), and for a run the kernel killed for
    its memory limit (`failed (out_of_memory): ` and the Hand's sentence naming the limit)."""
    from protocol.states import RunState

    s = end.state
    oom = end.reason == OUT_OF_MEMORY
    if s is RunState.SUCCEEDED or (s is RunState.FAILED and end.exit_code is not None and not end.error and not oom):
        return
    detail = end.error or end.reason
    code = f" ({end.reject_code.value})" if end.reject_code else f" ({OUT_OF_MEMORY})" if oom and end.error else ""
    stage = f", stopped by SIG{end.stage.value.upper()}" if end.stage else ""
    print(f"mind: run {end.run_id} {s.value}{code}{stage}: {printable(detail)}", file=sys.stderr)


def away(info: Any) -> str | None:
    """What a person needs to know of a running run whose Hand is away (DESIGN §15): it waits for
    the Hand within the Mind's resume window, and since when."""
    since = getattr(info, "hand_away_since", None)
    return f"hand away since {timestamp(since)}" if since else None


def stream_line(ev: Any, run_id: str | None) -> dict[str, Any]:
    """A `stream_data` chunk (or the follower's delivery of one) of run `run_id` as one `--events` line."""
    return {
        "event": "output",
        "run_id": run_id,
        "stream": ev.stream,
        "offset": ev.offset,
        "data": json_text(ev.data),
    }


def event_line(ev: Any) -> dict[str, Any]:
    """A run event as one `--events` line."""
    if ev.TYPE == "run_update":
        return {"event": "state", "run_id": ev.run_id, "state": ev.state.value, "gen": ev.gen}
    if ev.TYPE == "run_output":
        return {
            "event": "output",
            "run_id": ev.run_id,
            "stream": ev.stream,
            "offset": ev.offset,
            "data": json_text(ev.data),
        }
    return {"event": "end", **end_summary(ev), "stdout": json_text(ev.stdout.data), "stderr": json_text(ev.stderr.data)}
