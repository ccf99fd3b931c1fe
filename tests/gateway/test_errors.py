"""The error codes: one enum, every member documented, the typed codes of auth, reference
audio and the engine all inside it."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from gateway.auth import AuthErrorCode
from gateway.errors import ErrorCode, vendor_code
from gateway.voices.reference_audio import RejectionCode

DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_every_code_is_documented() -> None:
    documented = set(re.findall(r"`([a-z][a-z_]+)`", DOCS.read_text()))
    missing = sorted(code.value for code in ErrorCode if code.value not in documented)
    assert missing == []


def test_auth_and_reference_audio_codes_are_error_codes() -> None:
    for literal in (AuthErrorCode, RejectionCode):
        for value in typing.get_args(literal):
            assert ErrorCode(value).value == value


def test_unknown_engine_codes_map_to_engine_error() -> None:
    assert ErrorCode.from_engine("text_too_long") is ErrorCode.TEXT_TOO_LONG
    assert ErrorCode.from_engine("something_new") is ErrorCode.ENGINE_ERROR


def test_vendor_codes_name_their_protocol() -> None:
    assert vendor_code("twilio", "invalid_json") == "twilio_invalid_json"
