"""A local cluster for development: a ZooKeeper server and N `odradek serve` processes on loopback
(DESIGN, "Configuration and commands": `cluster`, a local ZooKeeper plus N brokers; seed 003,
"Replication": brokers coordinate through ZooKeeper, elect a controller and replicate partitions).

`LocalCluster` owns the processes. Layout of its directory:

    <dir>/zookeeper/           ZooKeeper's zoo.cfg, data and zookeeper.log
    <dir>/broker-<id>/data     the broker's log.dirs
    <dir>/broker-<id>/broker.log   its stdout and stderr
    <dir>/cluster.json         what runs now: ZooKeeper's address, each broker's id, address and pid

Broker i gets `broker.id=i`, `zookeeper.connect` of the local ZooKeeper, a PLAINTEXT listener on
127.0.0.1 (port base_port + i, or one the system picks; a restarted broker keeps its port) and its own
log dir. The replication factors of the internal topics are capped at the number of brokers (Kafka's
default of 3 cannot be met by a smaller cluster); `overrides` come last and win.

Every process runs in a session of its own, so a Ctrl-C in the terminal reaches only the supervisor,
which stops the brokers in order: the brokers that are not the controller one at a time (each moves
its leaders away with a controlled shutdown), then the controller, then ZooKeeper.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from odradek.cluster.local_zookeeper import LocalZooKeeper

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
_STARTED_RE = re.compile(r"odradek broker (-?\d+) started .*ports \{'[A-Za-z0-9_]+': (\d+)")

Progress = Callable[[str], None]


class ClusterError(RuntimeError):
    """A cluster that cannot start: the message names the process and where its log is."""


def odradek_command() -> list[str]:
    """`odradek` as the running interpreter runs it (the installed script, or `python -m`)."""
    exe = shutil.which("odradek", path=os.path.dirname(sys.executable)) or shutil.which("odradek")
    return [exe] if exe else [sys.executable, "-m", "odradek.cli.main"]


def cluster_defaults(size: int) -> dict[str, str]:
    """Broker configs every broker of a local cluster of `size` gets before the user's overrides."""
    return {
        "offsets.topic.replication.factor": str(min(3, size)),
        "transaction.state.log.replication.factor": str(min(3, size)),
        "transaction.state.log.min.isr": str(min(2, size)),
    }


