"""The log manager's delete path: `-delete` names that fit 255 bytes for 249-character topics, and the
renaming of a deleted topic's directories before the manager opens (so they are never loaded)."""

from pathlib import Path

from odradek.storage.config import LogConfig, LogManagerConfig
from odradek.storage.manager import LogManager, delete_dir_name
from tests.unit.storage.logutil import SMALL, produce


def test_delete_dir_names_fit_a_file_name_for_the_longest_topics():
    topic = "t" * 249
    for partition in (0, 7, 123456):
        name = delete_dir_name(topic, partition)
        assert len(name.encode()) <= 255 and name.endswith(f"-{partition}." + name.split(".")[-1])
        assert name.endswith("-delete")
    short = delete_dir_name("orders", 3)
    assert short.startswith("orders-3.") and len(short) == len("orders-3.") + 32 + len("-delete")


def test_a_long_topic_is_deleted_and_not_loaded_again(tmp_path):
    config = LogManagerConfig(log_dirs=(str(tmp_path),), log_defaults=LogConfig(**{**SMALL, "file_delete_delay_ms": 60_000}))
    manager = LogManager.open(config, now_ms=0)
    topic = "x" * 249
    produce(manager.get_or_create_log(topic, 0, now_ms=0), 2)
    assert manager.delete_log(topic, 0, now_ms=0)
    manager.close(now_ms=0)
    assert LogManager.open(config, now_ms=0).get_log(topic, 0) is None


def test_topic_dirs_are_renamed_away_before_open(tmp_path):
    dirs = (str(tmp_path / "a"), str(tmp_path / "b"))
    config = LogManagerConfig(log_dirs=dirs, log_defaults=LogConfig(**SMALL))
    manager = LogManager.open(config, now_ms=0)
    for p in range(4):
        produce(manager.get_or_create_log("doomed", p, now_ms=0), 1)
    produce(manager.get_or_create_log("kept", 0, now_ms=0), 3)
    produce(manager.get_or_create_log("doomed-2", 0, now_ms=0), 1)   # a topic whose name extends it
    manager.close(now_ms=0)
    assert LogManager.delete_topic_dirs(dirs, {"doomed"}) == 4
    reopened = LogManager.open(config, now_ms=0)
    assert sorted(tp for tp, _ in reopened.logs()) == [("doomed-2", 0), ("kept", 0)]
    assert not [p for d in dirs for p in Path(d).iterdir() if p.name.endswith("-delete")]
