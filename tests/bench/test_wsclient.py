"""The load generator's WebSocket codec, byte for byte (RFC 6455), without a socket."""

from __future__ import annotations

import base64
import struct

import pytest

from tests.bench import wsclient


def server_frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        return bytes((first, n)) + payload
    if n < 1 << 16:
        return bytes((first, 126)) + struct.pack("!H", n) + payload
    return bytes((first, 127)) + struct.pack("!Q", n) + payload


def test_accept_key_matches_rfc_example() -> None:
    key = base64.b64decode("dGhlIHNhbXBsZSBub25jZQ==")  # RFC 6455 section 1.3
    assert wsclient.expected_accept(key) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_handshake_request_and_response() -> None:
    key = bytes(range(16))
    request = wsclient.handshake_request(
        "ws://127.0.0.1:9/v1/stream?x=1", {"Authorization": "Bearer t"}, key
    )
    assert request.startswith(b"GET /v1/stream?x=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n")
    assert b"Authorization: Bearer t\r\n" in request and request.endswith(b"\r\n\r\n")
    response = (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {wsclient.expected_accept(key)}\r\n\r\n"
    ).encode()
    assert wsclient.parse_handshake_response(response[:-3], key) is None
    assert wsclient.parse_handshake_response(response + b"\x82", key) == len(response)


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 401 Unauthorized\r\n\r\n",
        b"HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: wrong\r\n\r\n",
    ],
)
def test_handshake_refusals(response: bytes) -> None:
    with pytest.raises(wsclient.WsProtocolError):
        wsclient.parse_handshake_response(response, bytes(16))


def test_parser_cuts_frames_across_arbitrary_reads() -> None:
    audio = bytes(range(160))
    stream = (
        server_frame(wsclient.OP_BINARY, audio)
        + server_frame(wsclient.OP_TEXT, b'{"type":"ready"}')
        + server_frame(wsclient.OP_BINARY, b"x" * 70_000)
        + server_frame(wsclient.OP_PING, b"hi")
    )
    parser = wsclient.FrameParser()
    got: list[tuple[int, bytes]] = []
    for i in range(0, len(stream), 7):
        got += parser.feed(stream[i : i + 7])
    assert got == [
        (wsclient.OP_BINARY, audio),
        (wsclient.OP_TEXT, b'{"type":"ready"}'),
        (wsclient.OP_BINARY, b"x" * 70_000),
        (wsclient.OP_PING, b"hi"),
    ]


def test_parser_joins_fragments_around_a_control_frame() -> None:
    parser = wsclient.FrameParser()
    data = (
        server_frame(wsclient.OP_TEXT, b"he", fin=False)
        + server_frame(wsclient.OP_PING, b"")
        + server_frame(wsclient.OP_CONT, b"llo")
    )
    assert parser.feed(data) == [(wsclient.OP_PING, b""), (wsclient.OP_TEXT, b"hello")]


def test_parser_rejects_masked_server_frames() -> None:
    with pytest.raises(wsclient.WsProtocolError):
        wsclient.FrameParser().feed(b"\x82\x81abcd\x00")


@pytest.mark.parametrize("size", [0, 5, 125, 126, 160, 65535, 65536])
def test_client_frames_are_masked_and_unmask(size: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    key = b"\x01\x02\x03\x04"
    frame = wsclient.encode_client_frame(wsclient.OP_BINARY, payload, key)
    assert frame[0] == 0x82 and frame[1] & 0x80
    n = frame[1] & 0x7F
    offset = 2 + {126: 2, 127: 8}.get(n, 0)
    assert frame[offset : offset + 4] == key
    assert wsclient.mask_payload(frame[offset + 4 :], key) == payload
