"""`python -m flexnpu` / `flexnpu` subcommands, one module each: `add_parser(subparsers)` registers
the subcommand and sets `func` to its `run(args) -> exit code` (flexnpu/__main__.py lists them)."""
