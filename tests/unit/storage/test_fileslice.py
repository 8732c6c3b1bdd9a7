import os
import socket

import pytest

from odradek.storage.errors import StorageError
from odradek.storage.log import MAX_LOADED_INACTIVE_SEGMENTS
from tests.unit.storage.logutil import open_log, produce


def test_slices_go_through_sendfile_without_copies_in_python(tmp_path):
    log = open_log(tmp_path)
    produce(log, 40, size=150)
    slices = log.read(3, 5_000)
    expected = b"".join(s.read() for s in slices)
    a, b = socket.socketpair()
    with a, b:
        for s in slices:
            sent = 0
            while sent < s.length:
                sent += os.sendfile(a.fileno(), s.fileno(), s.position + sent, s.length - sent)
        received = b""
        while len(received) < len(expected):
            received += b.recv(65536)
    assert received == expected
    assert slices[0].path.endswith(".log")


def test_short_read_is_an_error(tmp_path):
    log = open_log(tmp_path)
    produce(log, 3)
    (piece,) = log.read(0, 10_000)
    log.truncate_to(1, now_ms=0)
    with pytest.raises(StorageError):
        piece.read()


def test_inactive_segment_indexes_are_unloaded_beyond_the_bound(tmp_path):
    log = open_log(tmp_path)
    produce(log, 300, size=150)
    assert len(log.segments) > MAX_LOADED_INACTIVE_SEGMENTS + 5
    for start in range(0, 300, 5):
        log.read(start, 100)
    loaded = [s for s in log.segments[:-1] if s.offset_index.loaded]
    assert len(loaded) <= MAX_LOADED_INACTIVE_SEGMENTS
    assert log.read_bytes(0, 100)  # unloaded indexes come back when needed
