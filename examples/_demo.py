"""Shared bits of the examples: a Spark session, and, when no --bootstrap is given, a throwaway
`odradek serve` broker with sample data, so each example runs with one command."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_session(app: str):
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]")).appName(app)
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextmanager
def broker(bootstrap: str | None):
    """The given cluster, or a fresh single-broker odradek on a free port (removed afterwards)."""
    if bootstrap:
        yield bootstrap
        return
    base = Path(tempfile.mkdtemp(prefix="odradek-example-"))
    log = open(base / "broker.log", "wb")
    exe = shutil.which("odradek")
    cmd = [exe] if exe else [sys.executable, "-m", "odradek.cli.main"]
    proc = subprocess.Popen(cmd + ["serve", "--override", "listeners=PLAINTEXT://127.0.0.1:0",
                                   "--override", f"log.dirs={base / 'data'}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            m = re.search(r"started .*ports \{'\w+': (\d+)", (base / "broker.log").read_text(errors="replace"))
            if m:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the demo broker did not start:\n" + (base / "broker.log").read_text()[-2000:])
            time.sleep(0.05)
        print(f"demo broker on 127.0.0.1:{m.group(1)} (log dir {base})")
        yield f"127.0.0.1:{m.group(1)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(base, ignore_errors=True)


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    from odradek.client.admin import Admin
    from odradek.client.admin_types import NewTopic

    async def create():
        async with Admin({"bootstrap.servers": bootstrap}) as admin:
            existing = await admin.list_topics()
            new = [NewTopic(t, n, 1) for t, n in topics.items() if t not in existing]
            if new:
                await admin.create_topics(new)
    asyncio.run(create())


def produce(bootstrap: str, topic: str, records) -> int:
    """(key, value) pairs, through odradek's client."""
    from odradek.client import Producer

    async def send():
        n = 0
        async with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
            for key, value in records:
                await p.send(topic, value, key)
                n += 1
            await p.flush()
        return n
    return asyncio.run(send())
