"""A client frame holding more lists and maps than any request may is refused while it is built
(`protocol.envelope.unpack(max_containers=...)`), with its envelope header read, so it is answered
under its id and the connection goes on; a frame of a million empty lists cost the Mind's loop
100-230 ms to build before its arguments were even counted."""

from __future__ import annotations

import msgpack
import pytest

from protocol import PROTOCOL_VERSION, limits
from protocol.envelope import Channel, PayloadRefused, decode
from protocol.errors import ProtocolError


def frame(pad: object, seq: int = 1, id_: str = "q1") -> bytes:
    p = {"hand": "box", "tool": "read_file", "args": {"path": "x", "pad": pad}, "timeout_ms": 1000}
    return msgpack.packb({"v": PROTOCOL_VERSION, "t": "exec", "id": id_, "seq": seq, "gen": 1, "p": p})


def a_million_empty_lists() -> bytes:
    """`frame([[[] for _ in range(131072)] for _ in range(8)])`, its pad's bytes written directly (a
    million Python lists cost the test a second to build and to free)."""
    marker = "\x00pad\x00"
    inner = b"\xdd" + (131072).to_bytes(4, "big") + b"\x90" * 131072  # array32 of 131072 empty arrays
    return frame(marker).replace(msgpack.packb(marker), b"\x98" + inner * 8)


def test_a_frame_of_a_million_empty_lists_is_refused_with_its_header_read():
    data = a_million_empty_lists()
    assert data == frame([[[] for _ in range(2)] for _ in range(8)]).replace(
        b"\x92\x90\x90", b"\xdd" + (131072).to_bytes(4, "big") + b"\x90" * 131072
    )
    with pytest.raises(PayloadRefused) as refused:
        decode(data, max_containers=limits.ARGS_MAX_ITEMS)
    assert refused.value.header["id"] == "q1" and refused.value.header["seq"] == 1
    assert "more than 100000 lists and maps" in refused.value.message


def test_a_channel_answers_it_in_order_and_reads_the_next_frame():
    ch = Channel()
    ch.gen = 1
    ch.max_containers = 1000
    with pytest.raises(PayloadRefused) as refused:
        ch.receive_any(frame([[] for _ in range(1001)], seq=1, id_="q1"))
    assert refused.value.header == {"t": "exec", "id": "q1"}
    env = ch.receive_any(frame([[] for _ in range(10)], seq=2, id_="q2"))  # the seq moved on
    assert env is not None and env.id == "q2"


def test_within_the_bound_a_frame_decodes_as_without_it():
    data = frame([[1, 2], {"a": [3]}])
    assert decode(data, max_containers=100).msg == decode(data).msg


def test_a_refused_frame_out_of_order_still_closes():
    ch = Channel()
    ch.gen = 1
    ch.max_containers = 10
    with pytest.raises(ProtocolError) as bad:
        ch.receive_any(frame([[] for _ in range(11)], seq=5))  # seq 5 where 1 is due
    assert not isinstance(bad.value, PayloadRefused)
