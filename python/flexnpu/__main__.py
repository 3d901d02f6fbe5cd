"""`python -m flexnpu` / `flexnpu`: command line. Each subcommand lives in its own module
with an `add_parser(subparsers)` that registers it; list it in _SUBCOMMANDS."""

from __future__ import annotations

import argparse
import importlib
import sys

_SUBCOMMANDS = ("flexnpu._cli_analyze", "flexnpu._cli_stats", "flexnpu._cli_simulate",
                "flexnpu._cli_serve", "flexnpu._cli_export_tokenizer", "flexnpu._cli_devices",
                "flexnpu.daemon")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flexnpu", description="FlexNPU tools")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in _SUBCOMMANDS:
        importlib.import_module(name).add_parser(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