@dataclass
class BrokerProcess:
    """One `odradek serve` process of the cluster."""
    broker_id: int
    base_dir: Path
    port: int = 0                       # 0 until the first start tells which port it bound
    proc: subprocess.Popen | None = None
    starts: int = 0
    expected_exit: bool = False         # set before a signal the supervisor sends itself
    reported: bool = False              # an unexpected exit has been reported
    _log_mark: int = 0

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "broker.log"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def launch(self, zookeeper_connect: str, overrides: dict[str, str]) -> None:
        """Start the process; `wait_started` reads its port from the log."""
        if self.running:
            raise ClusterError(f"broker {self.broker_id} is already running")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        configs = {"broker.id": str(self.broker_id), "zookeeper.connect": zookeeper_connect,
                   "listeners": f"PLAINTEXT://{HOST}:{self.port}", "log.dirs": str(self.data_dir), **overrides}
        cmd = [*odradek_command(), "serve"]
        for k, v in configs.items():
            cmd += ["--override", f"{k}={v}"]
        self._log_mark = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"==== start #{self.starts + 1}: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.base_dir, start_new_session=True)
        self.starts += 1
        self.expected_exit = False
        self.reported = False

    def started(self) -> bool:
        """True once the broker logged that it started (and its port is known); ClusterError if it
        exited first."""
        if self.proc is None:
            return False
        with open(self.log_path, "rb") as f:
            f.seek(self._log_mark)
            m = _STARTED_RE.search(f.read().decode(errors="replace"))
        if m:
            self.port = int(m.group(2))
            return True
        if self.proc.poll() is not None:
            raise ClusterError(f"broker {self.broker_id} exited with status {self.proc.returncode} before it "
                               f"started; see {self.log_path}:\n{self.log_tail()}")
        return False

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_bytes()[-16384:].decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, sig: int) -> None:
        if self.running and self.proc is not None:
            self.expected_exit = True
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout_s: float) -> int | None:
        """The exit status, or None if it is still running after `timeout_s`."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """kill -9: a crash (no controlled shutdown, no clean-shutdown marker)."""
        self.signal(signal.SIGKILL)
        self.wait(10)


@dataclass
class StopReport:
    """How each process ended when the cluster was stopped."""
    clean: list[int] = field(default_factory=list)               # broker ids that exited 0 on SIGTERM
    failed: dict[int, str] = field(default_factory=dict)         # broker id -> what went wrong
    zookeeper: str = "stopped"

    @property
    def ok(self) -> bool:
        return not self.failed and self.zookeeper == "stopped"


class LocalCluster:
    """ZooKeeper and `size` brokers under `base_dir`. `start()` returns once every broker is
    registered under /brokers/ids and a controller is elected; `stop()` ends them all."""

    def __init__(self, base_dir: str | os.PathLike, size: int, *, base_port: int = 0, zookeeper_port: int = 0,
                 overrides: dict[str, str] | None = None, progress: Progress | None = None) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one broker")
        self.base_dir = Path(base_dir)
        self.size = size
        self.overrides = {**cluster_defaults(size), **(overrides or {})}
        self.zookeeper = LocalZooKeeper(self.base_dir / "zookeeper", port=zookeeper_port, host=HOST)
        self.brokers = [BrokerProcess(i, self.base_dir / f"broker-{i}", port=base_port + i if base_port else 0)
                        for i in range(size)]
        self.progress: Progress = progress or (lambda _text: None)
        self._store: Any = None
        self.zookeeper_reported = False

    # ------------------------------------------------------------------------------ addresses
    @property
    def bootstrap(self) -> str:
        """The bootstrap.servers of the brokers that run."""
        return ",".join(b.address for b in self.brokers if b.running and b.port)

    @property
    def zookeeper_connect(self) -> str:
        return self.zookeeper.connect

    # ------------------------------------------------------------------------------ start
    def start(self, timeout_s: float = START_TIMEOUT_S) -> "LocalCluster":
        self.base_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.progress(f"Starting ZooKeeper on {self.zookeeper.connect} ...")
        try:
            self.zookeeper.start(timeout_s)
        except RuntimeError as e:
            raise ClusterError(str(e)) from None
        self.progress(f"ZooKeeper is up ({time.monotonic() - t0:.1f} s)")
        for b in self.brokers:
            b.launch(self.zookeeper.connect, self.overrides)
            self.progress(f"Starting broker {b.broker_id} (pid {b.pid}, log {b.log_path}) ...")
        deadline = time.monotonic() + timeout_s
        waiting = list(self.brokers)
        while waiting:
            for b in list(waiting):
                if b.started():
                    waiting.remove(b)
                    self.progress(f"Broker {b.broker_id} listens on {b.address} ({time.monotonic() - t0:.1f} s)")
            if waiting and time.monotonic() > deadline:
                names = ", ".join(str(b.broker_id) for b in waiting)
                raise ClusterError(f"broker(s) {names} did not start within {timeout_s:g} s; see their broker.log")
            time.sleep(0.05)
        self.wait_registered(timeout_s)
        self.write_state()
        self.progress(f"Every broker is registered; controller: broker {self.controller_id()} "
                      f"({time.monotonic() - t0:.1f} s)")
        return self

    def store(self) -> Any:
        """A ZooKeeper session of the supervisor's own, to read /brokers/ids and /controller."""
        if self._store is None:
            try:
                from odradek.cluster.zookeeper_store import ZooKeeperStore
            except ImportError:
                raise ClusterError("the zookeeper extra is not installed (pip install 'odradek[zookeeper]')") \
                    from None
            self._store = ZooKeeperStore(self.zookeeper.connect, session_timeout_ms=10_000).start()
        return self._store

    def registered_ids(self) -> list[int]:
        from odradek.cluster.registration import BROKER_IDS_PATH
        return sorted(int(c) for c in self.store().children(BROKER_IDS_PATH) if c.lstrip("-").isdigit())

    def controller_id(self) -> int | None:
        from odradek.cluster.registration import current_controller
        return current_controller(self.store())

    def wait_registered(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every running broker is under /brokers/ids and a controller is elected."""
        deadline = time.monotonic() + timeout_s
        while True:
            wanted = {b.broker_id for b in self.brokers if b.running}
            registered = set(self.registered_ids())
            if wanted <= registered and self.controller_id() is not None:
                return
            for b in self.brokers:
                if b.proc is not None and not b.running and not b.expected_exit:
                    raise ClusterError(f"broker {b.broker_id} exited with status {b.returncode}; "
                                       f"see {b.log_path}:\n{b.log_tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"after {timeout_s:g} s, registered: {sorted(registered)}, wanted: "
                                   f"{sorted(wanted)}, controller: {self.controller_id()}")
            time.sleep(0.1)

    def write_state(self) -> None:
        state = {"zookeeper": {"connect": self.zookeeper.connect, "pid": self.zookeeper.proc.pid
                               if self.zookeeper.proc else None, "log": str(self.zookeeper.log_path)},
                 "bootstrap": self.bootstrap,
                 "brokers": [{"id": b.broker_id, "address": b.address, "pid": b.pid, "log_dir": str(b.data_dir),
                              "log": str(b.log_path)} for b in self.brokers]}
        tmp = self.base_dir / "cluster.json.tmp"
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.base_dir / "cluster.json")

    # ------------------------------------------------------------------------------ one broker
    def kill_broker(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()

    def stop_broker(self, broker_id: int, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (a controlled shutdown) and wait: the exit status, None if it did not stop."""
        b = self.brokers[broker_id]
        b.signal(signal.SIGTERM)
        return b.wait(timeout_s)

    def restart_broker(self, broker_id: int, timeout_s: float = START_TIMEOUT_S) -> None:
        b = self.brokers[broker_id]
        if b.running:
            raise ClusterError(f"broker {broker_id} is running")
        b.launch(self.zookeeper.connect, self.overrides)
        deadline = time.monotonic() + timeout_s
        while not b.started():
            if time.monotonic() > deadline:
                raise ClusterError(f"broker {broker_id} did not start within {timeout_s:g} s; see {b.log_path}")
            time.sleep(0.05)
        self.wait_registered(max(1.0, deadline - time.monotonic()))
        self.write_state()

    def unexpected_exits(self) -> list[BrokerProcess]:
        """Brokers that exited without being asked to, not reported before (each is reported once)."""
        out = []
        for b in self.brokers:
            if b.proc is not None and not b.running and not b.expected_exit and not b.reported:
                b.reported = True
                out.append(b)
        return out

    def zookeeper_exited(self) -> bool:
        """True once, when ZooKeeper has exited without being asked to."""
        proc = self.zookeeper.proc
        if proc is not None and proc.poll() is not None and not self.zookeeper_reported:
            self.zookeeper_reported = True
            return True
        return False

    # ------------------------------------------------------------------------------ stop
    def stop_order(self, controller: int | None) -> list[BrokerProcess]:
        """The running brokers, the controller last (so it moves the others' leaders while they go)."""
        running = [b for b in self.brokers if b.running]
        return sorted(running, key=lambda b: (b.broker_id == controller, b.broker_id))

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> StopReport:
        """SIGTERM each broker and wait (the controller last), then ZooKeeper. A broker that does not
        stop within `timeout_s` is killed and reported."""
        report = StopReport()
        for b in self.brokers:
            if b.proc is not None and not b.running and not b.expected_exit:
                report.failed[b.broker_id] = f"had exited with status {b.returncode} before the stop"
        try:
            controller = self.controller_id()
        except Exception:       # ZooKeeper gone: any order
            controller = None
        for b in self.stop_order(controller):
            t0 = time.monotonic()
            role = ", the controller" if b.broker_id == controller else ""
            self.progress(f"Stopping broker {b.broker_id} (pid {b.pid}{role}) ...")
            b.signal(signal.SIGTERM)
            rc = b.wait(timeout_s)
            if rc is None:
                b.kill()
                report.failed[b.broker_id] = f"did not stop within {timeout_s:g} s of SIGTERM and was killed"
                self.progress(f"Broker {b.broker_id} did not stop within {timeout_s:g} s: killed")
            elif rc != 0:
                report.failed[b.broker_id] = f"exited with status {rc} on SIGTERM; see {b.log_path}"
                self.progress(f"Broker {b.broker_id} exited with status {rc}")
            else:
                report.clean.append(b.broker_id)
                self.progress(f"Broker {b.broker_id} stopped ({time.monotonic() - t0:.1f} s)")
        self.close_store()
        if self.zookeeper.proc is not None:
            if self.zookeeper.running:
                self.progress("Stopping ZooKeeper ...")
                self.zookeeper.stop()
                self.progress("ZooKeeper stopped")
            else:
                report.zookeeper = f"had exited with status {self.zookeeper.proc.returncode}"
        return report

    def kill_all(self) -> None:
        """SIGKILL everything at once (a second Ctrl-C, or a failed start)."""
        for b in self.brokers:
            if b.running:
                b.kill()
        self.close_store()
        self.zookeeper.kill()

    def close_store(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            finally:
                self._store = None
