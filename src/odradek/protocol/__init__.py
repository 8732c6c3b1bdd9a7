"""Kafka's wire protocol as pure code: no sockets, no clocks (seed 003, chapter "2 - Protocol"; seed 004)."""
