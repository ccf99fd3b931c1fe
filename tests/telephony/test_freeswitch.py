"""FreeSWITCH mod_audio_stream core, byte for byte, without an event loop.

The frames are what amigniter/mod_audio_stream (commit ec2a781) puts on the socket:
metadata and ``send_text``/``stop`` text as TEXT frames, L16 audio as BINARY frames whose
size depends on ptime, resampling and ``STREAM_BUFFER_SIZE`` (audio_streamer_glue.cpp
``stream_frame``). The ``streamAudio`` message we send is the README's "play" example.
"""

from __future__ import annotations

import base64
import functools
import json
import struct
from typing import Any

import pytest

from telephony.freeswitch import (
    DEFAULT_MAX_TEXT_BYTES,
    DEFAULT_SAMPLE_RATE,
    MAX_AUDIO_FRAME_BYTES,
    MAX_CHUNK_MS,
    MAX_HELD_AUDIO_BYTES,
    MAX_HELD_AUDIO_FRAMES,
    MAX_METADATA_BYTES,
    MIN_CHUNK_MS,
    SAMPLE_RATES,
    TRANSITIONS,
    AudioReceived,
    FreeSwitchConnection,
    FreeSwitchError,
    FreeSwitchErrorCode,
    FreeSwitchMetadata,
    FreeSwitchPlayback,
    FreeSwitchProtocolError,
    FreeSwitchState,
    FreeSwitchTrigger,
    FreeSwitchUsageError,
    StreamStarted,
    TextReceived,
)
from telephony.limits import MAX_CALL_ID_CHARS

Code = FreeSwitchErrorCode
State = FreeSwitchState
RAW = FreeSwitchMetadata.RAW
JSON = FreeSwitchMetadata.JSON
STREAM_AUDIO = FreeSwitchPlayback.STREAM_AUDIO
BINARY = FreeSwitchPlayback.BINARY

UUID = "0e1f4b5c-6d7e-4f80-9a1b-2c3d4e5f6a7b"  # a FreeSWITCH channel uuid's shape


@functools.cache
def pcm(samples: int, start: int = 0) -> bytes:
    """``samples`` distinct little-endian int16 samples (so any reordering shows)."""
    return struct.pack(
        f"<{samples}h", *(((start + i) * 7919) % 65536 - 32768 for i in range(samples))
    )


FRAME_8K = pcm(160)  # 20 ms at 8 kHz: 320 bytes, one media-bug read at ptime 20
FRAME_16K = pcm(320)  # 20 ms at 16 kHz (resampled or a wideband codec)


def streaming(**kwargs: Any) -> FreeSwitchConnection:
    conn = FreeSwitchConnection(**kwargs)
    conn.receive_text("hello")
    assert conn.state is State.STREAMING
    return conn


def expect_protocol_error(
    conn: FreeSwitchConnection, frame: str | bytes, code: FreeSwitchErrorCode
) -> FreeSwitchProtocolError:
    with pytest.raises(FreeSwitchProtocolError) as info:
        feed(conn, frame)
    assert info.value.code is code
    assert conn.state is State.FAILED
    return info.value


def state_of(conn: FreeSwitchConnection) -> FreeSwitchState:
    """``conn.state``, read afresh (mypy keeps a property narrowed after an assert)."""
    return conn.state


def expect_usage_error(call: Any, code: FreeSwitchErrorCode) -> FreeSwitchUsageError:
    with pytest.raises(FreeSwitchUsageError) as info:
        call()
    assert info.value.code is code
    return info.value


def feed(conn: FreeSwitchConnection, frame: str | bytes) -> list[Any]:
    if isinstance(frame, str):
        return list(conn.receive_text(frame))
    return list(conn.receive_binary(frame))


def stream_audio(rate: int, audio: bytes) -> dict[str, Any]:
    """The README's "play" message for ``audio``."""
    return {
        "type": "streamAudio",
        "data": {
            "audioDataType": "raw",
            "sampleRate": rate,
            "audioData": base64.b64encode(audio).decode("ascii"),
        },
    }


# --------------------------------------------------------------------------- the start


