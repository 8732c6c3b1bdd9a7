import pytest

from odradek.storage.config import _FIELDS, LOG_CONFIG_BOUNDS, LONG_MAX, LogConfig, LogConfigError, LogManagerConfig


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


def test_kafka_boundaries_are_accepted_with_kafka_meaning(tmp_path):
    """Any negative retention.bytes is no size limit, and an index of 4 bytes (less than one time index
    entry) still holds one entry: the segment rolls at every indexed append (issue 26)."""
    from odradek.storage.retention import deletable_segment_count
    from tests.unit.storage.logutil import offsets, open_log, produce, read_all

    log = open_log(tmp_path, name="t-0", retention_ms=-1, retention_bytes=-5, segment_index_bytes=4,
                   index_interval_bytes=0)
    produce(log, 20, size=150)
    log.update_high_watermark(log.log_end_offset)
    assert len(log.segments) >= 10           # full indexes rolled the segments
    assert deletable_segment_count(log, 0) == 0
    assert offsets(read_all(log)) == list(range(20))


@pytest.mark.parametrize("name", sorted(LOG_CONFIG_BOUNDS))
def test_every_bound_is_inclusive_and_named(name):
    low, high = LOG_CONFIG_BOUNDS[name]
    field = dict(_FIELDS)[name]
    for ok in (low, high):
        assert getattr(LogConfig(**{field: ok}), field) == ok
    step = 0.001 if isinstance(low, float) else 1
    for bad in (low - step, high + step):
        if isinstance(low, int) and not (-(2**63) <= bad < 2**63):
            continue
        with pytest.raises(LogConfigError) as e:
            LogConfig(**{field: bad})
        assert e.value.name == name and e.value.value == bad


def test_from_properties_names_a_key_that_is_not_a_number():
    with pytest.raises(LogConfigError) as e:
        LogConfig().from_properties({"retention.bytes": "lots"})
    assert e.value.name == "retention.bytes"
