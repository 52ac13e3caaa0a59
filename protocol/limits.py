"""Limits shared by every peer, enforced on receive as well as on send (DESIGN §4)."""

import re

MAX_FRAME_BYTES = 8 << 20
"""Largest WebSocket message either side accepts; larger ones close the connection."""

PROGRESS_CHUNK_MAX = 4 << 10
PROGRESS_BYTES_MAX = 1 << 20
PROGRESS_EVENTS_MAX = 256
"""Progress is observation only: past these caps it is dropped and counted, execution goes on."""

OUTPUT_TAIL_MAX = 64 << 10
"""Final output kept per stream in the result (the tail), so memory stays bounded for any command."""

READ_FILE_MAX = 4 << 20
LIST_DIR_MAX_ENTRIES = 10_000
ARGS_MAX_BYTES = 1 << 20

TASK_LOG_PAGE_MAX = 64 << 10
MAX_RUNTIME_MAX_MS = 24 * 3600 * 1000
RUN_TIMEOUT_MAX_MS = 24 * 3600 * 1000

HANDSHAKE_TIMEOUT_S = 10.0
NONCE_BYTES = 32
MAC_BYTES = 32
SECRET_BYTES = 32

LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