def test_metadata_text_starts_the_stream_raw_mode() -> None:
    conn = FreeSwitchConnection(call_id=UUID, sample_rate=16000)
    assert conn.state is State.AWAITING_START
    assert (conn.call_id, conn.sample_rate, conn.start) == (UUID, 16000, None)
    # Metadata is any UTF-8 text [README API/Commands]; RAW mode does not interpret it.
    [event] = conn.receive_text('{"callId":"other","sampleRate":8000} ünïcode')
    assert event == StreamStarted(
        call_id=UUID,
        sample_rate=16000,
        metadata='{"callId":"other","sampleRate":8000} ünïcode',
        parameters={},
    )
    assert isinstance(event, StreamStarted)
    assert event.format == "pcm_16000"
    assert state_of(conn) is State.STREAMING
    assert conn.start is event
    assert (conn.call_id, conn.sample_rate) == (UUID, 16000)


def test_audio_first_starts_the_stream_without_metadata() -> None:
    # libwsc flushes audio queued during the handshake before the open callback sends
    # the metadata, so audio can come first.
    conn = FreeSwitchConnection()
    events = conn.receive_binary(FRAME_8K)
    assert events == [
        StreamStarted(call_id=None, sample_rate=DEFAULT_SAMPLE_RATE, metadata=None),
        AudioReceived(FRAME_8K),
    ]
    assert events[1].payload == FRAME_8K  # type: ignore[union-attr]
    assert conn.state is State.STREAMING
    # Late metadata is then plain text.
    assert conn.receive_text("late metadata") == [TextReceived("late metadata")]


def test_defaults_without_url_parameters() -> None:
    conn = FreeSwitchConnection()
    assert (conn.call_id, conn.sample_rate) == (None, 8000)
    [event] = conn.receive_text("x")
    assert event == StreamStarted(None, 8000, "x")


def test_repr_hides_metadata_parameters_and_audio() -> None:
    started = StreamStarted(UUID, 8000, '{"token":"s3cret"}', {"token": "s3cret"})
    assert "s3cret" not in repr(started)
    assert UUID in repr(started)
    assert "\\x" not in repr(AudioReceived(FRAME_8K))


# --------------------------------------------------------------------------- JSON metadata


def test_json_metadata_supplies_call_id_rate_and_parameters() -> None:
    conn = FreeSwitchConnection(metadata=JSON)
    text = json.dumps({"callId": UUID, "sampleRate": 16000, "caller": "+15551234567"})
    [event] = conn.receive_text(text)
    assert event == StreamStarted(
        call_id=UUID,
        sample_rate=16000,
        metadata=text,
        parameters={"callId": UUID, "caller": "+15551234567"},
    )
    assert (conn.call_id, conn.sample_rate) == (UUID, 16000)


def test_json_metadata_agreeing_with_the_url_is_accepted() -> None:
    conn = FreeSwitchConnection(metadata=JSON, call_id=UUID, sample_rate=8000)
    [event] = conn.receive_text(f'{{"callId":"{UUID}","sampleRate":8000}}')
    assert isinstance(event, StreamStarted)
    assert (event.call_id, event.sample_rate) == (UUID, 8000)


def test_json_metadata_without_our_members_keeps_the_url_values() -> None:
    conn = FreeSwitchConnection(metadata=JSON, call_id=UUID, sample_rate=16000)
    [event] = conn.receive_text('{"dnis":"100"}')
    assert event == StreamStarted(UUID, 16000, '{"dnis":"100"}', {"dnis": "100"})
    [event] = FreeSwitchConnection(metadata=JSON).receive_text("{}")
    assert event == StreamStarted(None, 8000, "{}", {})


