"""What `odradek serve` logs. The request log (Kafka's kafka.request.logger): `--logger
odradek.requests.completed.<Api>=DEBUG` logs every completed request of that API, and only of that API.
At start-up, how many objects it froze out of the garbage collector's full passes."""

from __future__ import annotations

import re
import subprocess
import time

from confluent_kafka.admin import AdminClient

from .clients import wait_until
from .conftest import odradek_command

BROKER_LOGGERS = {"odradek.requests.completed.Metadata": "DEBUG"}


def test_only_the_chosen_api_is_logged(broker):
    mark = broker.log_size()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "client.id": "request-log-test"})
    assert admin.list_topics(timeout=10).brokers
    pattern = re.compile(r"DEBUG odradek\.requests\.completed\.Metadata: Completed request Metadata v(\d+) "
                         r"correlation \d+ from client 'request-log-test' at 127\.0\.0\.1:\d+ in [\d.]+ ms: answered")
    deadline = time.monotonic() + 10
    while not pattern.search(broker.log_text(mark)):
        assert time.monotonic() < deadline, broker.log_text(mark)[-3000:]
        time.sleep(0.1)
    text = broker.log_text(mark)
    assert "Completed request ApiVersions" not in text   # librdkafka's first request, not chosen


def test_a_malformed_logger_option_is_refused():
    r = subprocess.run([*odradek_command(), "serve", "--logger", "odradek.requests.completed"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "expected NAME=LEVEL" in r.stderr


def test_start_up_objects_are_frozen_once_the_broker_listens(broker):
    pattern = re.compile(r"froze (\d+) start-up objects out of the garbage collector's full passes")
    found = wait_until(lambda: pattern.search(broker.log_text(0)), 10, "the start-up freeze in the broker's log")
    assert int(found.group(1)) > 10_000   # the modules and the broker's structures, not a handful
