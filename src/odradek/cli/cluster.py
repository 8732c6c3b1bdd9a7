"""`odradek cluster`: describe a cluster, or run a local one for development.

    odradek cluster describe [--json]          the cluster id, the controller, the brokers, and the
                                               under-replicated and offline partitions
    odradek cluster up --brokers 3 [--dir D] [--base-port P] [--override KEY=VALUE ...]

`up` starts a ZooKeeper server and N brokers (`odradek serve` with broker.id 0..N-1, each with its own
log dir under D and a listener on 127.0.0.1), waits until every broker is registered, prints their
addresses and the bootstrap servers, and runs until Ctrl-C or SIGTERM; then it stops the brokers
(SIGTERM, a controlled shutdown each, the controller last) and ZooKeeper last. A broker that exits on its
own is reported. Without --dir the cluster lives in a new temporary directory, removed after a clean
stop; with --dir its data stays, and `up` on the same directory starts the same cluster again.
Exit status: 0 when every process stopped cleanly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from odradek.cli.common import (
    CliError, admin_config, connection_parent, json_parent, non_negative_int, parse_key_values, positive_int,
    print_json, print_table, run, say,
)
from odradek.cli import partition_status

UP_ONLY = ("brokers", "dir", "base_port", "zookeeper_port", "override")


def add_parser(sub) -> None:
    conn, js = connection_parent(), json_parent()
    p = sub.add_parser("cluster", parents=[conn, js], help="describe a cluster, or run a local one",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["describe", "up"], default="describe",
                   help="describe (the default): brokers, controller and partitions that lack replicas; "
                        "up: run a local cluster until Ctrl-C")
    g = p.add_argument_group("up")
    g.add_argument("--brokers", type=positive_int, default=None, metavar="N", help="how many brokers (default 3)")
    g.add_argument("--dir", default=None, metavar="DIR",
                   help="where the cluster keeps its data and logs (default: a new temporary directory)")
    g.add_argument("--base-port", type=non_negative_int, default=None, metavar="PORT",
                   help="broker i listens on PORT+i (default: ports the system picks)")
    g.add_argument("--zookeeper-port", type=non_negative_int, default=None, metavar="PORT",
                   help="ZooKeeper's port (default: one the system picks)")
    g.add_argument("--override", action="append", default=None, metavar="KEY=VALUE",
                   help="a broker config for every broker (repeatable)")
    p.set_defaults(run=_dispatch)


def _dispatch(args) -> int:
    if args.action == "up":
        return up(args)
    given = [f"--{name.replace('_', '-')}" for name in UP_ONLY if getattr(args, name) is not None]
    if given:
        print(f"odradek cluster: error: {', '.join(given)}: only for `cluster up`", file=sys.stderr)
        return 2
    return run(args, describe)


# ------------------------------------------------------------------------------------------ describe
async def describe(args) -> int:
    from odradek.client.admin import Admin

    async with Admin(admin_config(args)) as admin:
        c = await admin.describe_cluster()
        names = list(await admin.list_topics(include_internal=True))
        topics = await admin.describe_topics(names) if names else {}
    live = {b.id for b in c.brokers}
    under, offline = [], []
    partitions = 0
    for name, t in sorted(topics.items()):
        for p in t.partitions:
            partitions += 1
            row = {"topic": name, "partition": p.partition, "leader": p.leader, "replicas": p.replicas,
                   "isr": p.isr, "offline_replicas": p.offline_replicas}
            if partition_status.under_replicated(p):
                under.append(row)
            if partition_status.offline(p):
                offline.append(row)
    missing = sorted({r for t in topics.values() for p in t.partitions for r in p.replicas} - live)
    if args.json:
        print_json({"cluster_id": c.cluster_id, "controller_id": c.controller_id,
                    "brokers": [{"id": b.id, "host": b.host, "port": b.port, "rack": b.rack} for b in c.brokers],
                    "topics": len(topics), "partitions": partitions,
                    "under_replicated_partitions": under, "offline_partitions": offline,
                    "replicas_on_missing_brokers": missing})
        return 0
    title = f"Cluster: {c.cluster_id}  Controller: {c.controller_id if c.controller_id >= 0 else 'none'}"
    print_table(["BROKER", "HOST", "PORT", "RACK", "CONTROLLER"],
                [(b.id, b.host, b.port, b.rack, "yes" if b.id == c.controller_id else "") for b in c.brokers],
                title=title)
    summary = (f"Topics: {len(topics)}  Partitions: {partitions}  Under-replicated: {len(under)}  "
               f"Offline: {len(offline)}")
    if missing:
        summary += f"  Replicas on brokers not in the cluster: {_ids(missing)}"
    say(summary)
    for label, rows in (("Under-replicated partitions", under), ("Offline partitions", offline)):
        if rows:
            print_table(["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR"],
                        [(r["topic"], r["partition"], "none" if r["leader"] < 0 else r["leader"],
                          _ids(r["replicas"]), _ids(r["isr"])) for r in rows], title=f"{label}:")
    return 0


def _ids(ids) -> str:
    return ",".join(map(str, ids))


# ------------------------------------------------------------------------------------------ up
def _line(text: str) -> None:
    print(text, flush=True)


def up(args) -> int:
    from odradek.cli.local_cluster import ClusterError, LocalCluster

    try:
        overrides = parse_key_values(args.override or [], "--override")
    except CliError as e:
        print(f"odradek cluster: error: {e}", file=sys.stderr)
        return e.status
    temporary = args.dir is None
    base = Path(tempfile.mkdtemp(prefix="odradek-cluster-")) if temporary else Path(args.dir).resolve()
    size = args.brokers or 3
    _line(f"Cluster directory: {base}")
    cluster = LocalCluster(base, size, base_port=args.base_port or 0, zookeeper_port=args.zookeeper_port or 0,
                           overrides=overrides, progress=_line)
    stop = threading.Event()

    def interrupt(signum, _frame):      # while starting or stopping: stop waiting at once
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            cluster.start()
        except ClusterError as e:
            print(f"odradek cluster: error: {e}", file=sys.stderr)
            cluster.kill_all()
            _line(f"Data and logs are in {base}")
            return 1
        except KeyboardInterrupt:
            _line("Interrupted while starting; stopping what started")
            return _stop(cluster, base, temporary, unexpected=False)
        _print_running(cluster)
        for s in previous:
            signal.signal(s, lambda signum, _frame: stop.set())
        unexpected = _supervise(cluster, stop)
        for s in previous:
            signal.signal(s, interrupt)
        _line("Stopping the cluster")
        return _stop(cluster, base, temporary, unexpected)
    except KeyboardInterrupt:
        _line("Interrupted again: killing every process")
        cluster.kill_all()
        return 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _print_running(cluster) -> None:
    controller = cluster.controller_id()
    print_table(["BROKER", "ADDRESS", "PID", "CONTROLLER", "LOG DIR"],
                [(b.broker_id, b.address, b.pid, "yes" if b.broker_id == controller else "", b.data_dir)
                 for b in cluster.brokers],
                title=f"{cluster.size} broker(s) running, ZooKeeper on {cluster.zookeeper_connect}")
    _line(f"Bootstrap: {cluster.bootstrap}")
    _line("Press Ctrl-C to stop the cluster.")


def _supervise(cluster, stop: threading.Event) -> bool:
    """Until `stop` is set: report brokers (and ZooKeeper) that exit on their own. True if any did."""
    unexpected = False
    while not stop.wait(0.2):
        for b in cluster.unexpected_exits():
            unexpected = True
            print(f"odradek cluster: broker {b.broker_id} (pid {b.pid}) exited unexpectedly with status "
                  f"{b.returncode}; last lines of {b.log_path}:\n{b.log_tail()}", file=sys.stderr, flush=True)
        if cluster.zookeeper_exited():
            unexpected = True
            print(f"odradek cluster: ZooKeeper exited unexpectedly; see {cluster.zookeeper.log_path}",
                  file=sys.stderr, flush=True)
    return unexpected


def _stop(cluster, base: Path, temporary: bool, unexpected: bool) -> int:
    t0 = time.monotonic()
    report = cluster.stop()
    for broker_id, what in sorted(report.failed.items()):
        print(f"odradek cluster: broker {broker_id} {what}", file=sys.stderr)
    if report.zookeeper != "stopped":
        print(f"odradek cluster: ZooKeeper {report.zookeeper}", file=sys.stderr)
    ok = report.ok and not unexpected
    _line(f"Cluster stopped in {time.monotonic() - t0:.1f} s" + ("" if ok else " (with problems; see above)"))
    if temporary and ok:
        shutil.rmtree(base, ignore_errors=True)
        _line(f"Removed {base}")
    else:
        _line(f"Data and logs are in {base}")
    return 0 if ok else 1
