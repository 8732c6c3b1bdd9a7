"""`odradek transactions`: list, describe, describe the producers of a partition, find hanging
transactions and abort them (as kafka-transactions.sh, KIP-664).

    odradek transactions list
    odradek transactions describe --transactional-id payments-1
    odradek transactions describe-producers --topic events --partition 0
    odradek transactions find-hanging --broker-id 1 [--max-transaction-timeout 15]
    odradek transactions find-hanging --topic events [--partition 0]
    odradek transactions abort --topic events --partition 0 --start-offset 42
    odradek transactions abort --topic events --partition 0 --producer-id 7 --producer-epoch 0 --coordinator-epoch 0

A transaction hangs when a partition holds it open (DescribeProducers shows a current transaction
start offset) for longer than the transaction timeout allows, yet its coordinator does not: as Kafka's
tool, find-hanging leaves out a transaction its coordinator still has Ongoing (or in a Prepare state)
with that partition, unless --include-active is given. Abort writes an ABORT marker on the partition
(WriteTxnMarkers to its leader) for the producer whose open transaction starts at --start-offset, or
for the producer named; the coordinator is not asked, so abort only what find-hanging reports.
"""

from __future__ import annotations

import time

from odradek.cli.common import (
    CliError, admin_config, connection_parent, json_parent, non_negative_int, print_json, print_table, run, say,
)

DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN = 15
ACTIVE_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def add_parser(sub) -> None:
    conn, js = connection_parent(), json_parent()
    p = sub.add_parser("transactions", help="list, describe, find hanging and abort transactions",
                       description=__doc__)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    ls = actions.add_parser("list", parents=[conn, js], help="every transactional id and its state")
    ls.set_defaults(run=lambda a: run(a, list_))

    d = actions.add_parser("describe", parents=[conn, js], help="a transactional id's state at its coordinator")
    d.add_argument("--transactional-id", required=True)
    d.set_defaults(run=lambda a: run(a, describe))

    dp = actions.add_parser("describe-producers", parents=[conn, js], help="the active producers of a partition")
    dp.add_argument("--topic", required=True)
    dp.add_argument("--partition", type=non_negative_int, required=True)
    dp.set_defaults(run=lambda a: run(a, describe_producers))

    fh = actions.add_parser("find-hanging", parents=[conn, js], help="transactions open longer than the timeout")
    scope = fh.add_mutually_exclusive_group(required=True)
    scope.add_argument("--broker-id", type=non_negative_int, help="the partitions this broker leads")
    scope.add_argument("--topic", help="the partitions of this topic")
    fh.add_argument("--partition", type=non_negative_int, help="only this partition (with --topic)")
    fh.add_argument("--max-transaction-timeout", type=non_negative_int, default=DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN,
                    metavar="MINUTES", help="open longer than this is hanging (default "
                                            f"{DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN}; the brokers' "
                                            "transaction.max.timeout.ms)")
    fh.add_argument("--include-active", action="store_true",
                    help="also list transactions their coordinator still has open with the partition")
    fh.set_defaults(run=lambda a: run(a, find_hanging))

    ab = actions.add_parser("abort", parents=[conn, js], help="write an ABORT marker for an open transaction")
    ab.add_argument("--topic", required=True)
    ab.add_argument("--partition", type=non_negative_int, required=True)
    ab.add_argument("--start-offset", type=non_negative_int, help="the first offset of the open transaction")
    ab.add_argument("--producer-id", type=non_negative_int)
    ab.add_argument("--producer-epoch", type=non_negative_int)
    ab.add_argument("--coordinator-epoch", type=non_negative_int)
    ab.set_defaults(run=lambda a: run(a, abort))


