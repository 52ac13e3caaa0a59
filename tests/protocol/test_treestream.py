"""The framing of a tree inside one stream (`protocol.treestream`): every tree the sender frames
comes out of the reader exactly, however the stream is cut into chunks; everything else (cut short,
oversized, a path that is absolute, `..`, empty or a link leading out, garbage) is a clear
`TreeFrameError`, never another exception, a hang, or an entry the receiver would act on."""

from __future__ import annotations

import hashlib
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import copy as rules
from protocol import treestream as ts

NAME = st.text(
    st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda n: n not in (".", ".."))
PATH = st.lists(NAME, min_size=1, max_size=4).map("/".join)


@st.composite
def trees(draw: st.DrawFn) -> list[tuple[ts.Entry, bytes]]:
    out: list[tuple[ts.Entry, bytes]] = []
    for path in draw(st.lists(PATH, max_size=8, unique=True)):
        kind = draw(st.sampled_from(["file", "file", "dir", "symlink", "error"]))
        mode = draw(st.none() | st.integers(0, 0o7777))
        mtime = draw(st.none() | st.floats(-1e9, 4e9, allow_nan=False))
        if kind == "file":
            body = draw(st.binary(max_size=300))
            out.append((ts.Entry(path, "file", len(body), mode, mtime), body))
        elif kind == "symlink":
            out.append((ts.Entry(path, "symlink", mode=mode, target=draw(NAME)), b""))
        elif kind == "error":
            out.append((ts.Entry(path, "error", error=draw(st.text(max_size=40))), b""))
        else:
            out.append((ts.Entry(path, "dir", mode=mode, mtime=mtime), b""))
    return out


def encode(tree: list[tuple[ts.Entry, bytes]]) -> bytes:
    out = b""
    for entry, body in tree:
        out += ts.header(entry)
        if entry.type == "file":
            out += body + ts.trailer(hashlib.sha256(body).digest())
    return out + ts.end(len(tree))


def decode(data: bytes, cuts: list[int], **kw: object) -> list[tuple[ts.Entry, bytes, str | None]]:
    """Feed `data` cut at `cuts`; the entries with their bodies and digests, after `close()`."""
    reader = ts.TreeReader(**kw)  # type: ignore[arg-type]
    got: list[tuple[ts.Entry, bytes, str | None]] = []
    body = bytearray()
    ended = False
    points = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    for a, b in zip(points, points[1:], strict=False):
        for ev in reader.feed(data[a:b]):
            if isinstance(ev, ts.Entry):
                got.append((ev, b"", None))
                body.clear()
            elif isinstance(ev, ts.Chunk):
                body += ev.data
            elif isinstance(ev, ts.EntryEnd):
                entry, _, _ = got[-1]
                got[-1] = (entry, bytes(body), ev.sha256)
            else:
                ended = True
    reader.close()
    assert ended and reader.done
    return got


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.lists(st.integers(0, 5000), max_size=12))
def test_every_tree_round_trips_however_the_stream_is_chunked(tree, cuts):
    got = decode(encode(tree), cuts)
    assert len(got) == len(tree)
    for (entry, body), (g, gbody, digest) in zip(tree, got, strict=True):
        assert g == entry
        if entry.type == "file":
            assert gbody == body and digest == hashlib.sha256(body).hexdigest()


@given(trees().filter(bool), st.data())
def test_a_stream_cut_short_anywhere_is_refused_at_its_end(tree, data):
    raw = encode(tree)
    cut = data.draw(st.integers(0, len(raw) - 1))
    reader = ts.TreeReader()
    reader.feed(raw[:cut])
    with pytest.raises(ts.TreeFrameError, match="cut short"):
        reader.close()


@given(st.binary(max_size=400))
def test_garbage_is_a_clear_error_never_a_crash(raw):
    reader = ts.TreeReader()
    try:
        reader.feed(raw)
        reader.close()
    except ts.TreeFrameError as exc:
        assert exc.message
    else:
        assert raw == ts.end(0) or reader.done


