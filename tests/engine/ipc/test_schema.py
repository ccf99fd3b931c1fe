"""Tests for engine.ipc.schema: message encoding and the length-prefixed FrameDecoder."""

from __future__ import annotations

import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ipc.schema import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    CacheLevelStats,
    Cancel,
    Cancelled,
    CancelUtterance,
    CheckPrompt,
    CloseStream,
    ForgetVoice,
    FrameDecoder,
    FramingError,
    Hello,
    Message,
    OpenStream,
    Ping,
    Pong,
    PrepareVoice,
    PromptRequest,
    PromptState,
    ProtocolError,
    PurgeTenant,
    SegmentState,
    Speak,
    SpeechCacheStats,
    SpeechStarted,
    StreamClosed,
    StreamOpened,
    StreamRejected,
    TenantPurged,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceFailed,
    UtteranceWords,
    VoiceInfo,
    VoicePrepared,
    VoicePrepareFailed,
    WarmPrompt,
    Welcome,
    WordTime,
    encode,
)

TO_ENGINE: list[Message] = [
    PrepareVoice(request_id=7, pcm16k=b"\x00\x01" * 8, language="en-US"),
    Hello(protocol_version=PROTOCOL_VERSION, client="gateway-1"),
    Ping(seq=42),
    OpenStream(stream_id=1, voice="en-us", sample_rate=8000),
    OpenStream(
        stream_id=2,
        voice="zh",
        sample_rate=16000,
        speed=1.5,
        language="zh-CN",
        voice_profile=b"\x00\x01\xffprofile",
        tenant="acme",
        retain=False,
        voice_digest="cd" * 32,
    ),
    Speak(stream_id=1, utterance=1, text="Hello, world."),
    Speak(stream_id=1, utterance=4, text="Your code is 1234.", retain=False),
    Speak(stream_id=1, utterance=2, text="你好！欢迎致电。😀", final=False),
    Speak(stream_id=1, utterance=3, text=""),
    Cancel(stream_id=1),
    CancelUtterance(stream_id=1, utterance=7),
    CloseStream(stream_id=1),
    WarmPrompt(
        request_id=3, prompt=PromptRequest(voice="en-us-joe", text="Welcome.", sample_rate=8000)
    ),
    CheckPrompt(
        request_id=4,
        prompt=PromptRequest(
            voice="zh-xiaoyi",
            text="您好。",
            sample_rate=16000,
            speed=1.2,
            language="zh-CN",
            voice_profile=b"\x00features",
            instruct="用四川话说",
            tenant="acme",
            shared=False,
            voice_digest="ef" * 32,
        ),
    ),
    ForgetVoice(voice_digest="ab" * 32, tenant="acme"),
    PurgeTenant(request_id=5, tenant="acme"),
]

FROM_ENGINE: list[Message] = [
    Welcome(
        protocol_version=PROTOCOL_VERSION,
        engine_pid=1234,
        backend="synthetic",
        shm_name="ivr-engine-1234-abcd",
        shm_directory="/dev/shm",
        slots=512,
        out_ring_bytes=128 * 1024,
        in_ring_bytes=32 * 1024,
        native_sample_rate=22050,
        max_text_chars=5000,
        voices=(
            VoiceInfo(id="en-us", language="en-US", name="English (US)", backend="espeak"),
            VoiceInfo(id="zh", language="zh-CN", name="Mandarin", backend="espeak", gender="male"),
        ),
    ),
    Welcome(
        protocol_version=PROTOCOL_VERSION,
        engine_pid=1,
        backend="x",
        shm_name="n",
        shm_directory="/tmp",
        slots=1,
        out_ring_bytes=4096,
        in_ring_bytes=4096,
        native_sample_rate=16000,
        max_text_chars=1,
        voices=(),
    ),
    Pong(seq=42, active_streams=3, queued_utterances=7, rss_bytes=123_456_789),
    Pong(
        seq=43,
        active_streams=0,
        queued_utterances=0,
        rss_bytes=1,
        speech_cache=SpeechCacheStats(
            enabled=True,
            levels=(
                CacheLevelStats(level="memory", store="memory", hits={"piper": 3}, entries=2),
                CacheLevelStats(level="shared", store="redis", misses={"kokoro": 1}, errors=1),
            ),
        ),
    ),
    StreamOpened(stream_id=1, slot=511),
    StreamRejected(stream_id=1, code="overloaded", message="all 512 engine slots are in use"),
    UtteranceAudio(stream_id=1, utterance=1, start_pos=0),
    UtteranceAudio(stream_id=1, utterance=2, start_pos=64, cache="hit"),
    UtteranceWords(
        stream_id=1,
        utterance=1,
        words=(WordTime("twelve", 0, 310), WordTime("dollars", 310, 820)),
        source="engine",
    ),
    UtteranceEnd(stream_id=1, utterance=1, start_pos=0, end_pos=2**40, samples=2**39),
    UtteranceEnd(stream_id=1, utterance=2, start_pos=10, end_pos=10, samples=0),
    UtteranceFailed(stream_id=1, utterance=1, code="backend_error", message="boom"),
    UtteranceFailed(
        stream_id=1, utterance=1, code="text_too_long", message="m", start_pos=5, end_pos=9
    ),
    Cancelled(stream_id=1, write_pos=2**63 - 1),
    StreamClosed(stream_id=1),
    StreamClosed(stream_id=1, slot=0),
    SpeechStarted(stream_id=1, audio_ms=320),
    VoicePrepared(request_id=7, features=b'{"v":1}', backend="espeak", version="x", seconds=0.1),
    VoicePrepareFailed(request_id=7, code="invalid_audio", message="too short"),
    PromptState(request_id=3, segments=(SegmentState("Welcome.", ("memory", "shared")),)),
    PromptState(request_id=4, code="unknown_voice", message="no voice 'x'"),
    TenantPurged(request_id=5, entries=12),
    TenantPurged(request_id=6, code="speech_cache_off", message="off"),
    ProtocolError(message="Hello expected first"),
]


