"""Stream bytes as opaque data frames (DESIGN §11b, issue 25) with real processes.

- The Mind relays 64 MiB each way without building a Python object from a payload: its process
  is instrumented (a `sitecustomize` on its own PYTHONPATH) to record every msgpack decode of a
  large buffer and count every `StreamData` it builds. With stream chunks as envelopes there would
  be one of each per 256 KiB chunk (512 per direction here), so the test can fail.
- A peer of the wire before data frames (protocol version 4) is refused at `hello`.
- Malformed data frames from an authenticated client (short header, unknown flags, oversize, a
  number never given, a stream it does not own) end its connection with an `error`, as malformed
  msgpack does, and the Mind goes on serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import textwrap

import msgpack
import pytest
from support.rawpeer import admin, handshake
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from mind.client.aio import MindClient
from mind.testing.cluster import Cluster, program, wait_until
from protocol import PROTOCOL_VERSION, frames, limits
from protocol.codes import ErrorCode
from protocol.envelope import decode
from protocol.messages import Error, Exec, RunUpdate, StreamNumbers, Streams

pytestmark = pytest.mark.slow  # a real Mind, a real Hand, the `mind` CLI

MIB = 1 << 20

HOOK = textwrap.dedent(
    """
    # Counts, in the Mind's process, what it builds from stream payloads (tests/integration/test_data_frames.py).
    import atexit, json, os
    import msgpack

    COUNTS = {"large_unpacks": [], "stream_data_models": 0}
    _unpackb = msgpack.unpackb

    def unpackb(data, *a, **kw):
        out = _unpackb(data, *a, **kw)
        if len(data) >= 64 * 1024:
            COUNTS["large_unpacks"].append(out.get("t") if isinstance(out, dict) else "?")
        return out

    msgpack.unpackb = unpackb

    def _hook_models():
        from protocol.messages import StreamData
        init, construct = StreamData.__init__, StreamData.model_construct.__func__
        validate = StreamData.model_validate.__func__

        def counted_validate(cls, *a, **kw):
            COUNTS["stream_data_models"] += 1
            return validate(cls, *a, **kw)

        StreamData.model_validate = classmethod(counted_validate)

        def counted_init(self, *a, **kw):
            COUNTS["stream_data_models"] += 1
            init(self, *a, **kw)

        def counted_construct(cls, *a, **kw):
            COUNTS["stream_data_models"] += 1
            return construct(cls, *a, **kw)

        StreamData.__init__ = counted_init
        StreamData.model_construct = classmethod(counted_construct)

    import builtins
    _import = builtins.__import__
    _done = []

    def hooked_import(name, *a, **kw):
        mod = _import(name, *a, **kw)
        if not _done and name == "protocol.messages":
            _done.append(1)
            _hook_models()
        return mod

    builtins.__import__ = hooked_import

    @atexit.register
    def _write():
        with open(os.environ["MINDHAND_TEST_COUNTS"], "w") as f:
            json.dump(COUNTS, f)
    """
)


def test_the_mind_relays_64_mib_each_way_without_building_an_object_from_a_payload(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    counts = tmp_path / "counts.json"
    (tmp_path / "cl").mkdir()
    cl = Cluster(tmp_path / "cl")
    try:
        plain = dict(cl.env)
        cl.env.update(PYTHONPATH=str(hook), MINDHAND_TEST_COUNTS=str(counts))
        cl.start_mind()
        cl.env = plain  # only the Mind is instrumented
        cl.start_hand("box")
        cl.wait_connected("box")
        size = 64 * MIB
        out = subprocess.run(
            [*program("mind"), "exec", "--hand", "box", "--", "head", "-c", str(size), "/dev/urandom"],
            env=cl.env,
            capture_output=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 0, out.stderr[-500:]
        assert len(out.stdout) == size, "every byte of stdout arrived"
        data = out.stdout
        back = subprocess.run(
            [*program("mind"), "exec", "--hand", "box", "--", "sha256sum"],
            env=cl.env,
            capture_output=True,
            timeout=300,
            input=data,
        )
        assert back.returncode == 0, back.stderr[-500:]
        assert back.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest(), "every byte of stdin arrived"
        assert cl.mind is not None
        os.kill(cl.mind.pid, signal.SIGTERM)
        wait_until(lambda: counts.exists() and counts.stat().st_size > 0, 30, "the Mind's counts")
    finally:
        cl.stop_all()
    got = json.loads(counts.read_text())
    assert got["stream_data_models"] == 0, f"the Mind built {got['stream_data_models']} chunks as models"
    # A run's `result` carries its output's bounded tail (up to 64 KiB, once per run): the only
    # large envelope. With stream chunks as envelopes there would be one per 256 KiB: 512 here.
    assert set(got["large_unpacks"]) <= {"result"} and len(got["large_unpacks"]) <= 2, got["large_unpacks"]


# --- the wire's version --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("frames"))
    try:
        c.start_mind()
        c.start_hand("box")
        c.wait_connected("box")
        yield c
    finally:
        c.stop_all()


def hello(version: int, role: str, label: str) -> bytes:
    frame = {
        "v": version,
        "t": "hello",
        "id": None,
        "seq": 1,
        "gen": None,
        "p": {"role": role, "label": label, "nonce": os.urandom(32), "claims": None},
    }
    return msgpack.packb(frame, use_bin_type=True)


@pytest.mark.parametrize("role,label", [("client", "admin"), ("hand", "box")])
async def test_a_peer_of_the_wire_before_data_frames_is_refused_at_hello(cl, role, label):
    assert PROTOCOL_VERSION >= 5  # data frames came with 5
    async with connect(cl.url, compression=None) as ws:
        await ws.send(hello(4, role, label))
        env = decode(await asyncio.wait_for(ws.recv(), 10))
        assert isinstance(env.msg, Error) and env.msg.code is ErrorCode.VERSION_MISMATCH
        assert "version 4" in env.msg.message and f"version {PROTOCOL_VERSION}" in env.msg.message
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
    await still_serving(cl)


# --- malformed data frames -----------------------------------------------------------------------


async def still_serving(cl) -> None:
    async with await MindClient.connect(cl.url, admin(cl)) as mc:
        assert [h.name for h in await mc.hands()] == ["box"]


async def error_then_close(ws, ch) -> ErrorCode:
    """Read (data frames too) until the Mind closes us: the code of its `error`."""
    code = None
    try:
        async with asyncio.timeout(15):
            while True:
                env = ch.receive_any(await ws.recv())
                if env is not None and isinstance(env.msg, Error) and env.id is None:
                    code = env.msg.code
    except ConnectionClosed:
        pass
    assert code is not None, "the Mind closed without saying why"
    return code


async def streamed_run(cl):
    """A raw client with a streamed run of `cat` (stdin open): `(ws, channel, numbers)`."""
    ws, ch = await handshake(cl.url, admin(cl))
    req = Exec(hand="box", tool="exec", args={"argv": ["cat"]}, timeout_ms=30_000, streams=Streams(stdin=True))
    await ws.send(ch.stamp(req, "x1"))
    async with asyncio.timeout(15):
        while True:
            env = ch.receive_any(await ws.recv())
            if env is not None and isinstance(env.msg, StreamNumbers):
                numbers = frames.announced(env.msg)
            if env is not None and isinstance(env.msg, RunUpdate):
                return ws, ch, numbers


SHORT = bytes([frames.MAGIC, 0, 0, 0])
FLAGS = frames.HEADER.pack(frames.MAGIC, 0x80, 1, 0) + b"x"


@pytest.mark.parametrize(
    "make,code",
    [
        (lambda n: SHORT, ErrorCode.MALFORMED_FRAME),
        (lambda n: FLAGS, ErrorCode.MALFORMED_FRAME),
        (
            lambda n: frames.header(n["stdin"], 0, False) + b"x" * (limits.STREAM_CHUNK_MAX + 1),
            ErrorCode.FRAME_TOO_LARGE,
        ),
        (lambda n: frames.encode(max(n.values()) + 1, 0, b"x", False), ErrorCode.INVALID_PAYLOAD),  # never given
        (lambda n: frames.encode(n["stdout"], 0, b"forged", False), ErrorCode.INVALID_PAYLOAD),  # not the client's
    ],
    ids=["short_header", "unknown_flags", "oversize", "number_never_given", "stream_not_owned"],
)
async def test_a_malformed_data_frame_ends_the_connection_with_an_error(cl, make, code):
    ws, ch, numbers = await streamed_run(cl)
    try:
        assert set(numbers) == {"stdin", "stdout", "stderr"}
        await ws.send(make(numbers))
        assert await error_then_close(ws, ch) is code
    finally:
        await ws.close()
    await still_serving(cl)


async def test_another_connections_number_means_nothing_here(cl):
    ws1, _, numbers = await streamed_run(cl)
    ws2, ch2 = await handshake(cl.url, admin(cl))  # a connection that was given no number at all
    try:
        await ws2.send(frames.encode(numbers["stdin"], 0, b"not mine", False))
        assert await error_then_close(ws2, ch2) is ErrorCode.INVALID_PAYLOAD
    finally:
        await ws1.close()
        await ws2.close()
    await still_serving(cl)
