"""The physical backend's own log lines (the XLA CPU plugin FlexNPU forwards to, and jaxlib)
go through XLA's logging, which reads TF_CPP_MIN_LOG_LEVEL once, when it first logs. During
compilation it prints lines such as `E0000 ... library_matcher.h:53] Unsupported fusion type: 5`
that read as errors but are not: the serving entry points therefore default to showing only
fatal ones. `--backend-log-level info` (or TF_CPP_MIN_LOG_LEVEL=0 in the environment, which
wins) shows them all."""

from __future__ import annotations

import os

BACKEND_LOG_LEVELS = {"info": "0", "warning": "1", "error": "2", "fatal": "3"}
DEFAULT_BACKEND_LOG_LEVEL = "fatal"


def set_backend_log_level(level: str = DEFAULT_BACKEND_LOG_LEVEL) -> str:
    """Sets XLA's log threshold unless the environment already does; call it before JAX loads a
    backend. Returns the threshold in effect."""
    if level not in BACKEND_LOG_LEVELS:
        raise ValueError(f"backend log level {level!r}: expected one of "
                         f"{', '.join(BACKEND_LOG_LEVELS)}")
    return os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", BACKEND_LOG_LEVELS[level])


def add_argument(parser) -> None:
    parser.add_argument("--backend-log-level", default=DEFAULT_BACKEND_LOG_LEVEL,
                        choices=list(BACKEND_LOG_LEVELS),
                        help="log lines of the physical backend (XLA) shown on stderr "
                             "(default: fatal only; an explicit TF_CPP_MIN_LOG_LEVEL wins)")
