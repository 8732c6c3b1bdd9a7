"""The decode budget's rule (protocol/codec.py, `decode_allowance`): a frame of n bytes may decode to
DECODE_SLACK_BYTES + DECODE_MULTIPLE * n bytes of estimated objects. Legal requests naming a few hundred
thousand items are admitted (Kafka answers them item by item); a million empty names, two bytes each on
the wire, are refused before the objects exist; and the estimate is never below what decoding really
allocates, so the allowance bounds the broker's memory."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from odradek.protocol import codec
from odradek.protocol.api import api, decode_request, encode_request, is_flexible
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.headers import RequestHeader, decode_request_header, request_header_version
from odradek.protocol.messages import add_partitions_to_txn as ap
from odradek.protocol.messages import list_offsets as lo
from odradek.protocol.messages import metadata as m
from odradek.protocol.messages import offset_fetch as of


def frame(api_key: int, version: int, body) -> bytes:
    return bytes(encode_request(RequestHeader(api_key, version, 1, "budget"), body))


def metadata(version: int, names) -> bytes:
    return frame(3, version, m.MetadataRequest(topics=[m.MetadataRequestTopic(name=n) for n in names],
                                               allow_auto_topic_creation=False))


def add_partitions_v3(partitions: int) -> bytes:
    return frame(24, 3, ap.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="t", v3_and_below_producer_id=1,
        v3_and_below_topics=[ap.AddPartitionsToTxnTopic(name="topic", partitions=list(range(partitions)))]))


def add_partitions_v4(txns: int, partitions: int) -> bytes:
    return frame(24, 4, ap.AddPartitionsToTxnRequest(transactions=[
        ap.AddPartitionsToTxnTransaction(transactional_id=f"t{j}", producer_id=j, topics=[
            ap.AddPartitionsToTxnTopic(name=f"topic-{j}", partitions=list(range(partitions)))])
        for j in range(txns)]))


def list_offsets(partitions: int) -> bytes:
    return frame(2, 7, lo.ListOffsetsRequest(replica_id=-1, topics=[lo.ListOffsetsTopic(name="topic", partitions=[
        lo.ListOffsetsPartition(partition_index=i, timestamp=-1) for i in range(partitions)])]))


def offset_fetch(topics: int) -> bytes:
    return frame(9, 7, of.OffsetFetchRequest(group_id="g", topics=[
        of.OffsetFetchRequestTopic(name=f"topic-{i}", partition_indexes=[0, 1, 2]) for i in range(topics)]))


def empty_names_v1(n: int) -> bytes:
    return struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", n) + b"\x00\x00" * n


def test_the_allowance_is_a_constant_factor_plus_a_constant():
    assert codec.decode_allowance(0) == codec.DECODE_SLACK_BYTES
    assert codec.decode_allowance(10 << 20) == codec.DECODE_SLACK_BYTES + codec.DECODE_MULTIPLE * (10 << 20)
    # With the frame itself a request holds at most 7x its bytes + 56 MiB: inside the abuse suite's
    # bound of 8x the bytes sent + 64 MiB, with room for the answer.
    assert codec.DECODE_MULTIPLE + 1 <= 8 and codec.DECODE_SLACK_BYTES <= 56 << 20


@pytest.mark.parametrize("name,build", [
    ("Metadata v1 naming 400,000 topics t0..t399999", lambda: metadata(1, (f"t{i}" for i in range(400_000)))),
    ("Metadata v12 naming 400,000 topics", lambda: metadata(12, (f"missing-{i:06d}" for i in range(400_000)))),
    ("AddPartitionsToTxn v3 naming 200,000 partitions", lambda: add_partitions_v3(200_000)),
    ("AddPartitionsToTxn v4, 20 transactions of 10,000 partitions", lambda: add_partitions_v4(20, 10_000)),
    ("ListOffsets v7 of 200,000 partitions", lambda: list_offsets(200_000)),
    ("OffsetFetch v7 of 100,000 topics", lambda: offset_fetch(100_000)),
])
def test_large_legal_requests_are_admitted(name, build):
    data = build()
    header, body = decode_request(data)
    assert header.correlation_id == 1 and body is not None, name


@pytest.mark.parametrize("n", [1_000_000, 4_000_000])
def test_a_million_empty_names_are_refused_before_they_are_decoded(n):
    data = empty_names_v1(n)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="would decode to more than|exceeds the limit"):
            decode_request(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"allocated {peak} bytes before refusing"


def charged_and_allocated(data: bytes) -> tuple[int, int]:
    """(what the budget charged, what tracemalloc saw) for decoding one request's body."""
    view = memoryview(data)
    api_key, version = struct.unpack_from(">hh", data)
    module = api(api_key)
    flexible = is_flexible(module, version)
    _, pos = decode_request_header(view, request_header_version(api_key, version, flexible))
    tracemalloc.start()
    try:
        with codec.decode_budget(len(data)) as left:
            body, _ = module.REQUEST_DECODERS[version](view, pos)
        allocated = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert body is not None
    return codec.decode_allowance(len(data)) - left[0], allocated


@pytest.mark.parametrize("name,build", [
    ("Metadata v1, empty names", lambda: empty_names_v1(20_000)),
    ("Metadata v1, one-letter names", lambda: metadata(1, ("abcdefghij"[i % 10] for i in range(20_000)))),
    ("Metadata v1, short names", lambda: metadata(1, (f"t{i}" for i in range(20_000)))),
    ("Metadata v12, names", lambda: metadata(12, (f"missing-{i:06d}" for i in range(20_000)))),
    ("AddPartitionsToTxn v3", lambda: add_partitions_v3(20_000)),
    ("AddPartitionsToTxn v4", lambda: add_partitions_v4(200, 100)),
    ("ListOffsets v7", lambda: list_offsets(20_000)),
    ("OffsetFetch v7", lambda: offset_fetch(20_000)),
])
def test_the_charge_is_never_below_what_decoding_allocates(name, build):
    charged, allocated = charged_and_allocated(build())
    assert allocated <= charged, f"{name}: charged {charged} bytes, allocated {allocated}"
