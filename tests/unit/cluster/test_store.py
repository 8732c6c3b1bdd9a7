"""The embedded metadata store: ZooKeeper's node rules, all-or-nothing multis, and persistence through
the journal (replay, torn tail, damage, failed writes, compaction)."""

from __future__ import annotations

import errno
import io
import json
import os

import pytest

import odradek.cluster.journal as journal_module
from odradek.cluster.journal import FileJournal, decode_line
from odradek.cluster.store import BadVersionError, CheckVersion, Create, Delete, EmbeddedStore, NodeExistsError, \
    NoNodeError, NotEmptyError, SetData, StoreError


def opened(tmp_path, **kw) -> EmbeddedStore:
    return EmbeddedStore(FileJournal(str(tmp_path), **kw))


def state(store: EmbeddedStore) -> dict:
    return {p: (v, ver) for p, (v, ver, eph) in store.nodes.items() if not eph}


class FailingFile(io.FileIO):
    """A journal file on a disk that fills up: once `budget` bytes are written, writes fail with
    ENOSPC (the last one after writing what still fits, as a real short write does)."""
    budget: int | None = None

    def write(self, data) -> int:
        if FailingFile.budget is None:
            return super().write(data)
        if FailingFile.budget <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = super().write(bytes(data[:FailingFile.budget]))
        FailingFile.budget -= n
        return n


@pytest.fixture
def failing_opener():
    FailingFile.budget = None
    yield lambda path, mode: FailingFile(path, mode.replace("b", ""))
    FailingFile.budget = None


# ------------------------------------------------------------------------------------------ node rules
def test_nodes_follow_zookeeper_rules():
    s = EmbeddedStore()
    with pytest.raises(NoNodeError):
        s.create("/a/b", {})                      # no parent
    s.create("/a", {"x": 1})
    s.create("/a/b", {"y": 2})
    assert s.get("/a") == ({"x": 1}, 0)
    assert s.children("/a") == ["b"] and s.children("/") == ["a"]
    with pytest.raises(NodeExistsError):
        s.create("/a", {})
    assert s.set("/a", {"x": 2}) == 1
    with pytest.raises(BadVersionError):
        s.set("/a", {"x": 3}, version=0)
    assert s.set("/a", {"x": 3}, version=1) == 2
    with pytest.raises(NotEmptyError):
        s.delete("/a")
    with pytest.raises(NoNodeError):
        s.delete("/nope")
    s.delete("/a", recursive=True)
    assert not s.exists("/a") and not s.exists("/a/b") and s.children("/") == []


def test_multi_is_all_or_nothing():
    s = EmbeddedStore()
    s.multi([Create("/t", {}), Create("/t/p", {"v": 0})])
    before = dict(s.nodes)
    with pytest.raises(NodeExistsError):
        s.multi([Create("/u", {}), SetData("/t/p", {"v": 1}), Create("/t/p", {})])
    assert s.nodes == before and not s.exists("/u")
    with pytest.raises(BadVersionError):
        s.multi([Delete("/t/p"), CheckVersion("/t", 5)])
    assert s.nodes == before
    # Later ops see the earlier ones: children go first, then their parent.
    assert s.multi([Create("/t/q", {}), Delete("/t/q"), Delete("/t/p"), Delete("/t")]) == [0, None, None, None]
    assert s.nodes == {} and s.children("/") == []


def test_ephemeral_nodes_are_not_persisted(tmp_path):
    s = opened(tmp_path)
    s.multi([Create("/brokers", {}), Create("/brokers/ids", {}), Create("/brokers/ids/0", {"h": 1}, ephemeral=True)])
    assert s.exists("/brokers/ids/0")
    with pytest.raises(ValueError):
        s.create("/brokers/ids/0/x", {})          # ephemeral nodes have no children
    s.close()
    again = opened(tmp_path)
    assert again.exists("/brokers/ids") and not again.exists("/brokers/ids/0")


# ------------------------------------------------------------------------------------------ persistence
def test_every_multi_is_replayed_with_its_versions(tmp_path):
    s = opened(tmp_path)
    s.multi([Create("/a", {}), Create("/a/1", {"n": 1})])
    s.set("/a/1", {"n": 2})
    s.multi([Create("/a/2", {"n": 3}), Delete("/a/1")])
    expected = state(s)
    s.close()
    assert state(opened(tmp_path)) == expected == {"/a": ({}, 0), "/a/2": ({"n": 3}, 0)}
    lines = (tmp_path / "odradek-metadata.journal").read_bytes().splitlines()
    assert len(lines) == 3, "one journal line per multi"
    assert [decode_line(line)[0] for line in lines] == [1, 2, 3]


def test_a_torn_last_line_is_dropped_and_writing_goes_on(tmp_path):
    s = opened(tmp_path)
    s.create("/a", {"n": 1})
    s.set("/a", {"n": 2})
    s.close()
    path = tmp_path / "odradek-metadata.journal"
    good = path.read_bytes()
    with open(path, "ab") as f:      # a crash in the middle of the third write
        f.write(b'0badc0de {"seq":3,"ops":[["s","/a",{"n"')
    s = opened(tmp_path)
    assert s.get("/a") == ({"n": 2}, 1)
    assert path.read_bytes() == good, "the torn tail is cut off"
    s.set("/a", {"n": 3})
    s.close()
    assert opened(tmp_path).get("/a") == ({"n": 3}, 2)


def test_zeros_after_the_last_line_are_a_torn_tail(tmp_path):
    s = opened(tmp_path)
    s.create("/a", {})
    s.close()
    with open(tmp_path / "odradek-metadata.journal", "ab") as f:
        f.write(b"\0" * 300)          # size extended, data never written
    assert opened(tmp_path).exists("/a")


