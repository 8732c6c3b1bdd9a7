"""`odradek topics`: create, list, describe, alter and delete topics (as kafka-topics.sh).

    odradek topics create --topic events --partitions 6 --replication-factor 1 --config retention.ms=86400000
    odradek topics list
    odradek topics describe --topic events
    odradek topics alter --topic events --partitions 12 --add-config cleanup.policy=compact
    odradek topics delete --topic events

`list` prints a table on a terminal and one name per line otherwise (as kafka-topics.sh --list), for
`odradek topics list | while read t; do ...; done`; `--json` gives every field. `describe` shows each
partition's leader, replicas, in-sync replicas and its log start offset and high watermark (as
`rpk topic describe -p`).
"""

from __future__ import annotations

import sys

from odradek.cli.common import (
    CliError, admin_config, connection_parent, json_parent, parse_key_values, positive_int, print_json,
    print_table, run, say,
)
from odradek.cli.configs import parse_config_list


def add_parser(sub) -> None:
    conn, js = connection_parent(), json_parent()
    p = sub.add_parser("topics", help="create, list, describe, alter and delete topics", description=__doc__)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    c = actions.add_parser("create", parents=[conn, js], help="create a topic")
    c.add_argument("--topic", required=True)
    c.add_argument("--partitions", type=positive_int, default=-1, help="default: the broker's num.partitions")
    c.add_argument("--replication-factor", type=positive_int, default=-1,
                   help="default: the broker's default.replication.factor")
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a topic config (repeatable)")
    c.add_argument("--if-not-exists", action="store_true", help="succeed if the topic exists already")
    c.add_argument("--validate-only", action="store_true", help="check the request, create nothing")
    c.set_defaults(run=lambda a: run(a, create))

    ls = actions.add_parser("list", parents=[conn, js], help="list topics",
                            description="List the topics: a table on a terminal, one name per line when piped.")
    ls.add_argument("--exclude-internal", action="store_true", help="leave out internal topics")
    ls.set_defaults(run=lambda a: run(a, list_))

    d = actions.add_parser("describe", parents=[conn, js], help="partitions, leaders, replicas and configs")
    d.add_argument("--topic", action="append", default=[], help="a topic (repeatable; default: every topic)")
    d.add_argument("--exclude-internal", action="store_true")
    f = d.add_argument_group("partition filters (as kafka-topics.sh; together: partitions any of them names)")
    f.add_argument("--under-replicated-partitions", dest="filters", action="append_const",
                   const="under_replicated", help="only partitions with fewer in-sync replicas than replicas")
    f.add_argument("--unavailable-partitions", dest="filters", action="append_const", const="unavailable",
                   help="only partitions whose leader is none or not a live broker")
    f.add_argument("--under-min-isr-partitions", dest="filters", action="append_const", const="under_min_isr",
                   help="only partitions with fewer in-sync replicas than min.insync.replicas")
    f.add_argument("--at-min-isr-partitions", dest="filters", action="append_const", const="at_min_isr",
                   help="only partitions with exactly min.insync.replicas in sync")
    d.set_defaults(run=lambda a: run(a, describe), filters=[])

    al = actions.add_parser("alter", parents=[conn, js], help="add partitions or change configs")
    al.add_argument("--topic", required=True)
    al.add_argument("--partitions", type=positive_int, help="the new total number of partitions")
    al.add_argument("--add-config", "--config", action="append", default=[], metavar="K=V[,K2=V2]",
                    help="set topic configs (repeatable)")
    al.add_argument("--delete-config", action="append", default=[], metavar="K[,K2]",
                    help="remove topic config overrides (repeatable)")
    al.set_defaults(run=lambda a: run(a, alter))

    rm = actions.add_parser("delete", parents=[conn, js], help="delete topics")
    rm.add_argument("--topic", action="append", required=True, help="a topic (repeatable)")
    rm.add_argument("--if-exists", action="store_true", help="succeed if a topic does not exist")
    rm.set_defaults(run=lambda a: run(a, delete))


