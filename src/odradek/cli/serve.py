"""`odradek serve`: run one broker (as Kafka's kafka-server-start.sh: a properties file and
`--override KEY=VALUE`). With no arguments: one broker on localhost:9092, embedded metadata, data in
./odradek-data. SIGTERM or SIGINT shuts it down cleanly, writing the clean-shutdown marker.

    odradek serve
    odradek serve --config server.properties
    odradek serve --override listeners=PLAINTEXT://localhost:9093 --override log.dirs=/tmp/odradek-2
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

log = logging.getLogger("odradek.serve")
LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def _logger_level(text: str) -> tuple[str, str]:
    import argparse
    name, sep, level = text.partition("=")
    if not sep or not name or level.upper() not in LEVELS:
        raise argparse.ArgumentTypeError(f"expected NAME=LEVEL with LEVEL one of {', '.join(LEVELS)}: {text!r}")
    return name, level.upper()


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run a broker", description=__doc__)
    p.add_argument("--config", metavar="FILE", help="a server.properties file")
    p.add_argument("--override", metavar="KEY=VALUE", action="append", default=[],
                   help="set a broker config, overriding the file (repeatable)")
    p.add_argument("--log-level", default="INFO", choices=LEVELS, help="the level of every logger")
    p.add_argument("--logger", metavar="NAME=LEVEL", action="append", default=[], type=_logger_level,
                   help="one logger's level, e.g. odradek.requests.completed=DEBUG to log every request "
                        "(repeatable)")
    p.add_argument("--event-loop", default="uvloop", choices=["asyncio", "uvloop"],
                   help="uvloop (default; asyncio's own loop when uvloop is not installed) or asyncio: "
                        "both send fetched records from the page cache with sendfile")
    p.set_defaults(run=run)


def run(args) -> int:
    from odradek.server.config import BrokerConfig, ConfigError

    logging.basicConfig(level=args.log_level, format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    for name, level in args.logger:
        logging.getLogger(name).setLevel(level)
    try:
        config = BrokerConfig.load(args.config, args.override)
    except ConfigError as e:
        print(f"odradek serve: invalid configuration: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"odradek serve: {e}", file=sys.stderr)
        return 2
    for w in config.warnings:
        log.warning(w)
    runner, loop_name = asyncio.run, "asyncio"
    if args.event_loop == "uvloop":
        try:
            import uvloop
            runner, loop_name = uvloop.run, "uvloop"
        except ImportError:
            log.warning("uvloop is not installed; using asyncio's event loop")
    log.info("event loop: %s", loop_name)
    try:
        return runner(_serve(config))
    except KeyboardInterrupt:
        return 0


DEFERRED_IMPORTS = ("odradek.records.scan_vector",)


def import_deferred() -> None:
    """Import, once the broker is ready, what its start need not wait for: numpy and the vectorised
    record scan (a third of the broker's import time), so neither the start nor the first produce of
    a large batch pays for it. Runs on a worker thread while the event loop serves; a request that
    needs the module meanwhile waits for this import to finish, as for any import in progress."""
    import importlib

    for name in DEFERRED_IMPORTS:
        importlib.import_module(name)


def settle_heap() -> int:
    """Collect what start-up left behind, then freeze the survivors (modules, configs, the broker's
    structures) into the collector's permanent generation, and return how many were frozen.

    They live as long as the process, yet every full (generation 2) collection walked them all: under
    a 10k records/s replicated load each broker paused 13-46 ms about every 20 s, the slowest samples
    of the end-to-end p99. Frozen, a full pass walks only what was made since. Reference counting still
    frees a frozen object that is dropped; only a frozen cycle would stay, and start-up makes none
    that it later drops."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def _serve(config) -> int:
    from odradek.server.broker import Broker

    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await broker.start()
    except OSError as e:
        log.error("cannot start: %s", e)
        await broker.aclose()
        return 1
    bound = ", ".join(f"{ep}" for _, ep in broker.listeners)
    log.info("odradek broker %d started (cluster %s) listening on %s, ports %s",
             broker.broker_id, broker.cluster_id, bound, broker.bound_ports)
    await asyncio.to_thread(import_deferred)
    log.info("froze %d start-up objects out of the garbage collector's full passes", settle_heap())
    await stop.wait()
    log.info("shutting down")
    await broker.aclose()
    log.info("shut down cleanly")
    return 0
