"""A lean WebSocket client for load generation (RFC 6455), sans-I/O core plus a thin
asyncio protocol.

Why not aiohttp's client: 500 realtime calls receive 25,000 frames a second, and an
awaited ``receive()`` per frame (a future, a task switch, a message object) costs the
load generator more CPU than the gateway spends sending them. Here a frame costs one slice
and one callback: :class:`FrameParser` cuts every complete frame out of what
``data_received`` got, and :class:`WsProtocol` hands each to its :class:`WsListener`
with the arrival time of the read that carried it.

Scope (what a load generator needs, nothing more): client handshake without extensions
(no permessage-deflate: RFC 6455 section 9 is opt-in), unfragmented and fragmented
server frames (section 5.4), ping answered by pong (section 5.5.2), close handshake
(section 5.5.1). Client frames are masked (section 5.3); the masking key comes from
``os.urandom`` except for :func:`encode_client_frame` callers that pass a key to reuse a
prebuilt frame (caller-audio silence), which servers cannot tell apart.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
import time
from typing import Protocol, cast
from urllib.parse import urlsplit

OP_CONT = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
_MAX_HEADER_BYTES = 16 * 1024
_U16 = struct.Struct("!H")
_U64 = struct.Struct("!Q")


class WsProtocolError(Exception):
    """The server broke RFC 6455 or refused the upgrade."""


# --- sans-I/O codec -----------------------------------------------------------------------


def handshake_request(url: str, headers: dict[str, str], key: bytes) -> bytes:
    """The HTTP/1.1 upgrade request for ``url`` (``ws://host:port/path?query``).

    ``key`` is the 16 random bytes of ``Sec-WebSocket-Key`` (RFC 6455 section 4.1).
    """
    parts = urlsplit(url)
    if parts.scheme != "ws":
        raise ValueError(f"only ws:// URLs are supported, got {url!r}")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {base64.b64encode(key).decode()}",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def expected_accept(key: bytes) -> str:
    """``Sec-WebSocket-Accept`` for ``key`` (RFC 6455 section 4.2.2, item 5.4)."""
    digest = hashlib.sha1(base64.b64encode(key) + _GUID).digest()
    return base64.b64encode(digest).decode()


def parse_handshake_response(data: bytes | bytearray, key: bytes) -> int | None:
    """Check the server's answer to the upgrade; returns the bytes it took, None if
    incomplete. Raises :class:`WsProtocolError` for anything but a valid 101."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > _MAX_HEADER_BYTES:
            raise WsProtocolError("handshake response headers too large")
        return None
    head = bytes(data[:end]).decode("latin-1").split("\r\n")
    status = head[0].split(" ", 2)
    if len(status) < 2 or status[1] != "101":
        raise WsProtocolError(f"upgrade refused: {head[0]!r}")
    fields: dict[str, str] = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    if fields.get("upgrade", "").lower() != "websocket":
        raise WsProtocolError("upgrade response lacks 'Upgrade: websocket'")
    if fields.get("sec-websocket-accept") != expected_accept(key):
        raise WsProtocolError("wrong Sec-WebSocket-Accept")
    if fields.get("sec-websocket-extensions"):
        raise WsProtocolError("server chose an extension the client did not offer")
    return end + 4


def mask_payload(payload: bytes, key: bytes) -> bytes:
    """XOR ``payload`` with the 4-byte masking ``key`` (RFC 6455 section 5.3)."""
    n = len(payload)
    if n == 0:
        return b""
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(stream, "little")).to_bytes(
        n, "little"
    )


def encode_client_frame(opcode: int, payload: bytes, key: bytes | None = None) -> bytes:
    """One masked, unfragmented client frame (RFC 6455 section 5.2)."""
    key = os.urandom(4) if key is None else key
    n = len(payload)
    first = 0x80 | opcode
    if n < 126:
        header = bytes((first, 0x80 | n))
    elif n < 1 << 16:
        header = bytes((first, 0x80 | 126)) + _U16.pack(n)
    else:
        header = bytes((first, 0x80 | 127)) + _U64.pack(n)
    return header + key + mask_payload(payload, key)


def close_payload(code: int, reason: str = "") -> bytes:
    return _U16.pack(code) + reason.encode("utf-8")[:120]


