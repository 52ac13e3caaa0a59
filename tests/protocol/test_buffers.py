"""protocol/io/buffers.py: what a partial scatter-gather send leaves is exactly the rest of the
bytes, and a key turned for a payload masked apart joins the header's masking exactly."""

from hypothesis import given
from hypothesis import strategies as st

from protocol.io.buffers import turned, unsent


@given(st.lists(st.binary(max_size=40), max_size=8), st.data())
def test_what_is_left_after_n_bytes_is_the_rest_of_them(buffers, data):
    whole = b"".join(buffers)
    n = data.draw(st.integers(0, len(whole)))
    left = unsent(buffers, n)
    assert b"".join(bytes(b) for b in left) == whole[n:]
    assert sum(isinstance(b, memoryview) for b in left) <= 1  # only the buffer cut through is a view


def _mask(data: bytes, key: bytes) -> bytes:
    return bytes(b ^ key[i % 4] for i, b in enumerate(data))


@given(st.binary(max_size=30), st.binary(max_size=30), st.binary(min_size=4, max_size=4))
def test_a_part_masked_with_the_turned_key_is_the_whole_masked(head, payload, key):
    assert _mask(head, key) + _mask(payload, turned(key, len(head))) == _mask(head + payload, key)
