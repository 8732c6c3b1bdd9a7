"""What the client subcommands share: connection flags, client configs, errors, output.

Every tool takes Kafka's `--bootstrap-server HOST:PORT[,...]` (default: the environment variable
ODRADEK_BOOTSTRAP_SERVER, else localhost:9092; the flag wins) and `--command-config FILE` (a properties
file of client configs, read as Kafka reads it: `odradek.properties`), plus `--timeout SECONDS` for each
call to the cluster. An address without a port, or with a bad one, is refused while the arguments are
parsed; a cluster whose every bootstrap address refuses connections is reported at once. Output is a
plain table for people (columns two spaces apart, no blank lines around it, no trailing spaces),
`--json` for scripts.

Errors end the command with one line on stderr, `odradek <command>: error: <reason>`, and a non-zero
status: 1 for a failure, 2 for bad arguments, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from typing import Any, Callable, Iterable

DEFAULT_BOOTSTRAP = "localhost:9092"
BOOTSTRAP_ENV = "ODRADEK_BOOTSTRAP_SERVER"
DEFAULT_TIMEOUT_S = 30.0


class CliError(Exception):
    """A one-line reason to stop; `status` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------------------ arguments
def connection_parent() -> argparse.ArgumentParser:
    """The flags every client subcommand takes (a parent parser for leaf commands)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--bootstrap-server", type=bootstrap_servers, default=None, metavar="HOST:PORT[,...]",
                   help=f"brokers to connect to (default: ${BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP})")
    g.add_argument("--command-config", metavar="FILE", help="a properties file of client configs")
    g.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"how long to wait for the cluster (default {DEFAULT_TIMEOUT_S:g})")
    return p


def bootstrap_servers(text: str) -> str:
    """`host:port[,host:port...]` (a `PLAINTEXT://` prefix allowed), as Kafka's tools require: a port
    on every address, 1-65535. Returns the text unchanged."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError("expected HOST:PORT[,HOST:PORT...], got nothing")
    for item in items:
        if not item:
            raise argparse.ArgumentTypeError(f"an empty address in {text!r}")
        address = item.split("://", 1)[1] if "://" in item else item
        host, sep, port = address.rpartition(":")
        if not sep or (host.count(":") and not host.startswith("[")):
            raise argparse.ArgumentTypeError(f"{item!r} has no port: expected HOST:PORT, e.g. localhost:9092")
        if not host.strip("[]"):
            raise argparse.ArgumentTypeError(f"no host in {item!r}: expected HOST:PORT, e.g. localhost:9092")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"bad port in {item!r}: expected 1-65535")
    return text


def resolve_bootstrap(args, parser: argparse.ArgumentParser) -> None:
    """Fill `args.bootstrap_server` when the flag was not given: ${BOOTSTRAP_ENV}, else the default;
    a bad address in the variable is an argument error naming it."""
    if getattr(args, "bootstrap_server", "") is not None:
        return
    from_env = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if not from_env:
        args.bootstrap_server = DEFAULT_BOOTSTRAP
        return
    try:
        args.bootstrap_server = bootstrap_servers(from_env)
    except argparse.ArgumentTypeError as e:
        parser.error(f"{BOOTSTRAP_ENV}: {e}")


def json_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return v


def non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return v


