"""Replication on a local 3-broker cluster (`odradek cluster up`'s LocalCluster: ZooKeeper and three
`odradek serve` processes on this machine), measured with confluent-kafka (librdkafka), side by side
in one run:

* produce throughput, acks=all, 1 KiB records, to a topic with replication factor 3 and to one with
  replication factor 1 on the same cluster (fresh topics, alternating, --rounds each, each topic's
  files removed when its round ends: log.segment.delete.delay.ms=0); the ratio
  RF3/RF1 (the issue's target: at least 0.5); then once more each with --sustained-records (3 GB by
  default), long enough for the page cache's growth to cost what it costs in a steady state (on a VM
  whose hypervisor reclaims freed memory, see odradek.storage.page_cache), where a 300 MB round does not;
* end-to-end latency (produce timestamp to the consumer receiving the record) at --rate records/s,
  acks=all, RF 3 next to RF 1, for each --linger-ms of the producer (1 ms sends about a request per
  millisecond, 5 ms fewer and larger ones; target: RF 3 p99 under 10 ms);
* failover, on a topic with RF 3 and min.insync.replicas=2 under a steady idempotent acks=all
  producer: the time from kill -9 of the partition's leader to the first acknowledgement of a record
  sent after the kill, and the longest any record sent from then on waited for its acknowledgement (the
  figure held against the target: under zookeeper.session.timeout.ms + 2 s); the same from SIGTERM of
  the leader (a controlled shutdown; target: under 1 s). Each --failovers times; the broker is
  restarted and back in the ISR before the next round.

Run from the repository root (needs the zookeeper and bench extras, and Debian's zookeeper package):

    python bench/cluster_bench.py [--records 300000] [--rounds 3] [--sustained-records 3000000]
        [--linger-ms 1,5] [--failovers 3] [--quick]

Prints a table with the targets and ratios, and writes JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import workloads
from odradek.cli.local_cluster import LocalCluster

RECORD_SIZE = 1024
_STAMP = struct.Struct(">q")


# ------------------------------------------------------------------------------------------ topics
def metadata(bootstrap: str, topic: str):
    return AdminClient({"bootstrap.servers": bootstrap, **workloads.QUIET}).list_topics(topic=topic, timeout=10)


def in_sync(bootstrap: str, topic: str, replication: int) -> bool:
    try:
        t = metadata(bootstrap, topic).topics.get(topic)
    except Exception:
        return False
    return t is not None and t.error is None and bool(t.partitions) and all(
        p.leader >= 0 and len(p.isrs) == replication for p in t.partitions.values())


def wait_for(what: str, condition, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise workloads.WorkloadError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def create_topic(bootstrap: str, prefix: str, partitions: int, replication: int, config: dict | None = None) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **workloads.QUIET})
    admin.create_topics([NewTopic(name, partitions, replication, config=config or {})],
                        operation_timeout=30)[name].result(60)
    wait_for(f"{name} led and fully in sync", lambda: in_sync(bootstrap, name, replication))
    return name


def leader_of(bootstrap: str, topic: str, partition: int = 0) -> int:
    return metadata(bootstrap, topic).topics[topic].partitions[partition].leader


# ------------------------------------------------------------------------------------------ workloads
def throughput(cluster: LocalCluster, args, replication: int, records: int | None = None) -> dict:
    topic = create_topic(cluster.bootstrap, f"tput-rf{replication}", args.partitions, replication)
    # The rounds before left up to a GB dirty in the page cache: written back now, not by the kernel
    # while this round's clock runs (which made whichever round came next pay for it).
    os.sync()
    try:
        return workloads.produce(cluster.bootstrap, topic, RECORD_SIZE, "all", records or args.records, None)
    finally:
        workloads.delete_topic(cluster.bootstrap, topic)


def latency(cluster: LocalCluster, args, replication: int, linger_ms: int) -> dict:
    os.sync()       # the throughput runs' gigabytes written back first, not during the sampling
    topic = create_topic(cluster.bootstrap, f"lat-rf{replication}", 1, replication)
    try:
        return workloads.latency(cluster.bootstrap, topic, args.latency_size, args.rate, args.latency_duration,
                                 linger_ms=linger_ms)
    finally:
        workloads.delete_topic(cluster.bootstrap, topic)


class SteadyProducer(threading.Thread):
    """An idempotent acks=all producer at a fixed rate; each record carries its send time, and each
    acknowledgement is kept as (send ns, ack ns)."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.topic, self.rate = topic, rate
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "linger.ms": 1, "message.timeout.ms": 120_000,
                                  "log_level": 2})   # the refused connections to a killed leader are expected
        self.acks: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self._pad = os.urandom(100 - _STAMP.size)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acks.append((_STAMP.unpack_from(msg.value())[0], time.monotonic_ns()))

    def run(self) -> None:
        start, sent = time.monotonic(), 0
        while not self.stopping.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while sent < due:
                try:
                    self.producer.produce(self.topic, _STAMP.pack(time.monotonic_ns()) + self._pad,
                                          on_delivery=self._delivered)
                    sent += 1
                except BufferError:
                    break
            self.producer.poll(0.001)

    def first_ack_sent_after(self, t_ns: int) -> int | None:
        return min((ack for sent, ack in list(self.acks) if sent >= t_ns), default=None)

    def longest_wait(self, from_ns: int, to_ns: int) -> float:
        """The longest a record sent in [from_ns, to_ns] waited for its acknowledgement, in s."""
        return max((ack - sent for sent, ack in self.acks if from_ns <= sent <= to_ns), default=0) / 1e9

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        left = self.producer.flush(120)
        if left:
            raise workloads.WorkloadError(f"{left} record(s) unacknowledged after the failovers")


