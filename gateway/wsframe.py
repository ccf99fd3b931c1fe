"""Non-blocking WebSocket frame writer for the hot path (one frame per 20 ms per call).

aiohttp's ``WebSocketResponse.send_*`` are coroutines; awaiting one per frame for
hundreds of streams from the single pacer task costs time and, worse, lets one slow peer
stall the pacer when its transport pauses. Server-to-client frames are trivial to build
(RFC 6455 section 5.2: FIN set, no mask), so the gateway writes them straight to the
connection's transport and checks the transport's write buffer instead of awaiting a
drain. Compression is off for these sockets (audio does not compress), so frames written
here and control frames written by aiohttp (pong, close) interleave safely at frame
boundaries.
"""

from __future__ import annotations

import asyncio
import struct

OP_TEXT = 0x1
OP_BINARY = 0x2
_LEN16 = struct.Struct("!BBH")
_LEN64 = struct.Struct("!BBQ")


def encode_frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, unfragmented frame (RFC 6455 section 5.2)."""
    first = 0x80 | opcode
    n = len(payload)
    if n < 126:
        return bytes((first, n)) + payload
    if n < 1 << 16:
        return _LEN16.pack(first, 126, n) + payload
    return _LEN64.pack(first, 127, n) + payload


class FrameWriter:
    """Writes frames to ``transport`` without waiting.

    ``backlogged`` is true when more than ``max_buffer`` bytes are queued in the
    transport (the peer reads too slowly); the pacer then skips the session until it
    catches up, so one slow peer never delays the others.
    """

    def __init__(self, transport: asyncio.BaseTransport, *, max_buffer: int = 256 * 1024) -> None:
        self._transport: asyncio.WriteTransport = transport  # type: ignore[assignment]
        self._max_buffer = max_buffer
        self.closed = False
        self.bytes_sent = 0

    def send_binary(self, payload: bytes) -> bool:
        return self._write(encode_frame(OP_BINARY, payload))

    def send_text(self, text: str) -> bool:
        return self._write(encode_frame(OP_TEXT, text.encode("utf-8")))

    def _write(self, frame: bytes) -> bool:
        if self.closed or self._transport.is_closing():
            return False
        self._transport.write(frame)
        self.bytes_sent += len(frame)
        return True

    def backlogged(self) -> bool:
        return self._transport.get_write_buffer_size() > self._max_buffer
