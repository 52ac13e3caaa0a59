"""The cluster harness our tests use is the shipped one (`mind/testing/cluster.py`): this module
keeps the old import path (`from support.cluster import Cluster, running, ...`) working."""

from mind.testing.cluster import (
    BIN,
    Cluster,
    Hand,
    Mind,
    Proc,
    pid_alive,
    program,
    running,
    stop_group,
    track,
    wait_until,
)

__all__ = [
    "BIN",
    "Cluster",
    "Hand",
    "Mind",
    "Proc",
    "pid_alive",
    "program",
    "running",
    "stop_group",
    "track",
    "wait_until",
]