def test_damage_before_good_lines_refuses_to_load(tmp_path):
    s = opened(tmp_path)
    s.create("/a", {"n": 1})
    s.create("/b", {"n": 2})
    s.close()
    path = tmp_path / "odradek-metadata.journal"
    data = bytearray(path.read_bytes())
    data[12] ^= 0x01                  # a flipped bit in the first line
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="damaged"):
        opened(tmp_path)


def test_a_failed_write_changes_nothing_and_leaves_no_garbage(tmp_path, failing_opener):
    s = opened(tmp_path, opener=failing_opener)
    s.multi([Create("/t", {}), Create("/t/a", {"n": 1})])
    before = dict(s.nodes)
    FailingFile.budget = 20           # the next line is cut after 20 bytes, then ENOSPC
    with pytest.raises(StoreError, match="No space left"):
        s.multi([Create("/t/b", {"n": 2}), SetData("/t/a", {"n": 3})])
    assert s.nodes == before and s.children("/t") == ["a"]
    with pytest.raises(StoreError):
        s.create("/t/c", {})
    FailingFile.budget = None         # space is back
    s.create("/t/b", {"n": 4})
    s.close()
    again = opened(tmp_path)
    assert state(again) == {"/t": ({}, 0), "/t/a": ({"n": 1}, 0), "/t/b": ({"n": 4}, 0)}


def test_a_failed_fsync_changes_nothing(tmp_path, monkeypatch):
    s = opened(tmp_path)
    s.create("/a", {"n": 1})

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(journal_module.os, "fsync", eio)
    with pytest.raises(StoreError, match="Input/output error"):
        s.set("/a", {"n": 2})
    assert s.get("/a") == ({"n": 1}, 0)
    monkeypatch.undo()
    s.set("/a", {"n": 3})
    s.close()
    assert opened(tmp_path).get("/a") == ({"n": 3}, 1)


# ------------------------------------------------------------------------------------------ compaction
def fill(s: EmbeddedStore, nodes: int) -> None:
    s.create("/n", {})
    for i in range(0, nodes, 100):
        s.multi([Create(f"/n/{j}", {"v": j}) for j in range(i, min(i + 100, nodes))])


def test_the_journal_is_compacted_into_a_snapshot(tmp_path):
    s = opened(tmp_path, compact_min_bytes=4096)
    fill(s, 50)
    for i in range(300):
        s.set(f"/n/{i % 50}", {"v": i})
    assert s.journal.compactions > 0
    assert s.journal.size_bytes < 2 * max(4096, os.path.getsize(tmp_path / "odradek-metadata.json"))
    snapshot = json.loads((tmp_path / "odradek-metadata.json").read_text())
    assert snapshot["format"] == 1 and snapshot["seq"] <= s.journal.seq
    expected = state(s)
    s.close()
    assert state(opened(tmp_path, compact_min_bytes=4096)) == expected


def test_a_write_costs_the_same_with_few_or_many_nodes(tmp_path):
    sizes = []
    for n, d in ((10, tmp_path / "small"), (5000, tmp_path / "big")):
        d.mkdir()
        s = opened(d)
        fill(s, n)
        before = s.journal.size_bytes
        s.set("/n/7", {"v": "x"})
        # the line's bytes, less the digits of its sequence number
        sizes.append(s.journal.size_bytes - before - len(str(s.journal.seq)))
        assert s.journal.compactions == 0
        s.close()
    assert sizes[0] == sizes[1]


def test_a_crash_between_snapshot_and_journal_truncation_replays_nothing_twice(tmp_path):
    s = opened(tmp_path, compact_min_bytes=1 << 30)
    fill(s, 20)
    s.set("/n/3", {"v": "after"})
    old_journal = (tmp_path / "odradek-metadata.journal").read_bytes()
    s.journal.compact(s._persistent_nodes())
    expected = state(s)
    s.close()
    (tmp_path / "odradek-metadata.journal").write_bytes(old_journal)   # the truncation never happened
    again = opened(tmp_path)
    assert state(again) == expected
    again.set("/n/3", {"v": "later"})
    again.close()
    assert opened(tmp_path).get("/n/3") == ({"v": "later"}, 2)


def test_a_failed_compaction_fails_no_write(tmp_path, failing_opener):
    s = opened(tmp_path, opener=failing_opener, compact_min_bytes=2048)
    s.create("/n", {})
    FailingFile.budget = None

    def no_snapshot(path, mode):
        if path.endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return failing_opener(path, mode)

    s.journal._open = no_snapshot
    for i in range(100):
        s.create(f"/n/{i}", {"v": "x" * 20})
    assert s.journal.compactions == 0 and not (tmp_path / "odradek-metadata.json.tmp").exists()
    s.journal._open = failing_opener
    for i in range(100):
        s.set(f"/n/{i}", {"v": "y"})
    assert s.journal.compactions > 0
    expected = state(s)
    s.close()
    assert state(opened(tmp_path)) == expected


def test_the_single_file_of_earlier_versions_is_read(tmp_path):
    legacy = {"/cluster/id": [{"version": "1", "id": "abc"}, 0],
              "/brokers/topics/t": [{"version": 3, "topic_id": "x", "partitions": {"0": [0]}}, 2]}
    (tmp_path / "odradek-metadata.json").write_text(json.dumps(legacy))
    s = opened(tmp_path)
    assert s.get("/brokers/topics/t")[1] == 2
    assert s.exists("/brokers") and s.exists("/brokers/topics") and s.exists("/cluster")
    assert s.children("/brokers/topics") == ["t"]
