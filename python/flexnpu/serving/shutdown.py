"""Serving until SIGINT (Ctrl-C) or SIGTERM, then shutting down within a bounded time
(`serve --shutdown-grace-s`).

The first signal drains: the listener closes (new connections are refused), a request that
still reaches the app, and /health, get a 503 (serving.server.InFlight), and the requests in
flight get up to the grace period to finish. Those still running then are aborted through the
engine (their KV blocks freed): a stream ends with a chunk whose finish_reason is "abort" and
`data: [DONE]`, a plain request gets an OpenAI-shaped 503. The process then exits 0. A second
signal exits at once with 128 + its number (130 for Ctrl-C): no drain, and the clients still
connected see their connection closed. Which signal is the first is the order the handlers run in:
signals that arrive before the process gets to run them (a busy machine) run in signal-number
order, SIGINT before SIGTERM, whatever order they were sent in.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

from flexnpu.serving.server import InFlight

# After the grace period the aborted requests end in a step or two; uvicorn cancels what is
# still running this much later (its own last resort).
ABORT_SETTLE_S = 10.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _say(message: str) -> None:
    print(f"flexnpu serve: {message}", file=sys.stderr, flush=True)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain above: uvicorn waits for every connection however long
    it takes, cancels tasks on the second Ctrl-C (tracebacks from the app) and re-raises the
    signal once it is done (KeyboardInterrupt)."""

    def __init__(
        self,
        config: uvicorn.Config,
        in_flight: InFlight,
        grace_s: float,
        on_listening: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.in_flight = in_flight
        self.grace_s = grace_s
        self.on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.on_listening is not None:
            self.on_listening()  # only once it really listens

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only (a server run from tests)
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            # A signal handler may interrupt a print to the same stream: os.write, not print.
            name = signal.Signals(sig).name
            os.write(2, f"flexnpu serve: second {name}: exiting without draining\n".encode())
            os._exit(128 + sig)
        self.should_exit = True  # uvicorn's main loop sees it within 0.1 s and calls shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        running = self.in_flight.close(self.grace_s)
        if running and self.grace_s > 0:  # with no grace, _end_grace says what it aborted
            _say(
                f"shutting down: {running} request(s) in flight get up to {self.grace_s:g}s "
                "to finish (Ctrl-C again to exit now)"
            )
        grace_end = asyncio.get_running_loop().call_later(self.grace_s, self._end_grace)
        try:
            await super().shutdown(sockets)
        finally:
            grace_end.cancel()

    def _end_grace(self) -> None:
        aborted = self.in_flight.abort_all()
        if aborted:
            _say(f"grace period of {self.grace_s:g}s over: aborted {aborted} request(s)")


def serve(
    app: Any,
    in_flight: InFlight,
    grace_s: float,
    sockets: list[socket.socket] | None = None,
    on_listening: Callable[[], None] | None = None,
    **config: Any,
) -> None:
    """Serves `app` (on `sockets`, bound by the caller, or config: uvicorn.Config's keywords,
    e.g. host, port, log_level) until a signal, then drains as the module says; returns once
    the server has stopped. `on_listening` runs once it listens. A server that could not start
    exits 3, as uvicorn.run does (its lifespan logged why)."""
    if not 0 <= grace_s < float("inf"):
        raise ValueError(f"shutdown grace period: seconds >= 0, got {grace_s}")
    cfg = uvicorn.Config(app, timeout_graceful_shutdown=int(grace_s + ABORT_SETTLE_S), **config)
    server = DrainingServer(cfg, in_flight, grace_s, on_listening)
    server.run(sockets=sockets)
    if not server.started:
        raise SystemExit(3)
