"""What the stores keep, as both engines write and read it: the records (`Ending`; a credential's,
`CredentialRow`, is in mind/store/credential_rows.py) and the one codec each way between a record and
its table's row.

A snapshot is one row of `task_snapshots` in both engines, its columns in `COLS` order; a run's end
(`RunEnd`) and a task's `TaskInfo` are msgpack blobs, a Hand's labels compact sorted JSON. The SQL
around the rows is each engine's own (`mind/store/snapshots.py`, `mind/store/postgres/`); what a row
holds is decided here, once, so a row one engine wrote means the same to the other's code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from mind.core.snapshots import Snapshot
from protocol.messages import RunEnd, RunInfo, TaskInfo
from protocol.states import TASK_TERMINAL, TaskState

# --- task snapshots ---

COLS = (
    "task_id, hand, tool, args_digest, binding_digest, state, stale, created_at, last_synced_at, "
    "version, info, cancel_pending, start_pending, reason, owner"
)
"""The columns of a snapshot's row, in the order of `snapshot_row` and `snapshot_of`."""
NON_TERMINAL = tuple(s.value for s in TaskState if s not in TASK_TERMINAL)
"""The states a snapshot can still leave: the ones that go stale."""


def snapshot_of(r: Sequence[Any]) -> Snapshot:
    """A snapshot from its row (`SELECT {COLS}`)."""
    info = TaskInfo.model_validate(msgpack.unpackb(r[10], raw=False)) if r[10] is not None else None
    return Snapshot(
        task_id=r[0],
        hand=r[1],
        tool=r[2],
        args_digest=r[3],
        binding_digest=r[4],
        state=TaskState(r[5]),
        stale=bool(r[6]),
        created_at=r[7],
        last_synced_at=r[8],
        version=r[9],
        info=info,
        cancel_pending=r[11],
        start_pending=bool(r[12]),
        reason=r[13],
        owner=r[14],
    )


def snapshot_row(s: Snapshot) -> tuple[Any, ...]:
    """A snapshot's row, its values in `COLS` order."""
    info = msgpack.packb(s.info.model_dump(mode="python"), use_bin_type=True) if s.info is not None else None
    return (
        s.task_id,
        s.hand,
        s.tool,
        s.args_digest,
        s.binding_digest,
        s.state.value,
        int(s.stale),
        s.created_at,
        s.last_synced_at,
        s.version,
        info,
        s.cancel_pending,
        int(s.start_pending),
        s.reason,
        s.owner,
    )


# --- endings ---

TAIL_KEPT = 512
"""Bytes of each output tail an ending keeps (the owner who attaches after a restart gets the
state, the exit code and the last lines; the whole output went to the client that was attached)."""


@dataclass(frozen=True)
class Ending:
    """One run the Mind ended by itself, as a restarted Mind needs it back."""

    end: RunEnd
    owner: str
    ended_at: float
    """Wall-clock time."""
    cancel_reason: str | None = None
    args_digest: str = ""
    hand: str = ""
    """The run's Hand: on a shared database the ending is written only while this node's claim of
    it is current (`mind.store.postgres`); not stored."""


ENDING_COLS = "run_id, owner, ended_at, cancel_reason, args_digest, run_end"
"""The columns of an ending's row in both engines, in the order of `ending_row` and `endings_of`."""


def ending_blob(ending: Ending) -> bytes:
    """The run's end as stored: its output tails trimmed to what a re-attaching client is shown."""
    end = ending.end
    short = {
        name: tail.model_copy(update={"data": tail.data[-TAIL_KEPT:]})
        for name in ("stdout", "stderr")
        if len((tail := getattr(end, name)).data) > TAIL_KEPT
    }
    if short:
        end = end.model_copy(update=short)
    return msgpack.packb(end.model_dump(mode="python"), use_bin_type=True)


def ending_row(ending: Ending) -> tuple[Any, ...]:
    """An ending's row, its values in `ENDING_COLS` order."""
    return (
        ending.end.run_id,
        ending.owner,
        ending.ended_at,
        ending.cancel_reason,
        ending.args_digest,
        ending_blob(ending),
    )


def endings_of(rows: Iterable[Sequence[Any]]) -> list[Ending]:
    """The endings of rows (`SELECT {ENDING_COLS}`), in their order. A row that does not decode (a
    damaged file, a newer Mind's row) is skipped, not fatal: it is one run's memory."""
    out: list[Ending] = []
    for run_id, owner, ended_at, reason, digest, blob in rows:
        try:
            end = RunEnd.model_validate(msgpack.unpackb(blob, raw=False))
        except Exception:
            continue
        if end.run_id == run_id:
            out.append(Ending(end, owner, ended_at, reason, digest))
    return out


# --- run history (PostgreSQL only) ---


def run_info_blob(info: RunInfo) -> bytes:
    return msgpack.packb(info.model_dump(mode="python"), use_bin_type=True)


def run_info_of(blob: bytes) -> RunInfo:
    """Raises when the blob does not decode (the caller answers as if there were no such run)."""
    return RunInfo.model_validate(msgpack.unpackb(blob, raw=False))
