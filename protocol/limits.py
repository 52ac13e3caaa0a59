"""Limits shared by every peer, enforced on receive as well as on send (DESIGN §4)."""

import re

RESUME_WINDOW_MAX_S = 7 * 24 * 3600.0
"""The longest resume window or `keep` a Mind may announce: past a week the answer is a background task."""

MAX_FRAME_BYTES = 8 << 20
"""Largest WebSocket message either side accepts; larger ones close the connection."""

PROGRESS_CHUNK_MAX = 4 << 10
PROGRESS_BYTES_MAX = 1 << 20
PROGRESS_EVENTS_MAX = 256
"""Progress is observation only: past these caps it is dropped and counted, execution goes on."""

OUTPUT_TAIL_MAX = 64 << 10
"""Final output kept per stream in the result (the tail), so memory stays bounded for any command."""

STREAM_CHUNK_MAX = 512 << 10
"""Largest chunk of one stream in one data frame. Measured with data frames (issue 25, table in
docs/design.md §11): 512 KiB chunks in a 2 MiB window took ~0.5 ns/B off the Mind against 256 KiB
in 1 MiB, and 1 MiB chunks in 4 MiB gained no more beyond the noise while doubling the memory a
stream may hold again (and a 1 MiB chunk needs a full pipe per read: pipe-max-size is 1 MiB)."""
STREAM_WINDOW = 2 << 20
"""Bytes a stream's sender may have unacknowledged (the Mind holds at most this per stream): four
chunks in flight, as before."""
STREAM_WINDOW_MIN = 64 << 10
STREAM_WINDOW_MAX = 64 << 20
"""The windows a stream's opening may ask for (`Streams.window`): at least enough for the quarter-window
acknowledgement pacing to stay cheap, at most what a peer agrees to hold (the sender keeps a window's
unacknowledged bytes for a resume, DESIGN §15)."""
STREAM_WINDOW_GROWN_MAX = 32 << 20
"""The largest window a receiver grows a stream's to (`protocol.streams.WindowTuner`): 32 MiB in
flight carries 320 MiB/s over a 100 ms round trip. The Mind's cap on what a client may ask
(`mind.core.budgets.STREAM_WINDOW_CAP`) is the same."""
OUTPUT_LIMIT_DEFAULT = 1 << 30
"""Bytes per output stream a Hand delivers to a client by default; past it the command keeps
running, the rest is counted, and the stream says where it was cut."""

READ_FILE_MAX = 4 << 20
LIST_DIR_MAX_ENTRIES = 10_000
ARGS_MAX_BYTES = 1 << 20

TASK_LOG_PAGE_MAX = 64 << 10
MAX_RUNTIME_MAX_MS = 24 * 3600 * 1000
RUN_TIMEOUT_MAX_MS = 24 * 3600 * 1000
RUN_TIMEOUT_DEFAULT_S = 3600.0
"""A foreground run's deadline when the caller gives none: `mind exec --timeout`'s default, and the
Python client's (`mc.start`, `mc.exec`, `mc.exec_many`), so a script and the shell agree (issue 24)."""

MAX_CONTAINER_ITEMS = 1 << 17
"""Items in one msgpack array or map of any frame (a listing has at most LIST_DIR_MAX_ENTRIES):
the decoder refuses a longer one before building it."""
ARGS_MAX_ITEMS = 100_000
"""Values (containers and scalars) in one request's arguments: the Mind refuses more before any
work, so no frame's decode, digest and re-encode stalls its loop (issue 13, item 5)."""
CLIENT_MAX_FRAME_BYTES = ARGS_MAX_BYTES + (64 << 10)
"""Largest frame the Mind reads from a client: its biggest request is an `exec` or `task_start`
with arguments of at most ARGS_MAX_BYTES (Hands' results may use the whole MAX_FRAME_BYTES)."""
PREAUTH_MAX_FRAME_BYTES = 16 << 10
"""Largest frame before `welcome`: a hello or a proof is a few hundred bytes; an unauthenticated
peer must not make the Mind buffer or decode megabytes (issue 13, item 4)."""

HANDSHAKE_TIMEOUT_S = 10.0
NONCE_BYTES = 32
MAC_BYTES = 32
SECRET_BYTES = 32

LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LABEL_VALUE_RE = LABEL_RE
"""An operator's label on a Hand (`role=web`): key and value are both names of this shape, so a
selector can name them without quoting."""
HAND_LABELS_MAX = 32
"""Labels one Hand may carry."""