def failover(cluster: LocalCluster, args, how: str) -> dict:
    """`how` is "kill" (kill -9) or "term" (SIGTERM: a controlled shutdown) of the leader.

    Two figures per round: `resumed`, from the signal to the first acknowledgement of a record sent
    after it; and `stall`, the longest a record sent from the signal until a second after the broker
    was gone waited for its acknowledgement (a controlled shutdown can keep acknowledging on the old
    leader while leadership moves, so the first figure alone would hide a pause that follows)."""
    os.sync()
    topic = create_topic(cluster.bootstrap, f"failover-{how}", 1, 3, {"min.insync.replicas": "2"})
    p = SteadyProducer(cluster.bootstrap, topic, args.failover_rate)
    p.start()
    resumed, windows, exits = [], [], []
    try:
        for _ in range(args.failovers):
            before = len(p.acks)
            wait_for("writes acknowledged", lambda: len(p.acks) >= before + args.failover_rate // 2, 60)
            leader = leader_of(cluster.bootstrap, topic)
            broker = cluster.brokers[leader]
            t0 = time.monotonic_ns()
            broker.signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
            rc = broker.wait(60)
            exits.append((time.monotonic_ns() - t0) / 1e9)
            if how == "term" and rc != 0:
                raise workloads.WorkloadError(f"broker {leader} exited with {rc} on SIGTERM")
            wait_for("writes resuming", lambda: p.first_ack_sent_after(t0) is not None, 120)
            resumed.append((p.first_ack_sent_after(t0) - t0) / 1e9)
            windows.append((t0, max(time.monotonic_ns(), p.first_ack_sent_after(t0)) + 1_000_000_000))
            wait_for("the end of the measured window", lambda: time.monotonic_ns() >= windows[-1][1], 10)
            cluster.restart_broker(leader)
            wait_for("the restarted broker back in the ISR", lambda: in_sync(cluster.bootstrap, topic, 3))
    finally:
        p.stop()
        workloads.delete_topic(cluster.bootstrap, topic)
    if p.errors:
        raise workloads.WorkloadError(f"{len(p.errors)} delivery error(s), e.g. {p.errors[0]}")
    stalls = [p.longest_wait(a, b) for a, b in windows]
    return {"resumed_s": resumed, "stall_s": stalls, "median_s": statistics.median(stalls), "max_s": max(stalls),
            "broker_exit_s": exits, "acknowledged": len(p.acks)}


# ------------------------------------------------------------------------------------------ report
def rows(results: dict, args) -> list[tuple[str, str, str, str, str, str]]:
    """(figure, RF 1, RF 3, RF3/RF1, target, met)."""
    out = []
    t1, t3 = results["throughput"]["rf1"], results["throughput"]["rf3"]
    ratio = t3["mb_per_s"] / t1["mb_per_s"]
    out.append(("produce 1 KiB acks=all, MB/s", f"{t1['mb_per_s']:.1f}", f"{t3['mb_per_s']:.1f}", f"{ratio:.2f}",
                "ratio >= 0.5", _met(ratio >= 0.5)))
    out.append(("produce 1 KiB acks=all, rec/s", f"{t1['records_per_s']:,.0f}", f"{t3['records_per_s']:,.0f}",
                f"{t3['records_per_s'] / t1['records_per_s']:.2f}", "", ""))
    if results.get("sustained"):
        s1, s3 = results["sustained"]["rf1"], results["sustained"]["rf3"]
        ratio = s3["mb_per_s"] / s1["mb_per_s"]
        out.append((f"sustained, {s1['mb'] / 1000:.1f} GB each, MB/s", f"{s1['mb_per_s']:.1f}", f"{s3['mb_per_s']:.1f}",
                    f"{ratio:.2f}", "ratio >= 0.5", _met(ratio >= 0.5)))
    for linger in args.linger_ms:
        l1, l3 = results["latency"][f"rf1 linger {linger}"], results["latency"][f"rf3 linger {linger}"]
        for q in ("p50", "p99", "p999"):
            key = f"{q}_ms"
            target = "RF3 < 10 ms" if q == "p99" else ""
            out.append((f"end-to-end {q} @{args.rate}/s linger.ms={linger}, ms", f"{l1[key]:.1f}", f"{l3[key]:.1f}",
                        f"{l3[key] / l1[key]:.2f}", target, _met(l3[key] < 10) if q == "p99" else ""))
    limit = args.session_timeout_ms / 1000 + 2
    k, t = results["failover_kill"], results["failover_term"]
    out.append(("kill -9 leader: longest write wait, s (median/max)", "", f"{k['median_s']:.2f} / {k['max_s']:.2f}",
                f"{k['max_s'] / limit:.2f} of target", f"< {limit:g} s", _met(k["max_s"] < limit)))
    out.append(("SIGTERM leader: longest write wait, s (median/max)", "", f"{t['median_s']:.2f} / {t['max_s']:.2f}",
                f"{t['max_s'] / 1.0:.2f} of target", "< 1 s", _met(t["max_s"] < 1.0)))
    return out


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"


def print_report(table: list[tuple], results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table("figure", "RF 1", "RF 3", "RF3/RF1", "target", "met", title="odradek, 3 brokers on one machine")
    for row in table:
        t.add_row(*row)
    Console(width=160).print(t)
    for name in ("failover_kill", "failover_term"):
        r = results[name]
        print(f"{name}: longest write wait {[round(x, 2) for x in r['stall_s']]} s; first ack of a record sent "
              f"after the signal {[round(x, 2) for x in r['resumed_s']]} s; broker gone after "
              f"{[round(x, 2) for x in r['broker_exit_s']]} s; {r['acknowledged']} records acknowledged")


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300_000, help="records per throughput run (1 KiB each)")
    ap.add_argument("--rounds", type=int, default=3, help="throughput runs per replication factor (median)")
    ap.add_argument("--sustained-records", type=int, default=3_000_000,
                    help="records of the one sustained throughput run per replication factor (0: none)")
    ap.add_argument("--partitions", type=int, default=3, help="partitions of the throughput topics")
    ap.add_argument("--rate", type=int, default=10_000, help="latency workload, records/s")
    ap.add_argument("--latency-size", type=int, default=RECORD_SIZE, help="latency record size, bytes")
    ap.add_argument("--linger-ms", type=lambda t: [int(x) for x in t.split(",")], default=[1, 5],
                    help="the latency producer's linger.ms values, comma-separated (default 1,5)")
    ap.add_argument("--latency-duration", type=float, default=10.0, help="latency sampling time, s")
    ap.add_argument("--failovers", type=int, default=3, help="leader kills and SIGTERMs, each")
    ap.add_argument("--failover-rate", type=int, default=1000, help="records/s during failovers")
    ap.add_argument("--session-timeout-ms", type=int, default=6000, help="zookeeper.session.timeout.ms")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker config for every broker (repeatable)")
    ap.add_argument("--quick", action="store_true", help="20k records, 3 s latency, 1 failover: a smoke run")
    ap.add_argument("--out", help="JSON output (default bench/results/cluster-bench-<time>.json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.rounds, args.latency_duration, args.failovers, args.linger_ms = 20_000, 1, 3.0, 1, [1]
        args.sustained_records = 100_000

    base = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    # Each round deletes its topic. With Kafka's default file.delete.delay.ms (60 s) the deleted rounds'
    # gigabytes stay in the page cache for the rest of the run, so every round started with more memory
    # in use than the one before; on a VM whose hypervisor reclaims freed memory that made each round
    # slower than the last (RF 3 first, as it writes three times the pages), and the median said how
    # many rounds ran. Removed at once, every round starts from the same state. --override replaces it.
    overrides = {"zookeeper.session.timeout.ms": str(args.session_timeout_ms), "log.segment.delete.delay.ms": "0"}
    for item in args.override:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--override expects KEY=VALUE, got {item!r}")
        overrides[key] = value
    cluster = LocalCluster(base, 3, overrides=overrides,
                           progress=lambda text: print(f"  {text}", flush=True))
    results: dict = {"throughput": {}, "sustained": {}, "latency": {}}
    try:
        cluster.start()
        runs: dict[str, list[dict]] = {"rf1": [], "rf3": []}
        for round_ in range(args.rounds):
            for rf in (1, 3):
                print(f"throughput RF {rf}, round {round_ + 1} ...", flush=True)
                runs[f"rf{rf}"].append(throughput(cluster, args, rf))
        for key, rs in runs.items():
            results["throughput"][key] = {
                "mb_per_s": statistics.median(r["mb_per_s"] for r in rs),
                "records_per_s": statistics.median(r["records_per_s"] for r in rs), "runs": rs}
        if args.sustained_records:
            for rf in (1, 3):
                print(f"sustained throughput RF {rf}, {args.sustained_records:,} records ...", flush=True)
                results["sustained"][f"rf{rf}"] = throughput(cluster, args, rf, args.sustained_records)
        for linger in args.linger_ms:
            for rf in (1, 3):
                print(f"latency RF {rf} @{args.rate}/s, linger.ms={linger} ...", flush=True)
                results["latency"][f"rf{rf} linger {linger}"] = latency(cluster, args, rf, linger)
        for how in ("kill", "term"):
            print(f"failover ({'kill -9' if how == 'kill' else 'SIGTERM'} of the leader) x{args.failovers} ...",
                  flush=True)
            results[f"failover_{how}"] = failover(cluster, args, how)
    finally:
        report = cluster.stop()
        if report.ok:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"cluster did not stop cleanly: {report.failed}; logs in {base}", file=sys.stderr)
    table = rows(results, args)
    print_report(table, results)
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / \
        f"cluster-bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "args": vars(args),
                               "broker_overrides": overrides,
                               "results": results, "table": table}, indent=2))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
