"""A copied file goes to the disk as it is written and leaves the page cache once there
(`protocol.io.writeback`): every byte still lands, and the file does not fill the page cache."""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import time

from protocol.io.writeback import LAG, STEP, Writeback

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def _resident(path) -> int:
    """Pages of `path` in the page cache now (`mincore(2)` over a read-only mapping of it)."""
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec)


def _write(path, size: int, through: bool) -> str:
    """`size` bytes written 1 MiB at a time, through a `Writeback` if `through`, then fsynced (as a
    copy's part file is); returns their sha256. A short pause each step gives a slow disk time
    to finish the writeback started steps before (a page still being written is kept)."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        wb = Writeback(fd, 0)
        pos = 0
        while pos < size:
            chunk = os.urandom(1 << 20)
            os.write(fd, chunk)
            h.update(chunk)
            pos += len(chunk)
            if through:
                wb.wrote(pos)
                if pos % STEP == 0:
                    time.sleep(0.02)
        os.fsync(fd)
    finally:
        os.close(fd)
    return h.hexdigest()


def test_a_file_written_through_writeback_is_whole_and_mostly_out_of_the_page_cache(tmp_path):
    size = 8 * STEP  # 64 MiB
    pages = size // mmap.PAGESIZE
    kept, dropped = tmp_path / "kept.bin", tmp_path / "dropped.bin"
    assert _write(kept, size, through=False) == hashlib.sha256(kept.read_bytes()).hexdigest()
    # The control: written plainly, the whole file stays cached (nothing here is under pressure).
    assert _resident(kept) > pages * 0.9
    digest = _write(dropped, size, through=True)
    at_most = (LAG + 1) * STEP // mmap.PAGESIZE  # the steps not yet dropped
    assert _resident(dropped) <= at_most + pages // 8, (_resident(dropped), pages)
    assert hashlib.sha256(dropped.read_bytes()).hexdigest() == digest  # every byte, read back from the disk


def _uncached(path) -> None:
    """`path` out of the page cache (written back first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _download(root, name: str) -> tuple[str, bytes]:
    """The Hand's `get_file` of `name`, read to the end as a copy reads it: (its digest, its bytes)."""
    from hand.system.copy import Download

    d = Download(root, name, name, 0)
    d.open()
    got = bytearray()
    while chunk := d.read():
        got += chunk
    return d.finish()["sha256"], bytes(got)


def test_a_file_nobody_had_cached_leaves_the_page_cache_as_a_copy_reads_it(tmp_path):
    size = 8 * STEP
    data = os.urandom(size)
    (tmp_path / "cold.bin").write_bytes(data)
    _uncached(tmp_path / "cold.bin")
    assert _resident(tmp_path / "cold.bin") < 16, "the control: the file starts out of the cache"
    digest, got = _download(tmp_path, "cold.bin")
    assert got == data and digest == hashlib.sha256(data).hexdigest()
    # What the read brought in was let go behind it: at most a step and the kernel's readahead.
    assert _resident(tmp_path / "cold.bin") <= 2 * STEP // mmap.PAGESIZE, _resident(tmp_path / "cold.bin")


def test_a_file_someone_had_cached_stays_cached_when_a_copy_reads_it(tmp_path):
    size = 8 * STEP
    data = os.urandom(size)
    (tmp_path / "warm.bin").write_bytes(data)
    assert (tmp_path / "warm.bin").read_bytes() == data  # in the cache, as a file in use is
    pages = size // mmap.PAGESIZE
    assert _resident(tmp_path / "warm.bin") > pages * 0.9
    digest, got = _download(tmp_path, "warm.bin")
    assert got == data and digest == hashlib.sha256(data).hexdigest()
    assert _resident(tmp_path / "warm.bin") > pages * 0.9, "nothing someone else uses is dropped"
