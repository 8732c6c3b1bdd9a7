"""`odradek configs`: describe and alter topic and broker configs (as kafka-configs.sh).

    odradek configs describe --entity-type topics --entity-name events
    odradek configs describe --entity-type brokers --entity-name 0 --all
    odradek configs alter --entity-type topics --entity-name events --add-config retention.ms=1000,cleanup.policy=[compact,delete]
    odradek configs alter --entity-type brokers --entity-default --delete-config log.retention.ms

`describe` shows the overrides (dynamic configs) unless `--all`; `alter` uses IncrementalAlterConfigs,
so configs not named stay as they are. Values holding commas go in square brackets, as in Kafka.
"""

from __future__ import annotations

from odradek.cli.common import (
    CliError, admin_config, connection_parent, json_parent, print_json, print_table, run, say,
)

ENTITY_TYPES = {"topics": "TOPIC", "brokers": "BROKER", "broker-loggers": "BROKER_LOGGER"}


def add_parser(sub) -> None:
    conn, js = connection_parent(), json_parent()
    p = sub.add_parser("configs", help="describe and alter topic and broker configs", description=__doc__)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_ in (("describe", "show configs"), ("alter", "set or delete configs")):
        a = actions.add_parser(name, parents=[conn, js], help=help_)
        a.add_argument("--entity-type", required=True, choices=sorted(ENTITY_TYPES))
        who = a.add_mutually_exclusive_group(required=name == "alter")
        who.add_argument("--entity-name", help="a topic name or a broker id")
        who.add_argument("--entity-default", action="store_true", help="the cluster-wide broker default")
        if name == "describe":
            a.add_argument("--all", action="store_true", help="every config, not only the overrides")
            a.set_defaults(run=lambda a: run(a, describe))
        else:
            a.add_argument("--add-config", action="append", default=[], metavar="K=V[,K2=V2]",
                           help="configs to set (repeatable)")
            a.add_argument("--delete-config", action="append", default=[], metavar="K[,K2]",
                           help="configs to remove (repeatable)")
            a.set_defaults(run=lambda a: run(a, alter))


def parse_config_list(items) -> dict[str, str]:
    """Kafka's --add-config syntax: `k1=v1,k2=[a,b],k3=v3` (brackets keep commas in a value)."""
    out: dict[str, str] = {}
    for item in items or ():
        depth, start, parts = 0, 0, []
        for i, ch in enumerate(item):
            if ch == "[":
                depth += 1
            elif ch == "]":
                depth = max(0, depth - 1)
            elif ch == "," and depth == 0:
                parts.append(item[start:i])
                start = i + 1
        parts.append(item[start:])
        for part in parts:
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise CliError(f"--add-config expects KEY=VALUE[,KEY=VALUE], got {part!r}", 2)
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            out[key.strip()] = value
    return out


def _resource(args):
    from odradek.client.admin_types import ConfigResource, ResourceType

    kind = ResourceType[ENTITY_TYPES[args.entity_type]]
    if args.entity_default:
        if kind != ResourceType.BROKER:
            raise CliError("--entity-default applies to --entity-type brokers only", 2)
        return ConfigResource(kind, "")
    if args.entity_name is None:
        return None
    if kind != ResourceType.TOPIC and not args.entity_name.strip().lstrip("-").isdigit():
        raise CliError(f"--entity-name of a broker is its id, not {args.entity_name!r}", 2)
    return ConfigResource(kind, args.entity_name)


async def describe(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.admin_types import ConfigResource, ConfigSource, ResourceType

    resource = _resource(args)
    async with Admin(admin_config(args)) as admin:
        if resource is not None:
            resources = [resource]
        elif args.entity_type == "topics":
            resources = [ConfigResource.topic(t) for t in await admin.list_topics()]
        else:
            resources = [ConfigResource(ResourceType[ENTITY_TYPES[args.entity_type]], str(b.id))
                         for b in (await admin.describe_cluster()).brokers]
        if resource is not None and resource.type == ResourceType.TOPIC:
            await admin.describe_topics([resource.name])  # a clear error for an unknown topic
        found = await admin.describe_configs(resources, include_synonyms=True) if resources else {}
    shown = {}
    for r, entries in found.items():
        keep = entries.values() if args.all or r.type == ResourceType.BROKER_LOGGER else [
            e for e in entries.values() if e.source not in (ConfigSource.DEFAULT_CONFIG, ConfigSource.STATIC_BROKER_CONFIG)
            and not e.is_default]
        shown[r] = sorted(keep, key=lambda e: e.name)
    if args.json:
        print_json([{"entity_type": args.entity_type, "entity_name": r.name, "configs": [
            {"name": e.name, "value": None if e.is_sensitive else e.value, "source": e.source.name,
             "read_only": e.is_read_only, "sensitive": e.is_sensitive, "default": e.is_default} for e in es]}
            for r, es in shown.items()])
        return 0
    for r, es in shown.items():
        title = f"Configs for {_label(args.entity_type, r.name)}" + ("" if args.all else " (overrides only; --all for every config)")
        print_table(["NAME", "VALUE", "SOURCE", "READ-ONLY"],
                    [(e.name, "(sensitive)" if e.is_sensitive else e.value, e.source.name, "yes" if e.is_read_only else "")
                     for e in es], title=title)
    return 0


def _label(entity_type: str, name: str) -> str:
    if entity_type == "brokers":
        return f"broker {name}" if name else "the default broker"
    return f"{entity_type[:-1].replace('-', ' ')} {name}"


async def alter(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.admin_types import AlterConfigOp, AlterConfigOpType, ResourceType

    resource = _resource(args)
    sets = parse_config_list(args.add_config)
    deletes = [k.strip() for item in args.delete_config for k in item.split(",") if k.strip()]
    if not sets and not deletes:
        raise CliError("nothing to alter: give --add-config or --delete-config", 2)
    both = set(sets) & set(deletes)
    if both:
        raise CliError(f"both set and deleted: {', '.join(sorted(both))}", 2)
    ops = [AlterConfigOp(k, v) for k, v in sets.items()] + [
        AlterConfigOp(k, None, AlterConfigOpType.DELETE) for k in deletes]
    async with Admin(admin_config(args)) as admin:
        if resource.type == ResourceType.TOPIC:
            await admin.describe_topics([resource.name])
        await admin.incremental_alter_configs({resource: ops})
    if args.json:
        print_json({"entity_type": args.entity_type, "entity_name": resource.name, "set": sets, "deleted": deletes})
    else:
        say(f"Completed updating config for {_label(args.entity_type, resource.name)}.")
    return 0