async def list_(args) -> int:
    from odradek.client.admin import Admin

    async with Admin(admin_config(args)) as admin:
        txns = await admin.list_transactions()
    txns = sorted(txns, key=lambda t: t.transactional_id)
    if args.json:
        print_json([{"transactional_id": t.transactional_id, "coordinator": t.coordinator,
                     "producer_id": t.producer_id, "state": t.state} for t in txns])
    else:
        print_table(["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
                    [(t.transactional_id, t.coordinator, t.producer_id, t.state) for t in txns])
    return 0


async def describe(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.admin_types import AdminError

    async with Admin(admin_config(args)) as admin:
        try:
            d = (await admin.describe_transactions([args.transactional_id]))[args.transactional_id]
        except AdminError as e:
            raise CliError(str(e)) from None
        coordinator = await admin._txn_coordinator(args.transactional_id)
    now = int(time.time() * 1000)
    duration = now - d.start_time_ms if d.start_time_ms >= 0 else None
    row = {"coordinator": coordinator, "transactional_id": d.transactional_id, "producer_id": d.producer_id,
           "producer_epoch": d.producer_epoch, "state": d.state, "timeout_ms": d.timeout_ms,
           "start_time_ms": d.start_time_ms if d.start_time_ms >= 0 else None, "duration_ms": duration,
           "topic_partitions": [[tp.topic, tp.partition] for tp in d.partitions]}
    if args.json:
        print_json(row)
    else:
        print_table(["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                     "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                     "TopicPartitions"],
                    [(coordinator, d.transactional_id, d.producer_id, d.producer_epoch, d.state, d.timeout_ms,
                      row["start_time_ms"], duration,
                      ",".join(f"{tp.topic}-{tp.partition}" for tp in d.partitions) or None)])
    return 0


def _producer_json(s) -> dict:
    return {"producer_id": s.producer_id, "producer_epoch": s.producer_epoch,
            "latest_coordinator_epoch": s.coordinator_epoch if s.coordinator_epoch >= 0 else None,
            "last_sequence": s.last_sequence, "last_timestamp": s.last_timestamp if s.last_timestamp >= 0 else None,
            "current_transaction_start_offset": s.current_txn_start_offset if s.current_txn_start_offset >= 0 else None}


async def _producers(admin, tp) -> list:
    from odradek.client.admin_types import AdminError

    try:
        return (await admin.describe_producers([tp]))[tp]
    except AdminError as e:
        raise CliError(str(e)) from None


async def describe_producers(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.fetcher import TopicPartition

    tp = TopicPartition(args.topic, args.partition)
    async with Admin(admin_config(args)) as admin:
        rows = [_producer_json(s) for s in await _producers(admin, tp)]
    if args.json:
        print_json(rows)
    else:
        print_table(["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                     "CurrentTransactionStartOffset"],
                    [(r["producer_id"], r["producer_epoch"], r["latest_coordinator_epoch"], r["last_sequence"],
                      r["last_timestamp"], r["current_transaction_start_offset"]) for r in rows])
    return 0


async def _partitions_to_search(admin, args) -> list:
    from odradek.client.admin_types import AdminError
    from odradek.client.fetcher import TopicPartition

    if args.topic is not None:
        try:
            described = (await admin.describe_topics([args.topic]))[args.topic]
        except AdminError as e:
            raise CliError(str(e)) from None
        have = [p.partition for p in described.partitions]
        if args.partition is not None:
            if args.partition not in have:
                raise CliError(f"topic {args.topic} has no partition {args.partition}")
            have = [args.partition]
        return [TopicPartition(args.topic, p) for p in sorted(have)]
    if args.partition is not None:
        raise CliError("--partition needs --topic", 2)
    topics = sorted(await admin.list_topics(include_internal=True))
    described = await admin.describe_topics(topics) if topics else {}
    return sorted(TopicPartition(t, p.partition) for t, d in described.items() for p in d.partitions
                  if p.leader == args.broker_id)


async def find_hanging(args) -> int:
    """Kafka's search: partitions' open transactions older than the limit, less those whose producer's
    transactional id its coordinator still has active with that partition at that epoch."""
    from odradek.client.admin import Admin
    from odradek.client.admin_types import AdminError

    limit_ms = args.max_transaction_timeout * 60_000
    now = int(time.time() * 1000)
    async with Admin(admin_config(args)) as admin:
        tps = await _partitions_to_search(admin, args)
        producers = await admin.describe_producers(tps) if tps else {}
        candidates = [(tp, s) for tp, states in producers.items() for s in states
                      if s.current_txn_start_offset >= 0 and s.last_timestamp >= 0
                      and now - s.last_timestamp > limit_ms]
        active: set = set()
        if candidates and not args.include_active:
            pids = sorted({s.producer_id for _, s in candidates})
            ids = {t.producer_id: t.transactional_id for t in await admin.list_transactions(producer_ids=pids)}
            described = {}
            for txn_id in sorted(set(ids.values())):
                try:
                    described.update(await admin.describe_transactions([txn_id]))
                except AdminError:
                    pass   # gone from its coordinator: whatever the partition holds is hanging
            for tp, s in candidates:
                d = described.get(ids.get(s.producer_id))
                if (d is not None and d.producer_id == s.producer_id and d.producer_epoch == s.producer_epoch
                        and d.state in ACTIVE_STATES and tp in d.partitions):
                    active.add((tp, s.producer_id))
    rows = [{"topic": tp.topic, "partition": tp.partition, "producer_id": s.producer_id,
             "producer_epoch": s.producer_epoch,
             "coordinator_epoch": s.coordinator_epoch if s.coordinator_epoch >= 0 else None,
             "start_offset": s.current_txn_start_offset, "last_timestamp": s.last_timestamp,
             "duration_min": (now - s.last_timestamp) // 60_000}
            for tp, s in candidates if (tp, s.producer_id) not in active]
    if args.json:
        print_json(rows)
    else:
        print_table(["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                     "LastTimestamp", "Duration(min)"],
                    [(r["topic"], r["partition"], r["producer_id"], r["producer_epoch"], r["coordinator_epoch"],
                      r["start_offset"], r["last_timestamp"], r["duration_min"]) for r in rows])
    return 0


async def abort(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.admin_types import AdminError
    from odradek.client.fetcher import TopicPartition

    named = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if args.start_offset is None and None in named:
        raise CliError("abort needs --start-offset, or --producer-id, --producer-epoch and --coordinator-epoch", 2)
    if args.start_offset is not None and any(v is not None for v in named):
        raise CliError("--start-offset cannot be given with --producer-id, --producer-epoch or "
                       "--coordinator-epoch", 2)
    tp = TopicPartition(args.topic, args.partition)
    async with Admin(admin_config(args)) as admin:
        if args.start_offset is not None:
            found = [s for s in await _producers(admin, tp) if s.current_txn_start_offset == args.start_offset]
            if not found:
                raise CliError(f"no open transaction starts at offset {args.start_offset} of {tp.topic}-{tp.partition}")
            s = found[0]
            pid, epoch, coordinator_epoch = s.producer_id, s.producer_epoch, max(0, s.coordinator_epoch)
        else:
            pid, epoch, coordinator_epoch = named
        try:
            await admin.abort_transaction(tp, pid, epoch, coordinator_epoch)
        except AdminError as e:
            raise CliError(str(e)) from None
    result = {"topic": tp.topic, "partition": tp.partition, "producer_id": pid, "producer_epoch": epoch,
              "coordinator_epoch": coordinator_epoch}
    if args.json:
        print_json(result)
    else:
        say(f"Aborted the transaction of producer {pid} (epoch {epoch}, coordinator epoch {coordinator_epoch}) "
            f"on {tp.topic}-{tp.partition}.")
    return 0
