"""The contract every mindhand peer shares.

No sockets, no files, no clocks of its own: everything here is a value, a codec or a pure state
machine, so the Mind, the Hand and the client agree by construction and tests can drive it directly.
"""

PROTOCOL_VERSION = 1
"""Bumped on any incompatible wire change. Peers never downgrade: a mismatch is refused at `hello`."""
