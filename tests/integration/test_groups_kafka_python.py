"""Consumer groups with kafka-python: two consumer processes, a clean leave, a kill -9, and commits
after processing while a producer runs (seed 000; seed 003, "Consumer Position")."""

from __future__ import annotations

from .groups_support import GROUP_REQUEST_LOGGERS, two_member_churn

BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000}
BROKER_LOGGERS = GROUP_REQUEST_LOGGERS


def test_two_processes_rebalance_and_commit(broker, tmp_path):
    two_member_churn("kafka-python", broker.bootstrap, tmp_path)
