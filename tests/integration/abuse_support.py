"""Shared pieces of the abuse suites (tests/integration/test_abuse_*.py): an unrelated client that keeps
pinging the broker while an abusive input is sent, the memory bound every abusive input must respect, and
a round trip of well-formed records through confluent-kafka, kafka-python and aiokafka before and after.

The memory bound is the hardening issue's: the broker's RSS may grow by at most
`RSS_MULTIPLE` x the bytes sent + `RSS_SLACK_KB`. Stall figures (the pinger's longest wait) are
reported by `bench/stall_bench.py`, never asserted here: a test asserts that the pinger kept being
answered, which is a functional property.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from .clients import (
    Msg, api_versions_ok, connect, consume_aiokafka, consume_confluent, consume_kafka_python,
    produce_aiokafka, produce_confluent, produce_kafka_python,
)

RSS_MULTIPLE = 8
RSS_SLACK_KB = 64 * 1024


class Pinger(threading.Thread):
    """An unrelated client: ApiVersions every 50 ms on its own connection; records each wait."""

    def __init__(self, host: str, port: int, interval_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.interval_s = host, port, interval_s
        self.stop = threading.Event()
        self.waits: list[float] = []
        self.failures: list[str] = []

    def run(self) -> None:
        sock = connect(self.host, self.port)
        cid = 0
        try:
            while not self.stop.is_set():
                cid += 1
                t0 = time.monotonic()
                if not api_versions_ok(sock, cid, timeout=60.0):
                    self.failures.append(f"ApiVersions {cid} not answered")
                    return
                self.waits.append(time.monotonic() - t0)
                self.stop.wait(self.interval_s)
        finally:
            sock.close()

    @property
    def answered(self) -> int:
        return len(self.waits)


@contextlib.contextmanager
def pinging(broker) -> Iterator[Pinger]:
    """A Pinger running for the duration of the block; it must have been answered throughout."""
    p = Pinger(broker.host, broker.port)
    p.start()
    try:
        yield p
    finally:
        p.stop.set()
        p.join(120)
    assert not p.failures, p.failures
    assert p.answered > 0, "the unrelated client was never answered"


def assert_rss_bounded(broker, rss_before_kb: int, bytes_sent: int, what: str) -> None:
    grown = broker.rss_kb() - rss_before_kb
    limit = RSS_MULTIPLE * bytes_sent // 1024 + RSS_SLACK_KB
    assert grown <= limit, f"{what}: RSS grew by {grown} KiB for {bytes_sent} bytes sent (limit {limit} KiB)"


def three_client_round_trip(bootstrap: str, topic: str, tag: str, n: int = 20) -> list[bytes]:
    """Produce n records with each of confluent-kafka, kafka-python and aiokafka; return the values."""
    values = []
    for name, produce in (("confluent", produce_confluent), ("kafka-python", produce_kafka_python),
                          ("aiokafka", produce_aiokafka)):
        msgs = [Msg(f"{tag}-{name}-{i}".encode(), f"{tag}-{name}-value-{i}".encode(), (), None)
                for i in range(n)]
        produce(bootstrap, topic, msgs)
        values += [m.value for m in msgs]
    return values


def assert_all_read_back(bootstrap: str, topic: str, expected: list[bytes]) -> None:
    """Every expected value is read, in order, by each of the three clients."""
    for name, consume in (("confluent", consume_confluent), ("kafka-python", consume_kafka_python),
                          ("aiokafka", consume_aiokafka)):
        got = [r.value for r in consume(bootstrap, topic, (0,))]
        assert got == expected, f"{name} read {len(got)} records, expected {len(expected)}"


def answered_during(host: str, port: int, action: Callable[[], object]) -> int:
    """Run `action()`, and return how many ApiVersions another connection had answered while it was
    still running (back to back). More than zero means the broker kept serving others meanwhile: a
    request held on the loop would answer them only after the action's own response."""
    sock = connect(host, port)
    running = threading.Event()
    running.set()
    answered = []
    failures = []

    def probe() -> None:
        cid = 0
        while running.is_set():
            cid += 1
            if not api_versions_ok(sock, cid, timeout=60.0):
                failures.append(cid)
                return
            if running.is_set():
                answered.append(cid)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        action()
    finally:
        running.clear()
        prober.join(60)
        sock.close()
    assert not failures, f"ApiVersions {failures} not answered"
    return len(answered)
