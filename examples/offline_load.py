"""Offline data load: topics -> Parquet, partitioned by topic and partition, exactly once across reruns.

    python examples/offline_load.py                                   # demo: own broker, sample data
    python examples/offline_load.py --bootstrap localhost:9092 --topics events,clicks --out /data/lake

Seed 003, "Offline Data Load": the load is split into one task per topic-partition (Spark tasks, one per
offset range), and a failed task restarts from its original position without duplicating data. This
script adds the same guarantee for the whole load, by keeping the offsets beside the output:

    OUT/topic=<t>/partition=<p>/<run>-part-....parquet    the data (columns: key, value, offset, timestamp, ...)
    OUT/_offsets/<seq>.json                               end offsets of each committed load
    OUT/_offsets/pending.json                             a load being committed (redo log)
    OUT/_staging/<run>/                                   a load being written

A run reads [last committed end, latest now) of every partition (new partitions from their start),
writes it into _staging with Spark, then commits: first the redo log (the files to move and the new
end offsets), then the moves, then `<seq>.json`, then the redo log goes. Killed while writing, a rerun
throws the staging away and reads the same ranges again; killed while committing, a rerun finishes
the moves from the redo log. So every record lands exactly once, and a rerun neither skips nor repeats.
Spark and other readers ignore the `_offsets` and `_staging` directories (names starting with `_`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import _demo


# ------------------------------------------------------------------------------------------ offsets
def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def committed_offsets(out: Path) -> tuple[int, dict]:
    """(sequence number, {topic: {partition: next offset}}) of the last committed load."""
    state = out / "_offsets"
    seqs = sorted(int(p.stem) for p in state.glob("*.json") if p.stem.isdigit()) if state.exists() else []
    if not seqs:
        return 0, {}
    return seqs[-1], json.loads((state / f"{seqs[-1]}.json").read_text())["end"]


def recover(out: Path) -> None:
    """Finish a commit that was interrupted (redo log), and drop unfinished writes."""
    pending = out / "_offsets" / "pending.json"
    if pending.exists():
        log = json.loads(pending.read_text())
        for src, dst in log["moves"]:
            if Path(src).exists():
                Path(dst).parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
        _write_json(out / "_offsets" / f"{log['seq']}.json", {"run": log["run"], "end": log["end"]})
        pending.unlink()
    shutil.rmtree(out / "_staging", ignore_errors=True)


def current_partitions(bootstrap: str, topics: list[str]) -> dict:
    """{topic: {partition: latest offset}} of the topics, now."""
    from odradek.client.admin import LATEST, Admin

    async def look():
        async with Admin({"bootstrap.servers": bootstrap}) as admin:
            listing = await admin.list_topics()
            tps = [(t, p) for t in topics if t in listing for p in range(listing[t].partitions)]
            found = await admin.list_offsets({tp: LATEST for tp in tps}) if tps else {}
            out: dict = {}
            for tp, o in found.items():
                out.setdefault(tp.topic, {})[str(tp.partition)] = o.offset
            return out
    return asyncio.run(look())


# ------------------------------------------------------------------------------------------ the load
def load(spark, bootstrap: str, topics: list[str], out: Path) -> int:
    """One incremental load; the number of records written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "_offsets").mkdir(exist_ok=True)
    recover(out)
    seq, start = committed_offsets(out)
    end = current_partitions(bootstrap, topics)
    starting = {t: {p: start.get(t, {}).get(p, -2) for p in ps} for t, ps in end.items()}
    if not any(o > start.get(t, {}).get(p, 0) for t, ps in end.items() for p, o in ps.items()):
        print("nothing new to load")
        return 0
    run = f"{int(time.time())}-{uuid.uuid4().hex[:6]}"
    staging = out / "_staging" / run
    df = (spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", ",".join(sorted(end)))
          .option("startingOffsets", json.dumps(starting)).option("endingOffsets", json.dumps(end))
          .load())
    df.write.partitionBy("topic", "partition").parquet(str(staging))
    moves = []
    for f in sorted(staging.rglob("*.parquet")):
        rel = f.relative_to(staging)
        moves.append((str(f), str(out / rel.parent / f"{run}-{rel.name}")))
    _write_json(out / "_offsets" / "pending.json", {"run": run, "seq": seq + 1, "end": end, "moves": moves})
    recover(out)
    n = sum(end[t][p] - max(starting[t][p], 0) for t in end for p in end[t])
    print(f"loaded offsets up to {end} (about {n} records) into {out}")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", help="Kafka-compatible cluster; default: a demo odradek broker")
    ap.add_argument("--topics", default="events,clicks", help="comma-separated topics")
    ap.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    args = ap.parse_args()
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    out = Path(args.out) if args.out else Path(_demo.tempfile.mkdtemp(prefix="offline-load-"))
    with _demo.broker(args.bootstrap) as bootstrap:
        if not args.bootstrap:
            _demo.create_topics(bootstrap, {t: 3 for t in topics})
            for t in topics:
                _demo.produce(bootstrap, t, ((b"user-%d" % (i % 50), b"%s event %d" % (t.encode(), i))
                                             for i in range(5000)))
        spark = _demo.spark_session("offline-load")
        load(spark, bootstrap, topics, out)
        if not args.bootstrap:
            df = spark.read.parquet(str(out))
            df.groupBy("topic", "partition").count().orderBy("topic", "partition").show()
            print("records:", df.count(), "distinct (topic, partition, offset):",
                  df.select("topic", "partition", "offset").distinct().count())
        spark.stop()


if __name__ == "__main__":
    main()
