"""Coordinators as replicated state machines (STYLE; DESIGN, "How data flows: Groups and transactions").

The classic group coordinator (seeds 000, 001, 004; seed 003 "Consumer Position"):

- `records`: `__consumer_offsets` keys and values in Kafka's formats, and a group's partition;
- `group`: one classic group, its members and states; `shard`: the groups of one partition, replay,
  timers as data, and the `Outcome` every operation returns;
- `rebalance`, `membership`: JoinGroup, SyncGroup, Heartbeat, LeaveGroup and timer expiry;
- `offsets`: OffsetCommit, OffsetFetch, OffsetDelete, offset retention; `admin`: List/Describe/DeleteGroups;
- consumer groups of the next-generation protocol (seed 002, KIP-848): `consumer_records` (their
  `__consumer_offsets` records), `consumer_group` (group, members, epochs, replay), `consumer_heartbeat`
  (ConsumerGroupHeartbeat, target assignment, reconciliation, timers), `assignors_server` (uniform,
  range), `consumer_admin` (ConsumerGroupDescribe, ListGroups types, deletes, member-epoch offset checks);
- `runtime`: the only I/O: loads partitions, runs operations, appends and replays their records, timers.
"""
