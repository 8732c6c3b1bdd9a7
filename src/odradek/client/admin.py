"""The asyncio admin client: Kafka's admin APIs, for any Kafka-compatible broker.

    async with Admin({"bootstrap.servers": "localhost:9092"}) as admin:
        await admin.create_topics([NewTopic("events", 6, 1, {"retention.ms": "86400000"})])
        described = await admin.describe_topics(["events"])
        await admin.incremental_alter_configs({ConfigResource.topic("events"): {"retention.ms": "1000"}})

Routing follows Kafka's AdminClient: topic creation, deletion and new partitions go to the controller
(`NOT_CONTROLLER` refreshes the metadata and retries); a broker's configs and log dirs to that broker;
topic configs and cluster questions to any broker; DeleteRecords and ListOffsets to each partition's
leader; group APIs to the group's coordinator (`admin_groups`); DescribeTransactions to each
transactional id's coordinator (`admin_transactions`). Each call is retried on lost
connections and retriable routing errors until `default.api.timeout.ms`; a broker's refusal is an
`AdminError` (see `admin_types`) with Kafka's error code and the broker's message. A broker that speaks
no version of an API raises `UnsupportedVersionError`.

Each request is built for the version negotiated with the broker it goes to, since several APIs change
shape between versions (DeleteTopics v6 names topics by id or name, OffsetFetch v8 batches groups, ...).
"""

from __future__ import annotations

import asyncio
import logging

from odradek.client.admin_groups import GroupAdminMixin
from odradek.client.admin_partitions import EARLIEST, LATEST, MAX_TIMESTAMP, PartitionAdminMixin
from odradek.client.admin_transactions import TransactionAdminMixin
from odradek.client.admin_types import (
    AdminError, AlterConfigOp, AlterConfigOpType, ClusterDescription, ConfigEntry, ConfigResource,
    ConfigSource, ConfigSynonym, ConfigType, CreatedTopic, LogDirDescription, NewTopic, Node,
    PartitionDescription, ReplicaInfo, ResourceType, Retry, TopicDescription, TopicListing, raise_first,
)
from odradek.client.cluster import Cluster, now_ms
from odradek.client.config import COMMON, ConfigDef, _int, build
from odradek.client.errors import (
    IllegalStateError, KafkaConnectionError, KafkaTimeoutError, UnsupportedVersionError,
)
from odradek.client.fetcher import TopicPartition
from odradek.protocol.api import APIS
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import alter_configs as ac
from odradek.protocol.messages import create_partitions as cp
from odradek.protocol.messages import create_topics as ct
from odradek.protocol.messages import delete_topics as dt
from odradek.protocol.messages import describe_cluster as dcl
from odradek.protocol.messages import describe_configs as dc
from odradek.protocol.messages import describe_log_dirs as dld
from odradek.protocol.messages import incremental_alter_configs as iac
from odradek.protocol.messages import metadata as md

log = logging.getLogger("odradek.client.admin")


ADMIN = COMMON + [ConfigDef("default.api.timeout.ms", _int, 60000)]


__all__ = ["Admin", "ADMIN_CALLS", "EARLIEST", "LATEST", "MAX_TIMESTAMP"]

# The calls, for the sync facade.
ADMIN_CALLS = (
    "create_topics", "delete_topics", "list_topics", "describe_topics", "create_partitions",
    "describe_configs", "alter_configs", "incremental_alter_configs", "describe_cluster", "describe_log_dirs",
    "list_offsets", "delete_records", "find_coordinator", "list_groups", "describe_groups",
    "delete_consumer_groups", "list_consumer_group_offsets", "alter_consumer_group_offsets",
    "delete_consumer_group_offsets", "describe_transactions", "end_transaction", "list_transactions",
    "describe_producers", "abort_transaction",
)


def admin_config(config: dict | None = None, **kwargs) -> dict:
    out = build(ADMIN, config, kwargs)
    out["allow.auto.create.topics"] = False   # an admin's Metadata request never creates a topic
    return out


def _resource(x) -> ConfigResource:
    r = x if isinstance(x, ConfigResource) else ConfigResource(*x)
    try:
        return ConfigResource(ResourceType(int(r.type)), str(r.name))
    except ValueError:
        return ConfigResource(r.type, str(r.name))


