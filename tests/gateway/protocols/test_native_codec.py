"""Tests for the native protocol's sans-I/O codec: client messages, events, start options."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import CloseCode, ErrorCode, ProtocolViolation, SessionError
from gateway.events import (
    BargeIn,
    Cleared,
    ErrorEvent,
    Flushed,
    MarkReached,
    Played,
    Ready,
    SessionEvent,
    UtteranceDone,
    UtteranceStarted,
    Word,
    Words,
)
from gateway.formats import FORMATS
from gateway.protocols.native_codec import (
    CancelMsg,
    ClearMsg,
    CloseMsg,
    FlushMsg,
    KeepaliveMsg,
    MarkMsg,
    SpeakMsg,
    StartMsg,
    decode_client_message,
    encode_event,
    start_options,
)


def decode(obj: Any) -> object:
    return decode_client_message(json.dumps(obj))


def violation(data: str | bytes) -> ProtocolViolation:
    with pytest.raises(ProtocolViolation) as info:
        decode_client_message(data)
    return info.value


# ---------------------------------------------------------------- client messages


def test_start_with_all_fields():
    msg = decode(
        {
            "type": "start",
            "voice": "en-us",
            "format": "mulaw_8000",
            "language": "en",
            "speed": 1.5,
            "pacing": "burst",
            "input_format": "pcm_16000",
            "barge_in": True,
        }
    )
    assert msg == StartMsg(
        voice="en-us",
        format="mulaw_8000",
        language="en",
        speed=1.5,
        pacing="burst",
        input_format="pcm_16000",
        barge_in=True,
    )


def test_start_defaults():
    msg = decode({"type": "start", "voice": "v"})
    assert isinstance(msg, StartMsg)
    assert msg.format is None
    assert msg.language is None
    assert msg.speed == 1.0
    assert msg.pacing == "realtime"
    assert msg.input_format is None
    assert msg.barge_in is None


def test_speak_with_all_fields_and_defaults():
    assert decode(
        {"type": "speak", "text": "Hello.", "utterance_id": "greeting", "flush": False}
    ) == SpeakMsg(text="Hello.", utterance_id="greeting", flush=False)
    msg = decode({"type": "speak", "text": "Hi"})
    assert isinstance(msg, SpeakMsg)
    assert (msg.text, msg.utterance_id, msg.flush) == ("Hi", None, True)


def test_flush_clear_mark_close():
    assert decode({"type": "flush", "utterance_id": "u1"}) == FlushMsg(utterance_id="u1")
    assert decode({"type": "flush"}) == FlushMsg(utterance_id=None)
    assert decode({"type": "clear"}) == ClearMsg()
    assert decode({"type": "mark", "name": "after-menu"}) == MarkMsg(name="after-menu")
    assert decode({"type": "close"}) == CloseMsg()


def test_cancel_keepalive_and_a_flush_id():
    assert decode({"type": "cancel", "utterance_id": "u7"}) == CancelMsg(utterance_id="u7")
    assert decode({"type": "keepalive"}) == KeepaliveMsg()
    assert decode({"type": "flush", "flush_id": "f1"}) == FlushMsg(flush_id="f1")


def test_bytes_input_is_accepted():
    assert decode_client_message(b'{"type":"clear"}') == ClearMsg()


def test_unknown_extra_fields_are_ignored():
    msg = decode({"type": "speak", "text": "x", "future_field": {"a": [1, 2]}, "n": 3})
    assert msg == SpeakMsg(text="x")
    assert decode({"type": "clear", "reason": "caller spoke"}) == ClearMsg()


def test_boundary_values_are_accepted():
    assert isinstance(decode({"type": "start", "voice": "v", "speed": 0.25}), StartMsg)
    assert isinstance(decode({"type": "start", "voice": "v", "speed": 4}), StartMsg)
    assert decode({"type": "mark", "name": "m" * 256}) == MarkMsg(name="m" * 256)


@pytest.mark.parametrize(
    "data",
    ["", "{", "not json", "{'type': 'clear'}", b"\xff\xfe", '{"type": "clear"} trailing'],
)
def test_invalid_json(data: str | bytes):
    exc = violation(data)
    assert exc.code == "invalid_json"


@pytest.mark.parametrize("data", ['[{"type": "clear"}]', "[]", '"clear"', "42", "null"])
def test_json_that_is_not_an_object(data: str):
    assert violation(data).code == "invalid_json"


@pytest.mark.parametrize(
    "obj",
    [{}, {"text": "hi"}, {"type": "dance"}, {"type": 5}, {"type": None}, {"type": "START"}],
)
def test_missing_or_unknown_type(obj: dict[str, Any]):
    assert violation(json.dumps(obj)).code == "unknown_type"


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "speak", "text": 5},
        {"type": "speak"},
        {"type": "speak", "text": "x", "flush": "yes"},
        {"type": "speak", "text": "x", "utterance_id": ""},
        {"type": "speak", "text": "x", "utterance_id": "u" * 257},
        {"type": "start"},
        {"type": "start", "voice": "v", "speed": 0.2},
        {"type": "start", "voice": "v", "speed": 4.01},
        {"type": "start", "voice": "v", "speed": "fast"},
        {"type": "start", "voice": "v", "pacing": "fast"},
        {"type": "start", "voice": 1},
        {"type": "mark", "name": ""},
        {"type": "mark", "name": "m" * 257},
        {"type": "mark"},
        {"type": "flush", "utterance_id": ""},
        {"type": "flush", "flush_id": ""},
        {"type": "flush", "flush_id": "f" * 257},
        {"type": "flush", "flush_id": 3},
        {"type": "start", "voice": "v", "max_buffer_delay_ms": 5001},
        {"type": "start", "voice": "v", "max_buffer_delay_ms": -1},
        {"type": "start", "voice": "v", "timestamps": "phoneme"},
        {"type": "cancel"},
        {"type": "cancel", "utterance_id": ""},
        {"type": "cancel", "utterance_id": 12},
        {"type": "start", "voice": "v", "instruct": "x" * 201},
        {"type": "start", "voice": "v", "instruct": 3},
        {"type": "speak", "text": "x", "instruct": "x" * 201},
    ],
)
def test_invalid_message(obj: dict[str, Any]):
    exc = violation(json.dumps(obj))
    assert exc.code == "invalid_message"
    assert exc.close_code is None  # the session decides; the codec only classifies


def test_violations_are_session_errors():
    exc = violation("nope")
    assert isinstance(exc, SessionError)
    assert exc.message


# ------------------------------------------------------------------------ events


def wire(event: SessionEvent) -> dict[str, Any]:
    text = encode_event(event)
    assert isinstance(text, str)
    decoded: dict[str, Any] = json.loads(text)
    # Compact: no whitespace between tokens, keys in the documented order.
    assert text == json.dumps(decoded, separators=(",", ":"), ensure_ascii=False)
    return decoded


def test_encode_ready():
    assert wire(Ready("s123", "mulaw_8000", 8000, 20)) == {
        "type": "ready",
        "session_id": "s123",
        "format": "mulaw_8000",
        "sample_rate": 8000,
        "frame_ms": 20,
    }


def test_encode_utterance_started():
    assert wire(UtteranceStarted("u1")) == {"type": "utterance_started", "utterance_id": "u1"}


def test_encode_utterance_done():
    assert wire(UtteranceDone("u1", 1234, 87)) == {
        "type": "utterance_done",
        "utterance_id": "u1",
        "audio_ms": 1234,
        "first_audio_ms": 87,
    }
    assert wire(UtteranceDone("u2", 0, None)) == {
        "type": "utterance_done",
        "utterance_id": "u2",
        "audio_ms": 0,
        "first_audio_ms": None,
    }


def test_encode_a_cancelled_utterance_and_flushed():
    assert wire(UtteranceDone("u3", 420, 90, cancelled=True)) == {
        "type": "utterance_done",
        "utterance_id": "u3",
        "audio_ms": 420,
        "first_audio_ms": 90,
        "cancelled": True,
    }
    assert wire(Flushed("f1")) == {"type": "flushed", "flush_id": "f1"}
    assert encode_event(Flushed(None)) == '{"type":"flushed","flush_id":null}'


def test_encode_mark():
    assert wire(MarkReached("m1")) == {"type": "mark", "name": "m1", "cleared": False}
    assert wire(MarkReached("m2", cleared=True)) == {"type": "mark", "name": "m2", "cleared": True}


def test_encode_cleared_and_barge_in():
    assert wire(Cleared()) == {"type": "cleared"}
    assert wire(BargeIn()) == {"type": "barge_in"}


def test_encode_error():
    assert wire(ErrorEvent(ErrorCode.QUEUE_FULL, "too many queued utterances")) == {
        "type": "error",
        "code": "queue_full",
        "message": "too many queued utterances",
    }
    assert wire(ErrorEvent(ErrorCode.ENGINE_ERROR, "synthesis failed", "u7")) == {
        "type": "error",
        "code": "engine_error",
        "message": "synthesis failed",
        "utterance_id": "u7",
    }


def test_encode_exact_text_and_non_ascii():
    assert encode_event(Cleared()) == '{"type":"cleared"}'
    assert json.loads(encode_event(MarkReached("caf\u00e9 \u2603")))["name"] == "caf\u00e9 \u2603"


# ------------------------------------------------------------------ start options


def start(**fields: Any) -> StartMsg:
    msg = decode({"type": "start", "voice": "en-us", **fields})
    assert isinstance(msg, StartMsg)
    return msg


def test_start_options_all_fields():
    opts = start_options(
        start(
            format="mulaw_8000",
            language="en",
            speed=0.5,
            pacing="burst",
            input_format="alaw_8000",
            barge_in=True,
        ),
    )
    assert opts.voice == "en-us"
    assert opts.format is FORMATS["mulaw_8000"]
    assert opts.language == "en"
    assert opts.speed == 0.5
    assert opts.pacing == "burst"
    assert opts.input_format is FORMATS["alaw_8000"]
    assert opts.barge_in is True


def test_start_options_defaults():
    opts = start_options(start(format="pcm_16000"))
    assert opts.format is FORMATS["pcm_16000"]
    assert (opts.language, opts.speed, opts.pacing) == (None, 1.0, "realtime")
    assert opts.input_format is None
    assert opts.barge_in is False


def test_start_options_unknown_format():
    with pytest.raises(SessionError) as info:
        start_options(start(format="mp3_44100"))
    assert info.value.code == "unsupported_format"
    assert info.value.close_code == 1008
    assert info.value.close_code == CloseCode.POLICY


def test_start_options_leaves_the_voice_to_the_registry_lookup():
    # Voices are resolved (built-in or registered, per tenant) by GatewayState.resolve_voice
    # after start_options; tests/integration covers unknown_voice end to end.
    opts = start_options(start(voice="anything", format="pcm_16000"))
    assert opts.voice == "anything" and opts.voice_profile is None


@pytest.mark.parametrize("input_format", ["opus_48000", "opus_16000", "wav", "mulaw"])
def test_start_options_rejects_input_format(input_format: str):
    with pytest.raises(SessionError) as info:
        start_options(start(format="pcm_16000", input_format=input_format))
    assert info.value.code == "unsupported_format"
    assert info.value.close_code == CloseCode.POLICY


def test_start_options_accepts_every_non_opus_input_format():
    for name in ("mulaw_8000", "alaw_8000", "pcm_8000", "pcm_16000", "pcm_24000", "pcm_48000"):
        opts = start_options(start(format="mulaw_8000", input_format=name))
        assert opts.input_format is FORMATS[name]


def test_start_options_format_is_required():
    with pytest.raises(ProtocolViolation) as info:
        start_options(start())
    assert info.value.code == "invalid_message"
    assert info.value.close_code == CloseCode.POLICY


# ---------------------------------------------------------------- fuzz

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)
_messages = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    _json.map(json.dumps),
    st.dictionaries(
        st.sampled_from(
            [
                "type",
                "text",
                "voice",
                "format",
                "utterance_id",
                "name",
                "call",
                "speed",
                "flush",
                "pacing",
                "barge_in",
                "input_format",
            ]
        ),
        _json | st.sampled_from(["start", "speak", "flush", "clear", "mark", "close"]),
    ).map(json.dumps),
    st.integers(1, 100_000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 100_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(data=_messages)
def test_decoding_raises_only_protocol_violations(data: str | bytes):
    """Whatever a peer sends, the codec returns a message or a ProtocolViolation with a
    documented code: never another exception (RecursionError, UnicodeError, ...)."""
    try:
        message = decode_client_message(data)
    except ProtocolViolation as exc:
        assert exc.code in ("invalid_json", "unknown_type", "invalid_message")
        assert exc.message and len(exc.message) < 2000
    else:
        assert type(message).__name__.endswith("Msg")


def test_encode_words_and_what_was_played():
    assert wire(Words("u1", (Word("twelve", 0, 310), Word("dollars", 310, 820)))) == {
        "type": "words",
        "utterance_id": "u1",
        "words": [
            {"text": "twelve", "start_ms": 0, "end_ms": 310},
            {"text": "dollars", "start_ms": 310, "end_ms": 820},
        ],
    }
    played = Played("u1", 400, "twelve dollars")
    assert wire(BargeIn(played)) == {
        "type": "barge_in",
        "utterance_id": "u1",
        "played_ms": 400,
        "played_text": "twelve dollars",
    }
    assert wire(Cleared(Played("u2", 0, None))) == {
        "type": "cleared",
        "utterance_id": "u2",
        "played_ms": 0,
    }
    assert wire(UtteranceDone("u1", 820, 40, played=Played("u1", 820, "twelve dollars"))) == {
        "type": "utterance_done",
        "utterance_id": "u1",
        "audio_ms": 820,
        "first_audio_ms": 40,
        "played_ms": 820,
        "played_text": "twelve dollars",
    }
    assert decode({"type": "start", "voice": "v", "format": "pcm_16000", "timestamps": "word"})
    assert start_options(StartMsg(voice="v", format="pcm_16000", timestamps="word")).word_timestamps
