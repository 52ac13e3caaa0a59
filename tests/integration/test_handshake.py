"""The handshake against a real `mind serve`: every refusal is clear, and the Mind stays up."""

import asyncio
import os
import random

import msgpack
import pytest
from support.rawpeer import admin
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from mind.client.aio import ClientError, MindClient, load_credential
from protocol import PROTOCOL_VERSION
from protocol.auth import ClientHandshake, Credential
from protocol.codes import ErrorCode
from protocol.envelope import Channel, decode
from protocol.messages import Error, Exec, HandClaims, ListHands

pytestmark = pytest.mark.slow  # a real Mind (the `cluster` fixture)

CLAIMS = HandClaims(hostname="test", platform="linux", machine="x", python="3.11", version="0")


@pytest.fixture
def mind(cluster):
    cluster.start_mind()
    return cluster


async def still_serving(cluster) -> None:
    async with await MindClient.connect(cluster.url, admin(cluster)) as mc:
        assert isinstance(await mc.hands(), list)
    assert cluster.mind.alive()


async def raw_error(url: str, frames: list[bytes]) -> Error:
    """Send raw frames and return the Mind's error frame; the socket must then be closed."""
    async with connect(url, compression=None) as ws:
        for f in frames:
            await ws.send(f)
        env = decode(await asyncio.wait_for(ws.recv(), 10))
        assert isinstance(env.msg, Error)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        return env.msg


async def test_good_client_credential(mind):
    async with await MindClient.connect(mind.url, admin(mind)) as mc:
        assert await mc.hands() == []


async def test_wrong_secret_and_unknown_label_are_refused_the_same_way(mind):
    good = admin(mind)
    wrong = Credential(role="client", label=good.label, secret=os.urandom(32))
    unknown = Credential(role="client", label="nobody", secret=os.urandom(32))
    errs = []
    for cred in (wrong, unknown):
        with pytest.raises(ClientError) as ei:
            await MindClient.connect(mind.url, cred)
        errs.append((ei.value.code, ei.value.message))
    assert errs[0] == errs[1] and errs[0][0] == ErrorCode.AUTH_FAILED.value
    await still_serving(mind)


async def test_revoked_credential_is_refused(mind):
    cred_file = mind.tmp / "bot.cred"
    assert mind.cli("client", "add", "bot", "--out", str(cred_file)).returncode == 0
    cred = load_credential(cred_file)
    async with await MindClient.connect(mind.url, cred) as mc:
        await mc.hands()
    r = mind.cli("client", "revoke", "bot")
    assert r.returncode == 0, r.stderr
    with pytest.raises(ClientError) as ei:
        await MindClient.connect(mind.url, cred)
    assert ei.value.code == ErrorCode.AUTH_FAILED.value
    await still_serving(mind)


async def test_other_protocol_version_is_refused_naming_both(mind):
    hello = msgpack.packb(
        {
            "v": PROTOCOL_VERSION + 1,
            "t": "hello",
            "id": None,
            "seq": 1,
            "gen": None,
            "p": {"role": "client", "label": "admin", "nonce": os.urandom(32), "claims": None},
        },
        use_bin_type=True,
    )
    err = await raw_error(mind.url, [hello])
    assert err.code is ErrorCode.VERSION_MISMATCH
    assert f"version {PROTOCOL_VERSION + 1}" in err.message and f"version {PROTOCOL_VERSION}" in err.message
    await still_serving(mind)


# Fixed bytes, not os.urandom: every pytest-xdist worker must collect the same test ids.
@pytest.mark.parametrize(
    "garbage",
    [b"\xc1\xc1\xc1", b"GET / HTTP/1.1\r\n", random.Random(98).randbytes(64), msgpack.packb([1, 2, 3])],
    ids=["invalid-msgpack", "http", "random-64", "a-list"],
)
async def test_garbage_instead_of_msgpack(mind, garbage):
    err = await raw_error(mind.url, [garbage])
    assert err.code in (ErrorCode.MALFORMED_FRAME, ErrorCode.UNKNOWN_TYPE)
    await still_serving(mind)


async def test_text_frame_is_refused(mind):
    async with connect(mind.url, compression=None) as ws:
        await ws.send("hello")
        env = decode(await asyncio.wait_for(ws.recv(), 10))
        assert env.msg.code is ErrorCode.MALFORMED_FRAME
    await still_serving(mind)


async def test_a_request_before_welcome_is_not_acted_on(mind):
    ch = Channel()
    mind.add_hand("h1")
    frame = ch.stamp(Exec(hand="h1", tool="exec", args={"argv": ["touch", "/tmp/never"]}, timeout_ms=1000), id="q1")
    err = await raw_error(mind.url, [frame])
    assert err.code is ErrorCode.UNEXPECTED_MESSAGE and "before welcome" in err.message
    ch2 = Channel()
    err = await raw_error(mind.url, [ch2.stamp(ListHands(), id="q1")])
    assert err.code is ErrorCode.UNEXPECTED_MESSAGE
    await still_serving(mind)


async def test_silent_peer_hits_the_handshake_deadline(mind):
    # Connect and say nothing: the Mind must not wait forever (deadline 10 s).
    async with connect(mind.url, compression=None) as ws:
        env = decode(await asyncio.wait_for(ws.recv(), 20))
        assert env.msg.code is ErrorCode.HANDSHAKE_TIMEOUT
    await still_serving(mind)


async def hand_connect(url: str, cred: Credential):
    ws = await connect(url, compression=None)
    ch = Channel()
    hs = ClientHandshake(cred, os.urandom(32), CLAIMS)
    await ws.send(ch.stamp(hs.hello()))
    proof = hs.on_challenge(ch.receive(await ws.recv()).msg)
    await ws.send(ch.stamp(proof))
    gen = hs.on_welcome(ch.receive(await ws.recv()).msg)
    ch.gen = gen
    return ws, gen


async def test_same_label_replaces_old_connection_at_once_and_generations_grow(mind):
    cred = load_credential(mind.add_hand("twin"))
    ws1, gen1 = await hand_connect(mind.url, cred)
    ws2, gen2 = await hand_connect(mind.url, cred)
    assert gen2 > gen1
    # the old socket is closed by the Mind promptly, not after a keepalive timeout (frames the Mind
    # sent it before, such as the reconciliation's inventory request, may still be read first)
    with pytest.raises(ConnectionClosed) as ei:
        async with asyncio.timeout(5):
            while True:
                await ws1.recv()
    assert ei.value.rcvd is not None and ei.value.rcvd.code == 4001
    info = mind.hand_info("twin")
    assert info["connected"] and info["generation"] == gen2
    await ws2.close()


async def test_generations_survive_a_mind_restart(mind):
    cred = load_credential(mind.add_hand("persist"))
    ws, gen1 = await hand_connect(mind.url, cred)
    await ws.close()
    mind.mind.stop()
    mind.start_mind(port=mind.port)
    ws, gen2 = await hand_connect(mind.url, cred)
    assert gen2 > gen1
    await ws.close()


async def test_hand_credential_cannot_act_as_client(mind):
    cred = load_credential(mind.add_hand("notaclient"))
    with pytest.raises(ClientError):
        await MindClient.connect(mind.url, cred)
    # and a hand's label presented with the client role is unknown: refused like any wrong secret
    as_client = Credential(role="client", label="notaclient", secret=cred.secret)
    with pytest.raises(ClientError) as ei:
        await MindClient.connect(mind.url, as_client)
    assert ei.value.code == ErrorCode.AUTH_FAILED.value