def _admin(args):
    from odradek.client.admin import Admin
    return Admin(admin_config(args))


async def create(args) -> int:
    from odradek.client.admin_types import AdminError, NewTopic
    from odradek.protocol.error_codes import ErrorCode

    configs = parse_key_values(args.config, "--config")
    async with _admin(args) as admin:
        try:
            created = await admin.create_topics(
                [NewTopic(args.topic, args.partitions, args.replication_factor, configs)],
                validate_only=args.validate_only)
        except AdminError as e:
            if args.if_not_exists and e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                created = None
            else:
                raise
    t = created[args.topic] if created else None
    if args.json:
        print_json({"topic": args.topic, "created": t is not None and not args.validate_only,
                    "validate_only": args.validate_only,
                    "topic_id": None if t is None else t.topic_id,
                    "partitions": None if t is None else t.num_partitions,
                    "replication_factor": None if t is None else t.replication_factor})
    elif t is None:
        say(f"Topic {args.topic} already exists.")
    elif args.validate_only:
        say(f"Topic {args.topic} can be created ({t.num_partitions} partitions, replication factor "
            f"{t.replication_factor}); nothing was created (--validate-only).")
    else:
        say(f"Created topic {args.topic}.")
    return 0


async def list_(args) -> int:
    async with _admin(args) as admin:
        topics = await admin.list_topics(include_internal=not args.exclude_internal)
    if args.json:
        print_json([{"name": t.name, "topic_id": t.topic_id, "partitions": t.partitions, "internal": t.is_internal}
                    for t in topics.values()])
    elif not sys.stdout.isatty():
        sys.stdout.write("".join(f"{name}\n" for name in sorted(topics)))
    else:
        print_table(["TOPIC", "PARTITIONS", "INTERNAL"],
                    [(t.name, t.partitions, "yes" if t.is_internal else "") for t in topics.values()])
    return 0


async def describe(args) -> int:
    """Each topic's partitions: leader, leader epoch, replicas, ISR, offline replicas and the
    replication flags of `partition_status`; `--json` gives the same per partition."""
    from odradek.cli import partition_status
    from odradek.client.admin_types import ConfigResource, ConfigSource

    async with _admin(args) as admin:
        names = args.topic or list(await admin.list_topics(include_internal=not args.exclude_internal))
        described = await admin.describe_topics(names) if names else {}
        configs = await admin.describe_configs([ConfigResource.topic(n) for n in names]) if names else {}
        live = {b.id for b in (await admin.describe_cluster()).brokers}
        offsets = await _offsets(admin, described)
    out = []
    for name, t in described.items():
        entries = configs[ConfigResource.topic(name)]
        overrides = {k: e.value for k, e in entries.items() if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG}
        min_isr = _int_or_none(entries["min.insync.replicas"].value) if "min.insync.replicas" in entries else None
        rf = max((len(p.replicas) for p in t.partitions), default=0)
        partitions = []
        for p in t.partitions:
            flags = partition_status.status(p, live, min_isr)
            if partition_status.selected(flags, args.filters):
                start, end = offsets.get((name, p.partition), (None, None))
                partitions.append({"partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                                   "replicas": p.replicas, "isr": p.isr, "offline_replicas": p.offline_replicas,
                                   "log_start_offset": start, "high_watermark": end, **flags})
        if args.filters and not partitions:
            continue
        out.append({"name": name, "topic_id": t.topic_id, "internal": t.is_internal, "partition_count": len(t.partitions),
                    "replication_factor": rf, "min_insync_replicas": min_isr, "configs": overrides,
                    "partitions": partitions})
    if args.json:
        print_json(out)
        return 0
    for n, t in enumerate(out):
        cfg = ",".join(f"{k}={v}" for k, v in sorted(t["configs"].items()))
        title = (f"Topic: {t['name']}  TopicId: {t['topic_id']}  PartitionCount: {t['partition_count']}  "
                 f"ReplicationFactor: {t['replication_factor']}  Configs: {cfg}")
        if n:
            sys.stdout.write("\n")     # a blank line between topics, none before the first or after the last
        print_table(["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "OFFLINE", "LOG-START-OFFSET",
                     "HIGH-WATERMARK", "STATUS"],
                    [(p["partition"], "none" if p["leader"] < 0 else p["leader"], p["leader_epoch"],
                      _ids(p["replicas"]), _ids(p["isr"]), _ids(p["offline_replicas"]), p["log_start_offset"],
                      p["high_watermark"], _status_text(p))
                     for p in t["partitions"]], title=title)
    return 0


