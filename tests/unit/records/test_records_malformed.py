"""Malformed input: every case raises ProtocolError and nothing else, and bombs stay within their cap.

Batches here are assembled by hand (struct, crc32c, zlib), not by our builder, so a field can be
given any value; `fixed` recomputes the CRC where a case must get past the CRC check to the parser.
"""

import struct
import tracemalloc
import zlib

import cramjam
import pytest
import zstandard
from crc32c import crc32c

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs, iter_batches, iter_records, legacy_to_v2, v2_to_legacy
from odradek.records.batch import RecordBatch
from odradek.records.control import EndTransactionMarker, parse_control_key
from odradek.records.varint import encode_varint, encode_varlong

INT32_MAX = 2**31 - 1
V2_HEADER = struct.Struct(">qiiBIhiqqqhii")


def v(n):
    return encode_varint(n)


def record(key=b"k", value=b"v", headers=b"\x00", *, length=None, attrs=b"\x00", ts=b"\x00", off=b"\x00"):
    body = attrs + ts + off + (v(-1) if key is None else v(len(key)) + key)
    body += (v(-1) if value is None else v(len(value)) + value) + headers
    return (v(len(body)) if length is None else length) + body


def v2(records_section, count, *, codec=0, batch_length=None, magic=2, crc=None):
    length = 49 + len(records_section) if batch_length is None else batch_length
    head = bytearray(V2_HEADER.pack(0, length, -1, magic, 0, codec, max(count - 1, 0), 0, 0, -1, -1,
                                    -1, count))
    data = head + records_section
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])) if crc is None else crc)
    return bytes(data)


def legacy(key=b"k", value=b"v", *, magic=1, attrs=0, offset=0, key_len=None, value_len=None,
           extra=b"", size=None, crc=None):
    ts = struct.pack(">q", 0) if magic == 1 else b""
    kl = (-1 if key is None else len(key)) if key_len is None else key_len
    vl = (-1 if value is None else len(value)) if value_len is None else value_len
    body = struct.pack(">bb", magic, attrs) + ts + struct.pack(">i", kl) + (key or b"")
    body += struct.pack(">i", vl) + (value or b"") + extra
    checksum = zlib.crc32(body) if crc is None else crc
    n = 4 + len(body) if size is None else size
    return struct.pack(">qiI", offset, n, checksum) + body


def max_offset_batch():
    data = bytearray(v2(record(off=v(5)), 1))
    struct.pack_into(">q", data, 0, 2**63 - 1)  # base offset is outside the CRC
    return bytes(data)


GOOD = v2(record() + record(b"k2", b"v2", off=v(1)), 2)
WRAPPED_INNER = legacy(b"a", b"b") + legacy(b"c", b"d", offset=1)


def consume(data, **kwargs):
    return list(iter_records(data, **kwargs))


def wrapper(inner, codec=codecs.GZIP, magic=1):
    return legacy(None, codecs.compress(codec, inner), attrs=codec, magic=magic)


def lz4_frame(flg=0x60, bd=0x40, blocks=b"\x00\x00\x00\x00", hc=None):
    descriptor = bytes((flg, bd))
    from odradek.records.lz4frame import xxh32
    checksum = (xxh32(descriptor) >> 8) & 0xFF if hc is None else hc
    return b"\x04\x22\x4d\x18" + descriptor + bytes((checksum,)) + blocks


