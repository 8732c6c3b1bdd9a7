"""A transactional copier written with aiokafka (read-process-write, seed 003 "Message Delivery
Semantics"), run as its own process so a test can kill it with SIGKILL: the same job as `txn_copier`
(confluent-kafka), with aiokafka's transactional AIOKafkaProducer and read_committed AIOKafkaConsumer.

    python -m tests.integration.aio_txn_copier BOOTSTRAP INPUT OUTPUT PARTITIONS GROUP TRANSACTIONAL_ID CHUNK PROCESS_MS

It takes the transactional id first (the producer's start() runs InitProducerId, which fences a killed
predecessor and aborts its open transaction and pending offsets; it must come before the consumer
fetches its offsets, as aiokafka's OffsetFetch v3 does not ask for stable offsets), then assigns itself
every input partition (aiokafka starts an assigned partition at the group's committed offset), copies
each polled chunk (at most CHUNK records) to OUTPUT with the value prefixed by "copied:" and commits it
with the consumer's next positions in one transaction (send_offsets_to_transaction with the group id:
aiokafka sends no member id or generation). PROCESS_MS is the work a chunk stands for: the copied
records sit on the broker, uncommitted, that long before the commit; half of it comes after
send_offsets_to_transaction, so kills land both before the group's offsets joined the transaction and
while it holds them pending. It prints "ready" once it holds the transactional id, and runs until
killed.
"""

from __future__ import annotations

import asyncio
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition


async def main(bootstrap: str, source: str, target: str, partitions: int, group: str, transactional_id: str,
               chunk: int, process_ms: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                                transaction_timeout_ms=10000, linger_ms=5)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, isolation_level="read_committed",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await producer.start()
    await consumer.start()
    tps = [TopicPartition(source, p) for p in range(partitions)]
    consumer.assign(tps)
    print("ready", flush=True)
    while True:
        polled = await consumer.getmany(timeout_ms=500, max_records=chunk)
        if not polled:
            continue
        async with producer.transaction():
            for tp, records in polled.items():
                for r in records:
                    await producer.send(target, b"copied:" + r.value, key=r.key, partition=tp.partition)
            await producer.flush()
            await asyncio.sleep(process_ms / 2000)
            positions = {tp: await consumer.position(tp) for tp in tps}
            await producer.send_offsets_to_transaction(positions, group)
            await asyncio.sleep(process_ms / 2000)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6],
                     int(sys.argv[7]), int(sys.argv[8])))
