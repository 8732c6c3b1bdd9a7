"""Admin handlers on a typed context of in-memory collaborators (`fakes.py`): DescribeCluster,
DescribeConfigs and IncrementalAlterConfigs, DeleteRecords, OffsetForLeaderEpoch, DescribeLogDirs and
FindCoordinator. What the wire carries is checked in tests/integration with real clients; these check
the handlers' decisions, in milliseconds."""

import asyncio

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import delete_records as dr
from odradek.protocol.messages import describe_cluster as dcl
from odradek.protocol.messages import describe_configs as dc
from odradek.protocol.messages import describe_log_dirs as dld
from odradek.protocol.messages import find_coordinator as fc
from odradek.protocol.messages import incremental_alter_configs as iac
from odradek.protocol.messages import offset_for_leader_epoch as ofle
from odradek.server.apis.admin_cluster import handle_describe_cluster
from odradek.server.apis.admin_configs import handle_describe_configs, handle_incremental_alter_configs
from odradek.server.apis.admin_logs import (
    handle_delete_records, handle_describe_log_dirs, handle_offset_for_leader_epoch,
)
from odradek.server.apis.groups import handle_find_coordinator
from tests.unit.server.fakes import batch, context, make_services, topic

TOPIC, BROKER = 2, 4
SET = 0


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_describe_cluster_lists_the_image_brokers_and_controller():
    services = make_services(brokers=(0, 1, 2))
    r = _run(handle_describe_cluster(context(services, 60, 1), dcl.DescribeClusterRequest(endpoint_type=1)))
    assert r.error_code == ErrorCode.NONE and r.cluster_id == "fake-cluster" and r.controller_id == 0
    assert [(b.broker_id, b.port) for b in r.brokers] == [(0, 9092), (1, 9093), (2, 9094)]
    r = _run(handle_describe_cluster(context(services, 60, 1), dcl.DescribeClusterRequest(endpoint_type=2)))
    assert r.error_code == ErrorCode.MISMATCHED_ENDPOINT_TYPE


def test_topic_configs_are_described_and_changed_through_the_controller():
    services = make_services(topic("cfg", configs={"retention.ms": "1000"}))
    ctx = context(services, 44, 1)
    alter = iac.IncrementalAlterConfigsRequest(validate_only=False, resources=[iac.AlterConfigsResource(
        resource_type=TOPIC, resource_name="cfg",
        configs=[iac.AlterableConfig(name="cleanup.policy", config_operation=SET, value="compact")])])
    r = _run(handle_incremental_alter_configs(ctx, alter))
    assert r.responses[0].error_code == ErrorCode.NONE
    recorded = {"retention.ms": "1000", "cleanup.policy": "compact"}
    assert services.controller.store.get("/config/topics/cfg")[0]["config"] == recorded
    assert services.metadata.topic("cfg").configs == recorded
    describe = dc.DescribeConfigsRequest(resources=[dc.DescribeConfigsResource(
        resource_type=TOPIC, resource_name="cfg", configuration_keys=["cleanup.policy", "retention.ms"])])
    r = _run(handle_describe_configs(context(services, 32, 4), describe))
    assert {c.name: c.value for c in r.results[0].configs} == {"cleanup.policy": "compact", "retention.ms": "1000"}
    missing = dc.DescribeConfigsRequest(resources=[dc.DescribeConfigsResource(
        resource_type=TOPIC, resource_name="missing", configuration_keys=None)])
    r = _run(handle_describe_configs(context(services, 32, 4), missing))
    assert r.results[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_a_dynamic_broker_config_reaches_the_image_config():
    services = make_services()
    alter = iac.IncrementalAlterConfigsRequest(validate_only=False, resources=[iac.AlterConfigsResource(
        resource_type=BROKER, resource_name="0",
        configs=[iac.AlterableConfig(name="log.retention.ms", config_operation=SET, value="5000")])])
    r = _run(handle_incremental_alter_configs(context(services, 44, 1), alter))
    assert r.responses[0].error_code == ErrorCode.NONE
    assert services.metadata.config.get("log.retention.ms") == 5000
    assert services.controller.store.get("/config/brokers/0")[0]["config"] == {"log.retention.ms": "5000"}
    other = iac.IncrementalAlterConfigsRequest(validate_only=False, resources=[iac.AlterConfigsResource(
        resource_type=BROKER, resource_name="7", configs=[])])
    assert _run(handle_incremental_alter_configs(context(services, 44, 1), other)).responses[0].error_code \
        == ErrorCode.INVALID_REQUEST


def test_delete_records_answers_each_partition():
    services = make_services(topic("d", partitions=2), topic("c", configs={"cleanup.policy": "compact"}))
    rm = services.replica_manager
    rm.append_to_leader(rm.leader_partition("d", 0), batch(b"a", b"b", b"c"), 0, log_append_time=False,
                        required_acks=1)
    request = dr.DeleteRecordsRequest(timeout_ms=1000, topics=[
        dr.DeleteRecordsTopic(name="d", partitions=[dr.DeleteRecordsPartition(partition_index=0, offset=2),
                                                    dr.DeleteRecordsPartition(partition_index=1, offset=5),
                                                    dr.DeleteRecordsPartition(partition_index=9, offset=0)]),
        dr.DeleteRecordsTopic(name="c", partitions=[dr.DeleteRecordsPartition(partition_index=0, offset=0)])])
    r = _run(handle_delete_records(context(services, 21, 2), request))
    got = {(t.name, p.partition_index): (p.error_code, p.low_watermark) for t in r.topics for p in t.partitions}
    assert got == {("d", 0): (ErrorCode.NONE, 2), ("d", 1): (ErrorCode.OFFSET_OUT_OF_RANGE, -1),
                   ("d", 9): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1), ("c", 0): (ErrorCode.POLICY_VIOLATION, -1)}


