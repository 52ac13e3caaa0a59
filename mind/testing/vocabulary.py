"""The fault vocabulary: one name per fault, shared by the fault proxy, the harness and the
deterministic simulation (`tests/sim/faults.py` picks its faults from these names), so a failure found
by one is described in the words the other understands and can be replayed there where the model
allows it (docs/testing.md, "Determinism and replay", says where it does not).

Pure: no I/O, no clock, nothing but names and what each one is, because the simulation imports it.
"""

from __future__ import annotations

from enum import StrEnum


class Fault(StrEnum):
    # --- L4, in Toxiproxy's words (its toxics, and `down`) ---
    LATENCY = "latency"
    BANDWIDTH = "bandwidth"
    SLOW_CLOSE = "slow_close"
    TIMEOUT = "timeout"
    SLICER = "slicer"
    LIMIT_DATA = "limit_data"
    RESET_PEER = "reset_peer"
    DOWN = "down"
    # --- L4, ours ---
    BLACKHOLE = "blackhole"
    REFUSE = "refuse"
    CUT = "cut"
    PARTITION = "partition"
    # --- frames: what only a proxy that reads our WebSocket frames can do ---
    HOLD = "hold"
    DROP = "drop"
    DUPLICATE = "duplicate"
    DELAY = "delay"
    # --- processes and disks (the harness's kill -9, the simulation's store) ---
    HAND_CRASH = "hand_crash"
    MIND_CRASH = "mind_crash"
    DISK_FAIL = "disk_fail"


FRAME_ACTIONS = (Fault.HOLD, Fault.DROP, Fault.DUPLICATE, Fault.DELAY, Fault.CUT)
"""What a frame rule (`frame ACTION TYPE ...`) can do to the k-th frame of a type."""

WHERE: dict[Fault, tuple[str, ...]] = {
    Fault.LATENCY: ("proxy", "sim"),
    Fault.BANDWIDTH: ("proxy",),
    Fault.SLOW_CLOSE: ("proxy",),
    Fault.TIMEOUT: ("proxy",),
    Fault.SLICER: ("proxy",),
    Fault.LIMIT_DATA: ("proxy",),
    Fault.RESET_PEER: ("proxy",),
    Fault.DOWN: ("proxy",),
    Fault.BLACKHOLE: ("proxy", "sim"),
    Fault.REFUSE: ("proxy", "sim"),
    Fault.CUT: ("proxy", "sim"),
    Fault.PARTITION: ("proxy", "sim"),
    Fault.HOLD: ("proxy",),
    Fault.DROP: ("proxy",),
    Fault.DUPLICATE: ("proxy", "sim"),
    Fault.DELAY: ("proxy",),
    Fault.HAND_CRASH: ("harness", "sim"),
    Fault.MIND_CRASH: ("harness", "sim"),
    Fault.DISK_FAIL: ("sim",),
}
"""Who can perform each fault: the proxy, the harness (`kill -9` of a process) and the simulation.
A fault only one of them knows cannot be replayed by the other (docs/testing.md)."""

DIRECTIONS = ("up", "down", "both")
"""`up` is client to server (a Hand or client to the Mind), `down` the way back."""
