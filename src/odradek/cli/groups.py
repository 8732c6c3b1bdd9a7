"""`odradek groups`: list, describe (with lag), reset offsets of and delete consumer groups (as
kafka-consumer-groups.sh). A group of the consumer protocol (KIP-848) is described with its group
epoch, target assignment epoch and the assignor that computed the target, and each member's epoch, current and target
assignment (ConsumerGroupDescribe); a classic group with DescribeGroups.

    odradek groups list
    odradek groups describe --group readers
    odradek groups reset-offsets --group readers --topic events --to-earliest            # dry run
    odradek groups reset-offsets --group readers --topic events:0,1 --shift-by -10 --execute
    odradek groups delete --group readers
    odradek groups delete-offsets --group readers --topic events

Offsets are reset only for a group without members (Empty, or one that does not exist yet): a live
consumer would overwrite them. Without --execute, reset-offsets shows the plan and changes nothing.
Offsets are kept between the partition's earliest and latest offsets, as Kafka does.
"""

from __future__ import annotations

import sys

from odradek.cli.common import (
    CliError, admin_config, connection_parent, json_parent, print_json, print_table, run, say,
)
from odradek.cli.formats import FormatError, parse_timestamp

INACTIVE_STATES = ("Empty", "Dead")


def add_parser(sub) -> None:
    conn, js = connection_parent(), json_parent()
    p = sub.add_parser("groups", help="list, describe, reset offsets of and delete consumer groups",
                       description=__doc__)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    ls = actions.add_parser("list", parents=[conn, js], help="list consumer groups")
    ls.add_argument("--state", action="append", default=[], help="only groups in this state (repeatable)")
    ls.set_defaults(run=lambda a: run(a, list_))

    d = actions.add_parser("describe", parents=[conn, js], help="state, members, committed offsets and lag")
    d.add_argument("--group", action="append", required=True, help="a group (repeatable)")
    d.set_defaults(run=lambda a: run(a, describe))

    r = actions.add_parser("reset-offsets", parents=[conn, js], help="move a group's committed offsets")
    r.add_argument("--group", required=True)
    scope = r.add_mutually_exclusive_group(required=True)
    scope.add_argument("--topic", action="append", metavar="TOPIC[:P,P]", help="a topic, or some of its partitions")
    scope.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument("--to-earliest", action="store_true")
    how.add_argument("--to-latest", action="store_true")
    how.add_argument("--to-current", action="store_true")
    how.add_argument("--to-offset", type=int, metavar="OFFSET")
    how.add_argument("--shift-by", type=int, metavar="N", help="move by N (negative: back)")
    how.add_argument("--to-datetime", metavar="WHEN", help="ms since the epoch or ISO 8601, e.g. 2024-05-01T12:00:00")
    run_mode = r.add_mutually_exclusive_group()
    run_mode.add_argument("--dry-run", action="store_true", help="show the new offsets only (the default)")
    run_mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    r.set_defaults(run=lambda a: run(a, reset_offsets))

    rm = actions.add_parser("delete", parents=[conn, js], help="delete consumer groups (must be empty)")
    rm.add_argument("--group", action="append", required=True, help="a group (repeatable)")
    rm.set_defaults(run=lambda a: run(a, delete))

    do = actions.add_parser("delete-offsets", parents=[conn, js], help="forget a group's offsets of a topic")
    do.add_argument("--group", required=True)
    do.add_argument("--topic", action="append", required=True, metavar="TOPIC[:P,P]")
    do.set_defaults(run=lambda a: run(a, delete_offsets))


def parse_topic_spec(text: str) -> tuple[str, list[int] | None]:
    """`events` -> ("events", None); `events:0,2` -> ("events", [0, 2])."""
    topic, sep, parts = text.rpartition(":") if ":" in text else (text, "", "")
    if not sep:
        return text, None
    try:
        partitions = sorted({int(p) for p in parts.split(",") if p.strip()})
    except ValueError:
        raise CliError(f"--topic expects TOPIC or TOPIC:P,P, got {text!r}", 2) from None
    if not topic or not partitions or partitions[0] < 0:
        raise CliError(f"--topic expects TOPIC or TOPIC:P,P, got {text!r}", 2)
    return topic, partitions


def lag_rows(committed: dict, ends: dict, members) -> list[dict]:
    """One row per partition that is committed or assigned: offsets, lag and owner (Kafka's describe)."""
    owner = {tp: m for m in members for tp in m.assignment}
    rows = []
    for tp in sorted(set(committed) | set(owner)):
        c = committed.get(tp)
        offset = c.offset if c is not None else None
        end = ends.get(tp)
        m = owner.get(tp)
        rows.append({"topic": tp.topic, "partition": tp.partition, "current_offset": offset, "log_end_offset": end,
                     "lag": None if offset is None or end is None else max(0, end - offset),
                     "consumer_id": m.member_id if m else None, "host": m.client_host if m else None,
                     "client_id": m.client_id if m else None})
    return rows


