"""What a subcommand reports when the user can fix it: one line `flexnpu <sub>: <message>` on
stderr and exit code 2, not a traceback. A bad FlexNPU configuration (FLEXNPU_POLICY, --policy,
FLEXNPU_BACKEND, ...) surfaces when JAX creates the backend, as JAX's RuntimeError around
FlexNPU's own message; `run_subcommand` unwraps it. Any other error keeps its traceback."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

CONFIGURATION_ERROR = 2  # argparse's code for a bad command line

# JAX: "Unable to initialize backend 'flexnpu': INVALID_ARGUMENT: <FlexNPU's message> (<hint>)",
# the hint being how to choose another backend, which does not fix FlexNPU's configuration.
_BACKEND_FAILED = re.compile(r"Unable to initialize backend 'flexnpu': (?:[A-Z_]+: )?(.*)", re.S)
_JAX_HINT = re.compile(
    r" \((?:set JAX_PLATFORMS=''|you may need to uninstall the failing plugin)[^()]*\)$"
)


class CliError(Exception):
    """A configuration the user can fix: the message says what and how, without a traceback."""


def backend_error(error: BaseException) -> str | None:
    """FlexNPU's message when `error` is JAX failing to create the flexnpu backend, else None."""
    if not isinstance(error, RuntimeError):
        return None
    found = _BACKEND_FAILED.match(str(error))
    if found is None:
        return None
    return _JAX_HINT.sub("", found.group(1).strip())


def run_subcommand(name: str, run: Callable[[], int]) -> int:
    """Runs `flexnpu <name>`; a CliError or a backend that refused its configuration becomes
    one line on stderr and exit code CONFIGURATION_ERROR."""
    try:
        return int(run())
    except CliError as error:
        message = str(error)
    except RuntimeError as error:
        message = backend_error(error)
        if message is None:
            raise
    print(f"flexnpu {name}: {message}", file=sys.stderr)
    return CONFIGURATION_ERROR
