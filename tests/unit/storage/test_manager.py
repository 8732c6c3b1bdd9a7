import os

import pytest

import odradek.storage.log as log_module
from odradek.storage.config import LogConfig, LogManagerConfig
from odradek.storage.errors import InconsistentMetaPropertiesError, StorageError
from odradek.storage.manager import LogManager
from tests.unit.storage.logutil import SMALL, offsets, produce, read_all

HOUR = 3_600_000


def manager_config(tmp_path, dirs=1, **log_config) -> LogManagerConfig:
    return LogManagerConfig(log_dirs=tuple(str(tmp_path / f"d{i}") for i in range(dirs)),
                            log_defaults=LogConfig(**{**SMALL, **log_config}))


def checkpoint(path) -> str:
    return path.read_text()


def test_partitions_spread_over_log_dirs_and_reload(tmp_path):
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    for p in range(5):
        produce(manager.get_or_create_log("events", p, now_ms=0), 3 + p)
    dirs = [manager.log_dir_of("events", p).name for p in range(5)]
    assert dirs == ["d0", "d1", "d0", "d1", "d0"]
    assert (tmp_path / "d1" / "events-1" / "00000000000000000000.log").exists()
    manager.get_log("events", 4).update_high_watermark(5)
    manager.close(now_ms=0)
    assert checkpoint(tmp_path / "d1" / "recovery-point-offset-checkpoint") == \
        "0\n2\nevents 1 4\nevents 3 6\n"
    assert checkpoint(tmp_path / "d0" / "replication-offset-checkpoint") == \
        "0\n3\nevents 0 0\nevents 2 0\nevents 4 5\n"
    assert checkpoint(tmp_path / "d0" / "log-start-offset-checkpoint") == \
        "0\n3\nevents 0 0\nevents 2 0\nevents 4 0\n"
    assert (tmp_path / "d0" / ".kafka_cleanshutdown").exists()

    again = LogManager.open(config, now_ms=0)
    assert not (tmp_path / "d0" / ".kafka_cleanshutdown").exists()
    assert sorted(tp for tp, _ in again.logs()) == [("events", p) for p in range(5)]
    assert again.get_log("events", 4).high_watermark == 5
    assert [again.get_log("events", p).log_end_offset for p in range(5)] == [3, 4, 5, 6, 7]
    assert again.log_dir_of("events", 3).name == "d1"
    again.close(now_ms=0)


def test_clean_start_skips_recovery_and_unclean_start_recovers(tmp_path, monkeypatch):
    calls = []
    real = log_module.recover_segment
    monkeypatch.setattr(log_module, "recover_segment", lambda s: calls.append(s) or real(s))
    config = manager_config(tmp_path)
    manager = LogManager.open(config, now_ms=0)
    produce(manager.get_or_create_log("t", 0, now_ms=0), 30, size=150)
    manager.close(now_ms=0)
    manager = LogManager.open(config, now_ms=0)
    assert calls == []
    log = manager.get_log("t", 0)
    produce(log, 5, size=150)
    active = log.active_segment.log_path
    for _, each in manager.logs():
        each.release()  # crash: no close, no marker
    with open(active, "ab") as f:
        f.write(b"\xff" * 100)
    manager = LogManager.open(config, now_ms=0)
    assert calls  # recovered from the checkpointed recovery point
    log = manager.get_log("t", 0)
    assert log.log_end_offset == 35
    assert offsets(read_all(log)) == list(range(35))
    assert os.path.getsize(active) == log.active_segment.size
    manager.close(now_ms=0)


def test_start_offsets_survive_a_restart(tmp_path):
    config = manager_config(tmp_path)
    manager = LogManager.open(config, now_ms=0)
    log = manager.get_or_create_log("t", 0, now_ms=0)
    produce(log, 10)
    log.update_high_watermark(10)
    log.delete_records_before(4, now_ms=0)
    manager.close(now_ms=0)
    again = LogManager.open(config, now_ms=0)
    log = again.get_log("t", 0)
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (4, 10, 10)
    assert read_all(log, 4)[0]["base_offset"] == 4
    again.close(now_ms=0)


def test_periodic_retention_and_checkpoints_with_a_fake_clock(tmp_path):
    config = manager_config(tmp_path, retention_ms=HOUR)
    now = 0
    manager = LogManager.open(config, now_ms=now)
    log = manager.get_or_create_log("t", 0, now_ms=now)
    produce(log, 60, size=150, ts0=0, step=1_000)
    log.update_high_watermark(60)
    next_due = manager.run_periodic(now)
    assert next_due == config.high_watermark_checkpoint_interval_ms
    assert len(log.segments) > 2
    manager.sync_background()          # the flush of the rolled segments, on the sync thread
    now = 2 * HOUR
    manager.run_periodic(now)
    manager.sync_background()          # the checkpoints, written there too
    assert len(log.segments) == 1
    assert log.log_start_offset == log.active_segment.base_offset
    assert checkpoint(tmp_path / "d0" / "replication-offset-checkpoint") == "0\n1\nt 0 60\n"
    assert checkpoint(tmp_path / "d0" / "log-start-offset-checkpoint") == \
        f"0\n1\nt 0 {log.log_start_offset}\n"
    # rolled segments were flushed by the periodic task, so the recovery point moved
    assert checkpoint(tmp_path / "d0" / "recovery-point-offset-checkpoint") == \
        f"0\n1\nt 0 {log.active_segment.base_offset}\n"
    manager.close(now_ms=now)