def plan_reset(args, partitions, committed: dict, earliest: dict, latest: dict, by_time: dict) -> dict:
    """{tp: new offset} for the strategy in `args`, kept within [earliest, latest]."""
    out = {}
    for tp in partitions:
        low, high = earliest[tp], latest[tp]
        current = committed.get(tp)
        if args.to_earliest:
            target = low
        elif args.to_latest:
            target = high
        elif args.to_current:
            if current is None:
                raise CliError(f"group has no committed offset for {tp.topic}-{tp.partition}")
            target = current
        elif args.to_offset is not None:
            target = args.to_offset
        elif args.shift_by is not None:
            if current is None:
                raise CliError(f"group has no committed offset for {tp.topic}-{tp.partition} to shift from")
            target = current + args.shift_by
        else:
            found = by_time.get(tp)
            target = high if found is None or found.offset < 0 else found.offset
        out[tp] = min(max(target, low), high)
    return out


async def _group(admin, group_id: str):
    """The group's description, or None when it does not exist."""
    from odradek.client.admin_types import AdminError
    from odradek.protocol.error_codes import ErrorCode

    try:
        g = (await admin.describe_groups([group_id]))[group_id]
    except AdminError as e:
        if e.code == ErrorCode.GROUP_ID_NOT_FOUND:
            return None
        raise
    return None if g.state == "Dead" else g


async def list_(args) -> int:
    from odradek.client.admin import Admin

    async with Admin(admin_config(args)) as admin:
        groups = await admin.list_groups(states=args.state or None)
    if args.json:
        print_json([{"group": g.group_id, "state": g.state, "type": g.type, "protocol_type": g.protocol_type}
                    for g in groups])
    else:
        print_table(["GROUP", "STATE", "TYPE", "PROTOCOL-TYPE"],
                    [(g.group_id, g.state, g.type, g.protocol_type) for g in groups])
    return 0


async def _end_offsets(admin, tps) -> dict:
    from odradek.client.admin import LATEST
    from odradek.client.admin_types import AdminError

    try:
        found = await admin.list_offsets({tp: LATEST for tp in tps}) if tps else {}
    except AdminError as e:   # a deleted topic: no end offset for its partitions
        found = {tp: v for tp, v in e.results.items() if not isinstance(v, AdminError)}
    return {tp: o.offset for tp, o in found.items() if o is not None}


async def _consumer_protocol_group(admin, group_id: str):
    """The group's ConsumerGroupDescribe answer, or None for a classic or unknown group (or a broker
    without the consumer protocol)."""
    from odradek.client.admin_types import AdminError
    from odradek.client.errors import UnsupportedVersionError
    from odradek.protocol.error_codes import ErrorCode

    try:
        return (await admin.describe_consumer_protocol_groups([group_id]))[group_id]
    except AdminError as e:
        if e.code == ErrorCode.GROUP_ID_NOT_FOUND:
            return None
        raise
    except UnsupportedVersionError:
        return None


