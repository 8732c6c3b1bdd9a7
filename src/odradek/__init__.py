"""odradek: Apache Kafka's design, a partitioned replicated commit log speaking Kafka's wire protocol."""

__version__ = "0.1.0"
