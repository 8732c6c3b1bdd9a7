"""The codecs against other implementations: zlib's gzip, python-snappy and kafka-python's xerial
framing, python-lz4's frames (and kafka-python's KAFKA-3160 variant), zstandard; plus the size caps."""

import gzip
import os

import lz4.frame
import pytest
import snappy
import xxhash
import zstandard
from kafka import codec as kp_codec

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs, lz4frame
from odradek.records.codecs import GZIP, LZ4, NONE, SNAPPY, ZSTD

PAYLOADS = [
    b"",
    b"x",
    os.urandom(100_000),  # incompressible: lz4 stores blocks uncompressed
    (b"the quick brown fox " * 20_000),  # several 64 KiB lz4 blocks and 32 KiB xerial blocks
]
ALL = [NONE, GZIP, SNAPPY, LZ4, ZSTD]


@pytest.mark.parametrize("codec", ALL)
@pytest.mark.parametrize("payload", PAYLOADS, ids=["empty", "one", "random", "text"])
def test_round_trip(codec, payload):
    assert bytes(codecs.decompress(codec, codecs.compress(codec, payload))) == payload


@pytest.mark.parametrize("payload", PAYLOADS[1:], ids=["one", "random", "text"])
def test_other_implementations_read_ours(payload):
    assert gzip.decompress(codecs.compress(GZIP, payload)) == payload
    assert kp_codec.snappy_decode(codecs.compress(SNAPPY, payload)) == payload
    assert lz4.frame.decompress(codecs.compress(LZ4, payload)) == payload
    assert kp_codec.lz4_decode_old_kafka(codecs.compress(LZ4, payload, legacy_lz4=True)) == payload
    assert zstandard.ZstdDecompressor().decompressobj().decompress(codecs.compress(ZSTD, payload)) == payload


@pytest.mark.parametrize("payload", PAYLOADS[1:], ids=["one", "random", "text"])
def test_we_read_other_implementations(payload):
    def ours(codec, data):
        return bytes(codecs.decompress(codec, data))

    assert ours(GZIP, gzip.compress(payload)) == payload
    assert ours(GZIP, gzip.compress(payload[:10]) + gzip.compress(payload[10:])) == payload  # members
    assert ours(SNAPPY, snappy.compress(payload)) == payload  # raw snappy
    assert ours(SNAPPY, kp_codec.snappy_encode(payload, xerial_compatible=True)) == payload
    assert ours(SNAPPY, kp_codec.snappy_encode(payload, xerial_blocksize=1000)) == payload
    for kwargs in ({}, {"content_checksum": True}, {"block_checksum": True},
                   {"block_size": lz4.frame.BLOCKSIZE_MAX4MB, "store_size": False}):
        assert ours(LZ4, lz4.frame.compress(payload, block_linked=False, **kwargs)) == payload
    assert ours(LZ4, kp_codec.lz4_encode(payload)) == payload
    assert ours(LZ4, kp_codec.lz4_encode_old_kafka(payload)) == payload  # KAFKA-3160 checksum
    assert ours(ZSTD, zstandard.ZstdCompressor().compress(payload)) == payload
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    assert codecs.zstd_declared_size(no_size) is None
    assert ours(ZSTD, no_size) == payload


def test_xxh32_matches_xxhash():
    data = os.urandom(64)
    for n in range(len(data)):
        assert lz4frame.xxh32(data[:n]) == xxhash.xxh32(data[:n]).intdigest()
    assert lz4frame.xxh32(b"") == 0x02CC5D05


def test_legacy_lz4_header_checksum_covers_the_magic():
    frame = codecs.compress(LZ4, b"payload", legacy_lz4=True)
    assert frame[6] == (xxhash.xxh32(frame[0:6]).intdigest() >> 8) & 0xFF
    proper = codecs.compress(LZ4, b"payload")
    assert proper[6] == (xxhash.xxh32(proper[4:6]).intdigest() >> 8) & 0xFF
    assert frame[6] != proper[6]


def test_lz4_linked_blocks_are_rejected_as_kafka_does():
    with pytest.raises(ProtocolError, match="linked"):
        codecs.decompress(LZ4, lz4.frame.compress(b"abc" * 100_000, block_linked=True))


def test_snappy_writes_xerial_framing():
    data = codecs.compress(SNAPPY, b"abc" * 20_000)
    assert data[:16] == b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"


CAP = 100_000


def _at_cap_inputs():
    exact = os.urandom(CAP // 2) * 2
    return [
        (GZIP, gzip.compress(exact)),
        (SNAPPY, codecs.compress(SNAPPY, exact)),
        (SNAPPY, snappy.compress(exact)),
        (LZ4, codecs.compress(LZ4, exact)),
        (LZ4, lz4.frame.compress(exact, block_linked=False)),
        (ZSTD, zstandard.ZstdCompressor().compress(exact)),
        (ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(exact)),
    ], exact


@pytest.mark.parametrize("index", range(7))
def test_cap_is_inclusive_and_enforced(index):
    cases, exact = _at_cap_inputs()
    codec, data = cases[index]
    assert bytes(codecs.decompress(codec, data, max_bytes=CAP)) == exact
    with pytest.raises(ProtocolError, match="limit"):
        codecs.decompress(codec, data, max_bytes=CAP - 1)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec(codec):
    with pytest.raises(ProtocolError):
        codecs.decompress(codec, b"anything")


def test_zstd_without_declared_size_grows_its_buffer_up_to_the_cap():
    payload = bytes(3_000_000)  # compresses ~10000:1, far past the first guess of the output size
    data = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    assert codecs.zstd_declared_size(data) is None
    assert bytes(codecs.decompress(ZSTD, data)) == payload
    assert bytes(codecs.decompress(ZSTD, data, max_bytes=len(payload))) == payload
    with pytest.raises(ProtocolError, match="limit"):
        codecs.decompress(ZSTD, data, max_bytes=len(payload) - 1)
