"""`log.drop.behind.bytes` on a running broker (storage/page_cache.py): a confluent-kafka producer writes
a partition well past the kept bytes; the broker drops the written pages before the newest ones from
the page cache (read back with mincore), keeps the newest, and kafka-python then reads every record
back, the dropped part from disk. DescribeConfigs shows the setting."""

from __future__ import annotations

import os

from confluent_kafka.admin import ConfigResource, NewTopic

from tests.page_cache_residency import resident

from .clients import Msg, consume_kafka_python, produce_confluent, segment_files, wait_until

MIB = 1024 * 1024
KEEP = MIB
RECORD = 16 * 1024
BROKER_OVERRIDES = {"log.drop.behind.bytes": str(KEEP)}


def _records(start: int, count: int) -> list[Msg]:
    return [Msg(key=str(i).encode(), value=str(i).encode().ljust(RECORD, b"."), partition=0)
            for i in range(start, start + count)]


def test_written_pages_leave_the_page_cache_and_every_record_reads_back(broker, admin):
    topic = "drop-behind"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=10)
    produce_confluent(broker.bootstrap, topic, _records(0, 6 * 64))         # 6 MiB, dirty in the cache
    (segment,) = segment_files(broker.log_dir, topic, 0)
    written = os.path.getsize(segment)
    assert resident(segment, 0, written) >= written - 4096
    os.sync()                                  # written back: the next drop can take these pages
    produce_confluent(broker.bootstrap, topic, _records(6 * 64, 3 * 64))    # 3 MiB more: a drop is due
    wait_until(lambda: resident(segment, 0, written - 4096) == 0, 20,
               "the broker to drop the first 6 MiB from the page cache")
    size = os.path.getsize(segment)
    assert resident(segment, size - KEEP, size) >= KEEP - 4096               # the newest stay

    back = consume_kafka_python(broker.bootstrap, topic)
    assert [(r.offset, r.key) for r in back] == [(i, str(i).encode()) for i in range(9 * 64)]
    assert all(r.value == str(r.offset).encode().ljust(RECORD, b".") for r in back)

    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    entry = admin.describe_configs([resource])[resource].result(timeout=10)["log.drop.behind.bytes"]
    assert entry.value == str(KEEP)