CASES = {
    # v2 framing
    "v2 truncated header": lambda: consume(GOOD[:40]),
    "v2 truncated records": lambda: consume(GOOD[:-1]),
    "v2 batch length below header": lambda: consume(v2(b"", 0, batch_length=10) + b"\x00" * 60),
    "v2 batch length negative": lambda: consume(v2(b"", 0, batch_length=-5) + b"\x00" * 60),
    "v2 batch length past the end": lambda: consume(v2(record(), 1, batch_length=1000)),
    "v2 magic 3": lambda: consume(v2(record(), 1, magic=3)),
    "v2 bad crc": lambda: consume(GOOD[:-1] + b"\x01"),
    "v2 bad crc via batch view": lambda: RecordBatch(GOOD[:-1] + b"\x01").ensure_valid(),
    # v2 counts and record lengths
    "records_count INT32_MAX": lambda: consume(v2(record(), INT32_MAX)),
    "records_count negative": lambda: consume(v2(record(), -1)),
    "records_count above records": lambda: consume(v2(record() * 2, 3)),
    "records_count below records": lambda: consume(v2(record() * 2, 1)),
    "record length negative": lambda: consume(v2(record(length=v(-3)), 1)),
    "record length past the end": lambda: consume(v2(record(length=v(200)), 1)),
    "record length short of its fields": lambda: consume(v2(record(length=v(6)) + b"\x00" * 8, 2)),
    "record length beyond its fields": lambda: consume(v2(record(headers=b"\x00\x00", length=v(9)), 1)),
    "key length -2": lambda: consume(v2(v(8) + b"\x00\x00\x00" + v(-2) + b"\x02v\x00\x00", 1)),
    "key length past the record": lambda: consume(v2(v(7) + b"\x00\x00\x00" + v(50) + b"k\x00\x00", 1)),
    "value length past the record": lambda: consume(v2(v(7) + b"\x00\x00\x00\x00" + v(40) + b"\x00\x00", 1)),
    "headers count negative": lambda: consume(v2(record(headers=v(-1)), 1)),
    "headers count INT32_MAX": lambda: consume(v2(record(headers=v(INT32_MAX)), 1)),
    "header key null": lambda: consume(v2(record(headers=v(1) + v(-1) + v(-1)), 1)),
    "header value length -3": lambda: consume(v2(record(headers=v(1) + v(1) + b"h" + v(-3)), 1)),
    "header value past the record": lambda: consume(v2(record(headers=v(1) + v(1) + b"h" + v(9)), 1)),
    # varints
    "overlong varint record length": lambda: consume(v2(b"\x80" * 6 + b"\x00" * 10, 1)),
    "overlong varint offset delta": lambda: consume(v2(record(off=b"\xff" * 5 + b"\x01"), 1)),
    "varint wider than 32 bits": lambda: consume(v2(record(off=b"\xff\xff\xff\xff\x7f"), 1)),
    "overlong varlong timestamp delta": lambda: consume(v2(record(ts=b"\x81" * 10 + b"\x01"), 1)),
    "truncated varint in a record": lambda: consume(v2(record(headers=b"\x80"), 1)),
    # v2 compression
    "unknown codec 5": lambda: consume(v2(record(), 1, codec=5)),
    "corrupt gzip section": lambda: consume(v2(b"\x1f\x8b" + b"\x00" * 30, 1, codec=1)),
    "corrupt snappy section": lambda: consume(v2(b"\xff\xff\xff\xff\xff", 1, codec=2)),
    "corrupt lz4 section": lambda: consume(v2(b"not an lz4 frame", 1, codec=3)),
    "corrupt zstd section": lambda: consume(v2(b"\x28\xb5\x2f\xfd" + b"\xff" * 20, 1, codec=4)),
    "zstd section garbage body": lambda: consume(v2(b"\x28\xb5\x2f\xfd\x00\x58" + b"\xff" * 20, 1, codec=4)),
    "compressed garbage records": lambda: consume(v2(codecs.compress(4, b"\xff" * 50), 1, codec=4)),
    # legacy framing
    "legacy truncated": lambda: consume(legacy()[:-1]),
    "legacy size below minimum": lambda: consume(legacy(size=5)),
    "legacy size negative": lambda: consume(legacy(size=-7)),
    "legacy magic 3": lambda: consume(legacy(magic=3)),
    "legacy bad crc": lambda: consume(legacy(crc=12345)),
    "legacy key length -2": lambda: consume(legacy(key_len=-2)),
    "legacy key length past the end": lambda: consume(legacy(key_len=1000)),
    "legacy value length past the end": lambda: consume(legacy(value_len=1000)),
    "legacy stray bytes after value": lambda: consume(legacy(extra=b"\x00")),
    "legacy wrapper null value": lambda: consume(legacy(None, None, attrs=1)),
    "legacy wrapper zstd": lambda: consume(wrapper(WRAPPED_INNER, codec=4)),
    "legacy wrapper empty": lambda: consume(wrapper(b"")),
    "legacy wrapper nested": lambda: consume(wrapper(wrapper(WRAPPED_INNER))),
    "legacy inner magic differs": lambda: consume(wrapper(legacy(magic=0))),
    "legacy inner truncated": lambda: consume(wrapper(WRAPPED_INNER[:-3])),
    "legacy inner bad crc": lambda: consume(wrapper(legacy(crc=1))),
    "legacy wrapper corrupt gzip": lambda: consume(legacy(None, b"\x1f\x8b\x08" + b"\x00" * 20, attrs=1)),
    "legacy wrapper corrupt snappy": lambda: consume(legacy(None, b"\x82SNAPPY\x00" + b"\x00" * 8 + b"\xff" * 6, attrs=2)),
    "up-convert bad input": lambda: legacy_to_v2(legacy(crc=1)),
    "up-convert offsets that do not increase": lambda: legacy_to_v2(
        wrapper(legacy(b"a", b"b", offset=5) + legacy(b"c", b"d", offset=5))),
    "up-convert offsets too far apart": lambda: legacy_to_v2(
        wrapper(legacy(b"a", b"b", offset=0) + legacy(b"c", b"d", offset=2**40))),
    "down-convert offsets that do not increase": lambda: v2_to_legacy(
        v2(record() + record(b"k2", b"v2"), 2), 1),
    "down-convert offset past int64": lambda: v2_to_legacy(max_offset_batch(), 1),
    "down-convert bad input": lambda: v2_to_legacy(GOOD[:-1] + b"\x01", 1),
    "record set entry magic 7": lambda: list(iter_batches(GOOD[:16] + b"\x07" + GOOD[17:])),
    # codecs directly
    "gzip truncated": lambda: codecs.decompress(1, codecs.compress(1, b"abc" * 100)[:-4]),
    "gzip trailing garbage": lambda: codecs.decompress(1, codecs.compress(1, b"abc") + b"junk"),
    "xerial header truncated": lambda: codecs.decompress(2, b"\x82SNAPPY\x00\x00\x00"),
    "xerial block length negative": lambda: codecs.decompress(2, codecs.XERIAL_HEADER + struct.pack(">i", -1)),
    "xerial block length past the end": lambda: codecs.decompress(2, codecs.XERIAL_HEADER + struct.pack(">i", 99) + b"ab"),
    "xerial block length truncated": lambda: codecs.decompress(2, codecs.XERIAL_HEADER + b"\x00\x00"),
    "lz4 bad magic": lambda: codecs.decompress(3, b"\x00" * 20),
    "lz4 bad version": lambda: codecs.decompress(3, lz4_frame(flg=0xA0)),
    "lz4 bad header checksum": lambda: codecs.decompress(3, lz4_frame(hc=0)),
    "lz4 dictionary id": lambda: codecs.decompress(3, lz4_frame(flg=0x61)),
    "lz4 reserved bits": lambda: codecs.decompress(3, lz4_frame(bd=0x41)),
    "lz4 bad block maximum": lambda: codecs.decompress(3, lz4_frame(bd=0x10)),
    "lz4 block above its maximum": lambda: codecs.decompress(3, lz4_frame(blocks=struct.pack("<I", 70000) + b"\x00" * 70000)),
    "lz4 block past the end": lambda: codecs.decompress(3, lz4_frame(blocks=struct.pack("<I", 50) + b"ab")),
    "lz4 corrupt block": lambda: codecs.decompress(3, lz4_frame(blocks=struct.pack("<I", 4) + b"\xff" * 4 + b"\x00" * 4)),
    "lz4 missing end mark": lambda: codecs.decompress(3, codecs.compress(3, b"abc")[:-4]),
    "lz4 stray bytes": lambda: codecs.decompress(3, codecs.compress(3, b"abc") + b"x"),
    "lz4 truncated header": lambda: codecs.decompress(3, lz4_frame()[:5]),
    "zstd truncated": lambda: codecs.decompress(4, codecs.compress(4, b"abc" * 1000)[:-3]),
    "zstd not a frame": lambda: codecs.decompress(4, b"\x00\x01"),
    # control records
    "control key null": lambda: parse_control_key(None),
    "control key short": lambda: parse_control_key(b"\x00\x00\x01"),
    "control key version negative": lambda: parse_control_key(b"\xff\xff\x00\x01"),
    "marker value short": lambda: EndTransactionMarker.decode(b"\x00\x00\x00\x01", b"\x00\x00\x00"),
    "marker value null": lambda: EndTransactionMarker.decode(b"\x00\x00\x00\x01", None),
    "marker of another control type": lambda: EndTransactionMarker.decode(b"\x00\x00\x00\x02", b"\x00" * 6),
}


