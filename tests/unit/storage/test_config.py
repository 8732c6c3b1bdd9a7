import pytest

from odradek.storage.config import LONG_MAX, LogConfig, LogManagerConfig


def test_kafka_defaults():
    c = LogConfig()
    assert (c.segment_bytes, c.segment_ms, c.segment_index_bytes, c.index_interval_bytes) == \
        (1073741824, 604800000, 10485760, 4096)
    assert (c.retention_ms, c.retention_bytes) == (604800000, -1)
    assert (c.flush_messages, c.flush_ms, c.file_delete_delay_ms) == (LONG_MAX, LONG_MAX, 60000)
    m = LogManagerConfig()
    assert m.retention_check_interval_ms == 300000


def test_topic_overrides():
    c = LogConfig().from_properties({"retention.ms": "1000", "segment.bytes": "5000",
                                     "cleanup.policy": "compact"})
    assert (c.retention_ms, c.segment_bytes, c.cleanup_policy) == (1000, 5000, ("compact",))
    assert not c.deletes_by_retention


@pytest.mark.parametrize("bad", [{"segment_bytes": 2**31}, {"segment_bytes": 5},
                                 {"retention_ms": -2}, {"cleanup_policy": ("nope",)},
                                 {"flush_messages": 0}])
def test_invalid_values(bad):
    with pytest.raises(ValueError):
        LogConfig(**bad)
