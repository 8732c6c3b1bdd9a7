"""An idempotent producer whose connection is cut again and again mid-request (seed 003, "Message
Delivery Semantics": the broker deduplicates a producer's retries). The producer reaches the broker only
through a fault-injecting TCP proxy (the broker advertises the proxy), which drops every connection
every 200 ms (once something was acknowledged since the last cut): requests whose responses were lost
are sent again, and the log must still hold each record exactly once, in order, with no gap."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from odradek.cluster.local_zookeeper import free_port
from tests.cluster.tcp_proxy import TcpProxy

RECORDS = 20_000


def test_an_idempotent_producer_through_a_connection_that_keeps_dropping_writes_each_record_once(broker_factory):
    port = free_port()
    proxy = TcpProxy(port)
    try:
        b = broker_factory(listeners=f"PLAINTEXT://127.0.0.1:{port}",
                           advertised_listeners=f"PLAINTEXT://127.0.0.1:{proxy.port}")
        through = f"127.0.0.1:{proxy.port}"
        stop = threading.Event()
        cuts = 0
        acked: list[int] = []
        failed: list[str] = []

        def cutter() -> None:
            # A cut every 200 ms, once something was acknowledged since the last one: requests in flight
            # lose their responses again and again, yet a slow machine still makes progress.
            nonlocal cuts
            seen = 0
            while not stop.wait(0.2):
                if len(acked) > seen:
                    seen = len(acked)
                    proxy.cut()
                    proxy.heal()
                    cuts += 1
        t = threading.Thread(target=cutter, daemon=True)
        t.start()
        p = Producer({"bootstrap.servers": through, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                      "message.timeout.ms": 120000, "batch.num.messages": 200})
        try:
            for i in range(RECORDS):
                while True:
                    try:
                        p.produce("dropped", str(i).encode(), on_delivery=lambda err, msg: (
                            acked.append(int(msg.value())) if err is None else failed.append(str(err))))
                        break
                    except BufferError:
                        p.poll(0.05)
                p.poll(0)
            assert p.flush(120) == 0
        finally:
            stop.set()
            t.join(5)
        assert not failed, failed[:5]
        assert cuts >= 3, "the connection was not cut while producing"
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "check", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest"})
        try:
            c.assign([TopicPartition("dropped", 0, 0)])
            read: list[int] = []
            deadline = time.monotonic() + 60
            while len(read) < RECORDS and time.monotonic() < deadline:
                read.extend(int(m.value()) for m in c.consume(1000, 1.0) if not m.error())
            read.extend(int(m.value()) for m in c.consume(1000, 1.0) if not m.error())   # anything extra
        finally:
            c.close()
        assert read == list(range(RECORDS)), (len(read), len(set(read)), [v for v in read[:5]])
        assert sorted(acked) == list(range(RECORDS))
    finally:
        proxy.close()