class FrameParser:
    """Cuts server frames out of a byte stream.

    ``feed(data)`` returns the complete messages it now holds as ``(opcode, payload)``:
    data messages (text/binary, fragments already joined) and control frames, in wire
    order. Raises :class:`WsProtocolError` on a masked server frame, a reserved bit or an
    oversized message.
    """

    def __init__(self, max_message: int = 1 << 20) -> None:
        self._buf = bytearray()
        self._max = max_message
        self._frag_op: int | None = None
        self._frag: list[bytes] = []

    def feed(self, data: bytes | bytearray) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos, size = 0, len(buf)
        while size - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            if b1 & 0x80:
                raise WsProtocolError("server frames must not be masked (RFC 6455 5.1)")
            if b0 & 0x70:
                raise WsProtocolError("reserved bits set without an extension")
            n = b1 & 0x7F
            start = pos + 2
            if n == 126:
                if size - start < 2:
                    break
                n = _U16.unpack_from(buf, start)[0]
                start += 2
            elif n == 127:
                if size - start < 8:
                    break
                n = _U64.unpack_from(buf, start)[0]
                start += 8
            if n > self._max:
                raise WsProtocolError(f"frame of {n} bytes over the {self._max}-byte limit")
            end = start + n
            if end > size:
                break
            self._message(b0 & 0x80, b0 & 0x0F, bytes(buf[start:end]), out)
            pos = end
        if pos:
            del buf[:pos]
        return out

    def _message(self, fin: int, opcode: int, payload: bytes, out: list[tuple[int, bytes]]) -> None:
        if opcode >= OP_CLOSE:  # control frames may sit between fragments
            out.append((opcode, payload))
        elif opcode == OP_CONT:
            if self._frag_op is None:
                raise WsProtocolError("continuation frame without a message")
            self._frag.append(payload)
            if sum(map(len, self._frag)) > self._max:
                raise WsProtocolError("fragmented message over the limit")
            if fin:
                out.append((self._frag_op, b"".join(self._frag)))
                self._frag_op, self._frag = None, []
        elif fin:
            out.append((opcode, payload))
        else:
            self._frag_op, self._frag = opcode, [payload]


# --- asyncio layer ------------------------------------------------------------------------


class WsListener(Protocol):
    """What a :class:`WsProtocol` reports to; ``t`` is ``time.monotonic()`` of the read."""

    def on_text(self, t: float, text: str) -> None: ...

    def on_binary(self, t: float, payload: bytes) -> None: ...

    def on_closed(self, code: int | None, reason: str) -> None: ...


class WsProtocol(asyncio.Protocol):
    """One client connection: handshake, then frames to ``listener``.

    ``opened`` resolves when the upgrade succeeded (or fails with the reason);
    :meth:`send_text` / :meth:`send_raw` write without waiting (the load generator sends
    little and must never block on one slow socket).
    """

    def __init__(self, url: str, headers: dict[str, str], listener: WsListener) -> None:
        self._url = url
        self._headers = headers
        self._listener = listener
        self._key = os.urandom(16)
        self._parser = FrameParser()
        self._handshake_buf: bytearray | None = bytearray()
        self._transport: asyncio.Transport | None = None
        self._close_sent = False
        self._closed_reported = False
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(handshake_request(self._url, self._headers, self._key))

    def data_received(self, data: bytes) -> None:
        t = time.monotonic()
        try:
            if self._handshake_buf is not None:
                self._handshake_buf += data
                used = parse_handshake_response(self._handshake_buf, self._key)
                if used is None:
                    return
                data = bytes(self._handshake_buf[used:])
                self._handshake_buf = None
                if not self.opened.done():
                    self.opened.set_result(None)
                if not data:
                    return
            messages = self._parser.feed(data)
        except WsProtocolError as exc:
            self._fail(exc)
            return
        listener = self._listener
        for opcode, payload in messages:
            if opcode == OP_BINARY:
                listener.on_binary(t, payload)
            elif opcode == OP_TEXT:
                listener.on_text(t, payload.decode("utf-8", "replace"))
            elif opcode == OP_PING:
                self.send_raw(encode_client_frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                code = _U16.unpack_from(payload)[0] if len(payload) >= 2 else None
                reason = payload[2:].decode("utf-8", "replace")
                if not self._close_sent:  # echo the close (RFC 6455 section 5.5.1)
                    self.send_raw(encode_client_frame(OP_CLOSE, payload[:2]))
                    self._close_sent = True
                self._report_closed(code, reason)
                if self._transport is not None:
                    self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(
                WsProtocolError(f"connection lost during the handshake: {exc!r}")
            )
        self._report_closed(None, "connection lost")

    # sending
    @property
    def is_open(self) -> bool:
        return (
            self._transport is not None
            and not self._transport.is_closing()
            and self._handshake_buf is None
            and not self._close_sent
        )

    def send_text(self, text: str) -> None:
        self.send_raw(encode_client_frame(OP_TEXT, text.encode("utf-8")))

    def send_raw(self, frame: bytes) -> None:
        """Write a prebuilt, already masked frame."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame)

    def close(self, code: int = 1000) -> None:
        """Start the close handshake; the server's close frame ends the connection."""
        if not self._close_sent:
            self._close_sent = True
            self.send_raw(encode_client_frame(OP_CLOSE, close_payload(code)))

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, exc: Exception) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc)
        self._report_closed(None, str(exc))
        self.abort()

    def _report_closed(self, code: int | None, reason: str) -> None:
        if not self._closed_reported:
            self._closed_reported = True
            self._listener.on_closed(code, reason)


async def connect(
    url: str, headers: dict[str, str], listener: WsListener, *, timeout: float = 10.0
) -> WsProtocol:
    """Open a WebSocket to ``url`` and complete the handshake within ``timeout``."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        _, protocol = await loop.create_connection(
            lambda: WsProtocol(url, headers, listener), host, port
        )
        try:
            await protocol.opened
        except BaseException:
            protocol.abort()
            raise
    return protocol
