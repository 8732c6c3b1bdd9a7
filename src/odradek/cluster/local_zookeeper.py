"""A local ZooKeeper server for development and tests (`odradek cluster up`, `tests/cluster/`).

ZooKeeper is the seeds' coordination engine; odradek does not reimplement it. This module runs the real
server from the Java distribution the system provides (Debian's `zookeeper` package: the class
`org.apache.zookeeper.server.quorum.QuorumPeerMain` in `zookeeper.jar`, whose manifest names the
jars it needs) as a child process with a `zoo.cfg` of our own: a standalone server on a loopback port,
its data in a directory we own, no admin server.

Sessions. ZooKeeper expires a session on its tick (`tickTime`), so a dead broker is noticed up to one
tick after `zookeeper.session.timeout.ms`: the tick is 200 ms here (ZooKeeper's own default is 3 s),
which keeps failover close to the session timeout. ZooKeeper clamps every requested timeout to
[minSessionTimeout, maxSessionTimeout], by default [2, 20] ticks, which would cut Kafka's default of
18 s to 4 s; the bounds are set instead to 2 ticks and MAX_SESSION_TIMEOUT_MS, so the timeout a broker
asks for is the one it gets (`session_timeouts()` shows what the server granted).

`find_zookeeper_jar()` looks in `$ODRADEK_ZOOKEEPER_JAR`, then in the files `dpkg -L zookeeper` lists,
then in the usual places; a missing jar is a clear error that names the package to install.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TICK_MS = 200
MAX_SESSION_TIMEOUT_MS = 120_000
_CANDIDATES = ("/usr/share/java/zookeeper.jar", "/usr/share/zookeeper/zookeeper.jar")


class ZooKeeperNotFound(RuntimeError):
    pass


def find_zookeeper_jar() -> str:
    env = os.environ.get("ODRADEK_ZOOKEEPER_JAR")
    if env:
        if not os.path.isfile(env):
            raise ZooKeeperNotFound(f"ODRADEK_ZOOKEEPER_JAR={env} is not a file")
        return env
    if shutil.which("dpkg"):
        try:
            listed = subprocess.run(["dpkg", "-L", "libzookeeper-java", "zookeeper"], capture_output=True,
                                    text=True, timeout=10).stdout.split()
        except (OSError, subprocess.SubprocessError):
            listed = []
        for path in listed:
            if path.endswith("/zookeeper.jar") and os.path.isfile(path):
                return path
    for path in _CANDIDATES:
        if os.path.isfile(path):
            return path
    raise ZooKeeperNotFound("no ZooKeeper server found: install Debian's zookeeper package "
                            "(apt-get install zookeeper) or set ODRADEK_ZOOKEEPER_JAR")


def find_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperNotFound("no java on PATH: install a JRE (apt-get install default-jre-headless)")
    return java


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalZooKeeper:
    """One standalone ZooKeeper server. `start()` returns once it answers `ruok`; `stop()` ends it;
    `kill()` is kill -9. Restarting keeps the data directory (and so every node but the ephemeral)."""

    def __init__(self, data_dir: str | os.PathLike, port: int = 0, host: str = "127.0.0.1",
                 tick_ms: int = TICK_MS) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.tick_ms = tick_ms
        self.proc: subprocess.Popen | None = None

    @property
    def connect(self) -> str:
        """The `zookeeper.connect` string (without a chroot)."""
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    def _write_config(self) -> Path:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text("\n".join([
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,cons",
            # Sessions as short as Kafka tests use (zookeeper.session.timeout.ms of a few seconds) and as
            # long as Kafka's defaults and beyond, whatever the tick.
            f"minSessionTimeout={2 * self.tick_ms}",
            f"maxSessionTimeout={max(MAX_SESSION_TIMEOUT_MS, 2 * self.tick_ms)}",
            "",
        ]))
        return cfg

    def start(self, timeout_s: float = 60.0) -> "LocalZooKeeper":
        if self.running:
            raise RuntimeError("ZooKeeper is already running")
        cfg = self._write_config()
        cmd = [find_java(), "-Xmx256m", "-Dzookeeper.jmx.log4j.disable=true", "-cp", find_zookeeper_jar(),
               MAIN_CLASS, str(cfg)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.data_dir, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self.ruok():
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"ZooKeeper did not answer within {timeout_s} s; see {self.log_path}")
            time.sleep(0.1)
        return self

    def ruok(self) -> bool:
        """ZooKeeper's four-letter health check."""
        try:
            return self.four_letter("ruok") == "imok"
        except OSError:
            return False

    def four_letter(self, word: str, limit: int = 1 << 20) -> str:
        """The answer to one of ZooKeeper's four-letter commands (the server closes when done)."""
        with socket.create_connection((self.host, self.port), timeout=5) as s:
            s.sendall(word.encode("ascii"))
            chunks, size = [], 0
            while size < limit and (chunk := s.recv(65536)):
                chunks.append(chunk)
                size += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def session_timeouts(self) -> dict[int, int]:
        """{session id: the timeout the server granted it, ms} for every client connected now."""
        out: dict[int, int] = {}
        for line in self.four_letter("cons").splitlines():
            fields = dict(f.split("=", 1) for f in line.strip().strip("()").split(",") if "=" in f)
            if "sid" in fields and "to" in fields:
                out[int(fields["sid"], 16)] = int(fields["to"])
        return out

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        self._signal(signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        self._signal(signal.SIGKILL, 20.0)

    def _signal(self, sig: int, timeout_s: float) -> None:
        if not self.running or self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout_s)

    def __enter__(self) -> "LocalZooKeeper":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
