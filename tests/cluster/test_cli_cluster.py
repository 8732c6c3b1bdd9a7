"""`odradek cluster up`, `odradek cluster describe` and `odradek topics describe` on a real local
cluster (a ZooKeeper and three `odradek serve` processes), driven as a user would: `cluster up` runs as
a subprocess, the test reads its printed bootstrap servers, creates a topic with replication factor 3
with confluent-kafka's AdminClient, reads what the tools say, pauses a broker (SIGSTOP) to see its
partitions reported under-replicated, and ends the cluster with SIGINT. One cluster for the module;
the tests run in order and the last one stops it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.cli_support import odradek
from tests.integration.conftest import odradek_command

from .cluster_support import wait_for

TOPIC = "replicated"
UP_OVERRIDES = {"zookeeper.session.timeout.ms": "6000", "replica.lag.time.max.ms": "3000",
                "auto.create.topics.enable": "false"}


class Up:
    """The `odradek cluster up` process, its output file and what it printed."""

    def __init__(self, out_dir: Path) -> None:
        self.stdout_path = out_dir / "up.out"
        self.stderr_path = out_dir / "up.err"
        cmd = [*odradek_command(), "cluster", "up", "--brokers", "3"]
        for k, v in UP_OVERRIDES.items():
            cmd += ["--override", f"{k}={v}"]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         start_new_session=True)
        self.bootstrap = wait_for("the printed bootstrap servers", lambda: self._printed(r"^Bootstrap: (\S+)$"),
                                  timeout=90)
        self.dir = Path(self._printed(r"^Cluster directory: (.+)$"))
        self.state = json.loads((self.dir / "cluster.json").read_text())

    def _printed(self, pattern: str) -> str | None:
        assert self.proc.poll() is None, f"cluster up exited with {self.proc.returncode}:\n{self.output()}"
        m = re.search(pattern, self.stdout_path.read_text(), re.M)
        return m.group(1) if m else None

    def output(self) -> str:
        return self.stdout_path.read_text() + self.stderr_path.read_text()

    def pids(self) -> dict[str, int]:
        out = {f"broker-{b['id']}": b["pid"] for b in self.state["brokers"]}
        out["zookeeper"] = self.state["zookeeper"]["pid"]
        return out

    def force_cleanup(self) -> None:
        """After a failed test only: nothing of the cluster is left running."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for pid in self.pids().values():
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    u = Up(tmp_path_factory.mktemp("cluster-up"))
    try:
        yield u
    finally:
        u.force_cleanup()


def isr_sizes(bootstrap: str, topic: str) -> dict[int, int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic=topic, timeout=10).topics[topic]
    return {p.id: len(p.isrs) for p in md.partitions.values()} if md.error is None else {}


def test_up_prints_three_brokers_and_writes_its_state(up):
    text = up.stdout_path.read_text()
    assert [b["id"] for b in up.state["brokers"]] == [0, 1, 2]
    assert up.bootstrap == ",".join(b["address"] for b in up.state["brokers"])
    for b in up.state["brokers"]:
        assert f"Broker {b['id']} listens on {b['address']}" in text and alive(b["pid"])
        assert Path(b["log_dir"]).is_dir()
    assert "Every broker is registered; controller: broker" in text
    assert alive(up.state["zookeeper"]["pid"])


def test_describe_shows_brokers_controller_and_an_isr_of_three(up):
    admin = AdminClient({"bootstrap.servers": up.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 3, 3, config={"min.insync.replicas": "2"})],
                        operation_timeout=30)[TOPIC].result(60)
    wait_for("an ISR of 3 everywhere", lambda: isr_sizes(up.bootstrap, TOPIC) == {0: 3, 1: 3, 2: 3})

    c = odradek("cluster", "describe", "--json", bootstrap=up.bootstrap).ok().json()
    assert [(b["id"], f"{b['host']}:{b['port']}") for b in c["brokers"]] == [
        (b["id"], b["address"]) for b in up.state["brokers"]]
    assert c["controller_id"] in (0, 1, 2)
    assert c["topics"] >= 1 and c["partitions"] >= 3
    assert c["under_replicated_partitions"] == [] and c["offline_partitions"] == []
    text = odradek("cluster", "describe", bootstrap=up.bootstrap).ok().stdout
    assert f"Controller: {c['controller_id']}" in text and "Under-replicated: 0  Offline: 0" in text

    [t] = odradek("topics", "describe", "--topic", TOPIC, "--json", bootstrap=up.bootstrap).ok().json()
    assert t["replication_factor"] == 3 and t["min_insync_replicas"] == 2
    for p in t["partitions"]:
        assert sorted(p["replicas"]) == [0, 1, 2] and sorted(p["isr"]) == [0, 1, 2]
        assert p["leader"] in p["replicas"] and not p["under_replicated"] and not p["unavailable"]
    assert sorted(p["leader"] for p in t["partitions"]) == [0, 1, 2]   # one leader per broker
    text = odradek("topics", "describe", "--topic", TOPIC, bootstrap=up.bootstrap).ok().stdout
    assert "ReplicationFactor: 3" in text and "ISR" in text and "REPLICAS" in text


