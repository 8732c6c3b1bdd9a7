"""`odradek consume`: print records (as kafka-console-consumer.sh).

    odradek consume --topic events --from-beginning --max-messages 10
    odradek consume --topic events --partition 0 --offset 42 --property print.key=true --property print.offset=true
    odradek consume --topic events --timestamp 2024-05-01T12:00:00 --json
    odradek consume --topic events --group readers

Without --group the tool reads every partition of the topic (or --partition) from the latest offset,
--from-beginning, --offset (with --partition) or --timestamp (ms or ISO 8601). With --group it joins the
consumer group, starts where the group's committed offsets say (else as --from-beginning says) and
commits what it printed, every second and on exit. It stops after --max-messages records, after
--timeout-ms without a record, or on Ctrl-C / SIGTERM; then it prints the count to stderr.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

from odradek.cli.common import (
    CliError, admin_config, client_config, connection_parent, non_negative_int, parse_key_values, positive_int,
    run,
)
from odradek.cli.formats import FormatError, RecordFormatter, parse_timestamp, record_json

COMMIT_INTERVAL_MS = 1000
POLL_MS = 500


def add_parser(sub) -> None:
    p = sub.add_parser("consume", parents=[connection_parent()], help="print records", description=__doc__)
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=non_negative_int, help="read only this partition")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true",
                       help="start at the earliest offset (with --group: where nothing is committed)")
    start.add_argument("--offset", help="with --partition: an offset, 'earliest' or 'latest'")
    start.add_argument("--timestamp", help="start at the first record at or after this time (ms or ISO 8601)")
    p.add_argument("--group", help="consume as a member of this consumer group, committing offsets")
    p.add_argument("--max-messages", type=positive_int, help="stop after this many records")
    p.add_argument("--timeout-ms", type=positive_int, help="stop after this long without a record")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="output settings: print.key, print.timestamp, print.partition, print.offset, "
                        "print.headers, print.value, key.separator, line.separator, headers.separator, "
                        "headers.key.separator, null.literal")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per record: topic, partition, offset, timestamp, key, value, headers")
    p.add_argument("--isolation-level", default="read_uncommitted", choices=["read_uncommitted", "read_committed"])
    p.add_argument("--consumer-property", action="append", default=[], metavar="KEY=VALUE",
                   help="a consumer config (repeatable)")
    p.set_defaults(run=lambda a: run(a, consume))


def _check_args(args) -> None:
    if args.offset is not None and args.partition is None:
        raise CliError("--offset needs --partition", 2)
    if args.offset is not None and args.offset not in ("earliest", "latest"):
        try:
            if int(args.offset) < 0:
                raise ValueError
        except ValueError:
            raise CliError(f"--offset must be a non-negative number, 'earliest' or 'latest', not {args.offset!r}", 2)
    if args.group and (args.partition is not None or args.offset is not None or args.timestamp is not None):
        raise CliError("--group cannot be combined with --partition, --offset or --timestamp", 2)


class _Output:
    """Writes what a poll returned, as columns (`Consumer.getmany_columns`): with the default format
    (values only) one bytes object per poll (`RecordColumns.joined_values`: no object per record when
    the values are of one size); any other format makes the records and formats them one by one."""

    def __init__(self, args) -> None:
        self.json = args.json
        try:
            self.formatter = f = RecordFormatter.from_properties(parse_key_values(args.property, "--property"))
        except FormatError as e:
            raise CliError(str(e), 2) from None
        self.values_only = not (self.json or f.print_timestamp or f.print_partition or f.print_offset
                                or f.print_headers or f.print_key)
        self.out = sys.stdout.buffer

    def write(self, tp, columns) -> None:
        from odradek.client.fetcher import records_from_columns

        f = self.formatter
        if self.values_only:
            sep = f.line_separator
            if not f.print_value:
                self.out.write(sep * len(columns))
            else:
                self.out.write(columns.joined_values(sep, f.null_literal))
        elif self.json:
            records = records_from_columns(tp, columns)
            self.out.write("".join(json.dumps(record_json(r)) + "\n" for r in records).encode())
        else:
            self.out.write(b"".join(map(f.format, records_from_columns(tp, columns))))
        self.out.flush()


async def consume(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.consumer import Consumer

    _check_args(args)
    output = _Output(args)
    start_ms = None
    if args.timestamp is not None:
        try:
            start_ms = parse_timestamp(args.timestamp)
        except FormatError as e:
            raise CliError(str(e), 2) from None
    async with Admin(admin_config(args)) as admin:
        count = len((await admin.describe_topics([args.topic]))[args.topic].partitions)
    if args.partition is not None and args.partition >= count:
        raise CliError(f"topic {args.topic} has {count} partitions; there is no partition {args.partition}")
    group = {"group.id": args.group, "enable.auto.commit": True, "auto.commit.interval.ms": COMMIT_INTERVAL_MS} \
        if args.group else {}
    conf = client_config(args, **{
        "auto.offset.reset": "earliest" if args.from_beginning else "latest", "allow.auto.create.topics": False,
        "isolation.level": args.isolation_level, **group,
        **parse_key_values(args.consumer_property, "--consumer-property")})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Consumer(conf) as consumer:
        if args.group:
            printed = await _consume_group(args, consumer, output, stop)
        else:
            partitions = [args.partition] if args.partition is not None else range(count)
            await _position(args, consumer, [(args.topic, p) for p in partitions], start_ms)
            printed = await _loop(args, consumer, output, stop)
    print(f"Processed a total of {printed} messages", file=sys.stderr)
    return 0


async def _position(args, consumer, tps, start_ms) -> None:
    from odradek.client.fetcher import TopicPartition

    tps = [TopicPartition(*tp) for tp in tps]
    consumer.assign(tps)
    if args.offset == "earliest":
        consumer.seek_to_beginning(*tps)
    elif args.offset == "latest":
        consumer.seek_to_end(*tps)
    elif args.offset is not None:
        consumer.seek(tps[0], int(args.offset))
    elif start_ms is not None:
        found = await consumer.offsets_for_times({tp: start_ms for tp in tps})
        for tp, o in found.items():
            if o is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, o.offset)


async def _loop(args, consumer, output, stop, joining=None) -> int:
    """Poll and print until a stop condition; the number of records printed. Time spent `joining()` a
    group does not count as idle."""
    printed = 0
    last_record = time.monotonic()
    while not stop.is_set():
        if joining is not None and joining():
            last_record = time.monotonic()
        left = None if args.max_messages is None else args.max_messages - printed
        wait_ms = POLL_MS
        if args.timeout_ms is not None:
            idle_left = args.timeout_ms - (time.monotonic() - last_record) * 1000
            if idle_left <= 0:
                break
            wait_ms = int(min(wait_ms, idle_left)) or 1
        poll = asyncio.ensure_future(consumer.getmany_columns(timeout_ms=wait_ms, max_records=left))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([poll, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not poll.done():
            poll.cancel()
            break
        for tp, columns in poll.result().items():
            last_record = time.monotonic()
            output.write(tp, columns)
            printed += len(columns)
        if left is not None and printed >= args.max_messages:
            break
    return printed


async def _consume_group(args, consumer, output, stop) -> int:
    """As a member of the group: the consumer joins on its first poll, commits the positions it handed
    out (exactly the printed records: each poll asks for no more than are still wanted) every second,
    on revocation and on close, and leaves the group on close."""
    from odradek.client.errors import UnsupportedVersionError

    consumer.subscribe([args.topic])
    try:
        return await _loop(args, consumer, output, stop, joining=lambda: not consumer.assignment())
    except UnsupportedVersionError as e:
        raise CliError(f"--group needs the consumer-group APIs, which the broker does not serve ({e})") from None