@pytest.mark.parametrize("case", CASES)
def test_malformed_input_raises_protocol_error(case):
    with pytest.raises(ProtocolError):
        CASES[case]()


def test_good_samples_parse():
    assert [r.key for r in consume(GOOD)] == [b"k", b"k2"]
    assert [r.key for r in consume(wrapper(WRAPPED_INNER))] == [b"a", b"c"]
    assert [r.key for r in consume(legacy())] == [b"k"]


@pytest.mark.parametrize("cut", range(1, len(GOOD)))
def test_every_truncation_of_a_batch(cut):
    with pytest.raises(ProtocolError):
        consume(GOOD[:cut])
    assert consume(GOOD + GOOD[:cut], allow_partial_tail=True) == consume(GOOD)


def test_validation_is_header_and_crc_only():
    # garbage records under a correct CRC: validation passes (no per-record work), reading fails
    data = v2(b"\xff" * 1000, 3)
    batch = RecordBatch(data)
    batch.ensure_valid()
    with pytest.raises(ProtocolError):
        list(batch)


# Decompression bombs: 16 MiB of zeros compressed, read with a 1 MiB cap.
CAP = 1 << 20
BOMB_SIZE = 16 << 20


def _zeros_stream(compressor_write):
    chunk = bytes(1 << 20)
    for _ in range(BOMB_SIZE // len(chunk)):
        compressor_write(chunk)


def gzip_bomb():
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = []
    _zeros_stream(lambda b: parts.append(c.compress(b)))
    return b"".join(parts) + c.flush()


def zstd_bomb(with_size):
    if with_size:
        return bytes(cramjam.zstd.compress(bytes(BOMB_SIZE), level=1))
    c = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    parts = []
    _zeros_stream(lambda b: parts.append(c.compress(b)))
    return b"".join(parts) + c.flush()


def snappy_bomb():
    block = bytes(cramjam.snappy.compress_raw(bytes(32 * 1024)))
    count = BOMB_SIZE // (32 * 1024)
    return codecs.XERIAL_HEADER + (struct.pack(">i", len(block)) + block) * count


BOMBS = {
    "gzip": (codecs.GZIP, gzip_bomb),
    "zstd declared size": (codecs.ZSTD, lambda: zstd_bomb(True)),
    "zstd streamed": (codecs.ZSTD, lambda: zstd_bomb(False)),
    "snappy xerial": (codecs.SNAPPY, snappy_bomb),
    "snappy raw": (codecs.SNAPPY, lambda: bytes(cramjam.snappy.compress_raw(bytes(BOMB_SIZE)))),
    "lz4": (codecs.LZ4, lambda: codecs.compress(codecs.LZ4, bytes(BOMB_SIZE))),
}


def _peak_while(fn):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with pytest.raises(ProtocolError, match="limit"):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", BOMBS)
def test_decompression_bomb_is_capped(name):
    codec, make = BOMBS[name]
    bomb = make()
    assert len(bomb) * 8 < BOMB_SIZE
    peak = _peak_while(lambda: codecs.decompress(codec, bomb, max_bytes=CAP))
    assert peak < 3 * CAP + 2 * len(bomb)


@pytest.mark.parametrize("name", ["gzip", "zstd streamed", "lz4"])
def test_bomb_inside_batches_is_capped(name):
    codec, make = BOMBS[name]
    bomb = make()
    batch = v2(bomb, 1, codec=codec)
    peak = _peak_while(lambda: consume(batch, max_uncompressed_bytes=CAP))
    assert peak < 3 * CAP + 2 * len(batch)
    if codec != codecs.ZSTD:
        message = legacy(None, bomb, attrs=codec)
        peak = _peak_while(lambda: consume(message, max_uncompressed_bytes=CAP))
        assert peak < 3 * CAP + 2 * len(message)


def test_huge_counts_allocate_nothing_first():
    data = v2(record(headers=v(INT32_MAX)), INT32_MAX)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            consume(data)
        assert tracemalloc.get_traced_memory()[1] < 64 * 1024
    finally:
        tracemalloc.stop()


def test_varint_helpers_reject_out_of_range():
    with pytest.raises(ValueError):
        encode_varint(2**31)
    with pytest.raises(ValueError):
        encode_varlong(2**63)
