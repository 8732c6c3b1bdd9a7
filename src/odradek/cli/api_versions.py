"""`odradek broker-api-versions`: each broker's API keys and version ranges, and the version this
client would use, in the format of Kafka's kafka-broker-api-versions.sh (NodeApiVersions.toString):

    odradek broker-api-versions --bootstrap-server localhost:9092
    odradek broker-api-versions --bootstrap-server localhost:9092 --json

    localhost:9092 (id: 0 rack: null) -> (
    	Produce(0): 3 to 12 [usable: 12],
    	...
    	SaslHandshake(17): UNSUPPORTED,
    	...
    )

A range the broker serves is followed by `[usable: V]` (the highest version both sides speak) or
`[unusable: node too old]` / `[unusable: node too new]`; an API this client knows and the broker does
not list is `UNSUPPORTED`; a key this client does not know is `UNKNOWN(key)`.
"""

from __future__ import annotations

from odradek.cli.common import admin_config, connection_parent, json_parent, print_json, run


def add_parser(sub) -> None:
    p = sub.add_parser("broker-api-versions", parents=[connection_parent(), json_parent()],
                       help="each broker's API versions (as kafka-broker-api-versions.sh)", description=__doc__)
    p.set_defaults(run=lambda a: run(a, api_versions))


def api_version_lines(broker: dict[int, tuple[int, int]], ours: dict[int, tuple[int, int]],
                      names: dict[int, str]) -> list[str]:
    """One entry per API key, in key order, as Kafka's NodeApiVersions.toString words them."""
    out = []
    for key in sorted(set(broker) | set(ours)):
        if key not in broker:
            out.append(f"{names.get(key, f'UNKNOWN({key})')}({key}): UNSUPPORTED")
            continue
        low, high = broker[key]
        text = (f"{names[key]}({key}): " if key in names else f"UNKNOWN({key}): ") + (
            str(low) if low == high else f"{low} to {high}")
        if key in ours:
            our_low, our_high = ours[key]
            if our_high < low:
                text += " [unusable: node too new]"
            elif high < our_low:
                text += " [unusable: node too old]"
            else:
                text += f" [usable: {min(our_high, high)}]"
        out.append(text)
    return out


async def api_versions(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.connection import client_versions
    from odradek.protocol.messages import API_NAMES

    ours = client_versions()
    nodes = []
    async with Admin(admin_config(args)) as admin:
        for b in (await admin.describe_cluster()).brokers:
            conn = await admin.cluster.connection(b.id)
            nodes.append((b, dict(conn.conn.broker_ranges)))
    if args.json:
        print_json([{"id": b.id, "host": b.host, "port": b.port, "rack": b.rack,
                     "apis": [{"api_key": k, "name": API_NAMES.get(k), "min_version": lo, "max_version": hi,
                               "usable_version": _usable(ours.get(k), (lo, hi))}
                              for k, (lo, hi) in sorted(ranges.items())]}
                    for b, ranges in nodes])
        return 0
    for b, ranges in nodes:
        lines = api_version_lines(ranges, ours, API_NAMES)
        rack = "null" if b.rack is None else b.rack
        print(f"{b.host}:{b.port} (id: {b.id} rack: {rack}) -> (\n\t" + ",\n\t".join(lines) + "\n)")
    return 0


def _usable(ours: tuple[int, int] | None, theirs: tuple[int, int]) -> int | None:
    if ours is None or ours[1] < theirs[0] or theirs[1] < ours[0]:
        return None
    return min(ours[1], theirs[1])