def _ids(messages: list[Message]) -> list[str]:
    return [f"{i}-{type(m).__name__}" for i, m in enumerate(messages)]


def test_every_message_type_is_covered():
    covered = {type(m) for m in TO_ENGINE + FROM_ENGINE}
    assert covered == set(Message.__subclasses__())


@pytest.mark.parametrize("message", TO_ENGINE, ids=_ids(TO_ENGINE))
def test_round_trip_to_engine(message):
    assert FrameDecoder("to_engine").feed(encode(message)) == [message]


@pytest.mark.parametrize("message", FROM_ENGINE, ids=_ids(FROM_ENGINE))
def test_round_trip_from_engine(message):
    decoded = FrameDecoder("from_engine").feed(encode(message))
    assert decoded == [message]
    assert type(decoded[0]) is type(message)


@pytest.mark.parametrize(
    ("direction", "messages"), [("to_engine", TO_ENGINE), ("from_engine", FROM_ENGINE)]
)
def test_decoding_byte_by_byte(direction, messages):
    decoder = FrameDecoder(direction)
    data = b"".join(encode(m) for m in messages)
    out: list[Message] = []
    for i in range(len(data)):
        got = decoder.feed(data[i : i + 1])
        # A message comes out exactly when the last byte of its frame arrives.
        assert len(got) <= 1
        out += got
    assert out == messages


@pytest.mark.parametrize("split", range(0, 40))
def test_decoding_split_at_every_boundary(split):
    frame = encode(Speak(stream_id=7, utterance=3, text="split me"))
    assert len(frame) > 40
    decoder = FrameDecoder("to_engine")
    first = decoder.feed(frame[:split])
    second = decoder.feed(frame[split:])
    assert first == []
    assert second == [Speak(stream_id=7, utterance=3, text="split me")]


def test_several_frames_in_one_feed():
    data = b"".join(encode(m) for m in TO_ENGINE)
    assert FrameDecoder("to_engine").feed(data) == TO_ENGINE


def test_several_frames_and_a_partial_one():
    decoder = FrameDecoder("to_engine")
    tail = encode(Ping(seq=3))
    assert decoder.feed(encode(Ping(seq=1)) + encode(Ping(seq=2)) + tail[:5]) == [
        Ping(seq=1),
        Ping(seq=2),
    ]
    assert decoder.feed(b"") == []
    assert decoder.feed(tail[5:]) == [Ping(seq=3)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=50))
def test_arbitrary_chunking(chunk_sizes):
    data = b"".join(encode(m) for m in FROM_ENGINE)
    decoder = FrameDecoder("from_engine")
    out: list[Message] = []
    pos = 0
    sizes = iter(chunk_sizes * (len(data) // sum(chunk_sizes) + 1))
    while pos < len(data):
        n = next(sizes)
        out += decoder.feed(data[pos : pos + n])
        pos += n
    assert out == FROM_ENGINE


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**63 - 1),
    st.text(),
    st.booleans(),
)
def test_speak_round_trip_property(stream_id, utterance, text, final):
    message = Speak(stream_id=stream_id, utterance=utterance, text=text, final=final)
    assert FrameDecoder("to_engine").feed(encode(message)) == [message]


