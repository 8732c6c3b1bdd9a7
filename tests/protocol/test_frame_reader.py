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


class CountingPool:
    """A FramePool with a fixed capacity, as the broker's RequestPool grants large frames."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def try_reserve(self, nbytes: int) -> bool:
        if self.used and self.used + nbytes > self.capacity:
            return False
        self.used += nbytes
        return True

    def charge(self, nbytes: int) -> None:
        self.used += nbytes


def test_an_announced_size_is_not_allocated_before_its_bytes_arrive():
    r = FrameReader(200 << 20)
    tracemalloc.start()
    try:
        wire = struct.pack(">i", 100_000_000) + bytes(55)
        buf = r.get_buffer()
        buf[:len(wire)] = wire
        assert r.buffer_updated(len(wire)) == []
        assert len(r.get_buffer()) <= r.initial_frame_bytes
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * r.initial_frame_bytes, peak
    assert r.buffered_bytes == 55


def test_a_large_frame_grows_with_what_arrives_and_comes_out_whole():
    payload = random.Random(3).randbytes(5_000_000)
    r = FrameReader(10 << 20, initial_frame_bytes=64 * 1024)
    sizes = []
    frames = []
    wire = wire_of([payload, b"tail"])
    pos = 0
    while pos < len(wire):
        buf = r.get_buffer()
        sizes.append(len(buf))
        n = min(len(buf), 100_000, len(wire) - pos)
        buf[:n] = wire[pos:pos + n]
        pos += n
        frames += [bytes(f) for f in r.buffer_updated(n)]
    assert frames == [payload, b"tail"]
    assert max(sizes) <= 5_000_000


def test_the_pool_grants_large_frames_and_charges_small_ones():
    pool = CountingPool(capacity=100_000)
    r = FrameReader(1 << 20, pool=pool)
    assert [bytes(f) for f in r.feed(wire_of([b"abc"]))] == [b"abc"]
    assert pool.used == 3
    pool.used = 0
    assert r.feed(struct.pack(">i", 60_000) + bytes(100)) == []
    assert pool.used == 60_000 and r.reserved_bytes == 60_000


def test_a_refused_frame_waits_for_the_pool_and_then_reads_on():
    pool = CountingPool(capacity=100_000)
    pool.used = 90_000                        # held by other connections
    r = FrameReader(1 << 20, pool=pool)
    wire = wire_of([b"small", bytes(50_000), b"after"])
    buf = r.get_buffer()
    n = len(buf)
    buf[:n] = wire[:n]
    assert [bytes(f) for f in r.buffer_updated(n)] == [b"small"]
    assert r.waiting_bytes == 50_000 and r.reserved_bytes == 0
    assert r.retry_reserve() is False         # still no room
    pool.used = 0                             # the others were answered
    assert r.retry_reserve() is True and r.waiting_bytes == 0
    rest = read(r, wire[n:], lambda room: room)
    assert rest == [bytes(50_000), b"after"]


def _one_large(reader: FrameReader, payload: bytes) -> bytearray:
    frames = reader.feed(wire_of([payload]))
    assert len(frames) == 1
    return frames[0]


def test_a_released_large_frame_buffer_is_read_into_again():
    reader = FrameReader(1 << 24)
    first = _one_large(reader, random.Random(1).randbytes(1 << 20))
    first_id = id(first)
    del first                                    # nobody holds it any more
    payload = random.Random(2).randbytes((1 << 20) - 1000)
    second = _one_large(reader, payload)
    assert id(second) == first_id and bytes(second) == payload
    del second
    bigger = random.Random(3).randbytes((1 << 20) + 300_000)   # grows in place, up to twice the spare
    third = _one_large(reader, bigger)
    assert bytes(third) == bigger


def test_a_large_frame_still_in_use_is_never_overwritten():
    reader = FrameReader(1 << 24)
    a_payload, b_payload = random.Random(4).randbytes(1 << 20), random.Random(5).randbytes(1 << 20)
    held = memoryview(_one_large(reader, a_payload))[10:20]     # a decoder's view into the frame
    second = _one_large(reader, b_payload)
    assert held.obj is not second
    assert bytes(held) == a_payload[10:20] and bytes(second) == b_payload
    kept = second                                               # the frame itself kept by its user
    third = _one_large(reader, a_payload)
    assert third is not kept and bytes(kept) == b_payload and bytes(third) == a_payload


def test_a_pipelining_stream_reuses_the_buffer_before_the_one_still_handled():
    """A producer's next request arrives while the one before it is handled: that one's buffer is
    busy, the one before it free, and read into again."""
    reader = FrameReader(1 << 24)
    payloads = [random.Random(10 + i).randbytes((1 << 20) - i) for i in range(6)]
    handled = _one_large(reader, payloads[0])
    ids = {id(handled)}
    for before, p in zip(payloads, payloads[1:]):
        nxt = _one_large(reader, p)            # arrives while `handled` is still in use
        assert bytes(handled) == before and bytes(nxt) == p
        ids.add(id(nxt))
        handled = nxt                          # the one before is done with now
    assert len(ids) == 2                       # two buffers took turns for six frames


def test_coalesced_joins_small_runs_and_keeps_large_chunks_and_references_in_order():
    from odradek.protocol.framing import COALESCE_BYTES, coalesced

    class Ref:                                  # a record-set reference, sent with sendfile
        size = 10

    ref = Ref()
    big = b"B" * COALESCE_BYTES
    small = [b"\x00\x00\x00\x05", bytearray(b"head"), memoryview(b"x")]
    out = coalesced([*small, ref, b"tail", big, b"a", b"b"])
    assert out[0] == b"\x00\x00\x00\x05headx" and out[1] is ref and out[2] == b"tail"
    assert out[3] is big and out[4] == b"ab" and len(out) == 5
    many = [b"y" * 1000] * 200                  # runs stop at COALESCE_BYTES
    joined = coalesced(many)
    assert b"".join(joined) == b"".join(many) and all(len(c) <= COALESCE_BYTES for c in joined)
    assert len(joined) == -(-200_000 // (COALESCE_BYTES // 1000 * 1000))
