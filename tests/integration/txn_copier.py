"""A transactional copier (read-process-write, seed 003 "Message Delivery Semantics": "the consumer's
position is stored as a message in a topic, so we can write the offset to Kafka in the same
transaction as the output topics receiving the processed data"), run as its own process so a test
can kill it with SIGKILL.

    python -m tests.integration.txn_copier BOOTSTRAP INPUT OUTPUT PARTITIONS GROUP TRANSACTIONAL_ID CHUNK PROCESS_MS

It assigns itself every input partition (the group's committed offsets are its starting point),
copies each polled chunk (at most CHUNK records: many small transactions) to OUTPUT with the value prefixed by "copied:", and commits the chunk and
the consumer's next positions in one transaction (send_offsets_to_transaction). PROCESS_MS is the
work each chunk stands for: the copied records are on the broker, uncommitted, for that long before
the commit, as a real job's would be while it does its work. It prints "ready"
once its producer holds the transactional id, and runs until killed.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def main(bootstrap: str, source: str, target: str, partitions: int, group: str, transactional_id: str,
         chunk: int, process_ms: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 10000, "linger.ms": 5})
    producer.init_transactions(60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(source, p) for p in range(partitions)])
    print("ready", flush=True)
    while True:
        msgs = [m for m in consumer.consume(chunk, 0.5) if not m.error()]
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(target, b"copied:" + m.value(), key=m.key(), partition=m.partition())
        producer.flush(30)
        time.sleep(process_ms / 1000)
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]), int(sys.argv[8]))
