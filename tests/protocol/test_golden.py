"""Golden bytes: request frames captured from real clients (tests/protocol/capture.py) decode, and encode
back to the identical bytes; every Produce request carries exactly the records the client was asked
to send (CRCs checked, codecs undone by odradek.records).

The frames are files under golden/<client>/; the clients are not needed here. To refresh them, run
`python -m tests.protocol.capture` (see its docstring).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from odradek.protocol.api import decode_request, encode_request
from odradek.records import BatchHeader, LegacyBatch, iter_batches, iter_records

GOLDEN_DIR = Path(__file__).parent / "golden"
INDEXES = {p.parent.name: json.loads(p.read_text()) for p in sorted(GOLDEN_DIR.glob("*/index.json"))}
FRAMES = [(client, entry) for client, index in INDEXES.items() for entry in index["frames"]]
# The clients whose bytes the golden set must hold (DESIGN, "Tests").
REQUIRED_CLIENTS = {"confluent-kafka", "kafka-python", "aiokafka", "kcat"}
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _frame(client: str, entry: dict) -> bytes:
    return (GOLDEN_DIR / client / entry["file"]).read_bytes()


def _first_difference(a: bytes, b: bytes) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (f"first difference at byte {n} of {len(a)} (re-encoded {len(b)}): "
            f"captured {a[n:n + 16].hex()} re-encoded {b[n:n + 16].hex()}")


def test_every_client_is_captured():
    assert REQUIRED_CLIENTS <= set(INDEXES), f"golden set lacks {REQUIRED_CLIENTS - set(INDEXES)}"
    for client in REQUIRED_CLIENTS:
        apis = {e["api_key"] for e in INDEXES[client]["frames"]}
        assert {0, 1, 3} <= apis, f"{client}: no Produce, Fetch or Metadata frame captured"
        labels = {spec["label"] for spec in INDEXES[client]["produced"].values()}
        assert set(CODEC_IDS) <= labels, f"{client}: codecs {set(CODEC_IDS) - labels} not captured"


def _librdkafka_all_topics(client, header, body, frame):
    """librdkafka (2.x, Metadata v9+) asking for all topics writes its topic count as a 4-byte
    placeholder and never rewrites it as a varint (rdkafka_request.c, rd_kafka_MetadataRequest0:
    "v9+: keep 0, varint encoded null"). The first zero reads as a null array; the next three zeros are
    read as AllowAutoTopicCreation, IncludeTopicAuthorizedOperations and the tag count, and the three
    bytes librdkafka meant for those (01 00 00) are left over. Apache Kafka reads it the same way."""
    return (client.startswith("confluent-kafka") and header.api_key == 3 and header.api_version >= 9
            and body.topics is None and frame[-7:] == b"\x00\x00\x00\x00\x01\x00\x00")


# Clients' known quirks that leave bytes after the body: (test, number of bytes).
KNOWN_TRAILING = [(_librdkafka_all_topics, 3)]


@pytest.mark.parametrize("client,entry", FRAMES, ids=[f"{c}/{e['file']}" for c, e in FRAMES])
def test_decode_encode_identical(client, entry):
    frame = _frame(client, entry)
    header, body = decode_request(frame)
    assert (header.api_key, header.api_version) == (entry["api_key"], entry["version"])
    if header.trailing_bytes:
        # A body that stops short is a field our schema lacks, unless it is a known client quirk.
        assert any(n == header.trailing_bytes and known(client, header, body, frame)
                   for known, n in KNOWN_TRAILING), (
            f"{header.trailing_bytes} bytes after the body: {frame[-header.trailing_bytes:].hex()}")
        frame = frame[:len(frame) - header.trailing_bytes]
    again = bytes(encode_request(header, body))
    assert again == frame, _first_difference(frame, again)


def _produced(client: str) -> dict[str, list]:
    """Records per topic, in capture order, from every Produce frame of a client."""
    out: dict[str, list] = {}
    for entry in INDEXES[client]["frames"]:
        if entry["api_key"] != 0:
            continue
        _, body = decode_request(_frame(client, entry))
        for td in body.topic_data:
            for pd in td.partition_data:
                for batch in iter_batches(pd.records):
                    if isinstance(batch, LegacyBatch):
                        assert batch.is_valid(), f"{entry['file']}: legacy message CRC mismatch"
                    else:
                        assert BatchHeader(batch.buf, batch.pos).is_valid(), f"{entry['file']}: batch CRC"
                out.setdefault(td.name, []).extend(
                    [r.key, r.value, [list(h) for h in r.headers]] for r in iter_records(pd.records))
    return out


@pytest.mark.parametrize("client", sorted(INDEXES))
def test_produce_records_are_what_the_client_sent(client):
    expected = {
        topic: [[k.encode("latin-1"), v.encode("latin-1"), [[hk, hv.encode("latin-1")] for hk, hv in hs]]
                for k, v, hs in spec["records"]]
        for topic, spec in INDEXES[client]["produced"].items()
    }
    got = _produced(client)
    assert sorted(got) == sorted(expected), "Produce frames and the produced topics disagree"
    for topic, records in expected.items():
        assert got[topic] == records, topic


def _magic(client: str) -> int:
    """The message format a client writes: pinned to 0.9 -> 0, to 0.10 -> 1, else v2 batches."""
    return 0 if client.endswith("-0.9") else 1 if client.endswith("-0.10") else 2


@pytest.mark.parametrize("client", sorted(INDEXES))
def test_produce_codecs_are_what_the_client_was_asked_for(client):
    """Each topic named after a codec holds batches compressed with it, in the client's format. A batch
    may also go uncompressed: librdkafka sends one that way when compressing does not shrink it (its
    first zstd batch, one record, is sent plain)."""
    batches: dict[str, list] = {}
    for entry in INDEXES[client]["frames"]:
        if entry["api_key"] == 0:
            _, body = decode_request(_frame(client, entry))
            for td in body.topic_data:
                for pd in td.partition_data:
                    batches.setdefault(td.name, []).extend(
                        (2 if not isinstance(b, LegacyBatch) else b.magic, b.compression)
                        for b in iter_batches(pd.records))
    for topic, spec in INDEXES[client]["produced"].items():
        codec = CODEC_IDS.get(spec["label"])
        if codec is not None:
            assert (_magic(client), codec) in batches[topic], topic
            assert set(batches[topic]) <= {(_magic(client), codec), (_magic(client), 0)}, topic
