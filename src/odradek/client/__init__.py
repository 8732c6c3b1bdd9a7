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

# Each name is imported on first use (PEP 562): `from odradek.client.errors import KafkaError` or
# `from odradek.client import Admin` loads what it names, not the producer, consumer and groups too.
_EXPORTS = {
    "Admin": "admin", "AdminError": "admin_types", "ConfigResource": "admin_types", "NewTopic": "admin_types",
    "DeliveryFuture": "batch", "RecordMetadata": "batch", "Consumer": "consumer",
    **dict.fromkeys((
        "BrokerResponseError", "BufferFullError", "ConfigError", "InvalidProducerEpochError",
        "KafkaConnectionError", "KafkaError", "KafkaTimeoutError", "OffsetOutOfRangeError", "ProducerFencedError",
        "TransactionAbortableError", "TransactionAbortedError", "TransactionError"), "errors"),
    "ConsumerRecord": "fetcher", "FetchedBatch": "fetcher", "OffsetAndTimestamp": "fetcher",
    "TopicPartition": "fetcher", "DefaultPartitioner": "partitioner", "murmur2": "partitioner",
    "partition_for_key": "partitioner", "to_positive": "partitioner", "Producer": "producer",
    **dict.fromkeys(("ConsumerGroupMetadata", "PreparedTransaction", "TxnState", "end_prepared_transaction"),
                    "transactions"),
}


def __getattr__(name: str):
    if name == "RecordColumns":
        from odradek.records.columns import RecordColumns
        return RecordColumns
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return value


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