class Admin(PartitionAdminMixin, GroupAdminMixin, TransactionAdminMixin):
    def __init__(self, config: dict | None = None, **kwargs) -> None:
        self.config = admin_config(config, **kwargs)
        self.cluster: Cluster | None = None
        self._coordinators: dict[str, int] = {}
        self._txn_coordinators: dict[str, int] = {}

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> "Admin":
        if self.cluster is None:
            cluster = Cluster(self.config)
            try:
                await cluster.start(self.config["default.api.timeout.ms"])
            except BaseException:
                await cluster.aclose()
                raise
            self.cluster = cluster
        return self

    async def aclose(self) -> None:
        if self.cluster is not None:
            await self.cluster.aclose()

    async def __aenter__(self) -> "Admin":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------------ plumbing
    def _check_started(self) -> Cluster:
        if self.cluster is None:
            raise IllegalStateError("admin not started: await start() or use `async with`")
        if self.cluster.closed:
            raise IllegalStateError("admin is closed")
        return self.cluster

    async def _request(self, node: int, api_key: int, build_request):
        """(response, version): `build_request(version)` sent to `node` at the negotiated version."""
        conn = await self._check_started().connection(node)
        version = conn.versions.get(api_key)
        if version is None:
            name = APIS[api_key].NAME
            raise UnsupportedVersionError(f"the broker at {conn.host}:{conn.port} does not support {name} "
                                          f"(API key {api_key})")
        return await conn.request(api_key, build_request(version)), version

    def _any_node(self) -> int:
        cluster = self._check_started()
        brokers = list(cluster.metadata.brokers)
        for n in brokers:
            if cluster.connection_nowait(n) is not None:
                return n
        for n in brokers:
            if not cluster.connection_failed_recently(n):
                return n
        return -1

    def _controller(self) -> int:
        meta = self._check_started().metadata
        return meta.controller_id if meta.controller_id in meta.brokers else self._any_node()

    async def _retrying(self, what: str, attempt):
        """Run `attempt()` until it returns, retrying lost connections and `Retry` with backoff until
        `default.api.timeout.ms` has passed."""
        cluster = self._check_started()
        c = self.config
        timeout_ms = c["default.api.timeout.ms"]
        deadline = now_ms() + timeout_ms
        backoff = c["retry.backoff.ms"]
        while True:
            left = deadline - now_ms()
            try:
                async with asyncio.timeout(max(left, 1) / 1000):
                    return await attempt()
            except TimeoutError:
                raise KafkaTimeoutError(f"{what}: no answer within {timeout_ms} ms") from None
            except (KafkaConnectionError, Retry) as e:
                last = e
                if isinstance(e, KafkaConnectionError) or e.refresh:
                    cluster.request_update()
            left = deadline - now_ms()
            if left <= 0:
                raise KafkaTimeoutError(f"{what}: gave up after {timeout_ms} ms: {last}") from last
            log.debug("%s: retrying: %s", what, last)
            await asyncio.sleep(min(backoff, left) / 1000)
            backoff = min(backoff * 2, c["retry.backoff.max.ms"])
            if cluster.stale():
                try:
                    await self._metadata([])
                except (KafkaConnectionError, UnsupportedVersionError):
                    pass

    async def _metadata(self, topics: list[str] | None) -> md.MetadataResponse:
        """A Metadata request from any broker (topics None: every topic), applied to the cache."""
        def build_request(v):
            return md.MetadataRequest(
                topics=None if topics is None else [md.MetadataRequestTopic(name=t) for t in topics],
                allow_auto_topic_creation=False)
        response, _ = await self._request(self._any_node(), 3, build_request)
        self.cluster.metadata.update(response, now_ms(), None if topics is None else set(topics))
        return response

    # ------------------------------------------------------------------------------------ topics
    async def create_topics(self, topics, *, validate_only: bool = False,
                            timeout_ms: int | None = None) -> dict[str, CreatedTopic]:
        """Create topics (NewTopic, or a bare name for the broker's defaults)."""
        wanted = [t if isinstance(t, NewTopic) else NewTopic(t) for t in topics]
        timeout_ms = self.config["request.timeout.ms"] if timeout_ms is None else timeout_ms

        def build_request(v):
            out = []
            for t in wanted:
                assignments = [ct.CreatableReplicaAssignment(partition_index=p, broker_ids=list(ids))
                               for p, ids in sorted((t.replica_assignment or {}).items())]
                out.append(ct.CreatableTopic(
                    name=t.name, num_partitions=-1 if assignments else t.num_partitions,
                    replication_factor=-1 if assignments else t.replication_factor, assignments=assignments,
                    configs=[ct.CreatableTopicConfig(name=k, value=None if val is None else str(val))
                             for k, val in t.configs.items()]))
            return ct.CreateTopicsRequest(topics=out, timeout_ms=timeout_ms, validate_only=validate_only)

        async def attempt():
            response, _ = await self._request(self._controller(), 19, build_request)
            results: dict = {t.name: None for t in wanted}
            for r in response.topics:
                if r.error_code == ErrorCode.NOT_CONTROLLER:
                    raise Retry("not the controller")
                if r.error_code:
                    results[r.name] = AdminError(r.error_code, r.error_message, f"topic {r.name!r}")
                else:
                    results[r.name] = CreatedTopic(
                        r.name, r.topic_id, r.num_partitions, r.replication_factor,
                        {c.name: c.value for c in (r.configs or [])})
            return results
        return raise_first(await self._retrying("CreateTopics", attempt))

    async def delete_topics(self, topics, *, timeout_ms: int | None = None) -> dict[str, None]:
        names = list(topics)
        timeout_ms = self.config["request.timeout.ms"] if timeout_ms is None else timeout_ms

        def build_request(v):
            if v >= 6:
                return dt.DeleteTopicsRequest(topics=[dt.DeleteTopicState(name=n) for n in names],
                                              timeout_ms=timeout_ms)
            return dt.DeleteTopicsRequest(topic_names=names, timeout_ms=timeout_ms)

        async def attempt():
            response, _ = await self._request(self._controller(), 20, build_request)
            results: dict = {n: None for n in names}
            for r in response.responses:
                if r.error_code == ErrorCode.NOT_CONTROLLER:
                    raise Retry("not the controller")
                if r.error_code:
                    results[r.name] = AdminError(r.error_code, r.error_message, f"topic {r.name!r}")
            return results
        return raise_first(await self._retrying("DeleteTopics", attempt))

    async def list_topics(self, *, include_internal: bool = False) -> dict[str, TopicListing]:
        response = await self._retrying("Metadata", lambda: self._metadata(None))
        out = {}
        for t in sorted(response.topics, key=lambda t: t.name or ""):
            if t.name is None or (t.is_internal and not include_internal) or t.error_code \
                    and t.error_code != ErrorCode.LEADER_NOT_AVAILABLE:
                continue
            out[t.name] = TopicListing(t.name, t.topic_id, t.is_internal, len(t.partitions))
        return out

    async def describe_topics(self, topics) -> dict[str, TopicDescription]:
        names = list(topics)
        response = await self._retrying("Metadata", lambda: self._metadata(names))
        results: dict = {n: AdminError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, f"topic {n!r}") for n in names}
        for t in response.topics:
            if t.name not in results:
                continue
            if t.error_code and not (t.error_code == ErrorCode.LEADER_NOT_AVAILABLE and t.partitions):
                results[t.name] = AdminError(t.error_code, None, f"topic {t.name!r}")
                continue
            parts = [PartitionDescription(p.partition_index, p.leader_id, p.leader_epoch, list(p.replica_nodes),
                                          list(p.isr_nodes), list(p.offline_replicas or []))
                     for p in sorted(t.partitions, key=lambda p: p.partition_index)]
            results[t.name] = TopicDescription(t.name, t.topic_id, t.is_internal, parts)
        return raise_first(results)

    async def create_partitions(self, new_totals: dict, *, validate_only: bool = False,
                                timeout_ms: int | None = None) -> dict[str, None]:
        """Grow topics to `{topic: total partition count}` (or `{topic: (count, [[broker ids], ...])}`)."""
        timeout_ms = self.config["request.timeout.ms"] if timeout_ms is None else timeout_ms
        items = {t: (n if isinstance(n, tuple) else (n, None)) for t, n in new_totals.items()}

        def build_request(v):
            return cp.CreatePartitionsRequest(topics=[
                cp.CreatePartitionsTopic(name=t, count=count, assignments=None if assign is None else [
                    cp.CreatePartitionsAssignment(broker_ids=list(ids)) for ids in assign])
                for t, (count, assign) in items.items()], timeout_ms=timeout_ms, validate_only=validate_only)

        async def attempt():
            response, _ = await self._request(self._controller(), 37, build_request)
            results: dict = {t: None for t in items}
            for r in response.results:
                if r.error_code == ErrorCode.NOT_CONTROLLER:
                    raise Retry("not the controller")
                if r.error_code:
                    results[r.name] = AdminError(r.error_code, r.error_message, f"topic {r.name!r}")
            return results
        return raise_first(await self._retrying("CreatePartitions", attempt))

    # ------------------------------------------------------------------------------------ configs
    def _config_node(self, r: ConfigResource) -> int:
        """A broker's (or broker logger's) configs are that broker's to answer; the rest, anyone's."""
        if r.type in (ResourceType.BROKER, ResourceType.BROKER_LOGGER) and r.name.strip().lstrip("-").isdigit():
            node = int(r.name)
            if node in self._check_started().metadata.brokers:
                return node
        return self._any_node()

    async def _per_node(self, what: str, resources: list, send) -> dict:
        """Group resources by the node that must answer; `send(node, resources)` -> {resource: result}."""
        results: dict = {r: None for r in resources}

        async def attempt():
            by_node: dict[int, list] = {}
            for r in resources:
                by_node.setdefault(self._config_node(r), []).append(r)
            for node, rs in by_node.items():
                results.update(await send(node, rs))
            return results
        return raise_first(await self._retrying(what, attempt))

    async def describe_configs(self, resources, *, keys=None, include_synonyms: bool = False,
                               include_documentation: bool = False) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        rs = [_resource(r) for r in resources]

        async def send(node, group):
            def build_request(v):
                return dc.DescribeConfigsRequest(resources=[
                    dc.DescribeConfigsResource(resource_type=int(r.type), resource_name=r.name,
                                               configuration_keys=None if keys is None else list(keys))
                    for r in group], include_synonyms=include_synonyms, include_documentation=include_documentation)
            response, v = await self._request(node, 32, build_request)
            out = {}
            for res in response.results:
                r = _resource((res.resource_type, res.resource_name))
                if res.error_code:
                    out[r] = AdminError(res.error_code, res.error_message, r)
                else:
                    out[r] = {c.name: _config_entry(c, v) for c in res.configs}
            return out
        return await self._per_node("DescribeConfigs", rs, send)

    async def alter_configs(self, configs: dict, *, validate_only: bool = False) -> dict[ConfigResource, None]:
        """Legacy AlterConfigs: replace each resource's whole set of overrides with `{name: value}`."""
        items = {_resource(r): dict(c) for r, c in configs.items()}

        async def send(node, group):
            def build_request(v):
                return ac.AlterConfigsRequest(resources=[
                    ac.AlterConfigsResource(resource_type=int(r.type), resource_name=r.name, configs=[
                        ac.AlterableConfig(name=k, value=None if val is None else str(val))
                        for k, val in items[r].items()]) for r in group], validate_only=validate_only)
            response, _ = await self._request(node, 33, build_request)
            return _alter_results(response.responses)
        return await self._per_node("AlterConfigs", list(items), send)

    async def incremental_alter_configs(self, changes: dict, *, validate_only: bool = False
                                        ) -> dict[ConfigResource, None]:
        """`{resource: [AlterConfigOp, ...]}`, or `{resource: {name: value}}` where None deletes."""
        items = {_resource(r): _ops(c) for r, c in changes.items()}

        async def send(node, group):
            def build_request(v):
                return iac.IncrementalAlterConfigsRequest(resources=[
                    iac.AlterConfigsResource(resource_type=int(r.type), resource_name=r.name, configs=[
                        iac.AlterableConfig(name=op.name, config_operation=int(op.op),
                                            value=None if op.value is None else str(op.value))
                        for op in items[r]]) for r in group], validate_only=validate_only)
            response, _ = await self._request(node, 44, build_request)
            return _alter_results(response.responses)
        return await self._per_node("IncrementalAlterConfigs", list(items), send)

    # ------------------------------------------------------------------------------------ cluster
    async def describe_cluster(self) -> ClusterDescription:
        async def attempt():
            node = self._any_node()
            conn = await self.cluster.connection(node)
            if 60 not in conn.versions:   # before KIP-700: Metadata says the same
                r = await self._metadata([])
                return ClusterDescription(r.cluster_id, r.controller_id,
                                          [Node(b.node_id, b.host, b.port, b.rack) for b in r.brokers])
            response, _ = await self._request(node, 60, lambda v: dcl.DescribeClusterRequest(endpoint_type=1))
            if response.error_code:
                raise AdminError(response.error_code, response.error_message, "cluster")
            return ClusterDescription(response.cluster_id, response.controller_id,
                                      [Node(b.broker_id, b.host, b.port, b.rack) for b in response.brokers])
        out = await self._retrying("DescribeCluster", attempt)
        out.brokers.sort(key=lambda n: n.id)
        return out

    async def describe_log_dirs(self, brokers=None, topics=None) -> dict[int, dict[str, LogDirDescription]]:
        """Each broker's log dirs and the replicas in them (`topics`: {topic: [partitions]} or all)."""
        cluster = self._check_started()
        ids = sorted(cluster.metadata.brokers) if brokers is None else [int(b) for b in brokers]

        def build_request(v):
            return dld.DescribeLogDirsRequest(topics=None if topics is None else [
                dld.DescribableLogDirTopic(topic=t, partitions=list(ps)) for t, ps in topics.items()])

        out = {}
        for node in ids:
            async def attempt(node=node):
                response, v = await self._request(node, 35, build_request)
                if v >= 3 and response.error_code:
                    raise AdminError(response.error_code, None, f"broker {node}")
                dirs = {}
                for d in response.results:
                    replicas = {TopicPartition(t.name, p.partition_index):
                                ReplicaInfo(p.partition_size, p.offset_lag, p.is_future_key)
                                for t in d.topics for p in t.partitions}
                    dirs[d.log_dir] = LogDirDescription(d.log_dir, ErrorCode(d.error_code), replicas,
                                                        d.total_bytes, d.usable_bytes)
                return dirs
            out[node] = await self._retrying(f"DescribeLogDirs (broker {node})", attempt)
        return out

