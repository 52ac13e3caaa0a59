"""mind/client/ws.py, the CLI's minimal WebSocket client, against the `websockets` library's own sans-I/O
server (the code the Mind runs), bytes passed by hand: upgrade, frames both ways, fragmentation,
ping/pong, the closing handshake, and each way a server can break the protocol."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Opcode
from websockets.server import ServerProtocol

from mind.client.ws import CLOSED, MESSAGE, PONG, WHOLE_MIN, WsClient, WsError, accept_key, apply_mask


def pair(max_size=1 << 20):
    client = WsClient("example:80", "/", max_size=max_size)
    server = ServerProtocol(max_size=max_size)
    server.receive_data(client.data_to_send())
    request = server.events_received()[0]
    server.send_response(server.accept(request))
    feed(server, client)
    assert client.state == "open"
    return client, server


def feed(server, client):
    for chunk in server.data_to_send():
        client.receive_data(chunk)


def to_server(client, server):
    server.receive_data(client.data_to_send())
    return server.events_received()


def test_messages_both_ways_masked_out_and_large_in():
    client, server = pair()
    client.send_binary(b"hello")
    frames = to_server(client, server)
    assert [(f.opcode, f.data) for f in frames] == [(Opcode.BINARY, b"hello")]  # the server unmasked it
    big = bytes(range(256)) * 1000
    server.send_binary(big)
    server.send_binary(b"")
    feed(server, client)
    assert client.events() == [(MESSAGE, big), (MESSAGE, b"")]


def test_a_header_and_payload_pair_is_one_message_masked_part_by_part():
    # A stream chunk is sent as (header, payload), never joined: each part masked with the key
    # turned by the header's length. The server reads exactly the two joined, whatever the sizes.
    import os

    client, server = pair(max_size=1 << 21)
    sent = []
    for head_len in (13, 14, 15, 16):
        for size in (0, 1, 100, 4082, 4083, 4096, 65_536, 300_001):
            head, payload = os.urandom(head_len), os.urandom(size)
            client.send_binary((head, memoryview(payload)))
            sent.append(head + payload)
    frames = to_server(client, server)
    assert [(f.opcode, f.data) for f in frames] == [(Opcode.BINARY, m) for m in sent]


def test_bytes_may_arrive_one_at_a_time():
    client, server = pair()
    server.send_binary(b"x" * 70_000)  # 64-bit length
    server.send_text(b"t")
    data = b"".join(server.data_to_send())
    for i in range(len(data)):
        client.receive_data(data[i : i + 1])
    assert client.events() == [(MESSAGE, b"x" * 70_000), (MESSAGE, "t")]


def test_fragmented_message_with_a_ping_in_between():
    client, server = pair()
    server.send_binary(b"ab", fin=False)
    server.send_ping(b"p1")
    server.send_continuation(b"cd", fin=True)
    feed(server, client)
    assert client.events() == [(MESSAGE, b"abcd")]
    frames = to_server(client, server)
    assert [(f.opcode, f.data) for f in frames] == [(Opcode.PONG, b"p1")]


def test_ping_from_client_gets_its_pong():
    client, server = pair()
    client.send_ping(b"1234")
    to_server(client, server)  # the server answers pings by itself
    feed(server, client)
    assert client.events() == [(PONG, b"1234")]


def test_server_initiated_close_is_echoed():
    client, server = pair()
    server.send_close(1011, "going away")
    feed(server, client)
    assert client.events() == [(CLOSED, 1011, "going away")]
    assert client.state == "closed"
    frames = to_server(client, server)
    assert frames[0].opcode == Opcode.CLOSE and frames[0].data[:2] == (1011).to_bytes(2, "big")
    with pytest.raises(WsError):
        client.send_binary(b"late")


def test_client_initiated_close_completes_on_the_servers_answer():
    client, server = pair()
    client.send_close()
    assert client.state == "closing"
    to_server(client, server)
    feed(server, client)
    assert client.events() == [(CLOSED, 1000, "")]


def test_eof_without_close_is_abnormal():
    client, _ = pair()
    client.receive_eof()
    assert client.events() == [(CLOSED, 1006, "")]


@pytest.mark.parametrize(
    "head,why",
    [
        (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", "HTTP 403"),
        (
            b"HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: bad\r\n\r\n",
            "Accept",
        ),
        (b"HTTP/1.1 101 OK\r\nConnection: Upgrade\r\n\r\n", "did not upgrade"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "valid HTTP"),
    ],
)
def test_bad_upgrade_answers_are_refused(head, why):
    client = WsClient("h", "/")
    client.data_to_send()
    with pytest.raises(WsError) as ei:
        client.receive_data(head)
    assert why in ei.value.message


def test_an_extension_we_did_not_offer_is_refused():
    client = WsClient("h", "/")
    head = (
        f"HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
        f"{accept_key(client.key)}\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
    ).encode()
    with pytest.raises(WsError):
        client.receive_data(head)


def test_an_endless_response_head_is_bounded():
    client = WsClient("h", "/")
    with pytest.raises(WsError):
        client.receive_data(b"HTTP/1.1 101 OK\r\n" + b"X-A: b\r\n" * 4000)


def test_eof_before_the_answer():
    client = WsClient("h", "/")
    with pytest.raises(WsError):
        client.receive_eof()


@pytest.mark.parametrize(
    "frame,code",
    [
        (b"\x82\x81abcd" + b"x", 1002),  # masked by the server
        (b"\xc2\x01x", 1002),  # RSV1 without an extension
        (b"\x83\x01x", 1002),  # reserved opcode
        (b"\x09\x01x", 1002),  # fragmented ping
        (b"\x89\x7e\x00\x7e" + b"x" * 126, 1002),  # control frame over 125 bytes
        (b"\x80\x01x", 1002),  # continuation with nothing to continue
        (b"\x02\x01a\x82\x01b", 1002),  # a new message inside a fragmented one
        (b"\x81\x02\xff\xfe", 1007),  # text that is not UTF-8
        (b"\x88\x01x", 1002),  # 1-byte close payload
        (b"\x82\x7f" + (1 << 40).to_bytes(8, "big"), 1009),  # a message over max_size, refused before buffering
    ],
)
def test_protocol_violations_carry_the_close_code(frame, code):
    client, _ = pair(max_size=1000)
    with pytest.raises(WsError) as ei:
        client.receive_data(frame)
    assert ei.value.code == code


def test_fragments_count_towards_max_size():
    client, server = pair(max_size=10)
    server.send_binary(b"123456", fin=False)
    server.send_continuation(b"78901", fin=True)
    with pytest.raises(WsError) as ei:
        feed(server, client)
    assert ei.value.code == 1009


@given(st.binary(max_size=300), st.binary(min_size=4, max_size=4))
def test_mask_is_its_own_inverse_and_matches_the_rfc(data, mask):
    masked = apply_mask(data, mask)
    assert masked == bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    assert apply_mask(masked, mask) == data


@given(st.lists(st.binary(max_size=2000), max_size=5), st.integers(min_value=1, max_value=500))
def test_any_split_of_the_stream_gives_the_same_messages(messages, step):
    client, server = pair()
    for m in messages:
        server.send_binary(m)
    data = b"".join(server.data_to_send())
    for i in range(0, len(data), step):
        client.receive_data(data[i : i + step])
    assert client.events() == [(MESSAGE, m) for m in messages]


@given(
    st.lists(st.sampled_from([0, 1, 5000, WHOLE_MIN - 1, WHOLE_MIN, WHOLE_MIN + 7, 300_000]), min_size=1, max_size=5),
    st.lists(st.integers(min_value=1, max_value=200_000), min_size=1, max_size=20),
    st.booleans(),
)
@settings(deadline=None)
def test_large_messages_gathered_in_their_own_buffer_arrive_whole_in_order(sizes, reads, into):
    # Large whole messages (from WHOLE_MIN on) that have not all arrived are gathered in a buffer of
    # their own, fed either as bytes (`receive_data`) or read into it (`buffer_to_fill` / `filled`),
    # mixed with small ones, text among them, with any read sizes: the same messages, in order.
    client, server = pair()
    messages: list[bytes | str] = []
    for i, n in enumerate(sizes):
        if i % 3 == 2:
            text = "é" * (n // 2)
            server.send_text(text.encode())
            messages.append(text)
        else:
            data = (
                bytes((i + j) % 251 for j in range(n))
                if n < 10_000
                else (bytes([i]) * 97 + b"x") * (n // 98) + b"y" * (n % 98)
            )
            server.send_binary(data)
            messages.append(data)
    stream = memoryview(b"".join(server.data_to_send()))
    pos, k = 0, 0
    while pos < len(stream):
        want = reads[k % len(reads)] if k < 100 else len(stream)  # odd splits first, then the rest at once
        k += 1
        room = client.buffer_to_fill() if into else None
        if room is not None:
            n = min(want, len(room), len(stream) - pos)
            room[:n] = stream[pos : pos + n]
            client.filled(n)
        else:
            n = min(want, len(stream) - pos)
            client.receive_data(bytes(stream[pos : pos + n]))
        pos += n
    got = client.events()
    assert [kind for kind, _ in got] == [MESSAGE] * len(messages)
    assert [bytes(m) if not isinstance(m, str) else m for _, m in got] == messages
    assert client.buffer_to_fill() is None


def test_a_gathered_buffer_is_used_again_only_once_nobody_holds_it():
    # The next large message of the same size reuses the last one's buffer, but never while the
    # consumer still holds it (or a view of it): a held message keeps its bytes.
    client, server = pair()
    n = WHOLE_MIN + 100
    first, second, third = b"a" * n, b"b" * n, b"c" * n

    def deliver(data: bytes) -> bytes | bytearray:
        server.send_binary(data)
        stream = b"".join(server.data_to_send())
        client.receive_data(stream[:1000])  # the header and a little: the rest is gathered
        room = client.buffer_to_fill()
        assert room is not None
        room[: len(stream) - 1000] = stream[1000:]
        client.filled(len(stream) - 1000)
        [(kind, got)] = client.events()
        assert kind == MESSAGE
        return got

    held = deliver(first)
    view = memoryview(held)[10:]  # a consumer's view of it, as a data frame's payload is
    del held
    again = deliver(second)  # the first's buffer is still viewed: a new one
    assert bytes(view) == first[10:] and bytes(again) == second
    del view
    kept = deliver(third)  # the last buffer (`again`'s) is held by this test: a new one
    assert bytes(again) == second and bytes(kept) == third
    was = id(kept)
    del again, kept  # nobody holds the last one now
    reused = deliver(first)
    assert id(reused) == was and bytes(reused) == first  # the same buffer, filled anew


def test_large_frames_are_masked_by_the_c_helper_without_importing_websockets():
    """The fast path masks big frames with websockets' C function, loaded from its file (the
    package itself, 30 ms of imports, stays unloaded) and bit-identical to the pure version."""
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from mind.client import ws\n"
        "d = os.urandom(200_000); m = os.urandom(4)\n"
        "key = (m * (len(d) // 4 + 1))[: len(d)]\n"
        "ref = (int.from_bytes(d, 'little') ^ int.from_bytes(key, 'little')).to_bytes(len(d), 'little')\n"
        "assert ws.apply_mask(d, m) == ref\n"
        "print(bool(ws._C_MASK), 'websockets' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert r.stdout.split() == [b"True", b"False"], r.stderr


test_large_frames_are_masked_by_the_c_helper_without_importing_websockets = pytest.mark.slow(
    test_large_frames_are_masked_by_the_c_helper_without_importing_websockets
)