def test_json_mode_holds_audio_until_the_metadata() -> None:
    conn = FreeSwitchConnection(metadata=JSON)
    frames = [pcm(320, 0), pcm(320, 320), pcm(319, 640)]  # resampler output varies
    for frame in frames:
        assert conn.receive_binary(frame) == []
        assert conn.state is State.AWAITING_START
    events = conn.receive_text('{"callId":"c1","sampleRate":16000}')
    assert events == [
        StreamStarted("c1", 16000, '{"callId":"c1","sampleRate":16000}', {"callId": "c1"}),
        *(AudioReceived(frame) for frame in frames),
    ]
    assert conn.state is State.STREAMING
    assert conn.receive_binary(FRAME_16K) == [AudioReceived(FRAME_16K)]
    assert conn.receive_text('{"callId":"c1"}') == [TextReceived('{"callId":"c1"}')]


def test_json_mode_holds_up_to_the_frame_limit() -> None:
    conn = FreeSwitchConnection(metadata=JSON)
    for _ in range(MAX_HELD_AUDIO_FRAMES):
        conn.receive_binary(b"\x00\x00")
    events = conn.receive_text("{}")
    assert len(events) == 1 + MAX_HELD_AUDIO_FRAMES
    conn = FreeSwitchConnection(metadata=JSON)
    for _ in range(MAX_HELD_AUDIO_FRAMES):
        conn.receive_binary(b"\x00\x00")
    err = expect_protocol_error(conn, b"\x00\x00", Code.METADATA_MISSING)
    assert f"{MAX_HELD_AUDIO_FRAMES} audio frames" in err.message


def test_json_mode_holds_up_to_the_byte_limit() -> None:
    conn = FreeSwitchConnection(metadata=JSON)
    frame = b"\x01\x00" * (MAX_AUDIO_FRAME_BYTES // 2)
    for _ in range(MAX_HELD_AUDIO_BYTES // MAX_AUDIO_FRAME_BYTES):
        conn.receive_binary(frame)
    expect_protocol_error(conn, b"\x00\x00", Code.METADATA_MISSING)
    # The failure drops what was held; nothing more is accepted.
    expect_usage_error(lambda: conn.receive_text("{}"), Code.CONNECTION_FAILED)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("not json", Code.INVALID_JSON),
        ('{"callId": ', Code.INVALID_JSON),
        ("NaN", Code.INVALID_JSON),
        ('{"a":"\\ud800"}', Code.INVALID_JSON),  # a lone surrogate escape
        ("[" * 4000 + "]" * 4000, Code.INVALID_JSON),  # RecursionError, under 8191 bytes
        ('["callId"]', Code.INVALID_JSON),  # not an object
        ('"callId"', Code.INVALID_JSON),
        ("8000", Code.INVALID_JSON),
        ("null", Code.INVALID_JSON),
        ('{"callId":42}', Code.INVALID_METADATA),
        ('{"callId":null}', Code.INVALID_METADATA),
        ('{"caller":{"number":"1"}}', Code.INVALID_METADATA),
        ('{"tags":["a"]}', Code.INVALID_METADATA),
        ('{"sampleRate":"8000"}', Code.INVALID_METADATA),
        ('{"sampleRate":true}', Code.INVALID_METADATA),
        ('{"sampleRate":8000.0}', Code.INVALID_METADATA),
        ('{"sampleRate":24000}', Code.UNSUPPORTED_SAMPLE_RATE),
        ('{"sampleRate":0}', Code.UNSUPPORTED_SAMPLE_RATE),
        ('{"sampleRate":-8000}', Code.UNSUPPORTED_SAMPLE_RATE),
        ('{"callId":""}', Code.INVALID_ID),
        ('{"callId":"has space"}', Code.INVALID_ID),
        ('{"callId":"tab\\t"}', Code.INVALID_ID),
        ('{"callId":"' + "x" * (MAX_CALL_ID_CHARS + 1) + '"}', Code.INVALID_ID),
    ],
)
def test_bad_json_metadata(text: str, code: FreeSwitchErrorCode) -> None:
    conn = FreeSwitchConnection(metadata=JSON)
    conn.receive_binary(FRAME_8K)  # held audio goes with the failure
    expect_protocol_error(conn, text, code)


def test_json_metadata_call_id_of_128_printable_characters_is_accepted() -> None:
    call_id = "é" + "x" * (MAX_CALL_ID_CHARS - 1)
    [event] = FreeSwitchConnection(metadata=JSON).receive_text(json.dumps({"callId": call_id}))
    assert isinstance(event, StreamStarted)
    assert event.call_id == call_id


