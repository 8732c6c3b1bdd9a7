"""Run the `odradek` command as a subprocess, as a user would, for the test_cli_* modules."""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass

from .conftest import odradek_command

CLI_TIMEOUT_S = 90


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    argv: list

    def json(self):
        return json.loads(self.stdout)

    def ok(self) -> "Result":
        assert self.returncode == 0, f"{self.argv} exited {self.returncode}:\n{self.stderr}\n{self.stdout}"
        return self

    def fails(self, *needles: str, status: int = 1) -> "Result":
        """A failure: the given status, nothing on stdout, one line on stderr holding every needle."""
        assert self.returncode == status, (f"{self.argv}: expected exit {status}, got {self.returncode}\n"
                                           f"{self.stderr}\n{self.stdout}")
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1, f"expected one line on stderr, got:\n{self.stderr}"
        for n in needles:
            assert n in lines[0], f"{n!r} not in {lines[0]!r}"
        return self


def odradek(*args, input: str | bytes | None = None, bootstrap: str | None = None, timeout: float = CLI_TIMEOUT_S,
            text: bool = True) -> Result:
    """`odradek <args> [--bootstrap-server B]`; stdin from `input`."""
    argv = [*odradek_command(), *map(str, args)]
    if bootstrap is not None:
        argv += ["--bootstrap-server", bootstrap]
    if text and isinstance(input, bytes):
        input = input.decode()
    r = subprocess.run(argv, input=input, capture_output=True, timeout=timeout, text=text)
    return Result(r.returncode, r.stdout, r.stderr, argv)


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def unreachable() -> str:
    """An address where nothing listens: a port bound and closed again."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"
