"""Log cleaner benchmark: how fast odradek compacts, and what cleaning costs producers.

Three figures, each on real `odradek serve` brokers started by `brokers.py`:

* **cleaner MB/s per core** (per value size): `--records` keyed records over `--keys` keys (one in
  ten a tombstone; fewer records for large values, at most `--log-mb` of log) are produced with
  confluent-kafka to a compacted topic of a broker whose cleaner is off; the broker is stopped and
  its log dir is opened in this process, its active segment rolled, and cleaned pass after pass
  until nothing is dirty. MB = bytes of log recopied (the map phase reads the dirty part once more, not
  counted); per core = divided by this process's CPU seconds over the passes.
* **produce with the cleaner running / without** (ratio): one confluent-kafka producer sends
  `--produce-records` keyed 100-byte records as fast as it can to a compacted topic (1 MiB segments,
  min.cleanable.dirty.ratio 0.1) on a broker whose cleaner runs (backoff 100 ms), on one whose
  cleaner is throttled (`--throttle-mb`), and on one whose cleaner is off; each mode runs `--repeat`
  times, alternating, best run kept. The passes the cleaner made during the runs, and their CPU
  seconds, come from the broker's log. The cleaner is Python and shares the GIL with the event loop,
  so whatever CPU it takes the loop loses; the throttle bounds that share.
* **coordinator start time after N offset commits, cleaner on / off** (`--offset-commits`, 0 to
  skip): 100 groups commit 10 partitions each, OffsetCommit requests written in bulk on one
  connection (kafka-python's protocol classes); the broker (4 offsets partitions of 1 MiB segments)
  is restarted and timed until OffsetFetch answers for every group.

Run from the repository root: `python bench/cleaner_bench.py [--quick]`. JSON goes to
`bench/results/cleaner-<time>.json` (gitignored).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import brokers
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

QUIET = {"log_level": 3}
MIB = 1024 * 1024
_PASS_LINE = re.compile(r"cleaned .* \((\d+\.\d) s CPU\): read (\d+) bytes")


def odradek(name: str, **overrides) -> brokers.Broker:
    cmd = brokers.default_command("odradek") + "".join(
        f" --override {k}={v}" for k, v in overrides.items())
    return brokers.Broker(name, cmd)


def create_compacted(bootstrap: str, topic: str, **configs) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    conf = {"cleanup.policy": "compact", **{k: str(v) for k, v in configs.items()}}
    admin.create_topics([NewTopic(topic, 1, 1, config=conf)])[topic].result(20)


def produce_keyed(bootstrap: str, topic: str, records: int, keys: int, size: int) -> float:
    """Keyed records as fast as one producer goes (every tenth a tombstone); records/s."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000,
                  "queue.buffering.max.messages": 500_000, **QUIET})
    value = os.urandom(size)
    key_bytes = [b"key-%07d" % k for k in range(keys)]
    start = time.perf_counter()
    for i in range(records):
        while True:
            try:
                p.produce(topic, value if i % 10 != 9 else None, key_bytes[i % keys])
                break
            except BufferError:
                p.poll(0.001)
        if i & 0x3FF == 0:
            p.poll(0)
    if p.flush(300):
        raise RuntimeError("records left unacknowledged")
    return records / (time.perf_counter() - start)


# ---- cleaner throughput ---------------------------------------------------------------------------

