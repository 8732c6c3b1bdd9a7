"""The dispatch table: API key -> handler (STYLE, "One module per API family")."""

from odradek.server.dispatch import HandlerFn

from odradek.server.apis.admin_cluster import handle_describe_cluster
from odradek.server.apis.admin_configs import (
    handle_alter_configs, handle_describe_configs, handle_incremental_alter_configs,
)
from odradek.server.apis.admin_logs import (
    handle_alter_replica_log_dirs, handle_delete_records, handle_describe_log_dirs, handle_offset_for_leader_epoch,
)
from odradek.server.apis.admin_topics import (
    handle_create_partitions, handle_create_topics, handle_delete_topics, handle_describe_topic_partitions,
)
from odradek.server.apis.api_versions import handle_api_versions
from odradek.server.apis.consumer_group_assign import (
    handle_consumer_group_install_assignment, handle_consumer_group_prepare_assignment,
)
from odradek.server.apis.consumer_group_heartbeat import (
    handle_consumer_group_describe, handle_consumer_group_heartbeat,
)
from odradek.server.apis.fetch import handle_fetch
from odradek.server.apis.inter_broker import (
    handle_controlled_shutdown, handle_leader_and_isr, handle_stop_replica, handle_update_metadata,
)
from odradek.server.apis.groups import (
    handle_delete_groups, handle_describe_groups, handle_find_coordinator, handle_heartbeat, handle_join_group,
    handle_leave_group, handle_list_groups, handle_sync_group,
)
from odradek.server.apis.leaders import handle_elect_leaders
from odradek.server.apis.list_offsets import handle_list_offsets
from odradek.server.apis.metadata import handle_metadata
from odradek.server.apis.offsets import handle_offset_commit, handle_offset_delete, handle_offset_fetch
from odradek.server.apis.produce import handle_produce
from odradek.server.apis.reassignments import (
    handle_alter_partition_reassignments, handle_list_partition_reassignments,
)
from odradek.server.apis.producer_ids import handle_init_producer_id
from odradek.server.apis.sasl import handle_sasl_authenticate, handle_sasl_handshake
from odradek.server.apis.transactions_admin import (
    handle_describe_producers, handle_describe_transactions, handle_list_transactions,
)
from odradek.server.apis.transactions import (
    handle_add_offsets_to_txn, handle_add_partitions_to_txn, handle_end_txn, handle_txn_offset_commit,
    handle_write_txn_markers,
)

HANDLERS: dict[int, HandlerFn] = {
    0: handle_produce,
    1: handle_fetch,
    2: handle_list_offsets,
    3: handle_metadata,
    4: handle_leader_and_isr,
    5: handle_stop_replica,
    6: handle_update_metadata,
    7: handle_controlled_shutdown,
    8: handle_offset_commit,
    9: handle_offset_fetch,
    10: handle_find_coordinator,
    11: handle_join_group,
    12: handle_heartbeat,
    13: handle_leave_group,
    14: handle_sync_group,
    15: handle_describe_groups,
    16: handle_list_groups,
    17: handle_sasl_handshake,
    18: handle_api_versions,
    19: handle_create_topics,
    20: handle_delete_topics,
    21: handle_delete_records,
    22: handle_init_producer_id,
    23: handle_offset_for_leader_epoch,
    24: handle_add_partitions_to_txn,
    25: handle_add_offsets_to_txn,
    26: handle_end_txn,
    27: handle_write_txn_markers,
    28: handle_txn_offset_commit,
    42: handle_delete_groups,
    43: handle_elect_leaders,
    32: handle_describe_configs,
    33: handle_alter_configs,
    34: handle_alter_replica_log_dirs,
    35: handle_describe_log_dirs,
    36: handle_sasl_authenticate,
    37: handle_create_partitions,
    44: handle_incremental_alter_configs,
    45: handle_alter_partition_reassignments,
    46: handle_list_partition_reassignments,
    47: handle_offset_delete,
    60: handle_describe_cluster,
    68: handle_consumer_group_heartbeat,
    69: handle_consumer_group_describe,
    61: handle_describe_producers,
    65: handle_describe_transactions,
    66: handle_list_transactions,
    75: handle_describe_topic_partitions,
    16384: handle_consumer_group_prepare_assignment,     # odradek extensions (protocol/extensions.py)
    16385: handle_consumer_group_install_assignment,
}
