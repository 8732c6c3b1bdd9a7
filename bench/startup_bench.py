"""Start-up benchmark (issue 34, "The first hour"): how long a person waits for `odradek serve` to be
ready and for one `odradek topics list`, against the floor of the machine in the same run.

Four commands, timed wall-clock from spawn, in alternating rounds (so a busy neighbour on a shared
machine slows them all alike), and reported as medians with each ratio:

- `python -c pass`: the interpreter's own start-up, the floor of any Python command;
- `kcat -L -b BROKER`: a native client's metadata listing, what a Kafka user compares with;
- `odradek serve`: until the log line containing `started` (the broker accepts connections);
- `odradek topics list --bootstrap-server BROKER`: to exit, against a broker already running.

Targets (issue 34): serve ready in at most 0.3 s, topics list in at most 0.25 s. It is a benchmark,
not a test: it prints figures and exits 0; nothing in CI times it.

Bytecode: by default the commands run as an installed package runs, from cached bytecode (`pip
install` compiles it; the first, uncounted round writes the caches of a source checkout).
`--no-bytecode` times them compiling odradek's modules from source each time (a copy of the package
without caches, PYTHONDONTWRITEBYTECODE set), as in an environment that sets PYTHONDONTWRITEBYTECODE=1
on a checkout without caches: there, compiling costs more than importing.

    python bench/startup_bench.py               # 9 rounds
    python bench/startup_bench.py --rounds 15 --json
    python bench/startup_bench.py --no-bytecode
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ODRADEK = [sys.executable, "-m", "odradek.cli.main"]
SERVE_TARGET_S = 0.30
LIST_TARGET_S = 0.25


ENV = dict(os.environ)


def _time_run(argv: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return dt


def _serve(data_dir: Path, port: int = 0) -> tuple[subprocess.Popen, float, int]:
    """Start a broker; (process, seconds until its `started` line, bound port)."""
    argv = [*ODRADEK, "serve", "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
            "--override", f"log.dirs={data_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=ENV)
    assert proc.stdout is not None
    seen = []
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        seen.append(line)
        if "started" in line:
            dt = time.perf_counter() - t0
            return proc, dt, _port_of(line)
    proc.wait()
    raise SystemExit(f"odradek serve exited {proc.returncode} before it started:\n{''.join(seen)[-2000:]}")


def _port_of(line: str) -> int:
    """The bound port from the started line: the last `:NNNN` or `: NNNN` number on it."""
    import re

    found = re.findall(r"[: ](\d{2,5})\b", line)
    return int(found[-1]) if found else 0


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds (default 9)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--no-bytecode", action="store_true", help="compile every module from source each run")
    args = ap.parse_args(argv)
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    times: dict[str, list[float]] = {"python -c pass": [], "kcat -L": [], "odradek serve": [],
                                     "odradek topics list": []}
    with tempfile.TemporaryDirectory(prefix="odradek-startup-") as tmp:
        if args.no_bytecode:
            # odradek's sources without their caches (the interpreter's own modules keep theirs).
            import importlib.util

            spec = importlib.util.find_spec("odradek")
            assert spec is not None and spec.submodule_search_locations
            shutil.copytree(spec.submodule_search_locations[0], Path(tmp) / "src" / "odradek",
                            ignore=shutil.ignore_patterns("__pycache__"))
            ENV.update(PYTHONDONTWRITEBYTECODE="1",
                       PYTHONPATH=os.pathsep.join(filter(None, [str(Path(tmp) / "src"), ENV.get("PYTHONPATH")])))
        else:
            ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        # One broker stays up for the listing commands; each round also starts a fresh one to time it.
        held, _, port = _serve(Path(tmp) / "held")
        bootstrap = f"127.0.0.1:{port}"
        try:
            _time_run([*ODRADEK, "topics", "create", "--topic", "startup-bench", "--bootstrap-server", bootstrap])
            warm, _, _ = _serve(Path(tmp) / "warm-up")      # uncounted: writes the bytecode caches
            _stop(warm)
            _time_run([*ODRADEK, "topics", "list", "--bootstrap-server", bootstrap])
            for n in range(args.rounds):
                times["python -c pass"].append(_time_run([sys.executable, "-c", "pass"]))
                if kcat:
                    times["kcat -L"].append(_time_run([kcat, "-L", "-b", bootstrap]))
                proc, ready, _ = _serve(Path(tmp) / f"round-{n}")
                times["odradek serve"].append(ready)
                _stop(proc)
                times["odradek topics list"].append(
                    _time_run([*ODRADEK, "topics", "list", "--bootstrap-server", bootstrap]))
        finally:
            _stop(held)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    result = {"rounds": args.rounds, "bytecode": not args.no_bytecode, "median_s": med, "samples_s": times, "python": sys.version.split()[0],
              "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    floor, native = med["python -c pass"], med.get("kcat -L")
    mode = "compiled from source each run" if args.no_bytecode else "from cached bytecode"
    print(f"medians of {args.rounds} alternating rounds (wall clock from spawn; Python {mode})")
    print(f"{'command':<22}{'median':>9}{'min':>9}{'/python':>9}{'/kcat':>9}{'target':>9}")
    targets = {"odradek serve": SERVE_TARGET_S, "odradek topics list": LIST_TARGET_S}
    for k, v in med.items():
        ratio_k = f"{v / native:8.1f}x" if native else f"{'-':>9}"
        target = f"{targets[k]:8.2f}s" if k in targets else f"{'':>9}"
        print(f"{k:<22}{v:8.3f}s{min(times[k]):8.3f}s{v / floor:8.1f}x{ratio_k}{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