def test_delete_log_renames_then_removes(tmp_path):
    config = manager_config(tmp_path, file_delete_delay_ms=60_000)
    manager = LogManager.open(config, now_ms=0)
    log = manager.get_or_create_log("gone", 0, now_ms=0)
    produce(log, 5)
    in_flight = log.read(0, 1000)[0]
    assert manager.delete_log("gone", 0, now_ms=0)
    assert manager.get_log("gone", 0) is None
    names = os.listdir(tmp_path / "d0")
    assert not (tmp_path / "d0" / "gone-0").exists()
    (doomed,) = [n for n in names if n.endswith("-delete")]
    assert doomed.startswith("gone-0.")
    assert in_flight.read()
    manager.run_periodic(59_999)
    assert (tmp_path / "d0" / doomed).exists()
    manager.run_periodic(60_000)                     # removed on the sync thread
    assert manager.sync_background(10)
    assert not (tmp_path / "d0" / doomed).exists()
    assert not manager.delete_log("gone", 0, now_ms=0)
    manager.close(now_ms=60_000)


def test_a_stray_log_is_renamed_and_kept_and_never_loaded_again(tmp_path):
    config = manager_config(tmp_path, file_delete_delay_ms=1_000)
    manager = LogManager.open(config, now_ms=0)
    produce(manager.get_or_create_log("left", 0, now_ms=0), 5)
    assert manager.delete_log("left", 0, now_ms=0, stray=True)
    assert manager.get_log("left", 0) is None
    (stray,) = [n for n in os.listdir(tmp_path / "d0") if n.endswith("-stray")]
    assert stray.startswith("left-0.")
    manager.run_periodic(5_000)                      # past file.delete.delay.ms: closed, not removed
    assert manager.sync_background(10)
    assert sorted(os.listdir(tmp_path / "d0" / stray))[0] == "00000000000000000000.index"
    manager.close(now_ms=5_000)
    again = LogManager.open(config, now_ms=5_000)
    assert list(again.logs()) == [] and (tmp_path / "d0" / stray).is_dir()
    again.close(now_ms=5_000)


def test_leftover_delete_dirs_are_removed_at_start(tmp_path):
    config = manager_config(tmp_path)
    (tmp_path / "d0" / "x-0.0123abcd-delete").mkdir(parents=True)
    (tmp_path / "d0" / "x-0.0123abcd-delete" / "00000000000000000000.log").write_bytes(b"x")
    (tmp_path / "d0" / "not a partition").mkdir()
    manager = LogManager.open(config, now_ms=0)
    assert list(manager.logs()) == []
    assert not (tmp_path / "d0" / "x-0.0123abcd-delete").exists()
    manager.close(now_ms=0)


def test_duplicate_partition_across_dirs_is_an_error(tmp_path):
    (tmp_path / "d0" / "t-0").mkdir(parents=True)
    (tmp_path / "d1" / "t-0").mkdir(parents=True)
    with pytest.raises(StorageError):
        LogManager.open(manager_config(tmp_path, dirs=2), now_ms=0)


def test_meta_properties_are_written_and_checked(tmp_path):
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    assert manager.ensure_meta_properties(1, "clusterA") == "clusterA"
    assert "broker.id=1" in (tmp_path / "d1" / "meta.properties").read_text()
    assert manager.ensure_meta_properties(1) == "clusterA"
    with pytest.raises(InconsistentMetaPropertiesError):
        manager.ensure_meta_properties(2)
    with pytest.raises(InconsistentMetaPropertiesError):
        manager.ensure_meta_properties(1, "clusterB")


def test_topic_configs_come_from_the_callback(tmp_path):
    config = manager_config(tmp_path)
    big = LogConfig(segment_bytes=10**6)
    manager = LogManager.open(config, now_ms=0,
                              config_for_topic=lambda t: big if t == "big" else SMALL_CONFIG)
    produce(manager.get_or_create_log("big", 0, now_ms=0), 50, size=150)
    produce(manager.get_or_create_log("small", 0, now_ms=0), 50, size=150)
    assert len(manager.get_log("big", 0).segments) == 1
    assert len(manager.get_log("small", 0).segments) > 1
    manager.close(now_ms=0)


SMALL_CONFIG = LogConfig(**SMALL)