def test_json_metadata_contradicting_the_url() -> None:
    conn = FreeSwitchConnection(metadata=JSON, call_id=UUID)
    expect_protocol_error(conn, '{"callId":"someone-else"}', Code.CALL_ID_MISMATCH)
    conn = FreeSwitchConnection(metadata=JSON, sample_rate=8000)
    expect_protocol_error(conn, '{"sampleRate":16000}', Code.SAMPLE_RATE_MISMATCH)


# --------------------------------------------------------------------------- TEXT limits


def test_metadata_size_limit() -> None:
    assert MAX_METADATA_BYTES == 8191  # char initialMetadata[8192] and its NUL
    [event] = FreeSwitchConnection().receive_text("m" * MAX_METADATA_BYTES)
    assert isinstance(event, StreamStarted)
    expect_protocol_error(
        FreeSwitchConnection(), "m" * (MAX_METADATA_BYTES + 1), Code.METADATA_TOO_LARGE
    )
    # Counted in UTF-8 bytes: 4,096 two-byte characters are 8,192 bytes.
    expect_protocol_error(FreeSwitchConnection(), "é" * 4096, Code.METADATA_TOO_LARGE)


def test_later_text_may_exceed_the_metadata_size() -> None:
    conn = streaming()
    text = "t" * (MAX_METADATA_BYTES + 1)
    assert conn.receive_text(text) == [TextReceived(text)]


def test_text_size_limit_counts_utf8_bytes() -> None:
    conn = streaming(max_text_bytes=10)
    assert conn.receive_text("é" * 5) == [TextReceived("é" * 5)]  # 10 bytes
    expect_protocol_error(conn, "é" * 6, Code.TEXT_TOO_LARGE)  # 6 characters, 12 bytes
    expect_protocol_error(streaming(max_text_bytes=10), "x" * 11, Code.TEXT_TOO_LARGE)


def test_default_text_limit() -> None:
    assert DEFAULT_MAX_TEXT_BYTES == 64 * 1024
    conn = streaming()
    conn.receive_text("x" * DEFAULT_MAX_TEXT_BYTES)
    expect_protocol_error(conn, "x" * (DEFAULT_MAX_TEXT_BYTES + 1), Code.TEXT_TOO_LARGE)


@pytest.mark.parametrize("text", ["", "\ud800", "ok \udfff"])
@pytest.mark.parametrize("started", [False, True])
def test_invalid_text(text: str, started: bool) -> None:
    conn = streaming() if started else FreeSwitchConnection()
    expect_protocol_error(conn, text, Code.INVALID_TEXT)


# --------------------------------------------------------------------------- BINARY audio


