"""`odradek transactions` as a subprocess against a real broker, with a confluent-kafka transactional
producer left open (begun, produced to, neither committed nor aborted): list and describe show it
Ongoing with its partitions, describe-producers shows its open transaction's start offset,
find-hanging finds it (Kafka leaves out a transaction its coordinator still has open, unless
--include-active), abort by start offset and by producer id writes ABORT markers that let a
read_committed reader past it; error paths."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from .cli_support import new_name, odradek
from .clients import confluent_config, wait_until
from .txn_support import read_values

COMMITTED_BEFORE = 3


def _open_transaction(bootstrap: str, topic: str, txn_id: str) -> Producer:
    """COMMITTED_BEFORE plain records on partition 0, then an open transaction: two records on
    partition 0 (from offset COMMITTED_BEFORE) and one on partition 1; then one more plain record on 0."""
    plain = Producer(confluent_config(bootstrap))
    for i in range(COMMITTED_BEFORE):
        plain.produce(topic, f"before-{i}".encode(), partition=0)
    assert plain.flush(20) == 0
    p = Producer(confluent_config(bootstrap, **{"transactional.id": txn_id, "transaction.timeout.ms": 120000}))
    p.init_transactions(20)
    p.begin_transaction()
    p.produce(topic, b"open-0", partition=0)
    p.produce(topic, b"open-1", partition=0)
    p.produce(topic, b"open-2", partition=1)
    assert p.flush(20) == 0
    plain.produce(topic, b"after", partition=0)
    assert plain.flush(20) == 0
    return p


def _ongoing(bootstrap: str, txn_id: str) -> str | None:
    rows = [r for r in odradek("transactions", "list", "--json", bootstrap=bootstrap).ok().json()
            if r["transactional_id"] == txn_id]
    return rows[0]["state"] if rows else None


def test_transactions_cli_finds_and_aborts_an_open_transaction(broker_factory):
    b = broker_factory()
    bs = b.bootstrap
    topic, txn_id = new_name("cli-txn"), new_name("open-txn")
    admin = AdminClient(confluent_config(bs))
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=20)
    p = _open_transaction(bs, topic, txn_id)

    # list: the id, its coordinator (the only broker), its producer id, Ongoing; a table for people.
    [row] = [r for r in odradek("transactions", "list", "--json", bootstrap=bs).ok().json()
             if r["transactional_id"] == txn_id]
    assert row["state"] == "Ongoing" and row["producer_id"] >= 0 and row["coordinator"] >= 0
    table = odradek("transactions", "list", bootstrap=bs).ok().stdout
    assert "TransactionalId" in table and "TransactionState" in table
    assert any(txn_id in line and "Ongoing" in line for line in table.splitlines())

    # describe: state, epoch, timeout, start time and both partitions.
    d = odradek("transactions", "describe", "--transactional-id", txn_id, "--json", bootstrap=bs).ok().json()
    assert d["state"] == "Ongoing" and d["producer_id"] == row["producer_id"] and d["coordinator"] == row["coordinator"]
    assert d["timeout_ms"] == 120000 and d["start_time_ms"] <= time.time() * 1000 and d["duration_ms"] >= 0
    assert sorted(map(tuple, d["topic_partitions"])) == [(topic, 0), (topic, 1)]
    odradek("transactions", "describe", "--transactional-id", "no-such-id",
            bootstrap=bs).fails("TRANSACTIONAL_ID_NOT_FOUND")

    # describe-producers: the transactional producer holds partition 0 open from offset 3.
    producers = odradek("transactions", "describe-producers", "--topic", topic, "--partition", "0", "--json",
                        bootstrap=bs).ok().json()
    [txp] = [s for s in producers if s["producer_id"] == row["producer_id"]]
    assert txp["current_transaction_start_offset"] == COMMITTED_BEFORE and txp["producer_epoch"] == d["producer_epoch"]
    assert txp["last_sequence"] == 1 and txp["last_timestamp"] > 0
    assert all(s["current_transaction_start_offset"] is None for s in producers if s is not txp)
    assert "CurrentTransactionStartOffset" in odradek("transactions", "describe-producers", "--topic", topic,
                                                      "--partition", "0", bootstrap=bs).ok().stdout

    # find-hanging: its coordinator still has it Ongoing with both partitions, so Kafka's rule leaves
    # it out; --include-active shows both partitions' open transactions.
    assert odradek("transactions", "find-hanging", "--topic", topic, "--max-transaction-timeout", "0", "--json",
                   bootstrap=bs).ok().json() == []
    found = wait_until(lambda: (lambda rows: rows if len(rows) == 2 else None)(
        odradek("transactions", "find-hanging", "--broker-id", str(row["coordinator"]), "--max-transaction-timeout",
                "0", "--include-active", "--json", bootstrap=bs).ok().json()), 20, "two open transactions found")
    assert sorted((r["topic"], r["partition"], r["start_offset"], r["producer_id"]) for r in found) == [
        (topic, 0, COMMITTED_BEFORE, row["producer_id"]), (topic, 1, 0, row["producer_id"])]
    assert odradek("transactions", "find-hanging", "--topic", topic, "--include-active", "--json",
                   bootstrap=bs).ok().json() == []   # not open for 15 minutes

    # Before the abort, a read_committed reader stops at the open transaction.
    assert read_values(bs, topic, 1, "read_committed") == [f"before-{i}".encode() for i in range(COMMITTED_BEFORE)]

    odradek("transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "999",
            bootstrap=bs).fails("no open transaction starts at offset 999")
    odradek("transactions", "abort", "--topic", topic, "--partition", "0", bootstrap=bs).fails("--start-offset",
                                                                                               status=2)
    aborted = odradek("transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset",
                      str(COMMITTED_BEFORE), "--json", bootstrap=bs).ok().json()
    assert (aborted["producer_id"], aborted["producer_epoch"]) == (row["producer_id"], d["producer_epoch"])

    # Partition 0 is closed: its reader gets past the aborted records to the later plain one.
    after = odradek("transactions", "describe-producers", "--topic", topic, "--partition", "0", "--json",
                    bootstrap=bs).ok().json()
    assert all(s["current_transaction_start_offset"] is None for s in after)
    assert read_values(bs, topic, 1, "read_committed") == [
        *(f"before-{i}".encode() for i in range(COMMITTED_BEFORE)), b"after"]

    # Partition 1 by producer id, epoch and coordinator epoch (as describe-producers shows them).
    [p1] = odradek("transactions", "describe-producers", "--topic", topic, "--partition", "1", "--json",
                   bootstrap=bs).ok().json()
    assert p1["current_transaction_start_offset"] == 0
    odradek("transactions", "abort", "--topic", topic, "--partition", "1", "--producer-id", str(p1["producer_id"]),
            "--producer-epoch", str(p1["producer_epoch"]), "--coordinator-epoch",
            str(p1["latest_coordinator_epoch"] or 0), bootstrap=bs).ok()
    assert read_values(bs, topic, 2, "read_committed") == [
        *(f"before-{i}".encode() for i in range(COMMITTED_BEFORE)), b"after"]
    assert odradek("transactions", "find-hanging", "--topic", topic, "--max-transaction-timeout", "0",
                   "--include-active", "--json", bootstrap=bs).ok().json() == []

    # As in Kafka, the markers do not tell the coordinator; the producer's own abort completes it there.
    assert _ongoing(bs, txn_id) == "Ongoing"
    p.abort_transaction(20)
    wait_until(lambda: _ongoing(bs, txn_id) == "CompleteAbort", 20, "the transaction CompleteAbort")
    assert sorted(read_values(bs, topic, 2, "read_uncommitted")) == sorted([
        *(f"before-{i}".encode() for i in range(COMMITTED_BEFORE)), b"open-0", b"open-1", b"after", b"open-2"])
