"""The OpenAI speech endpoint's request parsing and input splitting (the HTTP side is
tested against a real gateway with the ``openai`` package, tests/integration)."""

from __future__ import annotations

import json

import pytest

from gateway.speech_api import MAX_INPUT_CHARS, _BadRequest, parse_request, split_input


def body(**fields: object) -> bytes:
    return json.dumps({"model": "tts-1", "voice": "alloy", "input": "Hello.", **fields}).encode()


def test_a_request_names_its_format_and_voice() -> None:
    request, fmt, voice = parse_request(body(response_format="wav", speed=1.5))
    assert (fmt.name, fmt.content_type, voice, request.speed) == ("wav", "audio/wav", "alloy", 1.5)
    _request, fmt, _voice = parse_request(body())
    assert fmt.name == "mp3"  # OpenAI's default
    _request, _fmt, voice = parse_request(body(voice={"id": "en-us-joe"}))
    assert voice == "en-us-joe"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"not json", None),
        (b"[]", None),
        (json.dumps({"voice": "alloy", "input": "x"}).encode(), None),  # no model
        (body(input="   "), "input"),
        (body(input="x" * (MAX_INPUT_CHARS + 1)), "input"),
        (body(speed=0.1), "speed"),
        (body(response_format="flac"), "response_format"),
        (body(instructions="whisper"), "instructions"),
        (body(stream_format="sse"), "stream_format"),
        (body(voice={"name": "x"}), "voice"),
        (body(voice=""), "voice"),
        (body(model=""), "model"),
    ],
)
def test_bad_requests_name_the_field(raw: bytes, param: str | None) -> None:
    with pytest.raises(_BadRequest) as caught:
        parse_request(raw)
    assert caught.value.param == param


def test_input_is_split_after_sentences_within_the_limit() -> None:
    text = "One two three. Four five six! Seven eight nine? Ten."
    assert split_input(text, 30) == ["One two three. Four five six!", "Seven eight nine? Ten."]
    assert split_input(text, 1000) == [text]
    words = "word " * 50
    pieces = split_input(words, 42)
    assert all(len(p) <= 42 for p in pieces)
    assert " ".join(pieces).split() == words.split()
    assert split_input("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]
    assert split_input("  ", 10) == []
