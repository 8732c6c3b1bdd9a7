"""A transactional copier written with odradek.client (read-process-write, seed 003 "Message Delivery
Semantics"), run as its own process so a test can kill it with SIGKILL: the same job as
`txn_copier` (confluent-kafka), with our read_committed consumer and transactional producer.

    python -m tests.integration.ctxn_copier BOOTSTRAP INPUT OUTPUT PARTITIONS GROUP TRANSACTIONAL_ID CHUNK PROCESS_MS

It takes the transactional id first (fencing a killed predecessor, whose open transaction and pending
offsets are aborted), then starts every input partition at the group's committed offset, copies each
polled chunk (at most CHUNK records) to OUTPUT with the value prefixed by "copied:" and commits it with
the consumer's next positions in one transaction (send_offsets_to_transaction). PROCESS_MS is the work
a chunk stands for: the copied records sit on the broker, uncommitted, that long before the commit.
It prints "ready" once it holds the transactional id, and runs until killed.
"""

from __future__ import annotations

import asyncio
import sys

from odradek.client import Consumer, Producer, TopicPartition


async def main(bootstrap: str, source: str, target: str, partitions: int, group: str, transactional_id: str,
               chunk: int, process_ms: int) -> None:
    async with Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 10000, "linger.ms": 5}) as producer, \
            Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                      "auto.offset.reset": "earliest"}) as consumer:
        await producer.init_transactions(60)
        tps = [TopicPartition(source, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp, offset in (await consumer.committed(tps, 60000)).items():
            if offset is not None:
                consumer.seek(tp, offset)
        print("ready", flush=True)
        while True:
            polled = await consumer.getmany(timeout_ms=500, max_records=chunk)
            if not polled:
                continue
            producer.begin_transaction()
            for tp, records in polled.items():
                for r in records:
                    await producer.send(target, b"copied:" + r.value, key=r.key, partition=tp.partition)
            await producer.flush()
            await asyncio.sleep(process_ms / 1000)
            positions = {tp: await consumer.position(tp) for tp in tps}
            await producer.send_offsets_to_transaction(positions, consumer.group_metadata(), 30)
            await producer.commit_transaction(30)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6],
                     int(sys.argv[7]), int(sys.argv[8])))
