"""What the Mind counts, for `/metrics` (Prometheus text) and `/healthz`, served on its own port.

One registry per Mind (not the global one) so tests and embedders can run several. Values that
need the database (stale snapshots) are refreshed by the ticker, never computed during a scrape, so
a scrape never blocks the event loop.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)


class MindMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.hands_connected = Gauge("mindhand_hands_connected", "Hands connected now", registry=r)
        self.clients_connected = Gauge("mindhand_clients_connected", "Clients connected now", registry=r)
        self.handshakes = Counter("mindhand_handshakes", "Handshakes by result", ["result"], registry=r)
        self.runs = Counter("mindhand_runs", "Foreground runs by terminal state", ["state"], registry=r)
        self.run_seconds = Histogram(
            "mindhand_run_duration_seconds",
            "Foreground run duration, admission to terminal",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.runs_active = Gauge("mindhand_runs_active", "Foreground runs not yet terminal", registry=r)
        self.runs_retained = Gauge(
            "mindhand_runs_retained", "Foreground runs held in memory (bounded by retention)", registry=r
        )
        self.progress_dropped = Counter(
            "mindhand_progress_dropped", "Progress chunks dropped (caps, slow clients)", registry=r
        )
        self.snapshots_stale = Gauge(
            "mindhand_task_snapshots_stale", "Task snapshots that may be out of date", registry=r
        )
        self.reconcile_seconds = Histogram(
            "mindhand_reconcile_duration_seconds", "Reconciliation pass duration", buckets=LATENCY_BUCKETS, registry=r
        )
        self.loop_lag = Gauge(
            "mindhand_event_loop_lag_seconds", "Event-loop lag, sampled every 10 ms (last)", registry=r
        )
        self._lag_max = 0.0
        self.loop_lag_max = Gauge(
            "mindhand_event_loop_lag_max_seconds", "Largest event-loop lag since start", registry=r
        )
        self.denied = Counter("mindhand_denied", "Requests refused outside a credential's scope", registry=r)
        self.recording_gaps = Counter(
            "mindhand_recording_gap_bytes", "Bytes relayed that a recording could not keep (store failed)", registry=r
        )
        self.foreign = Counter("mindhand_foreign_inputs", "Hand messages about runs or tasks not theirs", registry=r)

    def observe_lag(self, lag: float) -> None:
        self.loop_lag.set(lag)
        if lag > self._lag_max:  # kept here: prometheus_client has no public getter
            self._lag_max = lag
            self.loop_lag_max.set(lag)

    def render(self) -> bytes:
        return generate_latest(self.registry)
