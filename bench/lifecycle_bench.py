"""Start, stop and sustained-load costs of one broker holding many partitions, for one or two source
trees side by side in one run (issue 26, point 6: "with 2,000 partitions, SIGTERM took 18 s ... a
start after kill -9 9.4 s ... broker CPU per record about 3x").

A tree is a checkout of odradek; its broker runs as `python -m odradek.cli.main serve` with
PYTHONPATH=<tree>/src, on a data dir of its own created once for the run: `--topics` x
`--partitions` partitions (default 20 x 100 = 2,000), `--fill` records written to each. Then, for
`--rounds` rounds, the trees alternating (A B, then B A, ...), each tree's broker:

* **start (clean)**: started on the data dir a SIGTERM left; seconds from the spawn to the log line
  "started" and to the first Metadata answer (a raw Metadata v1 for every topic, retried every 10 ms);
* **start after kill -9**: one record written to each partition, the broker killed with SIGKILL, then
  started again: seconds to "started" and to the first Metadata answer (log recovery);
* **SIGTERM**: one record written to each partition, then seconds from SIGTERM to the process's exit
  (controlled shutdown: flushes, checkpoints, the clean-shutdown marker).

And **sustained** (`--duration` seconds, default 60; `--sustained-rounds`, default 1): the broker
started on the same data dir, its idle CPU per second over `--idle` seconds (the periodic work over
its partitions), then a librdkafka producer at `--rate` records/s (default 1,500, `--size` bytes,
acks=all) into a topic of `--sustained-partitions` partitions created for the run; the broker
process's user+system CPU (/proc/<pid>/stat) before and after, per record, and per record above the
idle rate.

Figures are medians over rounds, with the ratio B/A when two trees are given (above 1: B is slower).
The machine may be shared: compare the ratios of one run, not figures of different runs.

    python bench/lifecycle_bench.py --tree base=../base --tree new=. --rounds 5 --duration 300
    python bench/lifecycle_bench.py --quick          # this tree alone, 200 partitions: checks the harness
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import _live, _proc_tree_cpu, free_port, install_cleanup  # noqa: E402

QUIET = {"log_level": 3}
REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------ broker
@dataclass
class TreeBroker:
    """One tree's broker on its data dir; started and stopped many times over the run."""

    name: str
    tree: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-lifecycle-")))
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    starts: int = 0

    def __post_init__(self) -> None:
        _live.append(self)       # its files are removed at exit whatever happens

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"broker-{self.starts}.log"

    def spawn(self) -> float:
        """Start the process; returns the monotonic time of the spawn."""
        self.starts += 1
        # Compiled modules cached (outside the tree) from the first start on, as an installed broker's
        # are: with PYTHONDONTWRITEBYTECODE every start would compile all of odradek again (seconds).
        env = {**os.environ, "PYTHONPATH": str(self.tree / "src"),
               "PYTHONPYCACHEPREFIX": str(self.workdir / "pycache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        argv = [sys.executable, "-m", "odradek.cli.main", "serve",
                "--override", f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "--override", f"log.dirs={self.workdir / 'data'}"]
        with open(self.log_path, "wb") as log:
            t0 = time.monotonic()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, env=env, start_new_session=True)
        return t0

    def start(self, timeout: float = 300.0) -> tuple[float, float]:
        """Spawn and wait until ready: (seconds to the "started" log line, seconds to a Metadata answer)."""
        t0 = self.spawn()
        started = metadata = None
        deadline = t0 + timeout
        while started is None or metadata is None:
            self._check_alive()
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"{self.name}: not ready after {timeout} s")
            if started is None and b" started " in self.log_path.read_bytes():
                started = now - t0
            if metadata is None and metadata_answered(self.port):
                metadata = time.monotonic() - t0
            time.sleep(0.01)
        return started, metadata

    def sigterm(self, timeout: float = 300.0) -> float:
        """SIGTERM and wait for the exit: seconds."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        elapsed = time.monotonic() - t0
        if code != 0:
            raise RuntimeError(f"{self.name}: exit code {code} after SIGTERM:\n{self.log_tail()}")
        if b"shut down cleanly" not in self.log_path.read_bytes():
            raise RuntimeError(f"{self.name}: no clean shutdown logged:\n{self.log_tail()}")
        return elapsed

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def cpu_seconds(self) -> float:
        self._check_alive()
        assert self.proc is not None
        return _proc_tree_cpu(self.proc.pid)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")

    def stop(self) -> None:
        """Harness clean-up (the `brokers` module's exit hook calls it): stop the process, remove files."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self in _live:
            _live.remove(self)


def metadata_answered(port: int) -> bool:
    """One Metadata v1 for every topic on a fresh connection; True when a whole answer came back."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.settimeout(30)
            payload = struct.pack(">hhih", 3, 1, 1, 5) + b"bench" + struct.pack(">i", -1)
            s.sendall(struct.pack(">i", len(payload)) + payload)
            head = _recv(s, 4)
            return head is not None and _recv(s, struct.unpack(">i", head)[0]) is not None
    except OSError:
        return False


def _recv(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


# ------------------------------------------------------------------------------------------ clients
def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300_000, **QUIET})
    for i in range(0, len(names), 5):      # a few hundred partitions a request: no request runs for long
        chunk = names[i:i + 5]
        futures = admin.create_topics([NewTopic(n, partitions, 1) for n in chunk], operation_timeout=300,
                                      request_timeout=300)
        for f in futures.values():
            f.result(330)


def write_each(bootstrap: str, topics: list[str], partitions: int, records: int) -> None:
    """`records` records of 100 B to every partition, explicitly addressed; returns once acknowledged."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, **QUIET})
    value, errors = os.urandom(100), []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err)
    for t in topics:
        for part in range(partitions):
            for _ in range(records):
                while True:
                    try:
                        p.produce(t, value, partition=part, on_delivery=on_delivery)
                        break
                    except BufferError:
                        p.poll(0.05)
        p.poll(0)
    if p.flush(180):
        raise RuntimeError("fill: records still unacknowledged after 180 s")
    if errors:
        raise RuntimeError(f"fill: {len(errors)} records failed, first {errors[0]}")


