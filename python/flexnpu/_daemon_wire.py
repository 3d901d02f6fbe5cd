"""The daemon protocol's frames (pjrt_flexnpu/backend/remote/daemon.proto) from Python: enough for
observers (`flexnpu stats --daemon`) and protocol-level tests. Clients use the C++ side."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

# = kProtocolVersion in pjrt_flexnpu/backend/remote/protocol.h (a test checks)
PROTOCOL_VERSION = 6
OP_HELLO = 1
OP_BUFFER_FROM_HOST = 2
OP_BUFFER_TO_HOST_SIZE = 3
OP_BUFFER_TO_HOST = 4
OP_BUFFER_DESTROY = 8
OP_COMPILE = 10
OP_EXECUTE = 16
OP_STATS = 17
OP_EVENT_READY = 100
ROLE_CLIENT = 0
ROLE_OBSERVER = 1


@dataclass
class Frame:
    call_id: int = 0
    op: int = 0
    code: int = 0
    text: str = ""
    ints: list[int] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("daemon protocol: truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def encode(frame: Frame) -> bytes:
    out = bytearray()
    if frame.call_id:
        out += _varint(1 << 3) + _varint(frame.call_id)
    out += _varint(2 << 3) + _varint(frame.op)
    if frame.text:
        text = frame.text.encode()
        out += _varint(4 << 3 | 2) + _varint(len(text)) + text
    if frame.ints:
        packed = b"".join(_varint(v) for v in frame.ints)
        out += _varint(5 << 3 | 2) + _varint(len(packed)) + packed
    for blob in frame.blobs:
        out += _varint(6 << 3 | 2) + _varint(len(blob)) + blob
    return bytes(out)


def decode(data: bytes) -> Frame:
    frame = Frame()
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            if number == 1:
                frame.call_id = value
            elif number == 2:
                frame.op = value
            elif number == 3:
                frame.code = _signed(value)
            elif number == 5:
                frame.ints.append(_signed(value))
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            payload, pos = data[pos:pos + size], pos + size
            if number == 4:
                frame.text = payload.decode(errors="replace")
            elif number == 5:
                p = 0
                while p < len(payload):
                    value, p = _read_varint(payload, p)
                    frame.ints.append(_signed(value))
            elif number == 6:
                frame.blobs.append(payload)
        else:
            raise ValueError(f"daemon protocol: unexpected wire type {wire}")
    return frame


class Connection:
    """A blocking protocol connection (one request at a time)."""

    def __init__(self, path: str, timeout_s: float = 10.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            raise ConnectionError(f"cannot connect to the flexnpu daemon at {path}: {e}") from e
        self._next_call = 1

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, frame: Frame) -> None:
        body = encode(frame)
        self._sock.sendall(struct.pack("<I", len(body)) + body)

    def _read(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self._sock.recv(n - len(chunks))
            if not chunk:
                raise ConnectionError("the flexnpu daemon closed the connection")
            chunks += chunk
        return bytes(chunks)

    def receive(self) -> Frame:
        (size,) = struct.unpack("<I", self._read(4))
        return decode(self._read(size))

    def call(self, op: int, ints: list[int] | None = None, text: str = "",
             blobs: list[bytes] | None = None) -> Frame:
        """Sends a request and returns its reply (event pushes in between are skipped)."""
        call_id = self._next_call
        self._next_call += 1
        self.send(Frame(call_id=call_id, op=op, text=text, ints=ints or [], blobs=blobs or []))
        while True:
            reply = self.receive()
            if reply.call_id == call_id:
                return reply

    def hello(self, tenant: str = "", role: int = ROLE_CLIENT,
              version: int = PROTOCOL_VERSION) -> Frame:
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