def test_offset_for_leader_epoch_fences_from_v2_only():
    services = make_services(topic("e", leader_epoch=3), topic("far", replicas=[1]), brokers=(0, 1))
    rm = services.replica_manager
    rm.append_to_leader(rm.leader_partition("e", 0), batch(b"a"), 0, log_append_time=False, required_acks=1)

    def ask(version, current, epoch, name="e"):
        request = ofle.OffsetForLeaderEpochRequest(replica_id=-1, topics=[ofle.OffsetForLeaderTopic(
            topic=name, partitions=[ofle.OffsetForLeaderPartition(partition=0, current_leader_epoch=current,
                                                                  leader_epoch=epoch)])])
        p = _run(handle_offset_for_leader_epoch(context(services, 23, version), request)).topics[0].partitions[0]
        return p.error_code, p.leader_epoch, p.end_offset

    assert ask(2, 3, 3) == (ErrorCode.NONE, 3, 1)
    assert ask(2, 2, 3)[0] == ErrorCode.FENCED_LEADER_EPOCH
    assert ask(1, 2, 3) == (ErrorCode.NONE, 3, 1)          # no current epoch before v2
    assert ask(2, -1, 3, "far")[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert ask(2, -1, 3, "gone")[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_describe_log_dirs_reports_sizes_of_the_wanted_partitions(tmp_path):
    services = make_services(topic("x", partitions=2))
    services.log_dirs.log_dirs[:] = [tmp_path]
    rm = services.replica_manager
    data = batch(b"0123456789")
    size = len(data)
    rm.append_to_leader(rm.leader_partition("x", 1), data, 0, log_append_time=False, required_acks=1)
    request = dld.DescribeLogDirsRequest(topics=[dld.DescribableLogDirTopic(topic="x", partitions=[1])])
    r = _run(handle_describe_log_dirs(context(services, 35, 4), request))
    (result,) = r.results
    assert result.error_code == ErrorCode.NONE and result.log_dir == str(tmp_path) and result.total_bytes > 0
    assert [(t.name, [(p.partition_index, p.partition_size, p.offset_lag) for p in t.partitions])
            for t in result.topics] == [("x", [(1, size, 0)])]


def test_find_coordinator_creates_the_offsets_topic_once_through_the_controller():
    services = make_services()

    async def main():
        await services.coordinators.start()
        try:
            ctx = context(services, 10, 4)
            request = fc.FindCoordinatorRequest(key_type=0, coordinator_keys=["g1", "g2"])
            r = await handle_find_coordinator(ctx, request)
            assert [(c.key, c.error_code, c.node_id, c.port) for c in r.coordinators] == [
                ("g1", ErrorCode.NONE, 0, 9092), ("g2", ErrorCode.NONE, 0, 9092)]
            r = await handle_find_coordinator(ctx, fc.FindCoordinatorRequest(key_type=5, coordinator_keys=["g"]))
            assert r.coordinators[0].error_code == ErrorCode.INVALID_REQUEST
            offsets = services.metadata.topic("__consumer_offsets")
            assert len(offsets.partitions) == 50 and offsets.configs["cleanup.policy"] == "compact"
            assert services.controller.store.exists("/brokers/topics/__consumer_offsets/partitions/49/state")
            assert services.coordinators.group is not None and services.coordinators.group.partition_count == 50
        finally:
            await services.coordinators.aclose()

    _run(main())
