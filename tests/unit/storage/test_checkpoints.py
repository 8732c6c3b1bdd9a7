import pytest

from odradek.storage.checkpoints import MetaProperties, OffsetCheckpointFile, \
    has_clean_shutdown_marker, read_meta_properties, remove_clean_shutdown_marker, \
    write_clean_shutdown_marker, write_meta_properties
from odradek.storage.errors import StorageError


def test_offset_checkpoint_format(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    OffsetCheckpointFile(path).write({("b.topic", 1): 7, ("a-topic", 0): 1234, ("a-topic", 10): 0})
    assert path.read_text() == "0\n3\na-topic 0 1234\na-topic 10 0\nb.topic 1 7\n"
    assert OffsetCheckpointFile(path).read() == {("a-topic", 0): 1234, ("a-topic", 10): 0,
                                                 ("b.topic", 1): 7}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the temp file was renamed


def test_offset_checkpoint_missing_empty_and_malformed(tmp_path):
    path = tmp_path / "replication-offset-checkpoint"
    assert OffsetCheckpointFile(path).read() == {}
    OffsetCheckpointFile(path).write({})
    assert path.read_text() == "0\n0\n"
    for bad in ("1\n0\n", "0\n2\nt 0 1\n", "0\n1\nt x 1\n", "", "0\n1\nt 0\n"):
        path.write_text(bad)
        with pytest.raises(StorageError):
            OffsetCheckpointFile(path).read()


def test_meta_properties(tmp_path):
    assert read_meta_properties(tmp_path) is None
    write_meta_properties(tmp_path, MetaProperties(broker_id=3, cluster_id="q1Sh-9_ISia_zwGINzRvyQ"))
    text = (tmp_path / "meta.properties").read_text()
    assert "version=0\n" in text and "broker.id=3\n" in text
    assert "cluster.id=q1Sh-9_ISia_zwGINzRvyQ\n" in text
    assert read_meta_properties(tmp_path) == MetaProperties(3, "q1Sh-9_ISia_zwGINzRvyQ", 0)


def test_meta_properties_written_by_kafka_is_read(tmp_path):
    (tmp_path / "meta.properties").write_text(
        "#\n#Tue Jan 02 10:00:00 UTC 2024\ncluster.id=abc\nversion=0\nbroker.id=0\n")
    assert read_meta_properties(tmp_path) == MetaProperties(0, "abc", 0)


def test_clean_shutdown_marker(tmp_path):
    assert not has_clean_shutdown_marker(tmp_path)
    write_clean_shutdown_marker(tmp_path)
    assert (tmp_path / ".kafka_cleanshutdown").exists()
    assert has_clean_shutdown_marker(tmp_path)
    remove_clean_shutdown_marker(tmp_path)
    assert not has_clean_shutdown_marker(tmp_path)
