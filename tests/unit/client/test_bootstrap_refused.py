"""Bootstrap against addresses where nothing listens: the client retries until its timeout, as Kafka's
clients do (a broker may be starting), unless `bootstrap.refused.fail.fast` is set, as the command-line
tools set it to say "connection refused" at once."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from odradek.client.cluster import Cluster
from odradek.client.config import producer_config
from odradek.client.errors import KafkaTimeoutError


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _bootstrap(fail_fast: bool, timeout_ms: int) -> tuple[float, str]:
    conf = producer_config({"bootstrap.servers": f"127.0.0.1:{_closed_port()}",
                            "bootstrap.refused.fail.fast": fail_fast, "reconnect.backoff.ms": 20})
    cluster = Cluster(conf)
    t0 = time.monotonic()
    try:
        with pytest.raises(KafkaTimeoutError) as e:
            await cluster.start(timeout_ms)
    finally:
        await cluster.aclose()
    return time.monotonic() - t0, str(e.value)


def test_a_refused_bootstrap_is_retried_until_the_timeout_by_default():
    waited, text = asyncio.run(_bootstrap(False, 1500))
    assert waited >= 1.4, f"gave up after {waited:.2f}s, before its 1.5 s timeout"
    assert "could not bootstrap" in text


def test_a_refused_bootstrap_fails_at_once_when_asked():
    waited, text = asyncio.run(_bootstrap(True, 30_000))
    assert "refused" in text
    assert waited < 10, f"waited {waited:.2f}s of its 30 s timeout"
