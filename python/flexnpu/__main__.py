"""`python -m flexnpu` / `flexnpu`: command line. Each subcommand lives in its own module of
flexnpu.cli with an `add_parser(subparsers)` that registers it; list it in _SUBCOMMANDS. A
configuration the user can fix ends in one line on stderr, exit code 2 (flexnpu/cli/errors.py)."""

from __future__ import annotations

import argparse
import importlib
import sys

from flexnpu.cli.errors import run_subcommand

_SUBCOMMANDS = (
    "flexnpu.cli.analyze",
    "flexnpu.cli.stats",
    "flexnpu.cli.simulate",
    "flexnpu.cli.serve",
    "flexnpu.cli.export_tokenizer",
    "flexnpu.cli.devices",
    "flexnpu.cli.daemon",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flexnpu", description="FlexNPU tools")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in _SUBCOMMANDS:
        importlib.import_module(name).add_parser(subparsers)
    args = parser.parse_args(argv)
    return run_subcommand(args.command, lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
