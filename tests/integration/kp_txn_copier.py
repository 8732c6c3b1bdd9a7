"""A transactional copier written with kafka-python (read-process-write, seed 003 "Message Delivery
Semantics"), run as its own process so a test can kill it with SIGKILL: the same job as `txn_copier`
(confluent-kafka), with kafka-python's transactional KafkaProducer and read_committed KafkaConsumer.

    python -m tests.integration.kp_txn_copier BOOTSTRAP INPUT OUTPUT PARTITIONS GROUP TRANSACTIONAL_ID CHUNK PROCESS_MS

It takes the transactional id first (init_transactions fences a killed predecessor, whose open
transaction and pending offsets are aborted), then assigns itself every input partition (kafka-python
starts an assigned partition at the group's committed offset), copies each polled chunk (at most CHUNK
records) to OUTPUT with the value prefixed by "copied:" and commits it with the consumer's next
positions in one transaction (send_offsets_to_transaction with the consumer's group metadata).
PROCESS_MS is the work a chunk stands for: the copied records sit on the broker, uncommitted, that long
before the commit; half of it comes after send_offsets_to_transaction, so kills land both before the
group's offsets joined the transaction and while it holds them pending. It prints "ready" once it holds
the transactional id, and runs until killed.
"""

from __future__ import annotations

import sys
import time

from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import OffsetAndMetadata, TopicPartition


def main(bootstrap: str, source: str, target: str, partitions: int, group: str, transactional_id: str,
         chunk: int, process_ms: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                             transaction_timeout_ms=10000, linger_ms=5)
    producer.init_transactions()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, isolation_level="read_committed",
                             enable_auto_commit=False, auto_offset_reset="earliest")
    tps = [TopicPartition(source, p) for p in range(partitions)]
    consumer.assign(tps)
    print("ready", flush=True)
    while True:
        polled = consumer.poll(timeout_ms=500, max_records=chunk)
        if not polled:
            continue
        producer.begin_transaction()
        for tp, records in polled.items():
            for r in records:
                producer.send(target, b"copied:" + r.value, key=r.key, partition=tp.partition)
        producer.flush(30)
        time.sleep(process_ms / 2000)
        positions = {tp: OffsetAndMetadata(consumer.position(tp), "", -1) for tp in tps}
        producer.send_offsets_to_transaction(positions, consumer.group_metadata())
        time.sleep(process_ms / 2000)
        producer.commit_transaction()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]),
         int(sys.argv[8]))
