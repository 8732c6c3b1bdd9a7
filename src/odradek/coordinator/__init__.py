"""Coordinators as replicated state machines (STYLE; DESIGN, "How data flows: Groups and transactions").

The classic group coordinator (seeds 000, 001, 004; seed 003 "Consumer Position"):

- `records`: `__consumer_offsets` keys and values in Kafka's formats, and a group's partition;
- `group`: one classic group, its members and states; `shard`: the groups of one partition, replay,
  timers as data, and the `Outcome` every operation returns;
- `rebalance`, `membership`: JoinGroup, SyncGroup, Heartbeat, LeaveGroup and timer expiry;
- `offsets`: OffsetCommit, OffsetFetch, OffsetDelete, offset retention; `admin`: List/Describe/DeleteGroups;
- `runtime`: the only I/O: loads partitions, runs operations, appends and replays their records, timers.
"""
