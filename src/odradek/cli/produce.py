"""`odradek produce`: records from lines of stdin or a file (as kafka-console-producer.sh).

    echo "hello" | odradek produce --topic events
    odradek produce --topic events --property parse.key=true --property key.separator=: < keyed.txt
    odradek produce --topic events --property parse.headers=true --file with-headers.txt --rate 100

Each line is a record (see `formats` for the key and header syntax). Nothing is printed on success
(with --json, a summary); the first failed delivery ends the command with status 1.

A topic that does not exist is created by the broker on the first record when the broker allows it
(auto.create.topics.enable, as kafka-console-producer.sh and kcat do: the producer's Metadata
requests allow auto-creation); when the broker does not, the command says so at once.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from odradek.cli.common import (
    CliError, admin_config, client_config, connection_parent, json_parent, non_negative_int, parse_key_values, positive_float,
    print_json, run,
)
from odradek.cli.formats import FormatError, LineReader

READ_CHUNK_BYTES = 1 << 16


def add_parser(sub) -> None:
    p = sub.add_parser("produce", parents=[connection_parent(), json_parent()], help="write lines as records",
                       description=__doc__)
    p.add_argument("--topic", required=True)
    p.add_argument("--file", metavar="PATH", help="read lines from this file instead of stdin")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="line reader settings: parse.key, key.separator, parse.headers, headers.delimiter, "
                        "headers.separator, headers.key.separator, ignore.error, null.marker")
    p.add_argument("--partition", type=non_negative_int, help="write every record to this partition")
    p.add_argument("--rate", type=positive_float, metavar="RECORDS/S", help="at most this many records a second")
    p.add_argument("--compression-codec", "--compression", default="none",
                   choices=["none", "gzip", "snappy", "lz4", "zstd"])
    p.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    p.add_argument("--linger-ms", type=non_negative_int, default=5)
    p.add_argument("--producer-property", action="append", default=[], metavar="KEY=VALUE",
                   help="a producer config (repeatable)")
    p.set_defaults(run=lambda a: run(a, produce))


async def read_lines(fd: int):
    """Lines (bytes, without line endings) from a file descriptor, as soon as they arrive."""
    loop = asyncio.get_running_loop()
    pending = b""
    while True:
        chunk = await loop.run_in_executor(None, os.read, fd, READ_CHUNK_BYTES)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line[:-1] if line.endswith(b"\r") else line
    if pending:
        yield pending[:-1] if pending.endswith(b"\r") else pending


async def produce(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.producer import Producer

    try:
        reader = LineReader.from_properties(parse_key_values(args.property, "--property"))
    except FormatError as e:
        raise CliError(str(e), 2) from None
    try:
        fd = os.open(args.file, os.O_RDONLY) if args.file else sys.stdin.fileno()
    except OSError as e:
        raise CliError(f"cannot read {args.file}: {e.strerror}") from None
    timeout_ms = int(args.timeout * 1000)
    conf = client_config(args, **{
        "acks": args.acks, "compression.type": args.compression_codec, "linger.ms": args.linger_ms,
        "max.block.ms": timeout_ms, "delivery.timeout.ms": max(timeout_ms, args.linger_ms + timeout_ms),
        **parse_key_values(args.producer_property, "--producer-property")})
    async with Admin(admin_config(args)) as admin:
        partitions = await _partitions_or_creatable(admin, args.topic, conf)
    if args.partition is not None and partitions is not None and args.partition >= partitions:
        raise CliError(f"topic {args.topic} has {partitions} partitions; there is no partition {args.partition}")
    failures: list = []
    count = 0
    started = time.monotonic()

    def on_delivery(err, md) -> None:
        if err is not None and not failures:
            failures.append(err)
    async with Producer(conf) as producer:
        async for line in read_lines(fd):
            count += 1
            try:
                key, value, headers = reader.parse(line, count)
            except FormatError as e:
                raise CliError(str(e)) from None
            if args.rate:
                ahead = started + (count - 1) / args.rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await producer.send(args.topic, value, key, partition=args.partition, headers=headers or None,
                                on_delivery=on_delivery)
            if failures:
                break
        await producer.flush()
    if failures:
        raise failures[0]
    if args.json:
        print_json({"topic": args.topic, "records": count, "seconds": round(time.monotonic() - started, 3)})
    return 0


async def _partitions_or_creatable(admin, topic: str, conf: dict) -> int | None:
    """The topic's partition count; None for a topic the first record will create. A topic that
    does not exist and will not be created is a CliError now, not a timeout later."""
    from odradek.client.admin_types import AdminError, ConfigResource
    from odradek.protocol.error_codes import ErrorCode

    try:
        return len((await admin.describe_topics([topic]))[topic].partitions)
    except AdminError as e:
        if e.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise
    create = "create it first: odradek topics create --topic " + topic
    if str(conf.get("allow.auto.create.topics", True)).lower() == "false":
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic {topic} does not exist and "
                       f"allow.auto.create.topics=false; {create}")
    broker = (await admin.describe_cluster()).brokers[0].id
    resource = ConfigResource.broker(broker)
    entry = (await admin.describe_configs([resource]))[resource].get("auto.create.topics.enable")
    if entry is not None and str(entry.value).lower() == "false":
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic {topic} does not exist and the broker does not "
                       f"create topics on use (auto.create.topics.enable=false); {create}")
    return None
