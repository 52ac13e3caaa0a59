"""The contract every mindhand peer shares.

No sockets, no files, no clocks of its own: everything here is a value, a codec or a pure state
machine, so the Mind, the Hand and the client agree by construction and tests can drive it directly.
"""

__version__ = "0.1.0"
"""The one version of mindhand: pyproject.toml reads it (`[tool.setuptools.dynamic]`), `mind --version`
and `hand --version` print it. The wire has its own number, below, because releases and wire changes differ."""

PROTOCOL_VERSION = 11
"""Bumped on any incompatible wire change: a peer forbids unknown fields, so one built before a new field
would refuse it mid-connection (2: the fields of issues 14-17; 3: the continuity fields and messages, the
window of a stream's opening, the fleet and connected-Hands requests; 4: a run's owner in `rpc` and what a Hand presents for a
Mind that restarted to adopt it, `resume_pending`, the unattended filter of `list_runs`; 5: stream bytes as binary data frames named by `stream_numbers`, no
`stream_data` envelope; 6: `mind task rm` (`task_remove`, `task_remove_request`, `task_removed`), the
reject code `disk_full`, and a Mind's seal over each `rpc`, presented back with the run; 7: a run's and a
task's `usage` and a run's `kill`, a Hand's `cgroups` and `limits` claims; 8: recordings, `list_recordings`, `get_recording`,
`verify_recordings` and their answers, the cancel reason `recording_failed`, `recording` in `status_reply`; 9: a
receiver's `window` in `stream_ack`, a sender's in `stream_position`; 10: `put_file`'s `digest_follows`,
an upload's sha256 after its bytes, and the receiver's `window` in `stream_resume`; 11: named runs, `welcome`'s
`run_ids` and `exec`'s `run_id`). Peers never downgrade: a
mismatch is refused at `hello`."""
