"""The fault proxy: put failure between a Hand (or a client) and the Mind, on command.

`FaultProxy.start(port)` runs it as a process and `await start_proxy(port)` in your event loop;
`mindhand-faultproxy` is the console script. All three take the same command lines (`GRAMMAR`), and
the Python objects have one method per command (`api.Commands`).
"""

from __future__ import annotations

GRAMMAR = """\
Commands (one line each, answered by one line starting `ok` or `error`). DIR is `up` (to the server:
a Hand or client to the Mind), `down` (the way back) or `both` (the default). ID is a connection id
from `status` (or id=N); without one an L4 command applies to every live connection AND becomes a
default for new ones, and a frame rule applies to the live connections, or when none is live to the
next one only (`every`: to every later one too). p=P (0..1) applies the fault to a connection with that probability, decided from the
seed and the connection's number (Toxiproxy's toxicity); seed=N overrides the proxy's seed for it.

L4 (Toxiproxy's toxics, by name):
  latency MS [jitter=MS] [DIR] [ID]   hold each piece MS (+- jitter) before forwarding, in order
  bandwidth KIB [DIR] [ID]            at most KIB KiB/s (0: unlimited)
  slow_close MS [DIR] [ID]            pass the close on MS late
  timeout MS [DIR] [ID]               stop the data (dropped) and close after MS (0: never)
  slicer BYTES [variation=N] [delay_us=US] [DIR] [ID]  forward in pieces of about BYTES
  limit_data BYTES [DIR] [ID]         close the connection once BYTES have passed
  reset_peer [MS] [ID]                reset (RST) the connection, after MS
  down / up                           close everything and refuse new connections / accept again
Ours:
  blackhole [DIR] [ID]                stop forwarding, nobody is told; data is held
  resume [DIR] [ID]                   forward again: what was held is delivered, in order
  cut [fin|rst] [ID]                  close (FIN) or reset (RST) now; held data is lost
  refuse / accept                     new connections are closed at once / proxied again
  partition [MS]                      cut (RST) every connection and refuse new ones (for MS)
Frames (plain ws:// only; a TLS or non-WebSocket link is `raw` in status and never matches):
  frame ACTION TYPE [DIR] [k=K] [times=N] [ms=MS] [after] [fin] [every] [ID]
      ACTION: hold (this frame and later data frames wait for `release`; pings pass), drop,
      duplicate, delay (hold for ms=MS), cut (RST before the frame; `after`: once it is delivered;
      `fin`: a FIN). TYPE: a message type (result, accepted, rpc, run_end, ...), ping, pong, close or *.
      k=K: the K-th frame of that type on the connection (default 1); times=N: N frames from there
      (default 1, 0: all), counted per connection. Without ID: the live connections, or the next
      one if none is live; `every`: also every later connection (so each reconnect meets it too).
  release [DIR] [ID]                  deliver held frames, in order
Other:
  status                              connections (bytes, frames by type, faults), defaults, seed
  clear [DIR] [ID]                    remove every fault (held frames are delivered)
  reset                               clear everything and accept new connections
  seed N                              the seed for later decisions
  target HOST:PORT                    where new connections go (a proxy started without --target
                                      holds connections until it is told)
  delay MS, throttle BYTES_PER_S      older names of latency and bandwidth
"""

from mind.testing.faultproxy.api import Commands, FaultProxy, FaultProxyError, InProcessProxy, start_proxy  # noqa: E402
from mind.testing.faultproxy.proxy import Proxy  # noqa: E402
from mind.testing.faultproxy.schedule import Step, random_schedule  # noqa: E402

__all__ = [
    "GRAMMAR",
    "Commands",
    "FaultProxy",
    "FaultProxyError",
    "InProcessProxy",
    "Proxy",
    "Step",
    "random_schedule",
    "start_proxy",
]