def positive_int(text: str) -> int:
    v = non_negative_int(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be positive")
    return v


def read_properties(path: str) -> dict[str, str]:
    """A properties file of client configs, read as `serve --config` reads server.properties
    (`odradek.properties`: Java's syntax, continuation lines, `key value`, escapes)."""
    from odradek.properties import load_properties

    try:
        return load_properties(path)
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise CliError(f"{path}: {e}") from None


def parse_key_values(items: Iterable[str], what: str = "--config") -> dict[str, str]:
    """`["k=v", "k2=v2"]` -> dict; a bad item is a CliError naming the flag."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"{what} expects KEY=VALUE, got {item!r}", 2)
        out[key.strip()] = value
    return out


def client_config(args, **extra) -> dict:
    """Client configs from --command-config, --bootstrap-server and --timeout, then `extra`."""
    conf: dict[str, Any] = {}
    if getattr(args, "command_config", None):
        conf.update(read_properties(args.command_config))
    conf["bootstrap.servers"] = args.bootstrap_server
    timeout_ms = max(1, int(args.timeout * 1000))
    conf.setdefault("request.timeout.ms", timeout_ms)
    conf.setdefault("socket.connection.setup.timeout.ms", min(timeout_ms, 10000))
    conf.setdefault("client.id", "odradek-cli")
    conf.setdefault("bootstrap.refused.fail.fast", True)     # say "connection refused" at once
    conf.update(extra)
    return conf


def admin_config(args) -> dict:
    return client_config(args, **{"default.api.timeout.ms": max(1, int(args.timeout * 1000))})


# ------------------------------------------------------------------------------------------ running
def run(args, main: Callable[[Any], Any]) -> int:
    """Run `await main(args)`; turn every failure into one line on stderr and an exit status."""
    from odradek.client.errors import ConfigError, KafkaError, KafkaTimeoutError

    prog = f"odradek {args.command}"
    try:
        result = asyncio.run(main(args))
        return int(result or 0)
    except CliError as e:
        return _fail(prog, str(e), e.status)
    except KafkaTimeoutError as e:
        text = str(e)
        if "could not bootstrap" in text and "every address refused" in text:    # at once (Cluster.start)
            text = f"cannot reach the cluster at {args.bootstrap_server}: connection refused"
        elif "could not bootstrap" in text:
            text = f"cannot reach the cluster at {args.bootstrap_server} within {args.timeout:g}s" + _probe(args)
        return _fail(prog, text, 1)
    except ConfigError as e:
        return _fail(prog, f"invalid client configuration: {e}", 2)
    except KafkaError as e:
        return _fail(prog, str(e), 1)
    except NotImplementedError as e:
        return _fail(prog, str(e), 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 0


def _probe(args) -> str:
    """Why the first bootstrap server cannot be reached, from a plain TCP connect ("connection refused")."""
    import socket

    first = args.bootstrap_server.split(",")[0].strip()
    host, _, port = first.split("://")[-1].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=min(args.timeout, 2)):
            return f" ({first} accepts connections but does not answer as a Kafka broker)"
    except socket.gaierror as e:
        return f" (cannot resolve {host}: {e.strerror})"
    except TimeoutError:
        return f" (connecting to {first} timed out)"
    except OSError as e:
        return f" ({first}: {(e.strerror or str(e)).lower()})"
    except ValueError:
        return f" (bad address {first!r})"


def _fail(prog: str, message: str, status: int) -> int:
    message = " ".join(str(message).split())   # one line
    print(f"{prog}: error: {message}", file=sys.stderr)
    return status


def _silence_stdout() -> None:
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


# ------------------------------------------------------------------------------------------ output
def console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output is not cut to 80 columns: scripts read it.
    return Console(file=stream, width=None if stream.isatty() else 200, highlight=False, soft_wrap=False)


def print_table(columns: list[str], rows: Iterable[Iterable[Any]], title: str | None = None) -> None:
    """A plain table: a header row, then one row per line, columns two spaces apart and left-aligned,
    no blank line before or after and no trailing spaces (as kafka-consumer-groups.sh prints)."""
    sys.stdout.write(format_table(columns, rows, title))


def format_table(columns: list[str], rows: Iterable[Iterable[Any]], title: str | None = None) -> str:
    cells = [[str(c) for c in columns]]
    cells += [["-" if v is None else " ".join(str(v).split("\n")) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [title.rstrip()] if title else []
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o):
    if isinstance(o, uuid.UUID):
        return str(o)
    if isinstance(o, (bytes, bytearray, memoryview)):
        return bytes(o).decode("utf-8", "backslashreplace")
    if hasattr(o, "name") and hasattr(o, "value"):
        return o.name
    raise TypeError(f"cannot encode {type(o).__name__} as JSON")


def say(text: str) -> None:
    """A line of human output (not in --json mode)."""
    sys.stdout.write(text + "\n")