@pytest.mark.parametrize(
    "size",
    [
        2,  # one sample
        318,  # a resampler short by one sample
        320,  # 20 ms at 8 kHz (ptime 20)
        480,  # 30 ms at 8 kHz (ptime 30)
        640,  # 20 ms at 16 kHz
        3200,  # STREAM_BUFFER_SIZE=200 at 8 kHz
        MAX_AUDIO_FRAME_BYTES,  # STREAM_BUFFER_SIZE=1000 at 16 kHz
    ],
)
def test_audio_frames_of_any_whole_sample_size(size: int) -> None:
    conn = streaming()
    frame = pcm(size // 2)
    [event] = conn.receive_binary(frame)
    assert event == AudioReceived(frame)
    assert isinstance(event, AudioReceived)
    assert event.payload == frame
    assert type(event.payload) is bytes


def test_audio_from_a_bytearray_or_memoryview_is_copied() -> None:
    conn = streaming()
    buffer = bytearray(FRAME_8K)
    [event] = conn.receive_binary(memoryview(buffer))  # type: ignore[arg-type]
    buffer[:2] = b"\xff\xff"
    assert event == AudioReceived(FRAME_8K)


@pytest.mark.parametrize("size", [0, 1, 3, 319, 321])
@pytest.mark.parametrize("mode", [RAW, JSON])
@pytest.mark.parametrize("started", [False, True])
def test_invalid_audio(size: int, mode: FreeSwitchMetadata, started: bool) -> None:
    conn = FreeSwitchConnection(metadata=mode)
    if started:
        conn.receive_text("{}")
    err = expect_protocol_error(conn, b"\x00" * size, Code.INVALID_AUDIO)
    assert f"{size} bytes" in err.message


@pytest.mark.parametrize("started", [False, True])
def test_audio_too_large(started: bool) -> None:
    conn = streaming() if started else FreeSwitchConnection()
    expect_protocol_error(conn, b"\x00" * (MAX_AUDIO_FRAME_BYTES + 2), Code.AUDIO_TOO_LARGE)


# --------------------------------------------------------------------------- our audio


def test_stream_audio_message_exact() -> None:
    conn = streaming(call_id=UUID)
    [message] = conn.audio(FRAME_8K)
    assert isinstance(message, str)
    assert json.loads(message) == stream_audio(8000, FRAME_8K)
    assert message == (
        '{"type":"streamAudio","data":{"audioDataType":"raw","sampleRate":8000,"audioData":"'
        + base64.b64encode(FRAME_8K).decode()
        + '"}}'
    )


def test_stream_audio_carries_the_stream_rate() -> None:
    conn = FreeSwitchConnection(metadata=JSON)
    conn.receive_text('{"sampleRate":16000}')
    [message] = conn.audio(FRAME_16K)
    assert json.loads(message) == stream_audio(16000, FRAME_16K)


def test_binary_playback_exact() -> None:
    conn = streaming(playback=BINARY)
    assert conn.chunk_bytes == 320  # 20 ms at 8 kHz
    assert conn.audio(FRAME_8K) == [FRAME_8K]
    assert conn.audio(FRAME_8K + FRAME_8K[:2]) == [FRAME_8K, FRAME_8K[:2]]


@pytest.mark.parametrize("rate", SAMPLE_RATES)
@pytest.mark.parametrize("chunk_ms", [MIN_CHUNK_MS, 333, MAX_CHUNK_MS])
@pytest.mark.parametrize("samples", [1, 159, 160, 161, 24_001])
def test_stream_audio_chunks_reassemble(rate: int, chunk_ms: int, samples: int) -> None:
    conn = streaming(sample_rate=rate, chunk_ms=chunk_ms)
    chunk = rate * chunk_ms // 1000 * 2
    assert conn.chunk_bytes == chunk
    audio = pcm(samples)
    messages = conn.audio(audio)
    assert len(messages) == -(-len(audio) // chunk)
    pieces = []
    for message in messages:
        assert isinstance(message, str)
        obj = json.loads(message)
        assert obj["type"] == "streamAudio"
        assert {k: v for k, v in obj["data"].items() if k != "audioData"} == {
            "audioDataType": "raw",
            "sampleRate": rate,
        }
        piece = base64.b64decode(obj["data"]["audioData"], validate=True)
        assert 0 < len(piece) <= chunk
        assert len(piece) % 2 == 0
        pieces.append(piece)
    assert all(len(p) == chunk for p in pieces[:-1])
    assert b"".join(pieces) == audio


@pytest.mark.parametrize("rate", SAMPLE_RATES)
def test_binary_chunks_reassemble(rate: int) -> None:
    conn = streaming(sample_rate=rate, playback=BINARY, chunk_ms=100)
    audio = pcm(rate + 3)  # 1 s and 3 samples
    messages = conn.audio(audio)
    assert all(isinstance(m, bytes) for m in messages)
    assert [len(m) for m in messages] == [rate // 5] * 10 + [6]
    assert b"".join(messages) == audio  # type: ignore[arg-type]


def test_default_chunk_sizes() -> None:
    # One second per streamAudio message (each is a file in the community edition);
    # 20 ms BINARY frames (the module's own framing).
    assert streaming().chunk_bytes == 16_000
    assert streaming(sample_rate=16000).chunk_bytes == 32_000
    assert streaming(playback=BINARY).chunk_bytes == 320
    assert streaming(playback=BINARY, sample_rate=16000).chunk_bytes == 640


def test_largest_stream_audio_message() -> None:
    [message] = streaming(sample_rate=16000).audio(pcm(16000))
    assert len(message) < 43_000


@pytest.mark.parametrize("audio", [b"", b"\x00", b"\x00" * 321])
def test_invalid_pcm(audio: bytes) -> None:
    conn = streaming()
    expect_usage_error(lambda: conn.audio(audio), Code.INVALID_PCM)
    assert conn.state is State.STREAMING  # local misuse changes nothing


def test_stop_audio_has_no_message() -> None:
    conn = streaming()
    assert conn.stop_audio() is None
    assert conn.state is State.STREAMING


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (State.AWAITING_START, Code.NOT_STREAMING),
        (State.CLOSING, Code.CLOSED),
        (State.CLOSED, Code.CLOSED),
        (State.FAILED, Code.CONNECTION_FAILED),
    ],
)
def test_sending_outside_streaming(state: FreeSwitchState, code: FreeSwitchErrorCode) -> None:
    conn = in_state(state)
    expect_usage_error(lambda: conn.audio(FRAME_8K), code)
    expect_usage_error(conn.stop_audio, code)
    assert conn.state is state


# --------------------------------------------------------------------------- formats and arguments


def test_format_names() -> None:
    assert FreeSwitchConnection.format_name(8000) == "pcm_8000"
    assert FreeSwitchConnection.format_name(16000) == "pcm_16000"
    assert SAMPLE_RATES == (8000, 16000)


@pytest.mark.parametrize("rate", [0, -8000, 11025, 24000, 32000, 44100, 48000])
def test_format_name_of_other_rates_is_a_usage_error(rate: int) -> None:
    expect_usage_error(lambda: FreeSwitchConnection.format_name(rate), Code.INVALID_SAMPLE_RATE)
    expect_usage_error(lambda: FreeSwitchConnection(sample_rate=rate), Code.INVALID_SAMPLE_RATE)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"call_id": ""},
        {"call_id": "a b"},
        {"call_id": "x" * (MAX_CALL_ID_CHARS + 1)},
        {"chunk_ms": MIN_CHUNK_MS - 1},
        {"chunk_ms": MAX_CHUNK_MS + 1},
        {"max_text_bytes": 0},
    ],
)
def test_invalid_constructor_arguments(kwargs: dict[str, Any]) -> None:
    expect_usage_error(lambda: FreeSwitchConnection(**kwargs), Code.INVALID_ARGUMENT)


