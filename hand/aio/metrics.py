"""What a Hand counts, for its optional local `/metrics` and `/healthz` (`hand.aio.health`).

One registry per Hand (never prometheus_client's global one), so tests and embedders can run
several agents in one process and a library that registers on the global registry cannot leak
into our output. Everything here is a counter bump or a gauge set, done synchronously where the
thing happens (`hand.aio.agent`, `hand.aio.runs`, `hand.aio.tasks`): nothing in this module awaits, reads
the database or blocks, so counting can never slow a run down, and a scrape only renders what
is already in memory.

The run and task code is handed a `HandMetrics`; code built without one (unit tests, embedders)
gets a private instance nobody reads, so the call sites never need a `None` check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from protocol.io import logs

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)
LIVE_TASK_STATES = ("queued", "running")
"""The task states held in memory, shown as a gauge. Finished tasks live in the database (`hand
tasks`); reading it on a scrape would put SQLite on the scrape path, so they are counted as they
end instead (`tasks_finished`)."""


def _live_count(live: Callable[[], dict[str, int]], state: str) -> int:
    return live().get(state, 0)


LOG_SINKS = ("audit", "log")


class _DroppedLines(Collector):
    """`mindhand_hand_log_writes_dropped{sink}`: the log and audit lines this process could not
    write (a full disk: `protocol.io.logs.DROPPED`), read at each scrape. The count lives where
    the lines are written, below any Hand, so it counts from the first line, before any agent."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "mindhand_hand_log_writes_dropped",
            "Log and audit lines that could not be written (full disk) and were dropped, by sink",
            labels=["sink"],
        )
        for sink in LOG_SINKS:
            family.add_metric([sink], logs.DROPPED.counts.get(sink, 0))
        yield family


class HandMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.started = time.monotonic()
        self.build = Info("mindhand_hand_build", "This Hand's version", registry=r)
        self.uptime = Gauge("mindhand_hand_uptime_seconds", "Seconds since this Hand started", registry=r)
        self.uptime.set_function(lambda: time.monotonic() - self.started)
        # the connection to the Mind
        self.connected = Gauge("mindhand_hand_connected", "1 while a connection is welcomed by the Mind", registry=r)
        self.connects = Counter("mindhand_hand_connects", "Connections the Mind welcomed", registry=r)
        self.disconnects = Counter("mindhand_hand_disconnects", "Welcomed connections that ended", registry=r)
        self.connect_failures = Counter(
            "mindhand_hand_connect_failures", "Dials that failed before a handshake (refused, timeout, TLS)", registry=r
        )
        self.handshake_failures = Counter(
            "mindhand_hand_handshake_failures",
            "Handshakes that failed or were refused, by error code",
            ["code"],
            registry=r,
        )
        self.backoff = Gauge(
            "mindhand_hand_reconnect_backoff_seconds", "The current reconnect delay (0 while connected)", registry=r
        )
        # foreground runs
        self.runs_started = Counter("mindhand_hand_runs_started", "Foreground runs accepted", registry=r)
        self.runs_rejected = Counter(
            "mindhand_hand_runs_rejected", "Foreground runs refused, by code", ["code"], registry=r
        )
        self.runs_finished = Counter(
            "mindhand_hand_runs_finished", "Foreground runs by terminal state", ["state"], registry=r
        )
        self.runs_active = Gauge(
            "mindhand_hand_runs_active", "Foreground runs accepted and not yet terminal", registry=r
        )
        self.run_seconds = Histogram(
            "mindhand_hand_run_duration_seconds",
            "Foreground run duration, accepted to terminal (Hand clock)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.progress_dropped_frames = Counter(
            "mindhand_hand_progress_dropped_frames",
            "Progress chunks not sent (past the caps, or after a cancel)",
            registry=r,
        )
        self.progress_dropped_bytes = Counter(
            "mindhand_hand_progress_dropped_bytes", "Bytes of progress chunks not sent", registry=r
        )
        # background tasks
        self.tasks = Gauge("mindhand_hand_tasks", "Background tasks held in memory, by state", ["state"], registry=r)
        for state in LIVE_TASK_STATES:
            self.tasks.labels(state)
        self.tasks_finished = Counter(
            "mindhand_hand_tasks_finished",
            "Background tasks by terminal state (lost: found at restart)",
            ["state"],
            registry=r,
        )
        self.tasks_uncommitted = Gauge(
            "mindhand_hand_tasks_uncommitted",
            "Background tasks that ended but whose outcome the database could not take yet (disk full?)",
            registry=r,
        )
        self.task_starts = Counter(
            "mindhand_hand_task_starts",
            "Background task starts: accepted, duplicate (nothing ran) or rejected",
            ["result"],
            registry=r,
        )
        # the log and the audit file (a full disk drops lines instead of stopping the Hand)
        r.register(_DroppedLines())
        # the event loop
        self.loop_lag = Gauge(
            "mindhand_hand_event_loop_lag_seconds", "Event-loop lag, sampled every 10 ms (last)", registry=r
        )
        self.loop_lag_max = Gauge(
            "mindhand_hand_event_loop_lag_max_seconds", "Largest event-loop lag since start", registry=r
        )
        self._run_started: dict[str, float] = {}
        self._connected = False
        self._lag_max = 0.0
        """What the gauges were last set to, kept here: prometheus_client has no public getter."""

    # --- one-line calls from where things happen ---

    def run_started(self, run_id: str) -> None:
        self.runs_started.inc()
        self.runs_active.inc()
        self._run_started[run_id] = time.monotonic()

    def run_finished(self, run_id: str, state: str) -> None:
        """Called once per accepted run (`RunTable._conclude` forgets a run exactly once)."""
        self.runs_finished.labels(state).inc()
        self.runs_active.dec()
        began = self._run_started.pop(run_id, None)
        if began is not None:
            self.run_seconds.observe(time.monotonic() - began)

    def runs_running(self) -> int:
        return len(self._run_started)

    def watch_tasks(self, live: Callable[[], dict[str, int]]) -> None:
        """Read the live task counts (`TaskManager.live`, memory only) at each scrape."""
        for state in LIVE_TASK_STATES:
            self.tasks.labels(state).set_function(partial(_live_count, live, state))

    def progress_dropped(self, nbytes: int) -> None:
        self.progress_dropped_frames.inc()
        self.progress_dropped_bytes.inc(nbytes)

    def welcomed(self) -> None:
        self._connected = True
        self.connected.set(1)
        self.connects.inc()
        self.backoff.set(0)

    def session_ended(self) -> None:
        """After every connection attempt; counts a disconnect only if the attempt was welcomed."""
        if self._connected:
            self._connected = False
            self.connected.set(0)
            self.disconnects.inc()

    def observe_lag(self, lag: float) -> None:
        self.loop_lag.set(lag)
        if lag > self._lag_max:
            self._lag_max = lag
            self.loop_lag_max.set(lag)

    def render(self) -> bytes:
        return generate_latest(self.registry)
