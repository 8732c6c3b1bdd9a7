"""`odradek cluster`: the cluster's id, its controller and its brokers.

    odradek cluster --bootstrap-server localhost:9092
    odradek cluster describe --json
"""

from __future__ import annotations

from odradek.cli.common import admin_config, connection_parent, json_parent, print_json, print_table, run


def add_parser(sub) -> None:
    conn, js = connection_parent(), json_parent()
    p = sub.add_parser("cluster", parents=[conn, js], help="the cluster id, controller and brokers",
                       description=__doc__)
    p.add_argument("action", nargs="?", choices=["describe"], default="describe",
                   help="describe (the default): the cluster id, controller and brokers")
    p.set_defaults(run=lambda a: run(a, describe))


async def describe(args) -> int:
    from odradek.client.admin import Admin

    async with Admin(admin_config(args)) as admin:
        c = await admin.describe_cluster()
    if args.json:
        print_json({"cluster_id": c.cluster_id, "controller_id": c.controller_id,
                    "brokers": [{"id": b.id, "host": b.host, "port": b.port, "rack": b.rack} for b in c.brokers]})
        return 0
    title = f"Cluster: {c.cluster_id}  Controller: {c.controller_id if c.controller_id >= 0 else 'none'}"
    print_table(["BROKER", "HOST", "PORT", "RACK", "CONTROLLER"],
                [(b.id, b.host, b.port, b.rack, "yes" if b.id == c.controller_id else "") for b in c.brokers],
                title=title)
    return 0