def test_options_accept_their_string_values() -> None:
    conn = FreeSwitchConnection(playback="binary", metadata="json")  # type: ignore[arg-type]
    conn.receive_text("{}")
    assert conn.audio(b"\x00\x00") == [b"\x00\x00"]


# --------------------------------------------------------------------------- a session


def test_realistic_session() -> None:
    # Dialplan: uuid_audio_stream ${uuid} start ws://gw:8080/fs?call=${uuid}&rate=16000
    #           mono 16k {"callId":"${uuid}","caller":"1001"}
    # The gateway read call and rate from the URL; metadata is JSON by convention.
    conn = FreeSwitchConnection(call_id=UUID, sample_rate=16000, metadata=JSON, chunk_ms=100)
    assert conn.receive_binary(FRAME_16K) == []  # captured during the TLS handshake
    metadata = f'{{"callId":"{UUID}","caller":"1001"}}'
    started, early = conn.receive_text(metadata)
    assert started == StreamStarted(UUID, 16000, metadata, {"callId": UUID, "caller": "1001"})
    assert early == AudioReceived(FRAME_16K)
    assert FreeSwitchConnection.format_name(conn.sample_rate) == "pcm_16000"

    heard = [conn.receive_binary(pcm(320, 320 * i)) for i in range(1, 4)]
    assert heard == [[AudioReceived(pcm(320, 320 * i))] for i in range(1, 4)]

    prompt = pcm(16000 * 3 // 2)  # 1.5 s of TTS
    messages = conn.audio(prompt)
    assert len(messages) == 15  # 100 ms each
    played = b"".join(base64.b64decode(json.loads(m)["data"]["audioData"]) for m in messages)
    assert played == prompt
    assert conn.stop_audio() is None  # barge-in: the adapter stops sending

    # uuid_audio_stream <uuid> send_text {"digit":"5"}  (a site's own DTMF convention)
    assert conn.receive_text('{"digit":"5"}') == [TextReceived('{"digit":"5"}')]
    # uuid_audio_stream <uuid> stop bye: the text, then a 1000 close.
    assert conn.receive_text("bye") == [TextReceived("bye")]
    conn.connection_closed()
    assert conn.state is State.CLOSED
    assert (conn.call_id, conn.sample_rate) == (UUID, 16000)
    expect_usage_error(lambda: conn.receive_binary(FRAME_16K), Code.CLOSED)


def test_session_closed_by_us() -> None:
    conn = streaming()
    conn.close()
    assert conn.state is State.CLOSING
    # Frames in flight are checked and dropped.
    assert conn.receive_binary(FRAME_8K) == []
    assert conn.receive_text("late") == []
    expect_usage_error(lambda: conn.audio(FRAME_8K), Code.CLOSED)
    expect_usage_error(conn.close, Code.CLOSED)
    conn.connection_closed()
    assert state_of(conn) is State.CLOSED


def test_closing_still_checks_frames() -> None:
    conn = streaming()
    conn.close()
    expect_protocol_error(conn, b"\x00", Code.INVALID_AUDIO)


def test_closing_before_the_start_drops_held_audio() -> None:
    conn = FreeSwitchConnection(metadata=JSON)
    conn.receive_binary(FRAME_8K)
    conn.close()
    assert conn.receive_text("{}") == []  # not a start any more
    assert conn.start is None


# --------------------------------------------------------------------------- the state table


def in_state(state: FreeSwitchState, mode: FreeSwitchMetadata = RAW) -> FreeSwitchConnection:
    conn = FreeSwitchConnection(metadata=mode)
    if state is State.AWAITING_START:
        return conn
    if state is State.FAILED:
        with pytest.raises(FreeSwitchProtocolError):
            conn.receive_binary(b"\x00")
        return conn
    conn.receive_text("{}")
    if state is State.CLOSING:
        conn.close()
    elif state is State.CLOSED:
        conn.connection_closed()
    assert conn.state is state
    return conn


def test_the_table() -> None:
    S, T = State, FreeSwitchTrigger
    assert dict(TRANSITIONS) == {
        (S.AWAITING_START, T.TEXT): S.STREAMING,
        (S.AWAITING_START, T.AUDIO): S.STREAMING,
        (S.AWAITING_START, T.HELD_AUDIO): S.AWAITING_START,
        (S.AWAITING_START, T.CLOSE): S.CLOSING,
        (S.STREAMING, T.TEXT): S.STREAMING,
        (S.STREAMING, T.AUDIO): S.STREAMING,
        (S.STREAMING, T.PLAY): S.STREAMING,
        (S.STREAMING, T.CLOSE): S.CLOSING,
        (S.CLOSING, T.TEXT): S.CLOSING,
        (S.CLOSING, T.AUDIO): S.CLOSING,
        (S.AWAITING_START, T.CONNECTION_CLOSED): S.CLOSED,
        (S.STREAMING, T.CONNECTION_CLOSED): S.CLOSED,
        (S.CLOSING, T.CONNECTION_CLOSED): S.CLOSED,
        (S.CLOSED, T.CONNECTION_CLOSED): S.CLOSED,
        (S.FAILED, T.CONNECTION_CLOSED): S.CLOSED,
    }


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("trigger", list(FreeSwitchTrigger))
def test_step_follows_the_table(state: FreeSwitchState, trigger: FreeSwitchTrigger) -> None:
    conn = in_state(state)
    expected = TRANSITIONS.get((state, trigger))
    if expected is not None:
        conn._step(trigger)
        assert conn.state is expected
        return
    with pytest.raises(FreeSwitchUsageError) as info:
        conn._step(trigger)
    assert conn.state is state
    if state is State.FAILED:
        assert info.value.code is Code.CONNECTION_FAILED
    elif state in (State.CLOSING, State.CLOSED):
        assert info.value.code is Code.CLOSED
    elif trigger is FreeSwitchTrigger.PLAY:
        assert info.value.code is Code.NOT_STREAMING
    else:  # a trigger the receivers never produce in this state
        assert (state, trigger) == (State.STREAMING, FreeSwitchTrigger.HELD_AUDIO)
        assert info.value.code is Code.ILLEGAL_TRANSITION


FRAMES: dict[str, str | bytes] = {"text": "{}", "audio": FRAME_8K}


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("mode", [RAW, JSON])
@pytest.mark.parametrize("kind", list(FRAMES))
def test_remote_frames_follow_the_table(
    state: FreeSwitchState, mode: FreeSwitchMetadata, kind: str
) -> None:
    conn = in_state(state, mode)
    frame = FRAMES[kind]
    if kind == "text":
        trigger = FreeSwitchTrigger.TEXT
    elif state is State.AWAITING_START and mode is JSON:
        trigger = FreeSwitchTrigger.HELD_AUDIO
    else:
        trigger = FreeSwitchTrigger.AUDIO
    expected = TRANSITIONS.get((state, trigger))
    if expected is not None:
        feed(conn, frame)
        assert conn.state is expected
    else:
        code = Code.CONNECTION_FAILED if state is State.FAILED else Code.CLOSED
        expect_usage_error(lambda: feed(conn, frame), code)
        assert conn.state is state


@pytest.mark.parametrize("state", list(State))
def test_local_triggers_follow_the_table(state: FreeSwitchState) -> None:
    conn = in_state(state)
    if (state, FreeSwitchTrigger.CLOSE) in TRANSITIONS:
        conn.close()
        assert conn.state is State.CLOSING
    else:
        with pytest.raises(FreeSwitchUsageError):
            conn.close()
        assert conn.state is state
    conn = in_state(state)
    conn.connection_closed()  # always legal
    assert conn.state is State.CLOSED


def test_after_failure_everything_is_local_misuse() -> None:
    conn = in_state(State.FAILED)
    for call in (
        lambda: conn.receive_text("x"),
        lambda: conn.receive_binary(FRAME_8K),
        lambda: conn.audio(FRAME_8K),
        conn.stop_audio,
        conn.close,
    ):
        expect_usage_error(call, Code.CONNECTION_FAILED)
    assert conn.state is State.FAILED


# --------------------------------------------------------------------------- errors


def test_error_types_separate_remote_from_local() -> None:
    assert issubclass(FreeSwitchProtocolError, FreeSwitchError)
    assert issubclass(FreeSwitchUsageError, FreeSwitchError)
    assert not issubclass(FreeSwitchProtocolError, FreeSwitchUsageError)
    err = expect_protocol_error(FreeSwitchConnection(), b"\x00", Code.INVALID_AUDIO)
    assert str(err).startswith("invalid_audio: ")
    assert err.message in str(err)


def test_error_messages_quote_at_most_an_excerpt() -> None:
    conn = FreeSwitchConnection(metadata=JSON)
    err = expect_protocol_error(conn, json.dumps({"callId": "y" * 200 + " "}), Code.INVALID_ID)
    assert "y" * 65 not in err.message


def test_every_error_code_is_exercised() -> None:
    # Keep this list in step with FreeSwitchErrorCode: a new code needs a test above.
    assert {c.value for c in Code} == {
        "text_too_large",
        "invalid_text",
        "metadata_too_large",
        "invalid_json",
        "invalid_metadata",
        "invalid_id",
        "unsupported_sample_rate",
        "call_id_mismatch",
        "sample_rate_mismatch",
        "metadata_missing",
        "invalid_audio",
        "audio_too_large",
        "invalid_argument",
        "invalid_sample_rate",
        "not_streaming",
        "closed",
        "connection_failed",
        "invalid_pcm",
        "illegal_transition",
    }
