"""The `odradek` command."""

from __future__ import annotations

import argparse
import sys

from odradek import __version__
from odradek.cli import serve


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="odradek", description="A Kafka-compatible broker and its tools.")
    p.add_argument("--version", action="version", version=f"odradek {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parser(sub)
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
