"""The tools as a new user meets them (issue 34, "The first hour"), each as the real `odradek` command
in a subprocess against a real broker: the console producer lets the broker create a topic; a refused
connection and a bad address are reported at once; one properties reader; help pages with their
examples; errors that point at the right help and guess a misspelt command; `topics list` piped and on
a terminal (a pseudo-terminal); plain tables; offsets in `topics describe`; `broker-api-versions` in
kafka-broker-api-versions.sh's format, cross-checked with a raw ApiVersions exchange; the
ODRADEK_BOOTSTRAP_SERVER variable."""

from __future__ import annotations

import os
import pty
import re
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from .cli_support import CLI_TIMEOUT_S, new_name, odradek, unreachable
from .clients import confluent_config, connect, recv_frame, request_frame, wait_until
from .conftest import odradek_command

COMMANDS_WITH_EXAMPLES = ["serve", "topics", "produce", "consume", "groups", "configs", "perf", "cluster",
                          "transactions", "broker-api-versions"]


def read_all(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    """Every record of partition 0 of `topic`, with confluent-kafka's consumer."""
    c = Consumer(confluent_config(bootstrap, group_id=new_name("check"), enable_auto_commit=False))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < expected and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and m.error() is None:
                got.append(m.value())
        return got
    finally:
        c.close()


def run_in_pty(args: list[str], env: dict | None = None) -> str:
    """The command's output as a terminal shows it: stdout is a pseudo-terminal."""
    main, child = pty.openpty()
    proc = subprocess.Popen([*odradek_command(), *args], stdout=child, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=env)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:          # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert proc.wait(CLI_TIMEOUT_S) == 0, proc.stderr.read().decode()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def assert_plain_table(text: str) -> list[str]:
    lines = text.split("\n")
    assert lines[-1] == "", "output ends with one newline"
    lines = lines[:-1]
    assert lines and lines[0].strip() and lines[-1].strip(), f"blank line before or after the table:\n{text!r}"
    assert all(line == line.rstrip() for line in lines), f"trailing spaces:\n{text!r}"
    return lines


# ------------------------------------------------------------------------------------------ producing
def test_produce_creates_a_missing_topic_when_the_broker_allows_it(broker):
    t = new_name("cli-autocreate")
    odradek("produce", "--topic", t, input="one\ntwo\n", bootstrap=broker.bootstrap).ok()
    assert read_all(broker.bootstrap, t, 2) == [b"one", b"two"]
    [d] = odradek("topics", "describe", "--topic", t, "--json", bootstrap=broker.bootstrap).ok().json()
    assert d["partition_count"] >= 1


def test_produce_to_a_missing_topic_says_why_at_once(broker, broker_factory):
    strict = broker_factory(auto_create_topics_enable="false")
    t = new_name("cli-nocreate")
    t0 = time.monotonic()
    odradek("produce", "--topic", t, input="x\n", bootstrap=strict.bootstrap).fails(
        "UNKNOWN_TOPIC_OR_PARTITION", t, "auto.create.topics.enable=false", f"odradek topics create --topic {t}")
    odradek("produce", "--topic", t, "--producer-property", "allow.auto.create.topics=false", input="x\n",
            bootstrap=broker.bootstrap).fails("allow.auto.create.topics=false", t)
    assert time.monotonic() - t0 < 25, "both answered well within one 30 s timeout"
    assert t not in odradek("topics", "list", bootstrap=broker.bootstrap).ok().stdout.split()


# ------------------------------------------------------------------------------------------ addresses
def test_refused_connection_is_reported_at_once():
    addr = unreachable()
    for command in (["topics", "list"], ["produce", "--topic", "x"], ["broker-api-versions"]):
        t0 = time.monotonic()
        r = odradek(*command, "--timeout", "60", input="x\n", bootstrap=f"{addr},{unreachable()}")
        elapsed = time.monotonic() - t0
        r.fails(f"cannot reach the cluster at {addr}", "connection refused")
        assert elapsed < 20, f"{command} took {elapsed:.1f}s of a 60 s timeout"


@pytest.mark.parametrize("address, reason", [
    ("localhost", "'localhost' has no port"), ("localhost:", "bad port"), ("localhost:99999", "bad port"),
    ("localhost:ab", "bad port"), ("localhost:9092,", "an empty address"), (":9092", "no host"),
])
def test_bad_address_is_refused_while_parsing(address, reason):
    t0 = time.monotonic()
    odradek("topics", "list", "--timeout", "60", bootstrap=address).fails(
        "argument --bootstrap-server", reason, "see: odradek topics list --help", status=2)
    assert time.monotonic() - t0 < 20


def test_bootstrap_server_from_the_environment(broker):
    env = {**os.environ, "ODRADEK_BOOTSTRAP_SERVER": broker.bootstrap}
    t = new_name("cli-env")
    odradek("topics", "create", "--topic", t, bootstrap=broker.bootstrap).ok()
    r = subprocess.run([*odradek_command(), "topics", "list"], env=env, capture_output=True, text=True,
                       timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0 and t in r.stdout.split(), r.stderr
    # The flag wins over the variable.
    env["ODRADEK_BOOTSTRAP_SERVER"] = unreachable()
    r = subprocess.run([*odradek_command(), "topics", "list", "--bootstrap-server", broker.bootstrap], env=env,
                       capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert r.returncode == 0 and t in r.stdout.split(), r.stderr
    env["ODRADEK_BOOTSTRAP_SERVER"] = "localhost"
    r = subprocess.run([*odradek_command(), "topics", "list"], env=env, capture_output=True, text=True,
                       timeout=CLI_TIMEOUT_S)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "ODRADEK_BOOTSTRAP_SERVER" in r.stderr, r.stderr


# ------------------------------------------------------------------------------------------ properties
def test_command_config_reads_java_properties_syntax(broker, tmp_path):
    """Continuation lines, `key value`, `key:value`, escapes and both comment marks, as serve reads them."""
    f = tmp_path / "client.properties"
    f.write_text("# a comment\n! another\nclient.id  cli\\\n    -props\nrequest.timeout.ms:20000\n"
                 "socket.connection.setup.timeout.ms = 5\\\n 000\n")
    out = odradek("topics", "list", "--json", "--command-config", f, bootstrap=broker.bootstrap).ok().json()
    assert isinstance(out, list)
    # A value read with the `key value` form is checked like any other: the key is named.
    bad = tmp_path / "bad.properties"
    bad.write_text("request.timeout.ms   soon\n")
    odradek("topics", "list", "--command-config", bad, bootstrap=broker.bootstrap).fails(
        "invalid client configuration", "request.timeout.ms", status=2)
    # The broker reads the same file the same way (`serve --config`): an unknown escape would differ.
    server = tmp_path / "server.properties"
    server.write_text("num.partitions \\\n  3\nlog.dirs=" + str(tmp_path / "data").replace("\\", "\\\\") + "\n"
                      "listeners:PLAINTEXT\\://127.0.0.1\\:0\n")
    proc = subprocess.Popen([*odradek_command(), "serve", "--config", str(server)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        started = ""
        for line in proc.stdout:
            if "started" in line:
                started = line
                break
        assert started, "the broker did not start"
        port = int(re.findall(r"(\d+)\D*$", started)[0])
        t = new_name("cli-props")
        odradek("topics", "create", "--topic", t, bootstrap=f"127.0.0.1:{port}").ok()
        [d] = odradek("topics", "describe", "--topic", t, "--json", bootstrap=f"127.0.0.1:{port}").ok().json()
        assert d["partition_count"] == 3
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


# ------------------------------------------------------------------------------------------ help and errors
@pytest.mark.parametrize("command", COMMANDS_WITH_EXAMPLES)
def test_help_keeps_its_example_lines(command):
    r = odradek(command, "--help").ok()
    examples = [line for line in r.stdout.splitlines() if line.startswith("    odradek ")]
    assert examples, f"no example lines in `odradek {command} --help`:\n{r.stdout}"
    for line in examples:
        assert len(line.split("odradek ")) == 2 or "|" in line or "&&" in line, f"two examples on one line: {line}"
    assert any(f"odradek {command}" in line for line in examples)


def test_unknown_flag_points_at_the_subcommands_help(broker):
    odradek("topics", "list", "--no-such-flag", bootstrap=broker.bootstrap).fails(
        "odradek topics list: error: unrecognized arguments: --no-such-flag", "see: odradek topics list --help",
        status=2)
    odradek("produce", "--topic", "t", "--frobnicate", bootstrap=broker.bootstrap).fails(
        "odradek produce: error", "--frobnicate", "see: odradek produce --help", status=2)


def test_misspelt_commands_get_a_suggestion():
    odradek("topcis", "list").fails("invalid choice: 'topcis'", "did you mean 'topics'?", "see: odradek --help",
                                    status=2)
    odradek("topics", "lsit").fails("did you mean 'list'?", "see: odradek topics --help", status=2)
    odradek("broker-api-version").fails("did you mean 'broker-api-versions'?", status=2)


# ------------------------------------------------------------------------------------------ output
def test_topics_list_piped_terminal_and_json(broker):
    names = sorted(new_name("cli-ls") for _ in range(3))
    for n in names:
        odradek("topics", "create", "--topic", n, "--partitions", "1", bootstrap=broker.bootstrap).ok()
    piped = odradek("topics", "list", bootstrap=broker.bootstrap).ok().stdout
    listed = piped.splitlines()
    assert listed == sorted(listed) and set(names) <= set(listed)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", line) for line in listed), piped
    on_terminal = run_in_pty(["topics", "list", "--bootstrap-server", broker.bootstrap])
    lines = assert_plain_table(on_terminal)
    assert lines[0].split() == ["TOPIC", "PARTITIONS", "INTERNAL"]
    assert {line.split()[0] for line in lines[1:]} == set(listed)
    as_json = odradek("topics", "list", "--json", bootstrap=broker.bootstrap).ok().json()
    assert {t["name"] for t in as_json} == set(listed)


def test_tables_have_no_blank_lines_or_trailing_spaces(broker):
    a, b = new_name("cli-tbl"), new_name("cli-tbl")
    for t in (a, b):
        odradek("topics", "create", "--topic", t, "--partitions", "2", bootstrap=broker.bootstrap).ok()
    text = odradek("topics", "describe", "--topic", a, "--topic", b, bootstrap=broker.bootstrap).ok().stdout
    lines = assert_plain_table(text)
    assert lines.count("") == 1, "one blank line between the two topics"
    for args in (["groups", "list"], ["cluster", "describe"], ["configs", "describe", "--entity-type", "topics",
                                                                "--entity-name", a]):
        assert_plain_table(run_in_pty([*args, "--bootstrap-server", broker.bootstrap]))


def test_describe_shows_log_start_offset_and_high_watermark(broker, admin):
    from confluent_kafka import TopicPartition as TP

    t = new_name("cli-offsets")
    odradek("topics", "create", "--topic", t, "--partitions", "2", bootstrap=broker.bootstrap).ok()
    odradek("produce", "--topic", t, "--partition", "1", input="".join(f"r{i}\n" for i in range(7)),
            bootstrap=broker.bootstrap).ok()
    [f] = admin.delete_records([TP(t, 1, 3)]).values()
    f.result(timeout=20)
    [d] = odradek("topics", "describe", "--topic", t, "--json", bootstrap=broker.bootstrap).ok().json()
    offsets = {p["partition"]: (p["log_start_offset"], p["high_watermark"]) for p in d["partitions"]}
    assert offsets == {0: (0, 0), 1: (3, 7)}
    text = odradek("topics", "describe", "--topic", t, bootstrap=broker.bootstrap).ok().stdout
    header, *rows = assert_plain_table(text)[1:]

    def cell(row: str, column: str) -> str:   # columns start where their header does (cells may be empty)
        start = header.index(column)
        return row[start:].split(" ", 1)[0] if len(row) > start else ""
    row1 = next(r for r in rows if cell(r, "PARTITION") == "1")
    assert (cell(row1, "LOG-START-OFFSET"), cell(row1, "HIGH-WATERMARK")) == ("3", "7")


# ------------------------------------------------------------------------------------------ api versions
def raw_api_versions(host: str, port: int) -> dict[int, tuple[int, int]]:
    """The broker's ranges from an ApiVersions v0 exchange, decoded here (not by odradek)."""
    with connect(host, port) as sock:
        sock.sendall(request_frame(18, 0, 7))
        frame = recv_frame(sock)
    cid, err, n = struct.unpack_from(">ihi", frame)
    assert (cid, err) == (7, 0)
    return {k: (lo, hi) for k, lo, hi in (struct.unpack_from(">hhh", frame, 10 + 6 * i) for i in range(n))}


def test_broker_api_versions_in_kafkas_format(broker):
    text = odradek("broker-api-versions", bootstrap=broker.bootstrap).ok().stdout
    lines = text.splitlines()
    assert re.fullmatch(rf"{re.escape(broker.bootstrap)} \(id: 0 rack: null\) -> \(", lines[0]), lines[0]
    assert lines[-1] == ")"
    entries = lines[1:-1]
    assert all(line.startswith("\t") for line in entries)
    assert all(line.endswith(",") for line in entries[:-1]) and not entries[-1].endswith(",")
    pattern = re.compile(r"\t(\w+)\((\d+)\): (?:(\d+)(?: to (\d+))? \[(?:usable: (\d+)|unusable: node too (?:old|new))\]"
                         r"|UNSUPPORTED),?")
    served = {}
    for line in entries:
        m = pattern.fullmatch(line)
        assert m, f"not in kafka-broker-api-versions' format: {line!r}"
        if m.group(3) is not None:
            low = int(m.group(3))
            served[int(m.group(2))] = (low, int(m.group(4)) if m.group(4) else low)
    assert served == raw_api_versions(broker.host, broker.port)
    assert any(line.startswith("\tProduce(0): ") for line in entries)
    assert any(line.startswith("\tMetadata(3): ") for line in entries)
    out = odradek("broker-api-versions", "--json", bootstrap=broker.bootstrap).ok().json()
    assert {a["api_key"]: (a["min_version"], a["max_version"]) for a in out[0]["apis"]} == served
