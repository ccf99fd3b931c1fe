"""What the vendor cores share (telephony/core.py)."""

from __future__ import annotations

import enum

import pytest

from telephony.core import CoreError, JsonFields
from telephony.jambonz import JambonzError, JambonzErrorCode, JambonzProtocolError
from telephony.twilio import TwilioError, TwilioErrorCode, TwilioProtocolError


class Code(enum.StrEnum):
    MISSING = "missing_field"
    INVALID = "invalid_field"


class Failed(CoreError[Code]):
    pass


FIELDS = JsonFields(Failed, Code.MISSING, Code.INVALID)


def test_a_core_error_carries_its_code_and_message() -> None:
    error = Failed(Code.INVALID, "media.payload must be a string")
    assert (error.code, error.message) == (Code.INVALID, "media.payload must be a string")
    assert str(error) == "invalid_field: media.payload must be a string"
    assert issubclass(TwilioProtocolError, TwilioError) and issubclass(TwilioError, CoreError)
    assert issubclass(JambonzProtocolError, JambonzError) and issubclass(JambonzError, CoreError)


@pytest.mark.parametrize(
    ("read", "obj", "code", "message"),
    [
        (FIELDS.get, {}, Code.MISSING, "m.x is missing"),
        (FIELDS.string, {"x": 1}, Code.INVALID, "m.x must be a string"),
        (FIELDS.object, {"x": []}, Code.INVALID, "m.x must be an object"),
        (FIELDS.integer, {"x": True}, Code.INVALID, "m.x must be an integer"),
        (FIELDS.integer, {"x": "1"}, Code.INVALID, "m.x must be an integer"),
    ],
)
def test_field_readers_refuse_with_the_cores_codes(read, obj, code, message) -> None:
    with pytest.raises(Failed) as caught:
        read(obj, "x", "m.x")
    assert (caught.value.code, caught.value.message) == (code, message)


def test_field_readers_return_what_is_there() -> None:
    obj = {"s": "a", "o": {"k": 1}, "i": 3}
    assert FIELDS.string(obj, "s", "s") == "a"
    assert FIELDS.object(obj, "o", "o") == {"k": 1}
    assert FIELDS.integer(obj, "i", "i") == 3


def test_the_cores_readers_raise_their_own_protocol_errors() -> None:
    from telephony import jambonz, twilio

    with pytest.raises(TwilioProtocolError) as twilio_error:
        twilio._str({}, "event", "event")
    assert twilio_error.value.code is TwilioErrorCode.MISSING_FIELD
    with pytest.raises(JambonzProtocolError) as jambonz_error:
        jambonz._object({"metadata": 1}, "metadata", "metadata")
    assert jambonz_error.value.code is JambonzErrorCode.INVALID_FIELD
