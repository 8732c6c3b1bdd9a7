"""Crashes: a Spark driver killed (SIGKILL) in the middle of a micro-batch, and the offline-load example
killed in the middle of a load; after a rerun, every record is in the output exactly once."""

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.spark.conftest import ROOT, create_topic, produce, spark_subprocess, unique

TIMEOUT_S = 240


def _entries(d: Path) -> list[int]:
    return sorted(int(p.name) for p in d.glob("*") if p.name.isdigit()) if d.exists() else []


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


def test_driver_killed_mid_batch_file_sink_has_no_duplicate(spark, odradek_broker, tmp_path):
    bs = odradek_broker.bootstrap
    topic = unique("killed")
    create_topic(bs, topic, 2)
    produce(bs, topic, [(i % 2, None, b"v%d" % i, [], None) for i in range(3000)])
    out, ckpt, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "job.log"
    proc = spark_subprocess(str(ROOT / "tests/spark/jobs/slow_stream_to_files.py"), bs, topic, out, ckpt, log=log)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        running_since = None
        while True:     # kill a batch planned (offsets logged) but not committed, 0.3 s into it
            offsets, commits = _entries(ckpt / "offsets"), _entries(ckpt / "commits")
            if len(commits) >= 2 and offsets and offsets[-1] > commits[-1]:
                if running_since is None or running_since[0] != offsets[-1]:
                    running_since = (offsets[-1], time.monotonic())
                elif time.monotonic() - running_since[1] >= 0.3:
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
            assert proc.poll() is None, f"the job exited early:\n{_log_tail(log)}"
            assert time.monotonic() < deadline, f"no batch in progress in time:\n{_log_tail(log)}"
            time.sleep(0.02)
    finally:
        _kill(proc)
    assert _entries(ckpt / "offsets")[-1] > _entries(ckpt / "commits")[-1], "the kill missed the batch"
    df = (spark.readStream.format("odradek").option("kafka.bootstrap.servers", bs).option("subscribe", topic)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "300").load())
    q = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt)) \
        .trigger(availableNow=True).start()
    assert q.awaitTermination(TIMEOUT_S) and q.exception() is None
    rows = spark.read.parquet(str(out)).select("partition", "offset").collect()
    got = sorted((r.partition, r.offset) for r in rows)
    assert got == sorted((p, o) for p in range(2) for o in range(1500))


def _offline_load_module():
    sys.path.insert(0, str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location("offline_load", ROOT / "examples" / "offline_load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_offline_load_killed_and_rerun_loads_each_record_once(spark, odradek_broker, tmp_path):
    loader = _offline_load_module()
    bs = odradek_broker.bootstrap
    topics = [unique("load-a"), unique("load-b")]
    for t in topics:
        create_topic(bs, t, 3)
        produce(bs, t, [(i % 3, b"k", b"%s-%d" % (t.encode(), i), [], None) for i in range(3000)])
    out = tmp_path / "lake"
    assert loader.load(spark, bs, topics, out) > 0                  # a first, complete load
    for t in topics:
        produce(bs, t, [(i % 3, b"k", b"%s-%d" % (t.encode(), i), [], None) for i in range(3000, 9000)])
    log = tmp_path / "load.log"
    proc = spark_subprocess(str(ROOT / "examples/offline_load.py"), "--bootstrap", bs, "--topics", ",".join(topics),
                            "--out", out, log=log)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (out / "_staging").exists():           # the second load's Spark job has begun writing
            assert proc.poll() is None, f"the load ended before it could be killed:\n{_log_tail(log)}"
            assert time.monotonic() < deadline, _log_tail(log)
            time.sleep(0.01)
    finally:
        _kill(proc)
    assert not (out / "_offsets" / "2.json").exists(), "the kill came after the commit"
    loader.load(spark, bs, topics, out)                                # the rerun
    assert loader.load(spark, bs, topics, out) == 0                    # and nothing more to do
    rows = spark.read.parquet(str(out)).select("topic", "partition", "offset", "value").collect()
    got = sorted((r.topic, r.partition, r.offset) for r in rows)
    assert len(got) == len(set(got)) == 2 * 9000
    assert {r.value for r in rows} == {b"%s-%d" % (t.encode(), i) for t in topics for i in range(9000)}


def test_offline_load_commit_is_redone_after_a_crash(tmp_path):
    """Killed between the redo log and the end of the moves: the next run finishes the commit."""
    loader = _offline_load_module()
    out = tmp_path / "lake"
    staging = out / "_staging" / "run1" / "topic=t" / "partition=0"
    staging.mkdir(parents=True)
    (out / "_offsets").mkdir()
    moves = []
    for i in range(3):
        f = staging / f"part-{i}.parquet"
        f.write_bytes(b"x")
        moves.append((str(f), str(out / "topic=t" / "partition=0" / f"run1-part-{i}.parquet")))
    (out / "_offsets" / "pending.json").write_text(json.dumps(
        {"run": "run1", "seq": 1, "end": {"t": {"0": 42}}, "moves": moves}))
    os.replace(moves[0][0], (Path(moves[0][1]).parent.mkdir(parents=True) or moves[0][1]))   # one move done
    loader.recover(out)
    assert sorted(p.name for p in (out / "topic=t" / "partition=0").iterdir()) == [
        "run1-part-0.parquet", "run1-part-1.parquet", "run1-part-2.parquet"]
    assert loader.committed_offsets(out) == (1, {"t": {"0": 42}})
    assert not (out / "_offsets" / "pending.json").exists() and not (out / "_staging").exists()