async def describe(args) -> int:
    from odradek.client.admin import Admin

    out = []
    async with Admin(admin_config(args)) as admin:
        for group_id in args.group:
            modern = await _consumer_protocol_group(admin, group_id)
            g = modern if modern is not None else await _group(admin, group_id)
            if g is None:
                raise CliError(f"consumer group {group_id!r} does not exist")
            committed = await admin.list_consumer_group_offsets(group_id)
            members = g.members
            tps = sorted(set(committed) | {tp for m in members for tp in m.assignment})
            rows = lag_rows(committed, await _end_offsets(admin, tps), members)
            if modern is not None:
                out.append({"group": group_id, "type": "consumer", "state": modern.state,
                            "group_epoch": modern.group_epoch, "assignment_epoch": modern.assignment_epoch,
                            "assignor": modern.assignor, "coordinator": modern.coordinator,
                            "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                                         "member_epoch": m.member_epoch, "client_id": m.client_id,
                                         "host": m.client_host, "subscribed_topics": m.subscribed_topic_names,
                                         "subscribed_regex": m.subscribed_topic_regex,
                                         "assignment": [[tp.topic, tp.partition] for tp in m.assignment],
                                         "target_assignment": [[tp.topic, tp.partition] for tp in m.target_assignment]}
                                        for m in modern.members],
                            "offsets": rows})
                continue
            out.append({"group": group_id, "type": "classic", "state": g.state, "protocol_type": g.protocol_type,
                        "protocol": g.protocol, "coordinator": g.coordinator,
                        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                                     "client_id": m.client_id, "host": m.client_host,
                                     "assignment": [[tp.topic, tp.partition] for tp in m.assignment]}
                                    for m in members],
                        "offsets": rows})
    if args.json:
        print_json(out)
        return 0
    for g in out:
        if g["type"] == "consumer":
            title = (f"Group: {g['group']}  Type: consumer  State: {g['state']}  Members: {len(g['members'])}  "
                     f"Group epoch: {g['group_epoch']}  Assignment epoch: {g['assignment_epoch']}  "
                     f"Assignor: {g['assignor']}  Coordinator: {g['coordinator']}")
        else:
            title = (f"Group: {g['group']}  State: {g['state']}  Members: {len(g['members'])}  "
                     f"Coordinator: {g['coordinator']}  Protocol: {g['protocol'] or '-'}")
        print_table(["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                     "CLIENT-ID"],
                    [(r["topic"], r["partition"], r["current_offset"], r["log_end_offset"], r["lag"], r["consumer_id"],
                      r["host"], r["client_id"]) for r in g["offsets"]], title=title)
        if g["members"] and g["type"] == "consumer":
            print_table(["CONSUMER-ID", "HOST", "CLIENT-ID", "MEMBER-EPOCH", "ASSIGNMENT", "TARGET-ASSIGNMENT"],
                        [(m["member_id"], m["host"], m["client_id"], m["member_epoch"],
                          ",".join(f"{t}-{p}" for t, p in m["assignment"]) or "-",
                          ",".join(f"{t}-{p}" for t, p in m["target_assignment"]) or "-") for m in g["members"]])
        elif g["members"]:
            print_table(["CONSUMER-ID", "HOST", "CLIENT-ID", "PARTITIONS"],
                        [(m["member_id"], m["host"], m["client_id"],
                          ",".join(f"{t}-{p}" for t, p in m["assignment"]) or "-") for m in g["members"]])
    return 0


async def _partitions(admin, args, committed) -> list:
    from odradek.client.fetcher import TopicPartition

    if args.all_topics:
        if not committed:
            raise CliError(f"group {args.group!r} has no committed offsets; name the topics with --topic")
        return sorted(committed)
    specs = [parse_topic_spec(t) for t in args.topic]
    described = await admin.describe_topics(sorted({t for t, _ in specs}))
    out = set()
    for topic, parts in specs:
        have = [p.partition for p in described[topic].partitions]
        for p in parts if parts is not None else have:
            if p not in have:
                raise CliError(f"topic {topic} has no partition {p}")
            out.add(TopicPartition(topic, p))
    return sorted(out)


async def reset_offsets(args) -> int:
    from odradek.client.admin import EARLIEST, LATEST, Admin

    by_time_ms = None
    if args.to_datetime is not None:
        try:
            by_time_ms = parse_timestamp(args.to_datetime)
        except FormatError as e:
            raise CliError(str(e), 2) from None
    async with Admin(admin_config(args)) as admin:
        g = await _group(admin, args.group)
        if g is not None and (g.members or g.state not in INACTIVE_STATES):
            raise CliError(f"consumer group {args.group!r} is not empty (state {g.state}, {len(g.members)} "
                           f"members): stop its consumers before resetting offsets")
        committed = {tp: o.offset for tp, o in (await admin.list_consumer_group_offsets(args.group)).items()
                     if o is not None}
        tps = await _partitions(admin, args, committed)
        earliest = {tp: o.offset for tp, o in (await admin.list_offsets({tp: EARLIEST for tp in tps})).items()}
        latest = {tp: o.offset for tp, o in (await admin.list_offsets({tp: LATEST for tp in tps})).items()}
        by_time = await admin.list_offsets({tp: by_time_ms for tp in tps}) if by_time_ms is not None else {}
        plan = plan_reset(args, tps, committed, earliest, latest, by_time)
        if args.execute:
            await admin.alter_consumer_group_offsets(args.group, plan)
    if args.json:
        print_json({"group": args.group, "executed": bool(args.execute), "offsets": [
            {"topic": tp.topic, "partition": tp.partition, "previous_offset": committed.get(tp), "new_offset": o}
            for tp, o in plan.items()]})
    else:
        print_table(["GROUP", "TOPIC", "PARTITION", "PREVIOUS-OFFSET", "NEW-OFFSET"],
                    [(args.group, tp.topic, tp.partition, committed.get(tp), o) for tp, o in plan.items()])
    if not args.execute:
        print("Dry run: no offsets were changed; add --execute to commit them.", file=sys.stderr)
    return 0


async def delete(args) -> int:
    from odradek.client.admin import Admin

    async with Admin(admin_config(args)) as admin:
        await admin.delete_consumer_groups(args.group)
    if args.json:
        print_json({"deleted": args.group})
    else:
        say(f"Deleted consumer groups: {', '.join(args.group)}.")
    return 0


async def delete_offsets(args) -> int:
    from odradek.client.admin import Admin

    async with Admin(admin_config(args)) as admin:
        committed = await admin.list_consumer_group_offsets(args.group) if await _group(admin, args.group) else None
        if committed is None:
            raise CliError(f"consumer group {args.group!r} does not exist")
        tps = []
        for topic, parts in (parse_topic_spec(t) for t in args.topic):
            if parts is None:
                parts = sorted({tp.partition for tp in committed if tp.topic == topic})
                if not parts:
                    parts = [p.partition for p in (await admin.describe_topics([topic]))[topic].partitions]
            tps += [(topic, p) for p in parts]
        await admin.delete_consumer_group_offsets(args.group, tps)
    if args.json:
        print_json({"group": args.group, "deleted": [[t, p] for t, p in tps]})
    else:
        say(f"Deleted the offsets of group {args.group} for {', '.join(f'{t}-{p}' for t, p in tps)}.")
    return 0
