"""Which bytes of a file are in the page cache: mincore(2) over a shared read-only mapping of it.
Shared by the drop-behind tests (storage/page_cache.py)."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident(path: Path | str, start: int, end: int) -> int:
    """Bytes of `path` in [start, end) that are in the page cache (mincore over a shared mapping)."""
    page = mmap.PAGESIZE
    first, last = start // page, (end + page - 1) // page
    length = (last - first) * page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, first * page)
        assert addr not in (None, _MAP_FAILED), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * (last - first))()
            assert _libc.mincore(addr, length, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(addr, length)
    finally:
        os.close(fd)
    return sum(page for v in vec if v & 1)