def raw_header(body: object) -> bytes:
    packed = msgpack.packb(body)
    return struct.pack(">BI", ts.TAG_HEADER, len(packed)) + packed


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"path": "/etc/passwd", "type": "file", "size": 1}, "not a plain path"),
        ({"path": "../x", "type": "file", "size": 1}, "not a plain path"),
        ({"path": "a/../../x", "type": "file", "size": 1}, "not a plain path"),
        ({"path": "a/./b", "type": "dir"}, "not a plain path"),
        ({"path": "", "type": "dir"}, "not a plain path"),
        ({"path": "a//b", "type": "dir"}, "not a plain path"),
        ({"path": "a\x00b", "type": "dir"}, "not a plain path"),
        ({"path": "l", "type": "symlink", "target": "../out"}, "leads outside"),
        ({"path": "d/l", "type": "symlink", "target": "/etc"}, "leads outside"),
        ({"path": "d/l", "type": "symlink", "target": "../../x"}, "leads outside"),
        ({"path": "l", "type": "symlink"}, "no target"),
        ({"path": "f", "type": "fifo"}, "unknown type"),
        ({"path": "f", "type": "file", "size": -1}, "impossible size"),
        ({"path": "f", "type": "file", "size": 1 << 60}, "impossible size"),
        ({"path": "f", "type": "file", "size": 10, "mtime": float("nan")}, "mtime must be"),
        ({"path": "f", "type": "file", "size": 10, "mode": 0o17777}, "impossible mode"),
        ({"path": "f", "type": "dir", "size": 3}, "has a size"),
        ({"path": "f", "type": "file", "extra": 1}, "unknown fields"),
        ([1, 2], "not a map"),
    ],
)
def test_entries_a_receiver_must_not_act_on_are_refused(body, why):
    with pytest.raises(ts.TreeFrameError, match=why):
        ts.TreeReader().feed(raw_header(body))


def test_a_file_over_the_receivers_limit_is_refused_by_its_header():
    with pytest.raises(ts.TreeFrameError, match="over this receiver's limit"):
        ts.TreeReader(max_file=100).feed(ts.header(ts.Entry("big", "file", 101)))


def test_an_oversized_record_is_refused_before_it_is_read():
    with pytest.raises(ts.TreeFrameError, match="over the"):
        ts.TreeReader().feed(struct.pack(">BI", ts.TAG_HEADER, ts.HEADER_MAX + 1))


def test_bytes_after_the_end_and_a_wrong_count_are_refused():
    with pytest.raises(ts.TreeFrameError, match="after the end"):
        ts.TreeReader().feed(ts.end(0) + b"H")
    with pytest.raises(ts.TreeFrameError, match="does not match"):
        ts.TreeReader().feed(ts.end(3))


def test_too_many_entries_are_refused():
    raw = b"".join(ts.header(ts.Entry(f"d{i}", "dir")) for i in range(3))
    with pytest.raises(ts.TreeFrameError, match="more than 2"):
        ts.TreeReader(max_entries=2).feed(raw)


def test_same_file_compares_size_and_time_or_the_digest():
    theirs = {"type": "file", "size": 3, "mtime": 100.0, "sha256": "ab"}
    assert rules.same_file(3, 100.0 + 1e-7, None, theirs, checksum=False)
    assert not rules.same_file(3, 101.0, None, theirs, checksum=False)
    assert not rules.same_file(4, 100.0, None, theirs, checksum=False)
    assert rules.same_file(3, 1.0, "ab", theirs, checksum=True)
    assert not rules.same_file(3, 100.0, "cd", theirs, checksum=True)
    assert not rules.same_file(3, 100.0, None, {**theirs, "type": "symlink"}, checksum=False)
    assert not rules.same_file(3, 100.0, None, None, checksum=False)


def test_long_path_lists_are_batched_in_order():
    paths = [f"{i:05d}" + "x" * 100 for i in range(10_000)]
    batches = rules.batch_paths(paths)
    assert [p for b in batches for p in b] == paths and len(batches) > 1
    assert all(sum(len(p) + 4 for p in b) <= rules.TREE_PATHS_BYTES for b in batches)
