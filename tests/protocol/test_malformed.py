"""Malformed input: every case raises ProtocolError (or its subclass), never another exception, and
never allocates much more than it was given (tracemalloc peak <= 10 x input + 64 KiB).

The table covers request frames (`decode_request`), framing (`FrameReader`, what the broker and the
client read frames with) and record sets
(`odradek.records`): lengths and counts that are negative, past the end or absurd, tagged fields out
of order, truncations (every prefix of real clients' frames), unknown API keys and versions, overlong
varints, bad CRCs and decompression bombs. Hypothesis then feeds random and mutated frames, record
sets and compressed blocks to the same decoders.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odradek.protocol.api import decode_request, encode_request
from odradek.protocol.exceptions import ProtocolError, UnsupportedVersionError
from odradek.protocol.framing import FrameReader, FrameTooLarge
from odradek.protocol.messages import APIS
from odradek.records import (
    GZIP, LZ4, NONE, SNAPPY, ZSTD, BatchHeader, LegacyBatch, LegacyBuilder, RecordBatch, RecordBatchBuilder,
    iter_batches, iter_records,
)
from odradek.records import codecs
from odradek.records.legacy_builder import encode_message

GOLDEN_DIR = Path(__file__).parent / "golden"
INT32_MAX = (1 << 31) - 1


# =========================================================================================== bytes

def i8(v: int) -> bytes:
    return struct.pack(">b", v)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def uv(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def s(text: str) -> bytes:
    raw = text.encode()
    return i16(len(raw)) + raw


def cs(text: str) -> bytes:
    raw = text.encode()
    return uv(len(raw) + 1) + raw


def header(api_key: int, version: int, *, client_id: bytes | None = b"golden", tags: bytes | None = None,
           correlation_id: int = 7) -> bytes:
    """A request header: v1 (client id), or v2 when tags is given (the tagged-field section)."""
    out = i16(api_key) + i16(version) + i32(correlation_id)
    out += b"\xff\xff" if client_id is None else i16(len(client_id)) + client_id
    return out + (tags if tags is not None else b"")


NO_TAGS = b"\x00"


def metadata_v1(topics: bytes) -> bytes:
    return header(3, 1) + topics


def produce_v3(topic_data: bytes) -> bytes:
    return header(0, 3) + b"\xff\xff" + i16(1) + i32(1000) + topic_data


def produce_v9(body_after_timeout: bytes, *, tags: bytes = NO_TAGS) -> bytes:
    return header(0, 9, tags=tags) + b"\x00" + i16(1) + i32(1000) + body_after_timeout


def fetch_v12(tags: bytes) -> bytes:
    """Fetch v12 with no topics, no forgotten topics, empty rack id, then the given top-level tags."""
    return (header(1, 12, tags=NO_TAGS) + i32(-1) + i32(500) + i32(1) + i32(1 << 20) + i8(0) + i32(0) + i32(-1)
            + uv(1) + uv(1) + cs("") + tags)


# A valid Produce v9 partition: compact array of 1 topic "t", 1 partition, 0 records bytes.
def produce_v9_topics(records: bytes = uv(1), count: bytes = uv(2)) -> bytes:
    return count + cs("t") + uv(2) + i32(0) + records + NO_TAGS + NO_TAGS + NO_TAGS


# =========================================================================================== records

def v2_batch(n: int = 3, compression: int = NONE) -> bytes:
    b = RecordBatchBuilder(compression=compression)
    for i in range(n):
        b.append(b"k%d" % i, b"v%d" % i, headers=[("h", b"x")], timestamp=1000 + i)
    return b.build()


def legacy_set(magic: int, compression: int = NONE) -> bytes:
    b = LegacyBuilder(magic, compression=compression)
    for i in range(3):
        b.append(b"k%d" % i, b"v%d" % i, timestamp=1000 + i)
    return b.build()


def flip(data: bytes, pos: int) -> bytes:
    out = bytearray(data)
    out[pos] ^= 0x01
    return bytes(out)


def patch(data: bytes, pos: int, raw: bytes) -> bytes:
    out = bytearray(data)
    out[pos:pos + len(raw)] = raw
    return bytes(out)


def consume(iterable) -> None:
    for _ in iterable:
        pass


def v2_records(data) -> None:
    consume(iter_records(data))


def ensure_batch(data) -> None:
    RecordBatch(data).ensure_valid()


def ensure_legacy(data) -> None:
    LegacyBatch(data).ensure_valid()


def header_is_valid_or_raise(data) -> None:
    """BatchHeader.is_valid is the broker's hot-path check: a bad CRC must read as invalid."""
    if not BatchHeader(data).is_valid():
        raise ProtocolError("crc mismatch")


