"""Client-side assignors of the consumer group protocol (seed 002's ConsumerGroupPrepareAssignment /
InstallAssignment; an odradek extension behind group.consumer.client.assignors.enable) on a real
broker: odradek.client members with a custom assignor (weights in their assignor metadata, a share
of metadata handed back to each) compute and install the assignment and reconcile to it; a
librdkafka member (consumer protocol, server-side assignment only) and an odradek member without
client assignors join the same group, which the server-side assignor then assigns, and the group
goes back to the client-side assignor when they leave. With the setting off (the default) the keys
are not in ApiVersions, a request for them is answered UNSUPPORTED_VERSION, and members declaring
client assignors are assigned by the server."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient

from odradek.client import Admin, Consumer, Producer, TopicPartition
from odradek.client.group_assignors import AssignorMetadata, GroupSpec, MemberAssignment
from odradek.protocol.api import decode_response, encode_request
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.extensions import CONSUMER_GROUP_PREPARE_ASSIGNMENT
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import consumer_group_prepare_assignment as cgp

from .groups_support import create_topic, describe

BROKER_OVERRIDES = {
    "group.consumer.client.assignors.enable": "true",
    "group.consumer.session.timeout.ms": 6000, "group.consumer.min.session.timeout.ms": 1000,
    "group.consumer.heartbeat.interval.ms": 300, "group.consumer.min.heartbeat.interval.ms": 100,
}
PARTITIONS = 6
RECORDS = 60


class WeightedAssignor:
    """Partitions in proportion to the weight each member puts in its assignor metadata, in member-id
    order; each member is told its share in the metadata handed back. No server assignor does this."""

    name = "weighted"
    minimum_version = 0
    maximum_version = 1

    def __init__(self, weight: int) -> None:
        self.weight = weight
        self.runs = 0
        self.told: bytes | None = None

    def metadata(self) -> AssignorMetadata:
        return AssignorMetadata(reason=0, version=1, metadata=str(self.weight).encode())

    def assign(self, group: GroupSpec) -> dict[str, MemberAssignment]:
        self.runs += 1
        assert group.version == 1
        ids = sorted(group.members)
        weights = {m: int(group.members[m].metadata.metadata or b"1") for m in ids}
        parts = sorted((t, p) for t, n in group.partitions_per_topic.items() for p in range(n))
        total = sum(weights.values())
        out, start = {}, 0
        for i, m in enumerate(ids):
            n = len(parts) - start if i == len(ids) - 1 else len(parts) * weights[m] // total
            share = parts[start:start + n]
            start += n
            out[m] = MemberAssignment([TopicPartition(t, p) for t, p in share], 1, str(len(share)).encode())
        return out

    def on_assignment(self, partitions, metadata_version: int, metadata: bytes) -> None:
        self.told = metadata


def _produce(bootstrap: str, topic: str) -> None:
    async def run() -> None:
        async with Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as p:
            for i in range(RECORDS):
                await p.send(topic, str(i).encode(), partition=i % PARTITIONS)
            await p.flush()
    asyncio.run(run())


def _conf(bootstrap: str, group: str, client_id: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer", "client.id": client_id,
            "auto.offset.reset": "earliest", "enable.auto.commit": True, "auto.commit.interval.ms": 200, **extra}


def test_client_assignor_alongside_server_assigned_members(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic, group = "client-assigned", "client-assigned-group"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    _produce(broker.bootstrap, topic)
    seen: set[bytes] = set()

    async def main() -> None:
        w1, w2 = WeightedAssignor(1), WeightedAssignor(2)
        ours = []
        for name, w in (("ours-1", w1), ("ours-2", w2)):
            c = Consumer(_conf(broker.bootstrap, group, name, **{"group.local.assignors": [w]}))
            await c.start()
            c.subscribe([topic])
            ours.append(c)
        plain = None
        lib = None

        async def until(check, what: str, timeout_s: float = 45) -> None:
            deadline = time.monotonic() + timeout_s
            while True:
                for c in ours + ([plain] if plain is not None else []):
                    for records in (await c.getmany(timeout_ms=20)).values():
                        seen.update(r.value for r in records)
                if lib is not None:
                    msg = lib.poll(0.02)
                    if msg is not None and msg.error() is None:
                        seen.add(msg.value())
                if check():
                    return
                assert time.monotonic() < deadline, f"not reached: {what}; broker view {describe(admin, group)}"

        def shares(*consumers) -> list[int]:
            return [len(c.assignment()) for c in consumers]

        def broker_says(expected: dict[str, int]) -> bool:
            state, view = describe(admin, group)
            return state == "STABLE" and {k: len(v) for k, v in view.items()} == expected

        async def assignor_named() -> str:
            """The AssignorName ConsumerGroupDescribe gives: the assignor that computed the target."""
            async with Admin({"bootstrap.servers": broker.bootstrap}) as ours_admin:
                return (await ours_admin.describe_consumer_protocol_groups([group]))[group].assignor

        # 1. Client-side: weights 1 and 2 give 2 and 4 partitions (the server's assignors would give 3 and 3).
        await until(lambda: shares(*ours) == [2, 4] and broker_says({"ours-1": 2, "ours-2": 4}), "weighted 2/4")
        assert w1.runs + w2.runs >= 1
        computed = sum(c._membership.assignments_computed for c in ours)
        assert computed >= 1
        await until(lambda: w2.told == b"4" and w1.told == b"2", "each member told its share")
        assert await assignor_named() == "weighted"

        # 2. librdkafka joins (no client assignors): the server-side assignor assigns everyone, 2 each.
        lib = ck.Consumer(_conf(broker.bootstrap, group, "librdkafka", **{"enable.auto.commit": True}))
        lib.subscribe([topic])
        await until(lambda: shares(*ours) == [2, 2] and broker_says({"ours-1": 2, "ours-2": 2, "librdkafka": 2}),
                    "server-assigned with librdkafka")
        assert await assignor_named() == "uniform"
        lib.close()
        lib = None
        # 3. Back to the client-side assignor when it leaves.
        await until(lambda: shares(*ours) == [2, 4] and broker_says({"ours-1": 2, "ours-2": 4}), "weighted again")

        # 4. One of ours without client assignors, asking for the range server assignor.
        plain = Consumer(_conf(broker.bootstrap, group, "ours-plain", **{"group.remote.assignor": "range"}))
        await plain.start()
        plain.subscribe([topic])
        await until(lambda: shares(*ours, plain) == [2, 2, 2]
                    and broker_says({"ours-1": 2, "ours-2": 2, "ours-plain": 2}), "server-assigned with ours-plain")
        assert await assignor_named() == "range"
        await plain.aclose()
        plain = None
        await until(lambda: shares(*ours) == [2, 4] and broker_says({"ours-1": 2, "ours-2": 4}), "weighted at last")
        await until(lambda: len(seen) == RECORDS, "every record consumed")
        assert sum(c._membership.assignments_computed for c in ours) > computed
        for c in ours:
            await c.aclose()

    asyncio.run(main())
    assert seen == {str(i).encode() for i in range(RECORDS)}


def _raw_request(host: str, port: int, api_key: int, version: int, body) -> object:
    frame = b"".join(bytes(c) for c in encode_request(RequestHeader(api_key, version, 11, "raw"), body).chunks())
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read(s, 4))[0]
        _, response = decode_response(api_key, version, _read(s, size))
    return response


def _read(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


def test_switched_off_by_default(broker_factory):
    b = broker_factory(**{"group.consumer.heartbeat.interval.ms": 300, "group.consumer.min.heartbeat.interval.ms": 100})
    topic, group = "client-assigned-off", "client-assigned-off-group"
    create_topic(b.bootstrap, topic, PARTITIONS)
    host, port = b.bootstrap.rsplit(":", 1)
    response = _raw_request(host, int(port), CONSUMER_GROUP_PREPARE_ASSIGNMENT, 0,
                            cgp.ConsumerGroupPrepareAssignmentRequest(group_id=group, member_id="m", member_epoch=1))
    assert response.error_code == ErrorCode.UNSUPPORTED_VERSION

    async def main() -> None:
        cs = []
        for name, w in (("ours-1", WeightedAssignor(1)), ("ours-2", WeightedAssignor(2))):
            c = Consumer(_conf(b.bootstrap, group, name, **{"group.local.assignors": [w]}))
            await c.start()
            c.subscribe([topic])
            cs.append(c)
        deadline = time.monotonic() + 45
        while sorted(len(c.assignment()) for c in cs) != [3, 3]:
            assert time.monotonic() < deadline, [sorted(c.assignment()) for c in cs]
            for c in cs:
                await c.getmany(timeout_ms=20)
        for c in cs:
            assert c._membership.assignments_computed == 0
            await c.aclose()

    asyncio.run(main())
    asyncio.run(_listed_keys(b.bootstrap, expect_listed=False))


async def _listed_keys(bootstrap: str, expect_listed: bool) -> None:
    from odradek.client.network import BrokerConnection
    host, port = bootstrap.rsplit(":", 1)
    conn = await BrokerConnection.connect(host, int(port), client_id="versions")
    try:
        listed = CONSUMER_GROUP_PREPARE_ASSIGNMENT in conn.versions and CONSUMER_GROUP_PREPARE_ASSIGNMENT + 1 in conn.versions
        assert listed == expect_listed, sorted(conn.versions)
    finally:
        conn.close()


def test_listed_when_enabled(broker):
    asyncio.run(_listed_keys(broker.bootstrap, expect_listed=True))