def test_exact_bytes_of_ping():
    frame = encode(Ping(seq=7))
    body = b"\x82\xa4type\xa4Ping\xa3seq\x07"  # msgpack map {"type": "Ping", "seq": 7}
    assert frame == struct.pack(">I", len(body)) + body
    assert frame == bytes.fromhex("00000010") + body
    assert msgspec.msgpack.decode(frame[4:]) == {"type": "Ping", "seq": 7}


def test_exact_bytes_of_stream_closed_with_default_slot():
    frame = encode(StreamClosed(stream_id=3))
    body = b"\x83\xa4type\xacStreamClosed\xa9stream_id\x03\xa4slot\xc0"
    assert frame == b"\x00\x00\x00\x24" + body


def test_length_prefix_is_big_endian():
    message = Speak(stream_id=1, utterance=1, text="x" * 300)
    frame = encode(message)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert len(frame) - 4 > 255  # more than one significant prefix byte


def test_tag_is_the_class_name():
    for message in TO_ENGINE + FROM_ENGINE:
        body = msgspec.msgpack.decode(encode(message)[4:])
        assert body["type"] == type(message).__name__


def test_oversized_length_prefix_raises():
    decoder = FrameDecoder("to_engine")
    with pytest.raises(FramingError, match="exceeds"):
        decoder.feed(struct.pack(">I", MAX_FRAME_BYTES + 1))


def test_oversized_length_prefix_raises_before_the_body_arrives():
    decoder = FrameDecoder("from_engine")
    with pytest.raises(FramingError):
        decoder.feed(b"\xff\xff\xff\xff")


def test_maximum_length_prefix_waits_for_the_body():
    decoder = FrameDecoder("to_engine")
    assert decoder.feed(struct.pack(">I", MAX_FRAME_BYTES) + b"\x00" * 100) == []


def test_encode_refuses_oversized_message():
    with pytest.raises(ValueError, match="exceeds"):
        encode(Speak(stream_id=1, utterance=1, text="x" * (MAX_FRAME_BYTES + 1)))


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1\xc1\xc1",  # never-used msgpack opcode
        b"",  # empty frame
        b"\x81\xa1",  # truncated map
        b"\x07",  # an integer, not a map
        b"\x80",  # a map without a tag
        msgspec.msgpack.encode({"type": "Nope", "seq": 1}),  # unknown tag
        msgspec.msgpack.encode({"type": "Ping"}),  # missing field
        msgspec.msgpack.encode({"type": "Ping", "seq": "one"}),  # wrong field type
        b"\x82\xa4type\xa4Ping\xa3seq\x07\x00",  # trailing byte
    ],
)
def test_garbage_body_raises(body):
    decoder = FrameDecoder("to_engine")
    with pytest.raises(FramingError, match="undecodable"):
        decoder.feed(struct.pack(">I", len(body)) + body)


@pytest.mark.parametrize("message", TO_ENGINE, ids=_ids(TO_ENGINE))
def test_to_engine_message_rejected_by_from_engine_decoder(message):
    with pytest.raises(FramingError):
        FrameDecoder("from_engine").feed(encode(message))


@pytest.mark.parametrize("message", FROM_ENGINE, ids=_ids(FROM_ENGINE))
def test_from_engine_message_rejected_by_to_engine_decoder(message):
    with pytest.raises(FramingError):
        FrameDecoder("to_engine").feed(encode(message))


def test_framing_error_is_a_value_error():
    assert issubclass(FramingError, ValueError)


def test_unknown_direction():
    with pytest.raises(ValueError, match="direction"):
        FrameDecoder("sideways")


def test_defaults_are_filled_in():
    body = msgspec.msgpack.encode(
        {"type": "OpenStream", "stream_id": 1, "voice": "en-us", "sample_rate": 8000}
    )
    (message,) = FrameDecoder("to_engine").feed(struct.pack(">I", len(body)) + body)
    assert message == OpenStream(stream_id=1, voice="en-us", sample_rate=8000)
    assert isinstance(message, OpenStream)
    assert message.speed == 1.0
    assert message.language is None
    assert message.voice_profile is None
