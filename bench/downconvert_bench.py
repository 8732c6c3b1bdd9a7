"""Down-conversion cost: the broker's CPU and RSS growth for Fetch v2 requests (magic 1 messages, so the
broker down-converts) of one stored batch of a million small records, zstd and gzip.

For each codec a fresh broker is started, the batch is produced with one raw Produce v7 frame, then N
Fetch v2 requests of about 100 bytes (each on its own connection, sent at once) ask for the batch from
spread offsets. Reported: the answers' sizes, wall time, the broker's CPU-seconds and its peak RSS
growth (sampled every 10 ms) over the fetches.

    python bench/downconvert_bench.py [--fetches 1 12] [--codecs zstd gzip] [--odradek-cmd CMD]
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import Broker, default_command, install_cleanup  # noqa: E402

from crc32c import crc32c  # noqa: E402

from odradek.records import codecs  # noqa: E402
from odradek.records.varint import encode_varint  # noqa: E402

RECORDS = 1_000_000


def million_record_batch(codec: int, n: int = RECORDS) -> bytes:
    """One v2 batch of n records: no key, value b"x", one timestamp, offset deltas 0..n-1."""
    records = b"".join(bytes((2 * (6 + len(d)),)) + b"\x00\x00" + d + b"\x01\x02x\x00"
                       for d in map(encode_varint, range(n)))
    body = codecs.compress(codec, records)
    ts = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", codec, n - 1, ts, ts, -1, -1, -1, n) + body
    return struct.pack(">qiib", 0, 9 + len(after_crc), -1, 2) + struct.pack(">I", crc32c(after_crc)) + after_crc


def frame(api_key: int, version: int, cid: int, body: bytes) -> bytes:
    payload = struct.pack(">hhih", api_key, version, cid, 5) + b"bench" + body
    return struct.pack(">i", len(payload)) + payload


def string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def produce_v7(topic: str, batch: bytes) -> bytes:
    body = struct.pack(">hhi", -1, -1, 60_000) + struct.pack(">i", 1) + string(topic)
    body += struct.pack(">ii", 1, 0) + struct.pack(">i", len(batch)) + batch
    return frame(0, 7, 1, body)


def fetch_v2(cid: int, topic: str, offset: int, max_bytes: int) -> bytes:
    body = struct.pack(">iiii", -1, 0, 1, 1) + string(topic) + struct.pack(">iiqi", 1, 0, offset, max_bytes)
    return frame(1, 2, cid, body)


def recv_frame(sock: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return bytes(buf)
    return exact(struct.unpack(">i", exact(4))[0])


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run(cmd: str, codec_name: str, fetches: int) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    codec = {"zstd": codecs.ZSTD, "gzip": codecs.GZIP, "lz4": codecs.LZ4, "none": codecs.NONE}[codec_name]
    batch = million_record_batch(codec)
    broker = Broker("odradek", cmd + " --override message.max.bytes=16000000")
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 3})
        admin.create_topics([NewTopic("t", 1, 1)])["t"].result(30)
        with socket.create_connection(("127.0.0.1", broker.port)) as s:
            s.sendall(produce_v7("t", batch))
            recv_frame(s)
        assert broker.proc is not None
        pid = broker.proc.pid
        time.sleep(1)
        base = peak = rss_kb(pid)
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, rss_kb(pid))
                stop.wait(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        sizes: list[int] = []

        def one(i: int) -> None:
            with socket.create_connection(("127.0.0.1", broker.port)) as c:
                c.sendall(fetch_v2(i + 1, "t", i * (RECORDS // fetches), 2 * len(batch)))
                sizes.append(len(recv_frame(c)))

        cpu0, t0 = broker.cpu_seconds(), time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(fetches)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        cpu = broker.cpu_seconds() - cpu0
        time.sleep(0.2)
        stop.set()
        watcher.join()
        return {"codec": codec_name, "batch_bytes": len(batch), "fetches": fetches, "answer_bytes": sorted(sizes),
                "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "rss_growth_mib": round((peak - base) / 1024, 1)}
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fetches", type=int, nargs="+", default=[1, 12])
    parser.add_argument("--codecs", nargs="+", default=["zstd", "gzip"])
    parser.add_argument("--odradek-cmd", default=default_command("odradek"))
    args = parser.parse_args()
    install_cleanup()
    for codec in args.codecs:
        for n in args.fetches:
            r = run(args.odradek_cmd, codec, n)
            print(f"{r['codec']:5} batch {r['batch_bytes']:>9} B  {r['fetches']:>2} Fetch v2: answers "
                  f"{r['answer_bytes'][0]}..{r['answer_bytes'][-1]} B  wall {r['wall_s']} s  cpu {r['cpu_s']} s  "
                  f"RSS +{r['rss_growth_mib']} MiB", flush=True)


if __name__ == "__main__":
    main()
