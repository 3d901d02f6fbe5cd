"""`python -m flexnpu serve [options]`: the OpenAI-compatible server (the same options as
`python examples/serve.py`; see `python -m flexnpu serve --help`)."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    from flexnpu.serving import cli

    parent = cli.build_parser()
    subparsers.add_parser("serve", parents=[parent], add_help=False,
                          help="serve a model with the OpenAI-compatible API over all the "
                               "virtual devices", description=parent.description)\
        .set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flexnpu.serving import cli

    return cli.serve(args)