def cleaner_throughput(records: int, keys: int, size: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from odradek.storage.config import CleanerConfig, LogConfig, LogManagerConfig
    from odradek.storage.manager import LogManager

    broker = odradek("cleaner-off", **{"log.cleaner.enable": "false"})
    broker.start()
    try:
        create_compacted(broker.bootstrap, "bench", **{"segment.bytes": 16 * MIB})
        produce_keyed(broker.bootstrap, "bench", records, keys, size)
        broker.stop(keep_log=True)
        data = broker.workdir / "data"
        config = LogManagerConfig(
            log_dirs=(str(data),),
            log_defaults=LogConfig(segment_bytes=16 * MIB, cleanup_policy=("compact",)),
            cleaner=CleanerConfig(threads=0))
        now_ms = time.time_ns() // 1_000_000
        manager = LogManager.open(config, now_ms=now_ms)
        log = manager.get_log("bench", 0)
        log.roll(now_ms)  # the active segment is never cleaned: make it all cleanable
        log_bytes = log.size_bytes
        cpu, wall = time.process_time(), time.perf_counter()
        passes = cleaned = records_read = 0
        while (result := manager.clean_now(time.time_ns() // 1_000_000)) is not None:
            passes += 1
            cleaned += result.stats.bytes_read - result.stats.map_bytes_read
            records_read += result.stats.records_read
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        left = manager.get_log("bench", 0).size_bytes
        manager.close(time.time_ns() // 1_000_000)
    finally:
        broker.stop()
    return {"value_bytes": size, "records": records, "log_mb": log_bytes / 1e6, "passes": passes,
            "cleaned_mb": cleaned / 1e6, "left_mb": left / 1e6, "cpu_s": cpu, "wall_s": wall,
            "mb_per_s_per_core": cleaned / 1e6 / cpu, "records_per_s_per_core": records_read / cpu}


# ---- produce with and without the cleaner ---------------------------------------------------------

def produce_run(mode: str, records: int, throttle_mb: float) -> dict:
    overrides = {"log.cleaner.backoff.ms": 100} if mode != "off" else {"log.cleaner.enable": "false"}
    if mode == "throttled":
        overrides["log.cleaner.io.max.bytes.per.second"] = int(throttle_mb * 1e6)
    broker = odradek(f"cleaner-{mode}", **overrides)
    broker.start()
    try:
        create_compacted(broker.bootstrap, "bench", **{"segment.bytes": MIB,
                                                       "min.cleanable.dirty.ratio": 0.1})
        cpu = broker.cpu_seconds()
        rate = produce_keyed(broker.bootstrap, "bench", records, 10_000, 100)
        cpu = broker.cpu_seconds() - cpu
        passes = _PASS_LINE.findall(broker.log_path.read_text(errors="replace"))
    finally:
        broker.stop()
    return {"records_per_s": rate, "broker_cpu_s": cpu, "cleaner_passes": len(passes),
            "cleaner_cpu_s": sum(float(c) for c, _ in passes),
            "cleaner_mb_read": sum(int(b) for _, b in passes) / 1e6}


# ---- coordinator start time -----------------------------------------------------------------------

def _frame(request, version: int, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="cleaner-bench")
    return request.encode(version=version, header=True, framed=True)


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise RuntimeError("the broker closed the connection")
        buf += chunk
    return bytes(buf)


def _response(sock: socket.socket, cls, version: int):
    return cls.decode(_read(sock, struct.unpack(">i", _read(sock, 4))[0]), version=version, header=True)


def bulk_commits(bootstrap: str, groups: list[str], rounds: int) -> None:
    from kafka.protocol.consumer.group import OffsetCommitRequest as Req
    from kafka.protocol.consumer.group import OffsetCommitResponse
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, \
        FindCoordinatorResponse

    ids = itertools.count(1)
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(_frame(FindCoordinatorRequest(key=groups[0], key_type=0), 1, next(ids)))
        _response(sock, FindCoordinatorResponse, 1)
        topic, part = Req.OffsetCommitRequestTopic, Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition
        for r in range(rounds):
            sock.sendall(b"".join(_frame(Req(
                group_id=g, generation_id_or_member_epoch=-1, member_id="", topics=[topic(
                    name="events", partitions=[part(partition_index=p, committed_offset=r,
                                                    committed_metadata="") for p in range(10)])]),
                8, next(ids)) for g in groups))
            for _ in groups:
                _response(sock, OffsetCommitResponse, 8)


def offsets_served(bootstrap: str, groups: list[str]) -> bool:
    from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse

    group_cls = OffsetFetchRequest.OffsetFetchRequestGroup
    req = OffsetFetchRequest(groups=[group_cls(group_id=g, topics=[
        group_cls.OffsetFetchRequestTopics(name="events", partition_indexes=list(range(10)))])
        for g in groups], require_stable=False)
    host, port = bootstrap.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(_frame(req, 8, 1))
            r = _response(sock, OffsetFetchResponse, 8)
    except OSError:
        return False
    return all(g.error_code == 0 and g.topics for g in r.groups)


def start_time(cleaner: bool, commits: int) -> dict:
    overrides = {"offsets.topic.num.partitions": 4, "offsets.topic.segment.bytes": MIB,
                 "log.cleaner.backoff.ms": 100}
    if not cleaner:
        overrides["log.cleaner.enable"] = "false"
    broker = odradek("offsets-" + ("on" if cleaner else "off"), **overrides)
    broker.start()
    groups = [f"group-{i:03d}" for i in range(100)]
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        admin.create_topics([NewTopic("events", 10, 1)])["events"].result(20)
        del admin  # its reconnects to the restarting broker would only be noise
        started = time.perf_counter()
        bulk_commits(broker.bootstrap, groups, max(commits // 1000, 1))
        commit_s = time.perf_counter() - started
        time.sleep(5)  # let the cleaner catch up, as it would between restarts
        data = broker.workdir / "data"
        size = sum(f.stat().st_size for d in data.glob("__consumer_offsets-*") for f in d.glob("*.log"))
        best = None
        for _ in range(2):
            os.killpg(broker.proc.pid, 15)
            broker.proc.wait(60)
            t0 = time.perf_counter()
            with open(broker.log_path, "ab") as log:
                broker.proc = subprocess.Popen(broker.proc.args, stdin=subprocess.DEVNULL, stdout=log,
                                               stderr=subprocess.STDOUT, cwd=broker.workdir,
                                               start_new_session=True)
            deadline = time.monotonic() + 300
            while not offsets_served(broker.bootstrap, groups):
                if time.monotonic() > deadline:
                    raise RuntimeError("offsets never served after the restart")
                time.sleep(0.01)
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
    finally:
        broker.stop()
    return {"offset_commits": max(commits // 1000, 1) * 1000, "commit_s": commit_s,
            "offsets_log_mb": size / 1e6, "start_s": best}


# ---- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000,
                    help="records per cleaner run (fewer for large values: at most --log-mb of log)")
    ap.add_argument("--log-mb", type=float, default=300.0)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--sizes", default="100,1024", help="value sizes for the cleaner runs")
    ap.add_argument("--produce-records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2, help="produce runs per mode (best kept)")
    ap.add_argument("--throttle-mb", type=float, default=10.0,
                    help="log.cleaner.io.max.bytes.per.second (MB/s) of the throttled produce mode "
                         "(0: no such mode)")
    ap.add_argument("--offset-commits", type=int, default=1_000_000,
                    help="offset commits before the start-time figure (0: skip)")
    ap.add_argument("--quick", action="store_true", help="small runs: checks the harness only")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.produce_records, args.repeat, args.offset_commits = 100_000, 100_000, 1, 10_000
        args.log_mb = 20.0
    brokers.install_cleanup()
    modes = ("off", "on", "throttled") if args.throttle_mb else ("off", "on")
    results: dict = {"cleaner": [], "produce": {m: [] for m in modes}, "start": {}}
    for size in (int(s) for s in args.sizes.split(",")):
        records = min(args.records, max(10 * args.keys, int(args.log_mb * 1e6 / (size + 30))))
        r = cleaner_throughput(records, args.keys, size)
        results["cleaner"].append(r)
        print(f"cleaner, {size} B values: {r['cleaned_mb']:.1f} MB cleaned in {r['passes']} passes, "
              f"{r['cpu_s']:.2f} s CPU: {r['mb_per_s_per_core']:.1f} MB/s per core "
              f"({r['records_per_s_per_core']:,.0f} records/s); "
              f"{r['log_mb']:.1f} MB -> {r['left_mb']:.1f} MB")
    for _ in range(args.repeat):
        for mode in modes:
            r = produce_run(mode, args.produce_records, args.throttle_mb)
            results["produce"][mode].append(r)
            print(f"produce, cleaner {mode}: {r['records_per_s']:,.0f} records/s, broker CPU "
                  f"{r['broker_cpu_s']:.1f} s, {r['cleaner_passes']} cleaner passes "
                  f"({r['cleaner_cpu_s']:.1f} s CPU, {r['cleaner_mb_read']:.0f} MB read)")
    best = {m: max(r["records_per_s"] for r in rs) for m, rs in results["produce"].items()}
    results["produce_ratio_on_off"] = best["on"] / best["off"]
    print(f"produce with the cleaner running / without: {results['produce_ratio_on_off']:.2f}")
    if "throttled" in best:
        results["produce_ratio_throttled_off"] = best["throttled"] / best["off"]
        print(f"produce with the cleaner throttled to {args.throttle_mb:g} MB/s / without: "
              f"{results['produce_ratio_throttled_off']:.2f}")
    if args.offset_commits:
        for mode in ("on", "off"):
            r = start_time(mode == "on", args.offset_commits)
            results["start"][mode] = r
            print(f"start after {r['offset_commits']:,} offset commits, cleaner {mode}: "
                  f"{r['start_s']:.2f} s ({r['offsets_log_mb']:.1f} MB of __consumer_offsets)")
    out = args.out or Path(__file__).resolve().parent / "results" / time.strftime(
        "cleaner-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "config": {k: str(v) for k, v in vars(args).items()},
                               "results": results}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
