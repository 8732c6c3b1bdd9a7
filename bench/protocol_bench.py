"""Protocol micro-benchmarks: the broker's per-request codec cost, without sockets or storage.

    python bench/protocol_bench.py            # about 20 s
    python bench/protocol_bench.py --quick    # a smoke run; the figures are noise

(a) Produce: decode a request carrying one 1 MiB v2 batch (1024 records of 1 KiB, uncompressed) and
    validate the batch as the broker's hot path does (header + CRC-32C: BatchHeader(...).is_valid()),
    at v9 (the first flexible version) and v13 (the newest: topics by id), and v3 for comparison.
    Rows for decode alone and CRC alone show where the time goes. MB/s counts request bytes.
(b) Fetch: encode a response with 100 partitions (10 topics x 10 partitions) at v4, v12 and v18
    (the newest), with each partition's records either 1 KiB of bytes (copied into the frame) or a
    reference object with a `.size` (a file slice, spliced in when sent: only its length is written).
    "encode" is encode_response over ready-made messages; "build+encode" also makes the 100
    PartitionData objects, as a handler does for every response.

Each figure is the best of several timeit repeats (timeit.Timer.autorange picks the loop count).
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import timeit
import uuid

from odradek.protocol.api import decode_request, encode_request, encode_response
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import fetch as fm
from odradek.protocol.messages import produce as pm
from odradek.records import BatchHeader, RecordBatchBuilder

MiB = 1 << 20


def best_time(fn, repeats: int, min_time: float) -> float:
    """Seconds per call: the best of `repeats` runs of an autoranged loop."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    number = max(number, int(number * min_time / 0.2))
    return min(timer.repeat(repeat=repeats, number=number)) / number


# ------------------------------------------------------------------------------------------ produce

def one_mib_batch() -> bytes:
    b = RecordBatchBuilder()
    payload = os.urandom(1024 - 16)
    for i in range(1024):
        b.append(b"key-%06d" % i, payload, timestamp=1_700_000_000_000 + i)
    return b.build()


def produce_frame(version: int, batch: bytes) -> bytearray:
    topic_id = uuid.UUID(int=0x1234)
    body = pm.ProduceRequest(
        transactional_id=None, acks=-1, timeout_ms=30000,
        topic_data=[pm.TopicProduceData(name="bench-topic", topic_id=topic_id, partition_data=[
            pm.PartitionProduceData(index=0, records=batch)])])
    w = encode_request(RequestHeader(0, version, 42, "bench-client"), body)
    return bytearray(bytes(w))  # frames arrive as bytearrays


def produce_rows(repeats: int, min_time: float) -> list[tuple]:
    batch = one_mib_batch()
    assert len(batch) >= MiB - 4096, len(batch)
    rows = []
    for version in (3, 9, 13):
        frame = produce_frame(version, batch)

        def decode_and_validate(frame=frame):
            _, req = decode_request(frame)
            for td in req.topic_data:
                for pd in td.partition_data:
                    if not BatchHeader(pd.records, 0).is_valid():
                        raise AssertionError("bad crc")

        def decode_only(frame=frame):
            decode_request(frame)

        records = decode_request(frame)[1].topic_data[0].partition_data[0].records

        def crc_only(records=records):
            BatchHeader(records, 0).is_valid()

        for label, fn in (("decode + header + CRC", decode_and_validate), ("decode only", decode_only),
                          ("header + CRC only", crc_only)):
            t = best_time(fn, repeats, min_time)
            rows.append((f"Produce v{version}", label, len(frame), t * 1e6, len(frame) / t / 1e6))
    return rows


# ------------------------------------------------------------------------------------------ fetch

class FileSliceRef:
    """Stands in for the broker's RecordSlices: the encoder writes only `size` and keeps a reference."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


TOPICS = [(f"bench-topic-{t}", uuid.UUID(int=t + 1)) for t in range(10)]


def fetch_response(records_for) -> fm.FetchResponse:
    return fm.FetchResponse(throttle_time_ms=0, error_code=0, session_id=12345, responses=[
        fm.FetchableTopicResponse(topic=name, topic_id=topic_id, partitions=[
            fm.PartitionData(partition_index=p, error_code=0, high_watermark=1_000_000 + p,
                             last_stable_offset=1_000_000 + p, log_start_offset=0, aborted_transactions=None,
                             preferred_read_replica=-1, records=records_for(p))
            for p in range(10)])
        for name, topic_id in TOPICS])


def fetch_rows(repeats: int, min_time: float) -> list[tuple]:
    small = os.urandom(1024)
    kinds = (("1 KiB bytes", lambda p: small), ("file-slice ref", lambda p: FileSliceRef(1 << 20)))
    rows = []
    for version in (4, 12, 18):
        for kind, records_for in kinds:
            response = fetch_response(records_for)
            size = encode_response(1, version, 7, response).size()

            def encode(response=response, version=version):
                encode_response(1, version, 7, response).chunks()

            def build_and_encode(records_for=records_for, version=version):
                encode_response(1, version, 7, fetch_response(records_for)).chunks()

            for label, fn in (("encode", encode), ("build+encode", build_and_encode)):
                t = best_time(fn, repeats, min_time)
                rows.append((f"Fetch v{version}", f"{label}, {kind}", size, t * 1e6, None))
    return rows


# ------------------------------------------------------------------------------------------ main

def print_table(title: str, rows: list[tuple]) -> None:
    print(f"\n{title}")
    print(f"  {'message':<12} {'case':<32} {'bytes':>10} {'us/op':>10} {'MB/s':>9}")
    for name, case, size, us, mbs in rows:
        mb = f"{mbs:9.0f}" if mbs is not None else f"{'':>9}"
        print(f"  {name:<12} {case:<32} {size:>10,} {us:10.1f} {mb}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short repeat per figure")
    args = ap.parse_args(argv)
    repeats, min_time = (1, 0.05) if args.quick else (7, 0.4)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs,"
          f" load {load:.1f}; best of {repeats}")
    print_table("(a) Produce request with one 1 MiB v2 batch", produce_rows(repeats, min_time))
    print_table("(b) Fetch response, 100 partitions (10 topics x 10)", fetch_rows(repeats, min_time))
    return 0


if __name__ == "__main__":
    sys.exit(main())