def records_capped(cap: int):
    def run(data) -> None:
        consume(RecordBatch(data).records(max_uncompressed_bytes=cap))
    return run


def decompress_capped(codec: int, cap: int):
    def run(data) -> None:
        codecs.decompress(codec, data, max_bytes=cap)
    return run


def feed(max_frame_bytes: int):
    def run(data) -> None:
        FrameReader(max_frame_bytes).feed(data)
    return run


def bomb_batch(codec: int, uncompressed: int) -> bytes:
    """A v2 batch whose one record's value is `uncompressed` zero bytes, compressed."""
    b = RecordBatchBuilder(compression=codec)
    b.append(None, bytes(uncompressed), timestamp=0)
    return b.build()


# =========================================================================================== table

@dataclass
class Case:
    name: str
    data: bytes
    fn: Callable = decode_request
    exc: type = ProtocolError


BOMB = 8 << 20  # 8 MiB of zeros: compresses to a few KiB
CAP = 16 << 10

CASES = [
    # --- headers
    *(Case(f"header truncated to {n} bytes", header(3, 1)[:n]) for n in range(8)),
    Case("client id length -2", i16(3) + i16(1) + i32(1) + i16(-2)),
    Case("client id length past the end", i16(3) + i16(1) + i32(1) + i16(300) + b"abc"),
    Case("client id not UTF-8", header(3, 1, client_id=b"\xff\xfe") + i32(-1)),
    Case("flexible header: tag count huge", header(0, 9, tags=uv(INT32_MAX))),
    Case("flexible header: tag count 5 bytes of 0xff", header(0, 9, tags=b"\xff\xff\xff\xff\x0f")),
    Case("flexible header: duplicate tags", header(0, 9, tags=uv(2) + uv(1) + uv(0) + uv(1) + uv(0))),
    Case("flexible header: tags not ascending", header(0, 9, tags=uv(2) + uv(3) + uv(0) + uv(1) + uv(0))),
    Case("flexible header: tag size past the end", header(0, 9, tags=uv(1) + uv(0) + uv(200) + b"ab")),
    Case("flexible header: tag section cut off", header(0, 9, tags=uv(1) + uv(0))),
    # --- unknown keys and versions
    Case("unknown api key 999", header(999, 0) + b"\x00" * 8, exc=UnsupportedVersionError),
    Case("api key -1", header(-1, 0), exc=UnsupportedVersionError),
    Case("Produce v14 (unknown version)", header(0, 14) + b"\x00" * 8, exc=UnsupportedVersionError),
    Case("Produce v-1", header(0, -1), exc=UnsupportedVersionError),
    Case("Fetch v32767", header(1, 32767), exc=UnsupportedVersionError),
    Case("ApiVersions v99 (KIP-511 fallback)", header(18, 99, tags=NO_TAGS) + b"\x07future\x02x\x00",
         exc=UnsupportedVersionError),
    Case("ApiVersions v99 with a broken client id", header(18, 99)[:8] + i16(500),
         exc=UnsupportedVersionError),
    # Found by the fuzz below: the header's tag section cut off raised IndexError (api.py, now guarded).
    Case("ApiVersions v99, header cut before its tag section", header(18, 99), exc=UnsupportedVersionError),
    # --- classic strings and arrays (Metadata v1: topics []string)
    Case("array count -2", metadata_v1(i32(-2))),
    Case("array count INT32_MAX", metadata_v1(i32(INT32_MAX))),
    Case("array count INT32_MIN", metadata_v1(i32(-(1 << 31)))),
    Case("array count past the end", metadata_v1(i32(50) + s("t"))),
    Case("array count 2^24 + 1 (over the cap)", metadata_v1(i32((1 << 24) + 1) + bytes(64))),
    Case("string length -2", metadata_v1(i32(1) + i16(-2))),
    Case("string length -32768", metadata_v1(i32(1) + i16(-32768))),
    Case("string length past the end", metadata_v1(i32(1) + i16(100) + b"ab")),
    Case("string not UTF-8", metadata_v1(i32(1) + i16(2) + b"\xc3\x28")),
    Case("non-nullable array null (Produce topic_data -1)", produce_v3(i32(-1))),
    Case("records length -2", produce_v3(i32(1) + s("t") + i32(1) + i32(0) + i32(-2))),
    Case("records length INT32_MIN", produce_v3(i32(1) + s("t") + i32(1) + i32(0) + i32(-(1 << 31)))),
    Case("records length past the end", produce_v3(i32(1) + s("t") + i32(1) + i32(0) + i32(1000) + b"x")),
    Case("records truncated mid-length", produce_v3(i32(1) + s("t") + i32(1) + i32(0) + b"\x00\x00")),
    Case("bytes length -2 (JoinGroup metadata)",
         header(11, 0) + s("g") + i32(1000) + s("") + s("consumer") + i32(1) + s("range") + i32(-2)),
    Case("bytes length past the end (JoinGroup metadata)",
         header(11, 0) + s("g") + i32(1000) + s("") + s("consumer") + i32(1) + s("range") + i32(99) + b"a"),
    Case("int32 array longer than the frame (OffsetFetch partitions)",
         header(9, 1) + s("g") + i32(1) + s("t") + i32(3) + i32(0) + i32(1)),
    Case("nullable string length -2 (Produce transactional id)",
         header(0, 3) + i16(-2) + i16(1) + i32(1000) + i32(0)),
    Case("uuid truncated (Metadata v10 topic id)", header(3, 10, tags=NO_TAGS) + uv(2) + bytes(9)),
    # --- compact forms (Produce v9)
    Case("compact array count 2^32 - 1", produce_v9(b"\xff\xff\xff\xff\x0f")),
    Case("compact array count 2^35 - 1", produce_v9(b"\xff\xff\xff\xff\x7f")),
    Case("compact array count INT32_MAX", produce_v9(uv(INT32_MAX))),
    Case("compact array count past the end", produce_v9(uv(40) + cs("t"))),
    Case("compact non-nullable array null", produce_v9(b"\x00" + NO_TAGS)),
    Case("compact string length huge", produce_v9(uv(2) + uv(1 << 30) + b"t")),
    Case("compact non-nullable string null", produce_v9(uv(2) + b"\x00" + uv(1))),
    Case("compact records length huge", produce_v9(produce_v9_topics(records=uv(INT32_MAX)))),
    Case("compact records length past the end", produce_v9(produce_v9_topics(records=uv(10) + b"abc"))),
    Case("overlong varint (6 bytes)", produce_v9(b"\x80\x80\x80\x80\x80\x01")),
    Case("overlong varint of 0x80 to the end", produce_v9(b"\x80" * 40)),
    Case("varint cut off by the end of the frame", produce_v9(b"\x80")),
    Case("compact nullable string length past the end",
         header(0, 9, tags=NO_TAGS) + uv(100) + b"tx"),
    # --- tagged fields in bodies
    Case("body: tag count huge", produce_v9(produce_v9_topics()[:-1] + uv(1 << 31))),
    Case("body: tag count INT32_MAX in a struct", produce_v9(uv(2) + cs("t") + uv(1) + uv(INT32_MAX))),
    Case("body: duplicate tags", produce_v9(produce_v9_topics()[:-1] + uv(2) + uv(4) + uv(0) + uv(4) + uv(0))),
    Case("body: tags not ascending",
         produce_v9(produce_v9_topics()[:-1] + uv(2) + uv(9) + uv(0) + uv(4) + uv(0))),
    Case("body: tag size past the end", produce_v9(produce_v9_topics()[:-1] + uv(1) + uv(4) + uv(1 << 20))),
    Case("body: tag number overlong varint",
         produce_v9(produce_v9_topics()[:-1] + uv(1) + b"\xff\xff\xff\xff\xff\x01" + uv(0))),
    Case("known tag (Fetch cluster_id) shorter than declared", fetch_v12(uv(1) + uv(0) + uv(3) + cs("a") + b"x")),
    Case("known tag (Fetch cluster_id) declared past the end", fetch_v12(uv(1) + uv(0) + uv(3) + cs("a"))),
    Case("known tag (Fetch cluster_id) reads past its declared size",
         fetch_v12(uv(1) + uv(0) + uv(1) + uv(5) + b"abcd")),
    Case("known tag (Fetch cluster_id) not UTF-8", fetch_v12(uv(1) + uv(0) + uv(3) + uv(3) + b"\xff\xfe")),
    # --- framing
    Case("frame size -1", i32(-1), fn=feed(1 << 20)),
    Case("frame size INT32_MIN", i32(-(1 << 31)), fn=feed(1 << 20)),
    Case("frame size INT32_MAX", i32(INT32_MAX) + b"\x00" * 16, fn=feed(100 << 20)),
    Case("frame size one past the limit", i32((1 << 20) + 1), fn=feed(1 << 20)),
    Case("second frame too large", i32(4) + b"abcd" + i32(1 << 30), fn=feed(1 << 20)),
    # --- record sets (what a Produce request carries)
    Case("v2 batch: CRC-covered byte flipped (BatchHeader.is_valid)", flip(v2_batch(), 70),
         fn=header_is_valid_or_raise),
    Case("v2 batch: CRC field flipped (RecordBatch.ensure_valid)", flip(v2_batch(), 20), fn=ensure_batch),
    Case("v2 batch: attributes flipped (iter_records)", flip(v2_batch(), 22), fn=v2_records),
    Case("v2 gzip batch: compressed byte flipped", flip(v2_batch(compression=GZIP), 75), fn=v2_records),
    Case("v2 batch: truncated", v2_batch()[:-1], fn=v2_records),
    Case("v2 batch: shorter than its header", v2_batch()[:60], fn=ensure_batch),
    Case("v2 batch: length -1", patch(v2_batch(), 8, i32(-1)), fn=v2_records),
    Case("v2 batch: length INT32_MAX", patch(v2_batch(), 8, i32(INT32_MAX)), fn=v2_records),
    Case("v2 batch: magic 3", patch(v2_batch(), 16, b"\x03"), fn=v2_records),
    Case("v2 batch: unknown codec 7", patch(v2_batch(), 21, i16(7)),
         fn=lambda d: consume(RecordBatch(d).records(check_crc=False))),
    Case("v2 batch: records count INT32_MAX", patch(v2_batch(), 57, i32(INT32_MAX)),
         fn=lambda d: consume(RecordBatch(d).records(check_crc=False))),
    Case("v2 batch: records count -1", patch(v2_batch(), 57, i32(-1)),
         fn=lambda d: consume(RecordBatch(d).records(check_crc=False))),
    Case("v2 batch: record length overlong varint", patch(v2_batch(), 61, b"\xff" * 6),
         fn=lambda d: consume(RecordBatch(d).records(check_crc=False))),
    Case("v2 batch: record key length past the record", patch(v2_batch(), 61 + 4, b"\x7e"),
         fn=lambda d: consume(RecordBatch(d).records(check_crc=False))),
    Case("legacy v0: CRC mismatch", flip(legacy_set(0), 29), fn=ensure_legacy),
    Case("legacy v1: CRC mismatch", flip(legacy_set(1), 30), fn=v2_records),
    Case("legacy v1 gzip wrapper: CRC mismatch", flip(legacy_set(1, GZIP), 40), fn=v2_records),
    Case("legacy v0: key length past the message", patch(legacy_set(0), 18, i32(1000)), fn=ensure_legacy),
    Case("legacy: magic 5", patch(legacy_set(1), 16, b"\x05"), fn=v2_records),
    Case("legacy v1 wrapper with nothing inside",
         encode_message(0, 1, GZIP, 0, None, gzip.compress(b"")), fn=v2_records),
    # --- decompression bombs and garbage
    Case("gzip bomb", codecs.compress(GZIP, bytes(BOMB)), fn=decompress_capped(GZIP, CAP)),
    Case("gzip bomb in many members", codecs.compress(GZIP, bytes(CAP)) * 4, fn=decompress_capped(GZIP, CAP)),
    Case("snappy bomb", codecs.compress(SNAPPY, bytes(BOMB)), fn=decompress_capped(SNAPPY, CAP)),
    Case("raw snappy bomb", b"\xff\xff\xff\x7f" + b"\x00" * 8, fn=decompress_capped(SNAPPY, CAP)),
    Case("lz4 bomb", codecs.compress(LZ4, bytes(BOMB)), fn=decompress_capped(LZ4, CAP)),
    Case("zstd bomb", codecs.compress(ZSTD, bytes(BOMB)), fn=decompress_capped(ZSTD, CAP)),
    Case("zstd bomb, content size not declared",
         zstandard.ZstdCompressor(write_content_size=False).compress(bytes(BOMB)), fn=decompress_capped(ZSTD, CAP)),
    Case("zstd frame declaring 2^60 bytes", patch(zstandard.ZstdCompressor().compress(b"x" * 300), 4, b"\xe0")
         + bytes(8), fn=decompress_capped(ZSTD, CAP)),
    Case("gzip bomb inside a v2 batch", bomb_batch(GZIP, BOMB), fn=records_capped(CAP)),
    Case("zstd bomb inside a v2 batch", bomb_batch(ZSTD, BOMB), fn=records_capped(CAP)),
    Case("lz4 bomb inside a v2 batch", bomb_batch(LZ4, BOMB), fn=records_capped(CAP)),
    Case("snappy bomb inside a v2 batch", bomb_batch(SNAPPY, BOMB), fn=records_capped(CAP)),
    Case("gzip garbage", b"\x1f\x8b\x08\x00" + b"\xff" * 32, fn=decompress_capped(GZIP, CAP)),
    Case("gzip truncated", codecs.compress(GZIP, b"hello" * 100)[:-5], fn=decompress_capped(GZIP, CAP)),
    Case("snappy garbage", b"\x82SNAPPY\x00" + bytes(8) + i32(8) + b"\xff" * 8, fn=decompress_capped(SNAPPY, CAP)),
    Case("xerial block length past the end", b"\x82SNAPPY\x00" + bytes(8) + i32(1 << 30),
         fn=decompress_capped(SNAPPY, CAP)),
    Case("lz4 garbage", b"\x04\x22\x4d\x18" + b"\xff" * 16, fn=decompress_capped(LZ4, CAP)),
    Case("zstd garbage", b"\x28\xb5\x2f\xfd" + b"\xff" * 16, fn=decompress_capped(ZSTD, CAP)),
    Case("unknown codec 6", b"abc", fn=decompress_capped(6, CAP)),
]