async def _offsets(admin, described) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """(log start offset, high watermark) of every partition that has a leader, by ListOffsets
    (earliest, latest) to the leaders; a partition whose leader cannot answer gets (None, None)."""
    from odradek.client.admin_partitions import EARLIEST, LATEST
    from odradek.client.admin_types import AdminError
    from odradek.client.fetcher import TopicPartition

    tps = [TopicPartition(name, p.partition) for name, t in described.items() for p in t.partitions
           if p.leader >= 0]
    if not tps:
        return {}
    try:
        start = await admin.list_offsets({tp: EARLIEST for tp in tps})
        end = await admin.list_offsets({tp: LATEST for tp in tps})
    except AdminError:
        return {}
    return {(tp.topic, tp.partition): (_offset(start.get(tp)), _offset(end.get(tp))) for tp in tps}


def _offset(found) -> int | None:
    return None if found is None or isinstance(found, Exception) else found.offset


def _status_text(p: dict) -> str:
    """The flags a person should see, most serious first; empty for a healthy partition."""
    words = [("offline", "offline"), ("unavailable", "leader not live"), ("under_min_isr", "under min ISR"),
             ("under_replicated", "under-replicated"), ("at_min_isr", "at min ISR")]
    shown = [text for key, text in words if p.get(key)]
    if "at min ISR" in shown and not p.get("under_replicated"):
        shown.remove("at min ISR")      # every healthy partition with as many replicas as min.insync.replicas
    if "offline" in shown and "leader not live" in shown:
        shown.remove("leader not live")
    return ", ".join(shown)


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _ids(ids) -> str:
    return ",".join(map(str, ids))


async def alter(args) -> int:
    from odradek.client.admin_types import AlterConfigOp, AlterConfigOpType, ConfigResource

    sets = parse_config_list(args.add_config)
    deletes = [k.strip() for item in args.delete_config for k in item.split(",") if k.strip()]
    if args.partitions is None and not sets and not deletes:
        raise CliError("nothing to alter: give --partitions, --add-config or --delete-config", 2)
    done = []
    async with _admin(args) as admin:
        await admin.describe_topics([args.topic])   # an unknown topic fails here, before any change
        if args.partitions is not None:
            await admin.create_partitions({args.topic: args.partitions})
            done.append(f"partitions={args.partitions}")
        if sets or deletes:
            ops = [AlterConfigOp(k, v) for k, v in sets.items()]
            ops += [AlterConfigOp(k, None, AlterConfigOpType.DELETE) for k in deletes]
            await admin.incremental_alter_configs({ConfigResource.topic(args.topic): ops})
            done += [f"{k}={v}" for k, v in sets.items()] + [f"-{k}" for k in deletes]
    if args.json:
        print_json({"topic": args.topic, "partitions": args.partitions, "set": sets, "deleted": deletes})
    else:
        say(f"Altered topic {args.topic}: {', '.join(done)}.")
    return 0


async def delete(args) -> int:
    from odradek.client.admin_types import AdminError
    from odradek.protocol.error_codes import ErrorCode

    async with _admin(args) as admin:
        try:
            await admin.delete_topics(args.topic)
            missing = []
        except AdminError as e:
            failed = {k: v for k, v in e.results.items() if isinstance(v, AdminError)}
            if not args.if_exists or any(v.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION for v in failed.values()):
                raise
            missing = list(failed)
    deleted = [t for t in args.topic if t not in missing]
    if args.json:
        print_json({"deleted": deleted, "missing": missing})
    else:
        for t in deleted:
            say(f"Deleted topic {t}.")
    return 0
