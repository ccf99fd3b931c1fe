"""Tests for gateway.wsframe: RFC 6455 server frames and the non-blocking FrameWriter."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from aiohttp import WSMsgType
from aiohttp._websocket.reader import WebSocketDataQueue, WebSocketReader
from aiohttp.base_protocol import BaseProtocol

from gateway.wsframe import OP_BINARY, OP_TEXT, FrameWriter, encode_frame

# ----------------------------------------------------------------- encode_frame


def payload(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


@pytest.mark.parametrize(
    ("length", "header"),
    [
        (0, b"\x82\x00"),
        (1, b"\x82\x01"),
        (125, b"\x82\x7d"),  # largest 7-bit length
        (126, b"\x82\x7e\x00\x7e"),  # 126 -> 16-bit extended length
        (65535, b"\x82\x7e\xff\xff"),  # largest 16-bit length
        (65536, b"\x82\x7f\x00\x00\x00\x00\x00\x01\x00\x00"),  # 127 -> 64-bit length
    ],
)
def test_binary_frame_header_forms(length: int, header: bytes):
    data = payload(length)
    frame = encode_frame(OP_BINARY, data)
    assert frame[: len(header)] == header
    assert frame[len(header) :] == data
    assert len(frame) == len(header) + length


def test_text_frame_exact_bytes():
    assert encode_frame(OP_TEXT, b"Hello") == b"\x81\x05Hello"  # RFC 6455 section 5.7
    assert encode_frame(OP_TEXT, b"") == b"\x81\x00"


def test_fin_set_no_mask_no_rsv():
    for n in (0, 125, 126, 65536):
        frame = encode_frame(OP_BINARY, payload(n))
        assert frame[0] & 0x80  # FIN
        assert frame[0] & 0x70 == 0  # RSV1-3
        assert frame[0] & 0x0F == OP_BINARY
        assert frame[1] & 0x80 == 0  # server frames are never masked


def test_64_bit_length_for_large_payload():
    n = 70_000
    frame = encode_frame(OP_BINARY, payload(n))
    first, second, length = struct.unpack("!BBQ", frame[:10])
    assert (first, second, length) == (0x82, 127, n)


def parse_frame(frame: bytes) -> tuple[bool, int, bytes]:
    """Hand parser for one unmasked frame: (fin, opcode, payload)."""
    fin, opcode = bool(frame[0] & 0x80), frame[0] & 0x0F
    assert frame[1] & 0x80 == 0
    n, offset = frame[1] & 0x7F, 2
    if n == 126:
        (n,) = struct.unpack_from("!H", frame, 2)
        offset = 4
    elif n == 127:
        (n,) = struct.unpack_from("!Q", frame, 2)
        offset = 10
    assert len(frame) == offset + n
    return fin, opcode, frame[offset:]


@pytest.mark.parametrize("length", [0, 7, 125, 126, 127, 65535, 65536, 100_000])
def test_hand_parse_round_trip(length: int):
    data = payload(length)
    assert parse_frame(encode_frame(OP_BINARY, data)) == (True, OP_BINARY, data)


async def test_round_trip_through_aiohttp_reader():
    loop = asyncio.get_running_loop()
    queue = WebSocketDataQueue(BaseProtocol(loop), 1 << 22, loop=loop)
    reader = WebSocketReader(queue, 0, compress=False, decode_text=True)
    sent: list[tuple[WSMsgType, Any]] = []
    stream = b""
    for n in (0, 1, 125, 126, 65535, 65536, 70_000):
        stream += encode_frame(OP_BINARY, payload(n))
        sent.append((WSMsgType.BINARY, payload(n)))
    for text in ("", "hello", "h\u00e9llo \u2603", "x" * 300):
        stream += encode_frame(OP_TEXT, text.encode("utf-8"))
        sent.append((WSMsgType.TEXT, text))
    # Feed the concatenated frames in awkward pieces, as a socket would deliver them.
    for i in range(0, len(stream), 1000):
        assert reader.feed_data(stream[i : i + 1000]) == (False, b"")
    received = [await queue.read() for _ in sent]
    assert [(m.type, m.data) for m in received] == sent


# ------------------------------------------------------------------ FrameWriter


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.buffered = 0
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered


def test_writer_writes_frames_and_counts_bytes():
    transport = FakeTransport()
    writer = FrameWriter(transport)
    assert writer.send_binary(b"\x01\x02\x03") is True
    assert writer.send_text("h\u00e9") is True
    assert transport.written == [b"\x82\x03\x01\x02\x03", b"\x81\x03h\xc3\xa9"]
    assert writer.bytes_sent == 5 + 5
    big = payload(200)
    writer.send_binary(big)
    assert transport.written[-1] == b"\x82\x7e\x00\xc8" + big
    assert writer.bytes_sent == 10 + 204


def test_writer_backlogged_threshold():
    transport = FakeTransport()
    writer = FrameWriter(transport, max_buffer=1000)
    assert not writer.backlogged()
    transport.buffered = 1000
    assert not writer.backlogged()  # at the limit is still fine
    transport.buffered = 1001
    assert writer.backlogged()
    transport.buffered = 0
    assert not writer.backlogged()


def test_writer_default_threshold_is_256_kib():
    transport = FakeTransport()
    writer = FrameWriter(transport)
    transport.buffered = 256 * 1024
    assert not writer.backlogged()
    transport.buffered += 1
    assert writer.backlogged()


def test_writer_does_not_write_when_closed():
    transport = FakeTransport()
    writer = FrameWriter(transport)
    writer.closed = True
    assert writer.send_binary(b"x") is False
    assert writer.send_text("x") is False
    assert transport.written == []
    assert writer.bytes_sent == 0


def test_writer_does_not_write_when_transport_is_closing():
    transport = FakeTransport()
    writer = FrameWriter(transport)
    assert writer.send_binary(b"a")
    transport.closing = True
    assert writer.send_binary(b"b") is False
    assert writer.send_text("c") is False
    assert transport.written == [b"\x82\x01a"]
    assert writer.bytes_sent == 3