def paced_produce(bootstrap: str, topic: str, rate: int, duration: float, size: int) -> int:
    """Records at `rate`/s for `duration` s (acks=all, librdkafka's default linger); returns the count."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **QUIET})
    value, errors = os.urandom(size), []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err)
    t0 = time.monotonic()
    sent = 0
    total = int(rate * duration)
    while sent < total:
        due = int((time.monotonic() - t0) * rate) + 1
        while sent < min(due, total):
            p.produce(topic, value, on_delivery=on_delivery)
            sent += 1
        p.poll(0)
        time.sleep(0.002)
    if p.flush(60):
        raise RuntimeError("sustained: records still unacknowledged after 60 s")
    if errors:
        raise RuntimeError(f"sustained: {len(errors)} records failed, first {errors[0]}")
    return sent


# ------------------------------------------------------------------------------------------ phases
def prepare(b: TreeBroker, args) -> None:
    (b.workdir / "data").mkdir()
    b.start()
    names = [f"lc-{i:04d}" for i in range(args.topics)]
    t0 = time.monotonic()
    create_topics(b.bootstrap, names, args.partitions)
    created = time.monotonic() - t0
    write_each(b.bootstrap, names, args.partitions, args.fill)
    create_topics(b.bootstrap, ["sustained"], args.sustained_partitions)
    b.sigterm()
    print(f"  {b.name}: {args.topics * args.partitions} partitions created in {created:.1f} s and filled",
          flush=True)


def lifecycle_round(b: TreeBroker, args) -> dict[str, float]:
    names = [f"lc-{i:04d}" for i in range(args.topics)]
    started, ready = b.start()
    write_each(b.bootstrap, names, args.partitions, 1)
    b.kill()
    rec_started, rec_ready = b.start()
    write_each(b.bootstrap, names, args.partitions, 1)
    down = b.sigterm()
    return {"start_started_s": started, "start_metadata_s": ready, "recovery_started_s": rec_started,
            "recovery_metadata_s": rec_ready, "sigterm_s": down}


def sustained_round(b: TreeBroker, args) -> dict[str, float]:
    b.start()
    time.sleep(1.0)          # bench pacing: the start-up's last work (first checkpoints) out of the window
    c0, t0 = b.cpu_seconds(), time.monotonic()
    time.sleep(args.idle)    # bench pacing: the idle window is a fixed length of wall time
    idle_per_s = (b.cpu_seconds() - c0) / (time.monotonic() - t0)
    c0, t0 = b.cpu_seconds(), time.monotonic()
    records = paced_produce(b.bootstrap, "sustained", args.rate, args.duration, args.size)
    cpu, wall = b.cpu_seconds() - c0, time.monotonic() - t0
    b.sigterm()
    return {"idle_cpu_ms_per_s": idle_per_s * 1e3, "cpu_us_per_record": cpu / records * 1e6,
            "cpu_us_per_record_above_idle": max(0.0, cpu - idle_per_s * wall) / records * 1e6,
            "records": records, "cpu_s": cpu, "wall_s": wall}


# ------------------------------------------------------------------------------------------ report
FIGURES = [("start_started_s", "start (clean): to \"started\"", "s"),
           ("start_metadata_s", "start (clean): to first Metadata", "s"),
           ("recovery_started_s", "start after kill -9: to \"started\"", "s"),
           ("recovery_metadata_s", "start after kill -9: to first Metadata", "s"),
           ("sigterm_s", "SIGTERM to exit", "s"),
           ("idle_cpu_ms_per_s", "idle broker CPU", "ms/s"),
           ("cpu_us_per_record", "sustained: broker CPU per record", "us"),
           ("cpu_us_per_record_above_idle", "sustained: CPU per record above idle", "us")]


def summarize(results: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for tree, rounds in results.items():
        out[tree] = {}
        for key, _, _ in FIGURES:
            values = [r[key] for r in rounds if key in r]
            if values:
                out[tree][key] = statistics.median(values)
    return out


def print_table(summary: dict[str, dict[str, float]], rounds: int, sustained: int, partitions: int) -> None:
    trees = list(summary)
    rows = []
    for key, label, unit in FIGURES:
        vals = [summary[t].get(key) for t in trees]
        if all(v is None for v in vals):
            continue
        cells = [f"{v:.3f}" if v is not None else "-" for v in vals]
        ratio = ""
        if len(trees) == 2 and vals[0] and vals[1] is not None:
            ratio = f"{vals[1] / vals[0]:.2f}"
        rows.append((f"{label} ({unit})", *cells, ratio))
    title = f"{partitions} partitions, medians of {rounds} rounds and {sustained} sustained runs per tree"
    headers = ["figure", *trees] + ([f"{trees[1]}/{trees[0]}"] if len(trees) == 2 else [])
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print("  ".join(headers))
        for row in rows:
            print("  ".join(str(c) for c in row[:len(headers)]))
        return
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row[:len(headers)])
    Console().print(table)


def parse_tree(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH: {text!r}")
    p = Path(path).resolve()
    if not (p / "src" / "odradek").is_dir():
        raise argparse.ArgumentTypeError(f"{path} has no src/odradek")
    return name, p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", type=parse_tree, default=[],
                    help="NAME=PATH of a checkout (one or two; default this checkout)")
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=100, help="partitions per topic")
    ap.add_argument("--fill", type=int, default=10, help="records written to each partition at set-up")
    ap.add_argument("--rounds", type=int, default=3, help="start/kill/SIGTERM rounds per tree")
    ap.add_argument("--duration", type=float, default=60.0, help="sustained produce seconds (0: skip)")
    ap.add_argument("--sustained-rounds", type=int, default=1)
    ap.add_argument("--rate", type=int, default=1500, help="sustained records/s")
    ap.add_argument("--size", type=int, default=100, help="sustained record bytes")
    ap.add_argument("--sustained-partitions", type=int, default=6)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured before the run")
    ap.add_argument("--quick", action="store_true", help="2 x 100 partitions, 1 round, 10 s sustained")
    ap.add_argument("--json", metavar="FILE", help="write every round's figures and the medians as JSON")
    args = ap.parse_args()
    if args.quick:
        args.topics, args.partitions, args.rounds, args.duration, args.idle = 2, 100, 1, 10.0, 3.0
    trees = args.tree or [("this", REPO)]
    if len(trees) > 2 or len({n for n, _ in trees}) != len(trees):
        ap.error("give one or two --tree with distinct names")
    install_cleanup()
    brokers = [TreeBroker(name, path) for name, path in trees]
    partitions = args.topics * args.partitions
    print(f"setting up {partitions} partitions per tree", flush=True)
    for b in brokers:
        prepare(b, args)
    results: dict[str, list[dict]] = {b.name: [] for b in brokers}
    for r in range(args.rounds):
        for b in (brokers if r % 2 == 0 else brokers[::-1]):
            fig = lifecycle_round(b, args)
            results[b.name].append(fig)
            print(f"  round {r + 1} {b.name}: " + ", ".join(f"{k} {v:.3f}" for k, v in fig.items()), flush=True)
    if args.duration > 0:
        for r in range(args.sustained_rounds):
            for b in (brokers if r % 2 == 0 else brokers[::-1]):
                fig = sustained_round(b, args)
                results[b.name].append(fig)
                print(f"  sustained {r + 1} {b.name}: " + ", ".join(f"{k} {v:.3f}" for k, v in fig.items()),
                      flush=True)
    summary = summarize(results)
    print_table(summary, args.rounds, args.sustained_rounds if args.duration > 0 else 0, partitions)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "partitions": partitions, "trees": {b.name: str(b.tree) for b in brokers},
            "args": {k: v for k, v in vars(args).items() if k not in ("tree", "json")},
            "rounds": results, "medians": summary}, indent=2))
    for b in brokers:
        b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
