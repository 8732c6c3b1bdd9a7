"""The `odradek` command: `serve` runs a broker; the other subcommands are the tools Kafka ships
(kafka-topics, kafka-console-producer and -consumer, kafka-consumer-groups, kafka-configs,
kafka-transactions, kafka-broker-api-versions, the perf tests), speaking to any Kafka-compatible
cluster through `odradek.client`.

    odradek serve
    odradek topics create --topic events --partitions 3
    odradek topics list
    odradek COMMAND --help
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from odradek import __version__
from odradek.cli.common import resolve_bootstrap

# Each command's module, in the order `odradek --help` lists them. A command line naming one imports
# and builds only that one's parser (the others are placeholders that are never shown): building all
# of them cost each command some 0.1 s.
COMMANDS = {
    "serve": "serve", "topics": "topics", "produce": "produce", "consume": "consume", "groups": "groups",
    "configs": "configs", "perf": "perf", "cluster": "cluster", "transactions": "transactions",
    "broker-api-versions": "api_versions",
}

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


class ArgumentParser(argparse.ArgumentParser):
    """Bad arguments: one line naming the problem (and where help is), exit status 2. A misspelt
    command or choice names the closest ones ("did you mean"). Every help page keeps the line breaks
    of its description, so example command lines stay one to a line."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        m = _INVALID_CHOICE.search(message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2))
            close = difflib.get_close_matches(m.group(1), choices, n=3, cutoff=0.6)
            if close:
                message += f"; did you mean {' or '.join(repr(c) for c in close)}?"
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; given a command, only that command's subparser is real."""
    import importlib

    p = ArgumentParser(prog="odradek", description=__doc__)
    p.add_argument("--version", action="version", version=f"odradek {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"odradek.cli.{module}").add_parser(sub)
        else:
            sub.add_parser(name)
    return p


def _leaf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command line's deepest subcommand, e.g. that of `odradek topics list`."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if not chosen or chosen not in subs[0].choices:
            return parser
        parser = subs[0].choices[chosen]


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    first = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    leaf = _leaf(parser, args)
    if unknown:
        leaf.error(f"unrecognized arguments: {' '.join(unknown)}")
    resolve_bootstrap(args, leaf)
    if not getattr(args, "run", None):
        leaf.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
