"""The daemon protocol from Python: enough for observers (`flexnpu stats --daemon`) and
protocol-level tests. Frames, their encoding and the socket I/O are the C++ protocol's
(pjrt_flexnpu/backend/remote/protocol.h, through flexnpu._native); clients use the C++ side
whole."""

from __future__ import annotations

from typing import Any

from flexnpu._native_loader import native

_protocol = native("DaemonConnection", "the daemon")

PROTOCOL_VERSION: int = _protocol.DAEMON_PROTOCOL_VERSION  # protocol.h's kProtocolVersion
OP_HELLO: int = _protocol.DaemonOp.HELLO
OP_BUFFER_FROM_HOST: int = _protocol.DaemonOp.BUFFER_FROM_HOST
OP_BUFFER_TO_HOST_SIZE: int = _protocol.DaemonOp.BUFFER_TO_HOST_SIZE
OP_BUFFER_TO_HOST: int = _protocol.DaemonOp.BUFFER_TO_HOST
OP_BUFFER_DESTROY: int = _protocol.DaemonOp.BUFFER_DESTROY
OP_COMPILE: int = _protocol.DaemonOp.COMPILE
OP_EXECUTE: int = _protocol.DaemonOp.EXECUTE
OP_STATS: int = _protocol.DaemonOp.STATS
OP_EVENT_READY: int = _protocol.DaemonOp.EVENT_READY
# Hello's role (protocol.h, kHello).
ROLE_CLIENT = 0
ROLE_OBSERVER = 1

# One frame: call_id, op, code, text, ints, blobs (keywords, all optional).
Frame: Any = _protocol.DaemonFrame


class Connection(_protocol.DaemonConnection):  # type: ignore[misc]
    """A blocking protocol connection (one request at a time): send(frame), receive() and
    close() are the C++ protocol's; `timeout_s` bounds each send and receive."""

    def __init__(self, path: str, timeout_s: float = 10.0) -> None:
        super().__init__(path, timeout_s)
        self._next_call = 1

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        op: int,
        ints: list[int] | None = None,
        text: str = "",
        blobs: list[bytes] | None = None,
    ) -> Any:
        """Sends a request and returns its reply (event pushes in between are skipped)."""
        call_id = self._next_call
        self._next_call += 1
        self.send(Frame(call_id=call_id, op=op, text=text, ints=ints or [], blobs=blobs or []))
        while True:
            reply = self.receive()
            if reply.call_id == call_id:
                return reply

    def hello(
        self, tenant: str = "", role: int = ROLE_CLIENT, version: int = PROTOCOL_VERSION
    ) -> Any:
        return self.call(OP_HELLO, [version, role], text=tenant)


def daemon_stats(path: str) -> str:
    """The daemon's stats JSON, asked as an observer session."""
    with Connection(path) as c:
        reply = c.hello(role=ROLE_OBSERVER)
        if reply.code:
            raise RuntimeError(f"flexnpu daemon at {path}: {reply.text}")
        reply = c.call(OP_STATS)
        if reply.code:
            raise RuntimeError(f"flexnpu daemon at {path}: {reply.text}")
        return reply.text
