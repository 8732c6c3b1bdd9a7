"""The metadata cache: images are never changed, only replaced; a reader keeps its image."""

from odradek.server.metadata_cache import MetadataCache, MetadataImage
from tests.unit.server.fakes import broker_config, registration, topic


def test_updates_replace_the_image_and_leave_old_ones_as_they_were():
    first = MetadataImage(broker_config(), cluster_id="c", controller_id=0, brokers={0: registration(0)})
    cache = MetadataCache(first)
    seen = []
    cache.add_listener(lambda old, new: seen.append((old, new)))
    a = topic("a", partitions=3)
    cache.update(cache.image.with_topics([a]))
    held = cache.image
    cache.update(cache.image.without_topics(["a"]))
    assert first.topic("a") is None and held.topic("a") is a and cache.image.topic("a") is None
    assert held.topic_by_id(a.topic_id) is a and cache.image.topic_by_id(a.topic_id) is None
    assert held.partition("a", 2) is not None and not held.has_partition("a", 3)
    assert [n for _, n in seen] == [held, cache.image]


def test_a_topic_replaced_under_its_name_loses_its_old_id():
    image = MetadataImage(broker_config()).with_topics([old := topic("t")])
    image = image.with_topics([new := topic("t")])
    assert image.topic_by_id(old.topic_id) is None and image.topic_by_id(new.topic_id) is new


def test_topic_configs_resolve_against_the_image_broker_config():
    image = MetadataImage(broker_config(log_retention_ms="1000")).with_topics(
        [topic("o", configs={"segment.bytes": "1048576"}), topic("p")])
    assert image.topic_config("o").get_value("segment.bytes") == 1048576
    assert image.topic_config("p").get_value("retention.ms") == 1000
    changed = image.with_config(image.config.with_dynamic(dynamic_default={"log.retention.ms": "2000"}))
    assert changed.topic_config("p").get_value("retention.ms") == 2000
    assert image.topic_config("p").get_value("retention.ms") == 1000


def test_alive_endpoints_by_listener():
    image = MetadataImage(broker_config(), brokers={1: registration(1, 9093), 0: registration(0)})
    assert [(b.broker_id, e.port) for b, e in image.alive_endpoints("PLAINTEXT")] == [(0, 9092), (1, 9093)]
    assert image.alive_endpoints("OTHER") == [] and image.live_broker_ids() == {0, 1}


def test_first_update_waits_for_the_controller_and_gives_up_at_its_bound():
    import asyncio

    async def scenario():
        cache = MetadataCache(MetadataImage(broker_config(), brokers={0: registration(0)}))
        await asyncio.wait_for(cache.first_update(5), 1)         # embedded mode: nothing to wait for
        cache.expect_controller()
        alone = asyncio.ensure_future(cache.first_update(0.05))
        await asyncio.wait_for(alone, 2)                        # no controller: answered at the bound
        waiting = asyncio.ensure_future(cache.first_update(30))
        done, _ = await asyncio.wait({waiting}, timeout=0.2)      # held: nothing has set it free
        assert not done
        cache.update(cache.image.with_brokers({0: registration(0), 1: registration(1, 9093)}, 1))
        cache.controller_reached()
        await asyncio.wait_for(waiting, 1)
        await asyncio.wait_for(cache.first_update(30), 1)        # later requests do not wait
    asyncio.run(scenario())