def test_a_paused_broker_makes_partitions_under_replicated_and_is_not_an_exit(up):
    """SIGSTOP a broker: its ZooKeeper session expires, the controller moves its leaders away and
    the ISRs shrink to the two others, and both tools say so; SIGCONT: it registers again, catches up
    and rejoins every ISR. `cluster up` reports nothing: the process never exited."""
    paused = 1
    pid = up.pids()[f"broker-{paused}"]
    bootstrap = ",".join(b["address"] for b in up.state["brokers"] if b["id"] != paused)

    def shrunk() -> bool:
        md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic=TOPIC, timeout=10)
        parts = md.topics[TOPIC].partitions.values()
        return paused not in md.brokers and all(paused not in p.isrs and p.leader >= 0 for p in parts)

    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for("the paused broker gone from the brokers and every ISR", shrunk, timeout=60)
        c = odradek("cluster", "describe", "--json", bootstrap=bootstrap).ok().json()
        assert [b["id"] for b in c["brokers"]] == [0, 2] and c["replicas_on_missing_brokers"] == [paused]
        under = {r["partition"]: r for r in c["under_replicated_partitions"] if r["topic"] == TOPIC}
        assert sorted(under) == [0, 1, 2] and c["offline_partitions"] == []
        assert all(sorted(r["isr"]) == [0, 2] and paused in r["replicas"] for r in under.values())
        text = odradek("cluster", "describe", bootstrap=bootstrap).ok().stdout
        assert "Under-replicated partitions:" in text and "Replicas on brokers not in the cluster: 1" in text

        [t] = odradek("topics", "describe", "--topic", TOPIC, "--under-replicated-partitions", "--json",
                      bootstrap=bootstrap).ok().json()
        assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
        assert all(p["under_replicated"] and p["at_min_isr"] and not p["under_min_isr"] and
                   p["offline_replicas"] == [paused] for p in t["partitions"])
        assert odradek("topics", "describe", "--topic", TOPIC, "--under-min-isr-partitions", "--json",
                       bootstrap=bootstrap).ok().json() == []
        text = odradek("topics", "describe", "--topic", TOPIC, bootstrap=bootstrap).ok().stdout
        assert text.count("under-replicated, at min ISR") == 3
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for("an ISR of 3 again", lambda: isr_sizes(up.bootstrap, TOPIC) == {0: 3, 1: 3, 2: 3}, timeout=90)
    assert "exited unexpectedly" not in up.stderr_path.read_text()


def test_sigint_stops_every_broker_then_zookeeper_with_status_0(up):
    pids = up.pids()
    assert all(alive(pid) for pid in pids.values()), pids
    up.proc.send_signal(signal.SIGINT)
    status = up.proc.wait(120)
    out = up.output()
    assert status == 0, out
    assert [n for n, pid in pids.items() if alive(pid)] == [], out
    stops = [int(m) for m in re.findall(r"^Broker (\d) stopped", out, re.M)]
    assert sorted(stops) == [0, 1, 2], out
    assert out.index("ZooKeeper stopped") > max(out.index(f"Broker {i} stopped") for i in range(3))
    # the controller goes last, so the others move their leaders to a controller that stays
    controller_line = re.search(r"^Stopping broker (\d) \(pid \d+, the controller\)", out, re.M)
    assert controller_line and int(controller_line.group(1)) == stops[-1], out
    assert not up.dir.exists(), "the temporary cluster directory is removed after a clean stop"
    assert up.stderr_path.read_text() == ""