def _golden_frames() -> list[tuple[str, bytes]]:
    """A few real clients' frames: (name, bytes); one per (client, api) below, the first captured."""
    wanted = [("kcat", 0), ("kafka-python", 3), ("confluent-kafka", 1), ("kafka-python", 11),
              ("aiokafka", 18), ("kafka-python-0.9", 0), ("confluent-kafka", 8), ("kafka-python", 19)]
    out = []
    for client, api_key in wanted:
        index_path = GOLDEN_DIR / client / "index.json"
        if not index_path.exists():
            continue
        for entry in json.loads(index_path.read_text())["frames"]:
            if entry["api_key"] == api_key:
                out.append((f"{client}/{entry['file']}", (GOLDEN_DIR / client / entry["file"]).read_bytes()))
                break
    return out


GOLDEN = _golden_frames()


# =========================================================================================== checks

@pytest.fixture
def traced():
    tracemalloc.start()
    yield
    tracemalloc.stop()


def budget(data: bytes) -> int:
    return 10 * len(data) + 64 * 1024


def rejects(fn, data, exc=ProtocolError):
    """Run fn(data); it must raise exc (a ProtocolError); return (exception, peak bytes allocated)."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        fn(data)
    except exc as e:
        caught = e
    except Exception as e:  # noqa: BLE001 - the point: no other type may escape
        raise AssertionError(f"raised {type(e).__name__}, not {exc.__name__}: {e}") from e
    else:
        raise AssertionError(f"accepted: {bytes(data[:64]).hex()}")
    peak = tracemalloc.get_traced_memory()[1] - base
    assert isinstance(caught, ProtocolError)
    return caught, peak


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed(case, traced):
    e, peak = rejects(case.fn, case.data, case.exc)
    assert peak <= budget(case.data), f"allocated {peak} bytes for {len(case.data)} bytes of input"
    if isinstance(e, UnsupportedVersionError):
        assert e.header is not None and e.header.correlation_id == 7, "the header must come with the error"
    if isinstance(e, FrameTooLarge):
        assert e.limit > 0


def test_unsupported_api_versions_keeps_client_id(traced):
    e, _ = rejects(decode_request, header(18, 99, tags=NO_TAGS) + b"\x07future\x02x\x00", UnsupportedVersionError)
    assert (e.header.api_key, e.header.api_version, e.header.client_id) == (18, 99, "golden")


def test_frame_reader_waits_for_whole_frames(traced):
    """Truncation is not an error for the framer: it buffers, a byte at a time. A frame larger than the
    scratch buffer gets its own buffer once the size is known (within the limit), sized by what has
    arrived, not by what was announced: it grows as the bytes come, up to the announced size."""
    frame = header(3, 1) + i32(-1)
    wire = i32(len(frame)) + frame
    r = FrameReader(1 << 20)
    got = []
    for b in wire:
        got += r.feed(bytes([b]))
    assert got == [bytearray(frame)] and r.buffered_bytes == 0
    r = FrameReader(1 << 20)
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    assert r.feed(i32(1 << 20)) == [] and r.buffered_bytes == 0
    peak = tracemalloc.get_traced_memory()[1] - base
    assert peak <= r.initial_frame_bytes + 64 * 1024 < (1 << 20)
    assert r.feed(b"x" * 100) == [] and r.buffered_bytes == 100
    [whole] = r.feed(b"y" * ((1 << 20) - 100))
    assert len(whole) == 1 << 20 and whole[:101] == b"x" * 100 + b"y"


@pytest.mark.parametrize("name,frame", GOLDEN, ids=[n for n, _ in GOLDEN])
def test_every_prefix_of_a_real_frame_is_rejected(name, frame, traced):
    decode_request(frame)
    for n in range(len(frame)):
        _, peak = rejects(decode_request, frame[:n])
        assert peak <= budget(frame[:n]), f"prefix of {n} bytes allocated {peak}"


@pytest.mark.parametrize("name,frame", GOLDEN, ids=[n for n, _ in GOLDEN])
def test_trailing_bytes_are_ignored_and_counted(name, frame):
    """Kafka ignores bytes after a body (docs/compat-notes.md: librdkafka's Metadata v9+ for all topics)."""
    header_, body = decode_request(frame + b"\x00\x01\x02")
    assert header_.trailing_bytes == 3 and body == decode_request(frame)[1]


def test_every_prefix_of_a_record_set_is_rejected(traced):
    for data in (v2_batch(), v2_batch(compression=ZSTD), legacy_set(0), legacy_set(1, SNAPPY),
                 v2_batch() + legacy_set(1)):
        consume(iter_records(data))
        boundaries = {0}
        for entry in iter_batches(data):
            boundaries.add(entry.pos + entry.size)  # a record set cut between entries is still valid
        for n in range(1, len(data)):
            if n not in boundaries:
                rejects(v2_records, data[:n])


def test_table_size():
    """The issue asks for a table; keep it from shrinking unnoticed."""
    assert len(CASES) >= 90


# =========================================================================================== fuzz

GOLDEN_ALL = [p.read_bytes() for p in sorted(GOLDEN_DIR.glob("*/*.bin"))]
assert GOLDEN_ALL, f"no golden frames under {GOLDEN_DIR.name}/: they are committed with the tests"
# ODRADEK_FUZZ_EXAMPLES=20000 python -m pytest tests/protocol/test_malformed.py -k fuzz  to dig deeper.
FUZZ = settings(max_examples=int(os.environ.get("ODRADEK_FUZZ_EXAMPLES", "400")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def decodes_or_rejects(frame: bytes) -> None:
    try:
        header_, body = decode_request(frame)
    except ProtocolError:
        return
    # Whatever decodes re-encodes, and that encoding decodes to the same message.
    again = bytes(encode_request(header_, body))
    header2, body2 = decode_request(again)
    assert body2 == body and header2.trailing_bytes == 0
    header2.trailing_bytes = header_.trailing_bytes
    assert header2 == header_


@FUZZ
@given(st.binary(max_size=600))
def test_fuzz_random_bytes(data):
    decodes_or_rejects(data)


@st.composite
def header_then_noise(draw):
    """A valid header for a random API and version, then random bytes: reaches the body decoders."""
    key = draw(st.sampled_from(sorted(APIS)))
    module = APIS[key]
    version = draw(st.integers(module.MIN_VERSION, module.MAX_VERSION))
    flexible = module.FLEXIBLE_MIN_VERSION is not None and version >= module.FLEXIBLE_MIN_VERSION
    client = draw(st.none() | st.binary(max_size=8).map(lambda b: b.hex().encode()))
    head = header(key, version, client_id=client, tags=NO_TAGS if flexible else None)
    return head + draw(st.binary(max_size=300))


@FUZZ
@given(header_then_noise())
def test_fuzz_valid_header_random_body(frame):
    decodes_or_rejects(frame)


@st.composite
def mutated(draw, corpus):
    data = bytearray(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "ff-run"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            del data[pos:pos + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[pos:]
        elif kind == "ff-run" and data:
            data[pos:pos + 4] = b"\xff\xff\xff\x7f"
    return bytes(data)


@FUZZ
@given(mutated(GOLDEN_ALL))
def test_fuzz_mutated_golden_frames(frame):
    decodes_or_rejects(frame)


def frames_of(wire: bytes, limit: int) -> tuple[list[bytes], bool]:
    """The reference: the whole frames at the front of `wire`, and whether a size outside [0, limit]
    stops them."""
    frames, pos = [], 0
    while len(wire) - pos >= 4:
        size = struct.unpack_from(">i", wire, pos)[0]
        if not 0 <= size <= limit:
            return frames, True
        if len(wire) - pos - 4 < size:
            break
        frames.append(wire[pos + 4:pos + 4 + size])
        pos += 4 + size
    return frames, False


def read_pieces(limit: int, pieces: list[bytes]) -> None:
    """Feed the pieces to a FrameReader; what it returns (and whether it refuses) must match the
    reference."""
    r = FrameReader(limit)
    wire = b"".join(pieces)
    expected, too_large = frames_of(wire, limit)
    got: list[bytes] = []
    try:
        for piece in pieces:
            got += [bytes(f) for f in r.feed(piece)]
    except FrameTooLarge as e:
        assert too_large and not 0 <= e.size <= limit
        assert got == expected[:len(got)]
        return
    assert not too_large and got == expected
    if sum(4 + len(f) for f in expected) == len(wire):
        assert r.buffered_bytes == 0


@st.composite
def framed_streams(draw):
    """Frames of random sizes (some past the 16 KiB scratch buffer) back to back, then a few random
    bytes, cut into random pieces, with a random limit."""
    payloads = draw(st.lists(st.one_of(st.binary(max_size=64), st.integers(16_000, 40_000).map(bytes)),
                             max_size=6))
    wire = b"".join(i32(len(p)) + p for p in payloads) + draw(st.binary(max_size=8))
    cuts = sorted(draw(st.lists(st.integers(0, len(wire)), max_size=12)))
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)])]
    return draw(st.sampled_from([64, 20_000, 1 << 20])), pieces


@FUZZ
@given(framed_streams())
def test_fuzz_frame_reader_any_split(case):
    read_pieces(*case)


@FUZZ
@given(st.binary(max_size=600), st.sampled_from([0, 4, 100, 1 << 16]), st.integers(1, 64))
def test_fuzz_frame_reader_random_bytes(data, limit, piece):
    read_pieces(limit, [data[i:i + piece] for i in range(0, len(data), piece)])


RECORD_CORPUS = [v2_batch(), v2_batch(compression=GZIP), v2_batch(compression=SNAPPY), v2_batch(compression=LZ4),
                 v2_batch(compression=ZSTD), legacy_set(0), legacy_set(1), legacy_set(1, GZIP),
                 legacy_set(0, SNAPPY), legacy_set(1, LZ4), v2_batch() + legacy_set(1)]


@FUZZ
@given(mutated(RECORD_CORPUS), st.booleans())
def test_fuzz_mutated_record_sets(data, check_crc):
    try:
        consume(iter_records(data, check_crc=check_crc, max_uncompressed_bytes=1 << 20))
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from([GZIP, SNAPPY, LZ4, ZSTD]), st.binary(max_size=200) | mutated(
    [codecs.compress(c, b"abc" * 50) for c in (GZIP, SNAPPY, LZ4, ZSTD)]))
def test_fuzz_decompress(codec, data):
    try:
        out = codecs.decompress(codec, data, max_bytes=1 << 16)
    except ProtocolError:
        return
    assert len(out) <= 1 << 16
