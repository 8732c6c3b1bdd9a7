"""Server-side assignor benchmark (seed 002, KIP-848 "Broker API"): how long the consumer group
coordinator takes to compute a target assignment for a large group, against a peer doing the same
job in the same run: the cooperative-sticky assignor a classic group's leader runs in our client
(`odradek.client.assignors.sticky_assign`, the algorithm of Kafka's client-side sticky assignor).

Scenarios, for 1,000 members and 10,000 partitions (10 topics of 1,000) by default:

    initial      everyone joins at once: no previous assignment
    join         one member joins a balanced group (stickiness: only its quota moves)
    leave        one member leaves a balanced group
    hetero       members subscribe to different topic subsets (initial assignment)

Each figure is the median of `--repeat` runs in milliseconds; the last column is odradek/peer.
The target is under 100 ms for `uniform` on `initial` at the default size.

    python bench/assignor_bench.py [--members 1000] [--partitions 10000] [--topics 10] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from odradek.client.assignors import Subscription, sticky_assign  # noqa: E402
from odradek.client.fetcher import TopicPartition  # noqa: E402
from odradek.coordinator.assignors_server import MemberSpec, assign  # noqa: E402


def build(members: int, partitions: int, topics: int, hetero: bool, seed: int = 7):
    rng = random.Random(seed)
    names = [f"topic-{i}" for i in range(topics)]
    ids = {n: uuid.uuid5(uuid.NAMESPACE_DNS, n) for n in names}
    per_topic = partitions // topics
    member_ids = [f"member-{i:05d}" for i in range(members)]
    subs = {m: (rng.sample(names, rng.randint(1, topics)) if hetero else names) for m in member_ids}
    server = ({m: MemberSpec(frozenset(ids[n] for n in subs[m])) for m in member_ids},
              {ids[n]: per_topic for n in names})
    client = ({n: per_topic for n in names}, {m: Subscription(tuple(subs[m])) for m in member_ids})
    return server, client, ids


def timed(fn, repeat: int) -> tuple[float, object]:
    samples, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples), out


def to_client_owned(assignment, ids) -> dict[str, tuple[TopicPartition, ...]]:
    names = {v: k for k, v in ids.items()}
    return {m: tuple(TopicPartition(names[t], p) for t, ps in parts.items() for p in ps)
            for m, parts in assignment.items()}


def run(args) -> list[tuple[str, str, float, float]]:
    rows = []
    for scenario in ("initial", "join", "leave", "hetero"):
        (members, topics), (ppt, subs), ids = build(args.members, args.partitions, args.topics, scenario == "hetero")
        current: dict = {}
        if scenario in ("join", "leave"):
            current = assign("uniform", members, topics, {})
            owned = to_client_owned(current, ids)
            subs = {m: Subscription(s.topics, owned.get(m, ()), generation_id=1) for m, s in subs.items()}
            if scenario == "join":
                members = {**members, "member-new": next(iter(members.values()))}
                subs = {**subs, "member-new": Subscription(next(iter(subs.values())).topics)}
            else:
                gone = next(iter(members))
                members = {m: s for m, s in members.items() if m != gone}
                subs = {m: s for m, s in subs.items() if m != gone}
        for name in ("uniform", "range"):
            ours, _ = timed(lambda: assign(name, members, topics, current), args.repeat)
            peer, _ = timed(lambda: sticky_assign(ppt, subs), args.repeat) if name == "uniform" else (float("nan"), None)
            rows.append((scenario, name, ours, peer))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=10000)
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{args.members} members, {args.partitions} partitions in {args.topics} topics; median of {args.repeat}")
    print(f"{'scenario':<10}{'assignor':<10}{'odradek ms':>12}{'peer ms':>12}{'ratio':>8}")
    for scenario, name, ours, peer in run(args):
        ratio = f"{ours / peer:.3f}" if peer == peer else "-"
        peer_s = f"{peer:.1f}" if peer == peer else "-"
        print(f"{scenario:<10}{name:<10}{ours:>12.1f}{peer_s:>12}{ratio:>8}")


if __name__ == "__main__":
    main()
