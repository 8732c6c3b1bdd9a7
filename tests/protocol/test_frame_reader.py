"""FrameReader, the broker's framing on asyncio.BufferedProtocol: any split of the byte stream gives the
same frames; a frame larger than the scratch buffer is read straight into its own buffer; a size beyond
the limit (or negative) is refused before anything is allocated for it."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest

from odradek.protocol.framing import FrameReader, FrameTooLarge

SIZES = [0, 1, 100, 16 * 1024 - 5, 16 * 1024 - 4, 16 * 1024, 20_000, 1 << 20, 3, 70_000, 0, 5]


def wire_of(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def read(reader: FrameReader, wire: bytes, pick) -> list[bytes]:
    """Feed `wire` the way a socket would: each read fills at most `pick(room)` bytes of get_buffer()."""
    frames, pos = [], 0
    while pos < len(wire):
        buf = reader.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), pick(len(buf)), len(wire) - pos)
        buf[:n] = wire[pos:pos + n]
        pos += n
        frames += [bytes(f) for f in reader.buffer_updated(n)]
    return frames


@pytest.mark.parametrize("seed", range(8))
def test_any_split_gives_the_same_frames(seed):
    rnd = random.Random(seed)
    payloads = [rnd.randbytes(n) for n in SIZES]
    rnd.shuffle(payloads)
    wire = wire_of(payloads)
    style = seed % 4
    pick = [lambda room: room,                       # whole buffers
            lambda room: 1,                          # a byte at a time (slow: only the small frames)
            lambda room: rnd.randint(1, 7000),       # random pieces
            lambda room: rnd.choice([1, 3, 4, 5, 65536])][style]
    if style == 1:
        payloads = [p for p in payloads if len(p) < 30_000]
        wire = wire_of(payloads)
    r = FrameReader(1 << 21)
    assert read(r, wire, pick) == payloads
    assert r.buffered_bytes == 0


def test_frames_are_writable_and_independent():
    r = FrameReader(1 << 21)
    frames = []
    wire = wire_of([b"abc", bytes(40_000), b"xyz"])
    buf = r.get_buffer()
    buf[:len(buf)] = wire[:len(buf)]
    frames += r.buffer_updated(len(buf))
    rest = wire[len(buf):]
    while rest:
        buf = r.get_buffer()
        n = min(len(buf), len(rest))
        buf[:n] = rest[:n]
        rest = rest[n:]
        frames += r.buffer_updated(n)
    assert [bytes(f) for f in frames] == [b"abc", bytes(40_000), b"xyz"]
    for f in frames:
        assert isinstance(f, bytearray)
        f[0] = 0x7F                # the log patches offsets in produced batches
    assert bytes(frames[0]) == b"\x7fbc"


def test_a_large_frame_is_read_in_place():
    """Once a large frame's size is known, the next read goes straight into the frame's own buffer."""
    r = FrameReader(1 << 21, scratch_bytes=4096)
    payload = bytes(range(256)) * 400            # 102400 bytes
    wire = wire_of([payload])
    buf = r.get_buffer()
    buf[:100] = wire[:100]
    assert r.buffer_updated(100) == []
    target = r.get_buffer()
    assert len(target) == len(payload) - 96     # what is left of the frame, nothing more
    target[:] = wire[100:]
    [frame] = r.buffer_updated(len(target))
    assert frame == payload


@pytest.mark.parametrize("size", [-1, -(2 ** 31), (1 << 20) + 1, 2 ** 31 - 1])
def test_bad_sizes_are_refused_before_allocation(size):
    r = FrameReader(1 << 20)
    buf = r.get_buffer()
    buf[:4] = struct.pack(">i", size)
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge):
            r.buffer_updated(4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
