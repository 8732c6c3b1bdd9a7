"""odradek's Kafka client: a sans-I/O connection, an asyncio producer and consumer, a sync facade.

Depends only on `odradek.protocol` and `odradek.records` (DESIGN, "Layers"); it works against any
Kafka-compatible broker. Config names and defaults are Kafka's (`config`).

- `connection.ClientConnection`: framing, correlation ids, pipelining, ApiVersions negotiation (sans I/O)
- `network.BrokerConnection`: the asyncio shell (connect, send -> future of the response, close)
- `cluster.Cluster`: bootstrap, metadata cache, one connection per broker
- `producer.Producer`: batching, murmur2/sticky partitioning, compression, retries, idempotence,
  transactions (`producer_txn`: the calls; `transactions`: Kafka's TransactionManager state machine)
- `consumer.Consumer`: assign, seek, offsets_for_times, pause/resume, isolation.level=read_committed; reads per record (`getmany`, each
  batch decoded once in bulk), as columns (`getmany_columns`) and per batch (`fetch_batches`)
- `admin.Admin`: the admin APIs (topics, partitions, configs, cluster, log dirs, records, groups)
- `sync.Producer`, `sync.Consumer`, `sync.Admin`: the same from plain threads
"""

from odradek.client.admin import Admin
from odradek.client.admin_types import AdminError, ConfigResource, NewTopic
from odradek.client.batch import DeliveryFuture, RecordMetadata
from odradek.client.consumer import Consumer
from odradek.client.errors import (
    BrokerResponseError, BufferFullError, ConfigError, InvalidProducerEpochError, KafkaConnectionError,
    KafkaError, KafkaTimeoutError, OffsetOutOfRangeError, ProducerFencedError, TransactionAbortableError,
    TransactionAbortedError, TransactionError,
)
from odradek.client.fetcher import ConsumerRecord, FetchedBatch, OffsetAndTimestamp, TopicPartition
from odradek.records.columns import RecordColumns
from odradek.client.partitioner import DefaultPartitioner, murmur2, partition_for_key, to_positive
from odradek.client.producer import Producer
from odradek.client.transactions import (
    ConsumerGroupMetadata, PreparedTransaction, TxnState, end_prepared_transaction,
)

__all__ = [
    "Admin", "AdminError", "ConfigResource", "NewTopic",
    "BrokerResponseError", "BufferFullError", "ConfigError", "Consumer", "ConsumerRecord", "DefaultPartitioner",
    "DeliveryFuture", "FetchedBatch", "KafkaConnectionError", "KafkaError", "KafkaTimeoutError",
    "OffsetAndTimestamp", "OffsetOutOfRangeError", "Producer", "RecordColumns", "RecordMetadata", "TopicPartition",
    "murmur2",
    "partition_for_key", "to_positive",
    "ConsumerGroupMetadata", "InvalidProducerEpochError", "PreparedTransaction", "ProducerFencedError",
    "TransactionAbortableError", "TransactionAbortedError", "TransactionError", "TxnState",
    "end_prepared_transaction",
]