def test_close_flushes_and_closes_the_logs_of_each_dir_on_its_threads_at_once(tmp_path, monkeypatch):
    import threading
    config = manager_config(tmp_path, dirs=2)
    manager = LogManager.open(config, now_ms=0)
    for p in range(8):
        produce(manager.get_or_create_log("t", p, now_ms=0), 2 + p)
    threads: dict[str, list[str]] = {}
    together = threading.Barrier(4, timeout=30)     # 2 dirs x 2 threads: passed only if all run at once
    lock = threading.Lock()
    real_flush = log_module.Log.flush

    def flush(log, now_ms, up_to_offset=None):
        name = threading.current_thread().name
        with lock:
            first = name not in threads
            threads.setdefault(name, []).append(log.dir.parent.name)
        if first:
            together.wait()
        real_flush(log, now_ms, up_to_offset)

    monkeypatch.setattr(log_module.Log, "flush", flush)
    manager.close(now_ms=0, threads_per_dir=2)
    assert len(threads) == 4 and sum(len(d) for d in threads.values()) == 8
    for name, dirs in threads.items():          # a dir's pool closes that dir's logs only
        assert name.startswith("log-close-") and set(dirs) == {f"d{name.split('-')[2][0]}"}
    assert all((tmp_path / d / ".kafka_cleanshutdown").exists() for d in ("d0", "d1"))
    assert checkpoint(tmp_path / "d0" / "recovery-point-offset-checkpoint") == \
        "0\n4\nt 0 2\nt 2 4\nt 4 6\nt 6 8\n"
    monkeypatch.setattr(log_module.Log, "flush", real_flush)
    monkeypatch.setattr(log_module, "recover_segment", lambda s: pytest.fail("a clean start recovered"))
    again = LogManager.open(config, now_ms=0)
    assert [again.get_log("t", p).log_end_offset for p in range(8)] == [2 + p for p in range(8)]
    again.close(now_ms=0)


def test_a_log_that_fails_to_flush_at_close_leaves_no_clean_shutdown_marker(tmp_path, monkeypatch):
    config = manager_config(tmp_path)
    manager = LogManager.open(config, now_ms=0)
    for p in range(4):
        produce(manager.get_or_create_log("t", p, now_ms=0), 3)
    real_flush = log_module.Log.flush
    flushed = []

    def flush(log, now_ms, up_to_offset=None):
        if log.partition == 1:
            raise OSError(5, "Input/output error")
        real_flush(log, now_ms, up_to_offset)
        flushed.append(log.partition)

    monkeypatch.setattr(log_module.Log, "flush", flush)
    with pytest.raises(OSError, match="Input/output"):
        manager.close(now_ms=0, threads_per_dir=2)
    assert sorted(flushed) == [0, 2, 3]             # the others were still flushed
    assert not (tmp_path / "d0" / ".kafka_cleanshutdown").exists()
    monkeypatch.setattr(log_module.Log, "flush", real_flush)
    recovered = []
    real_recover = log_module.recover_segment
    monkeypatch.setattr(log_module, "recover_segment", lambda s: recovered.append(s) or real_recover(s))
    again = LogManager.open(config, now_ms=0)
    assert recovered                                # no marker: the next start recovers
    assert [again.get_log("t", p).log_end_offset for p in range(4)] == [3, 3, 3, 3]
    again.close(now_ms=0)


def test_periodic_tasks_pass_over_quiet_logs_and_name_when_set_aside_segments_go(tmp_path, monkeypatch):
    config = manager_config(tmp_path, retention_ms=HOUR, file_delete_delay_ms=1_000)
    manager = LogManager.open(config, now_ms=0)
    old = manager.get_or_create_log("old", 0, now_ms=0)
    produce(old, 60, size=150, ts0=0, step=1_000)
    old.update_high_watermark(60)
    for p in range(3):
        produce(manager.get_or_create_log("quiet", p, now_ms=0), 2, ts0=2 * HOUR)
    manager.run_periodic(0)
    manager.sync_background()
    visited = []
    real = log_module.Log.delete_expired_files
    monkeypatch.setattr(log_module.Log, "delete_expired_files",
                        lambda log, *a: visited.append(log.topic) or real(log, *a))
    now = 2 * HOUR
    # Retention sets the old segments aside in this call: the answer already names their removal.
    assert manager.run_periodic(now) == now + 1_000
    assert old.has_pending_deletes and visited == []
    assert manager.run_periodic(now + 500) == now + 1_000
    assert visited == ["old"]                       # the quiet logs had nothing set aside: passed over
    set_aside = [s.log_path for _, s in old._pending_deletes]
    assert manager.run_periodic(now + 1_000) == now + config.high_watermark_checkpoint_interval_ms
    assert not old.has_pending_deletes
    manager.sync_background()                       # the files go on the sync thread
    assert set_aside and not any(p.exists() for p in set_aside)
    manager.close(now_ms=now + 1_000)