# ------------------------------------------------------------------------------------------ helpers
def _config_entry(c, version: int) -> ConfigEntry:
    if version >= 1 and c.config_source >= 0:
        try:
            source = ConfigSource(c.config_source)
        except ValueError:
            source = ConfigSource.UNKNOWN
        is_default = source == ConfigSource.DEFAULT_CONFIG
    else:
        is_default = bool(c.is_default)
        source = ConfigSource.DEFAULT_CONFIG if is_default else ConfigSource.UNKNOWN
    synonyms = [ConfigSynonym(s.name, s.value, _source(s.source)) for s in (c.synonyms or [])] if version >= 1 else []
    ctype = ConfigType.UNKNOWN
    if version >= 3:
        try:
            ctype = ConfigType(c.config_type)
        except ValueError:
            pass
    return ConfigEntry(c.name, c.value, source, c.read_only, c.is_sensitive, is_default, synonyms, ctype,
                       c.documentation if version >= 3 else None)


def _source(code: int) -> ConfigSource:
    try:
        return ConfigSource(code)
    except ValueError:
        return ConfigSource.UNKNOWN


def _ops(changes) -> list[AlterConfigOp]:
    if isinstance(changes, dict):
        return [AlterConfigOp(k, None, AlterConfigOpType.DELETE) if v is None else AlterConfigOp(k, str(v))
                for k, v in changes.items()]
    return [op if isinstance(op, AlterConfigOp) else AlterConfigOp(*op) for op in changes]


def _alter_results(responses) -> dict:
    out = {}
    for res in responses:
        r = _resource((res.resource_type, res.resource_name))
        out[r] = AdminError(res.error_code, res.error_message, r) if res.error_code else None
    return out
