"""The `odradek` command: `serve` runs a broker; the other subcommands are the tools Kafka ships
(kafka-topics, kafka-console-producer and -consumer, kafka-consumer-groups, kafka-configs,
kafka-transactions, the perf tests), speaking to any Kafka-compatible cluster through `odradek.client`."""

from __future__ import annotations

import argparse
import sys

from odradek import __version__
from odradek.cli import cluster, configs, consume, groups, perf, produce, serve, topics, transactions


class ArgumentParser(argparse.ArgumentParser):
    """Bad arguments: one line naming the problem (and where help is), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="odradek", description=__doc__)
    p.add_argument("--version", action="version", version=f"odradek {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parser(sub)
    topics.add_parser(sub)
    produce.add_parser(sub)
    consume.add_parser(sub)
    groups.add_parser(sub)
    configs.add_parser(sub)
    perf.add_parser(sub)
    cluster.add_parser(sub)
    transactions.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
