"""Twilio Media Streams core, byte for byte, without an event loop.

Fixtures are the examples of Twilio's "Media Streams - WebSocket Messages" page,
https://www.twilio.com/docs/voice/media-streams/websocket-messages, copied with their
layout (only trailing spaces removed). The page abbreviates media payloads
("no+JhoaJjpzS..."); where a test needs a decodable payload it drops the "..." and says so.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from telephony.limits import MAX_CALL_ID_CHARS
from telephony.twilio import (
    MULAW_FRAME_BYTES,
    TRANSITIONS,
    TwilioConnected,
    TwilioConnection,
    TwilioDtmf,
    TwilioError,
    TwilioErrorCode,
    TwilioMark,
    TwilioMedia,
    TwilioMediaFormat,
    TwilioProtocolError,
    TwilioStart,
    TwilioState,
    TwilioStop,
    TwilioUsageError,
    build_clear,
    build_mark,
    build_media,
)

SID = "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
ACCOUNT = "ACXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
CALL = "CAXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"

# --- "WebSocket messages from Twilio" -------------------------------------------------

# "Connected message"
DOC_CONNECTED = """{
 "event": "connected",
 "protocol": "Call",
 "version": "1.0.0"
}"""

# "Start message"
DOC_START = """{
  "event": "start",
  "sequenceNumber": "1",
  "start": {
    "accountSid": "ACXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
    "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
    "callSid": "CAXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
    "tracks": [ "inbound" ],
    "mediaFormat": {
        "encoding": "audio/x-mulaw",
        "sampleRate": 8000,
        "channels": 1 },
    "customParameters": {
     "FirstName": "Jane",
     "LastName": "Doe",
     "RemoteParty": "Bob"
   }
  },
  "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
}"""

# "Media message", the outbound example (payload abbreviated on the page)
DOC_MEDIA_OUTBOUND = """{
 "event": "media",
 "sequenceNumber": "3",
 "media": {
   "track": "outbound",
   "chunk": "1",
   "timestamp": "5",
   "payload": "no+JhoaJjpz..."
 } ,
 "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
}"""

# "Media message", the inbound example (payload abbreviated on the page)
DOC_MEDIA_INBOUND = """
{
 "event": "media",
 "sequenceNumber": "4",
 "media": {
   "track": "inbound",
   "chunk": "2",
   "timestamp": "5",
   "payload": "no+JhoaJjpzS..."
 },
"streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
}"""

# "Stop message"
DOC_STOP = """{
 "event": "stop",
 "sequenceNumber": "5",
 "stop": {
    "accountSid": "ACXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
    "callSid": "CAXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
  },
  "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
}"""

# "DTMF message"
DOC_DTMF = """
{
  "event": "dtmf",
  "streamSid":"MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
  "sequenceNumber":"5",
  "dtmf": {
      "track":"inbound_track",
      "digit": "1"
  }
}"""

# "Mark message"
DOC_MARK = """{
 "event": "mark",
 "sequenceNumber": "4",
 "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
 "mark": {
   "name": "my label"
 }
}"""

# --- "Send WebSocket messages to Twilio" ----------------------------------------------

# "Send a media message" (payload abbreviated on the page)
DOC_SEND_MEDIA = """{
  "event": "media",
  "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
  "media": {
    "payload": "a3242sa..."
  }
}"""

# "Send a mark message"
DOC_SEND_MARK = """{
 "event": "mark",
 "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
 "mark": {
   "name": "my label"
 }
}"""

# "Send a clear message"
DOC_SEND_CLEAR = """{
 "event": "clear",
 "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
}"""


def unabbreviate(doc: str) -> str:
    """The page's payloads end in "..."; without it "no+JhoaJjpzS" is valid base64."""
    return doc.replace("...", "")


def streaming() -> TwilioConnection:
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    conn.receive_text(DOC_START)
    return conn


def msg(**fields: Any) -> str:
    return json.dumps(fields)


def media_msg(payload: bytes = b"\xff" * 160, sid: str = SID, seq: str = "2") -> str:
    return msg(
        event="media",
        sequenceNumber=seq,
        media={
            "track": "inbound",
            "chunk": "1",
            "timestamp": "0",
            "payload": base64.b64encode(payload).decode(),
        },
        streamSid=sid,
    )


def mark_msg(name: str, seq: str = "9") -> str:
    return msg(event="mark", sequenceNumber=seq, streamSid=SID, mark={"name": name})


def start_with(**start_changes: Any) -> str:
    doc = json.loads(DOC_START)
    doc["start"].update(start_changes)
    return json.dumps(doc)


def expect_protocol_error(conn: TwilioConnection, text: str, code: TwilioErrorCode) -> None:
    with pytest.raises(TwilioProtocolError) as info:
        conn.receive_text(text)
    assert info.value.code is code
    assert conn.state is TwilioState.FAILED


# --------------------------------------------------------------------------- inbound


def test_connected_documented_example() -> None:
    conn = TwilioConnection()
    assert conn.receive_text(DOC_CONNECTED) == [TwilioConnected(protocol="Call", version="1.0.0")]
    assert conn.state is TwilioState.AWAITING_START


def test_start_documented_example() -> None:
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    [event] = conn.receive_text(DOC_START)
    assert event == TwilioStart(
        sequence_number=1,
        stream_sid=SID,
        account_sid=ACCOUNT,
        call_sid=CALL,
        tracks=("inbound",),
        media_format=TwilioMediaFormat("audio/x-mulaw", 8000, 1),
        custom_parameters={"FirstName": "Jane", "LastName": "Doe", "RemoteParty": "Bob"},
    )
    assert isinstance(event, TwilioStart)
    assert event.token is None
    assert conn.state is TwilioState.STREAMING
    assert conn.start is event
    assert conn.stream_sid == SID


def test_start_exposes_token_parameter_but_never_reprs_it() -> None:
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    [event] = conn.receive_text(start_with(customParameters={"token": "eyJ.secret.jwt"}))
    assert isinstance(event, TwilioStart)
    assert event.token == "eyJ.secret.jwt"
    assert event.custom_parameters == {"token": "eyJ.secret.jwt"}
    assert "secret" not in repr(event)


def test_start_without_custom_parameters_is_accepted() -> None:
    doc = json.loads(DOC_START)
    del doc["start"]["customParameters"]
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    [event] = conn.receive_text(json.dumps(doc))
    assert isinstance(event, TwilioStart)
    assert event.custom_parameters == {}


@pytest.mark.parametrize(
    ("doc", "seq", "track", "chunk", "printed", "payload_b64"),
    [
        # "no+JhoaJjpz" is 11 characters: one "=" makes it decodable
        (DOC_MEDIA_OUTBOUND, 3, "outbound", 1, "no+JhoaJjpz...", "no+JhoaJjpz="),
        (DOC_MEDIA_INBOUND, 4, "inbound", 2, "no+JhoaJjpzS...", "no+JhoaJjpzS"),
    ],
)
def test_media_documented_examples(
    doc: str, seq: int, track: str, chunk: int, printed: str, payload_b64: str
) -> None:
    conn = streaming()
    [event] = conn.receive_text(doc.replace(printed, payload_b64))
    assert event == TwilioMedia(
        sequence_number=seq,
        stream_sid=SID,
        track=track,
        chunk=chunk,
        timestamp=5,
        payload=base64.b64decode(payload_b64),
    )
    assert isinstance(event, TwilioMedia)
    assert "payload=" not in repr(event)
    assert conn.state is TwilioState.STREAMING


def test_media_documented_example_as_printed_is_not_base64() -> None:
    # The page's "no+JhoaJjpzS..." is an abbreviation, not base64: rejected, not guessed.
    expect_protocol_error(streaming(), DOC_MEDIA_INBOUND, TwilioErrorCode.INVALID_BASE64)


def test_media_payload_is_decoded_mulaw() -> None:
    audio = bytes(range(256))
    [event] = streaming().receive_text(media_msg(audio))
    assert isinstance(event, TwilioMedia)
    assert event.payload == audio


def test_dtmf_documented_example() -> None:
    assert streaming().receive_text(DOC_DTMF) == [
        TwilioDtmf(sequence_number=5, stream_sid=SID, track="inbound_track", digit="1")
    ]


def dtmf_with_digit(digit: Any) -> str:
    """The page's "DTMF message", byte for byte, but for its ``digit``."""
    head, documented, tail = DOC_DTMF.partition('"digit": "1"')
    assert documented
    return f'{head}"digit": {json.dumps(digit)}{tail}'


@pytest.mark.parametrize("digit", list("0123456789*#ABCD"))
def test_dtmf_every_number_pad_digit_is_accepted(digit: str) -> None:
    # DTMF's 16 tones, RFC 4733 telephone-events 0-15
    assert streaming().receive_text(dtmf_with_digit(digit)) == [
        TwilioDtmf(sequence_number=5, stream_sid=SID, track="inbound_track", digit=digit)
    ]


@pytest.mark.parametrize("digit", ["x", "E", "\x00"])
def test_dtmf_any_single_character_is_passed_on(digit: str) -> None:
    # the gateway's leg decides what it tells an application (telephony.limits.DTMF_DIGITS)
    [event] = streaming().receive_text(dtmf_with_digit(digit))
    assert isinstance(event, TwilioDtmf) and event.digit == digit


@pytest.mark.parametrize(
    "digit",
    [*["", "12", "1 ", 1, None], pytest.param("x" * 10_000, id="x*10000")],
)
def test_dtmf_digit_other_than_one_character_is_invalid_field(digit: Any) -> None:
    conn = streaming()
    with pytest.raises(TwilioProtocolError) as info:
        conn.receive_text(dtmf_with_digit(digit))
    assert info.value.code is TwilioErrorCode.INVALID_FIELD
    assert "dtmf.digit" in info.value.message
    assert conn.state is TwilioState.FAILED


def test_dtmf_invalid_digit_message_quotes_at_most_64_characters() -> None:
    with pytest.raises(TwilioProtocolError) as info:
        streaming().receive_text(dtmf_with_digit("x" * 10_000))
    assert info.value.message == f"dtmf.digit {'x' * 64!r}... is not one character"


def test_mark_documented_example_echoes_a_sent_mark() -> None:
    conn = streaming()
    conn.send_mark("my label")
    assert conn.pending_marks == ("my label",)
    assert conn.receive_text(DOC_MARK) == [
        TwilioMark(sequence_number=4, stream_sid=SID, name="my label", cleared=False)
    ]
    assert not conn.pending_marks


def test_stop_documented_example() -> None:
    conn = streaming()
    conn.send_mark("never echoed")
    assert conn.receive_text(DOC_STOP) == [
        TwilioStop(
            sequence_number=5,
            stream_sid=SID,
            account_sid=ACCOUNT,
            call_sid=CALL,
            unechoed_marks=("never echoed",),
        )
    ]
    assert conn.state is TwilioState.STOPPED
    assert conn.pending_marks == ()


# --------------------------------------------------------------------------- outbound


def test_build_media_matches_documented_shape_and_is_compact() -> None:
    audio = b"\x7f" * MULAW_FRAME_BYTES
    text = build_media(SID, audio)
    expected = json.loads(DOC_SEND_MEDIA)
    expected["media"]["payload"] = base64.b64encode(audio).decode()
    assert json.loads(text) == expected
    assert text == (
        '{"event":"media","streamSid":"MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",'
        f'"media":{{"payload":"{base64.b64encode(audio).decode()}"}}}}'
    )


def test_build_mark_matches_documented_example_exactly() -> None:
    text = build_mark(SID, "my label")
    assert json.loads(text) == json.loads(DOC_SEND_MARK)
    assert text == (
        '{"event":"mark","streamSid":"MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX","mark":{"name":"my label"}}'
    )


def test_build_clear_matches_documented_example_exactly() -> None:
    text = build_clear(SID)
    assert json.loads(text) == json.loads(DOC_SEND_CLEAR)
    assert text == '{"event":"clear","streamSid":"MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"}'


def test_send_media_twenty_milliseconds_is_160_bytes_in_216_base64_chars() -> None:
    conn = streaming()
    frame = bytes(range(MULAW_FRAME_BYTES))
    text = conn.send_media(frame)
    payload = json.loads(text)["media"]["payload"]
    assert MULAW_FRAME_BYTES == 160
    assert len(payload) == 216
    assert base64.b64decode(payload) == frame
    assert text == build_media(SID, frame)


def test_send_mark_and_clear_use_the_stream_sid() -> None:
    conn = streaming()
    assert conn.send_mark("m") == build_mark(SID, "m")
    assert conn.send_clear() == build_clear(SID)


def test_non_ascii_mark_name_round_trips() -> None:
    conn = streaming()
    text = conn.send_mark("问候-1")
    assert json.loads(text)["mark"]["name"] == "问候-1"
    [event] = conn.receive_text(mark_msg("问候-1"))
    assert isinstance(event, TwilioMark)
    assert event.name == "问候-1"


# --------------------------------------------------------------------------- marks


def test_marks_sent_before_clear_echo_as_cleared_and_later_ones_as_played() -> None:
    conn = streaming()
    conn.send_media(b"\xff" * 160)
    conn.send_mark("a")
    conn.send_mark("b")
    conn.send_clear()
    conn.send_media(b"\xff" * 160)
    conn.send_mark("c")
    echoes = [conn.receive_text(mark_msg(name))[0] for name in ("a", "b", "c")]
    assert [(e.name, e.cleared) for e in echoes if isinstance(e, TwilioMark)] == [
        ("a", True),
        ("b", True),
        ("c", False),
    ]
    assert conn.pending_marks == ()


def test_mark_echoed_before_clear_was_played() -> None:
    conn = streaming()
    conn.send_mark("a")
    conn.send_mark("b")
    [played] = conn.receive_text(mark_msg("a"))
    conn.send_clear()
    [dropped] = conn.receive_text(mark_msg("b"))
    assert isinstance(played, TwilioMark) and not played.cleared
    assert isinstance(dropped, TwilioMark) and dropped.cleared


def test_duplicate_mark_names_are_matched_oldest_first() -> None:
    conn = streaming()
    conn.send_mark("same")
    conn.send_clear()
    conn.send_mark("same")
    first = conn.receive_text(mark_msg("same"))[0]
    second = conn.receive_text(mark_msg("same"))[0]
    assert isinstance(first, TwilioMark) and first.cleared
    assert isinstance(second, TwilioMark) and not second.cleared


def test_clear_with_no_marks_outstanding() -> None:
    conn = streaming()
    conn.send_clear()
    conn.send_mark("after")
    [event] = conn.receive_text(mark_msg("after"))
    assert isinstance(event, TwilioMark) and not event.cleared


# --------------------------------------------------------------------------- state machine


def test_transition_table_is_the_documented_order() -> None:
    assert dict(TRANSITIONS) == {
        (TwilioState.AWAITING_CONNECTED, "connected"): TwilioState.AWAITING_START,
        (TwilioState.AWAITING_START, "start"): TwilioState.STREAMING,
        (TwilioState.STREAMING, "media"): TwilioState.STREAMING,
        (TwilioState.STREAMING, "dtmf"): TwilioState.STREAMING,
        (TwilioState.STREAMING, "mark"): TwilioState.STREAMING,
        (TwilioState.STREAMING, "stop"): TwilioState.STOPPED,
    }


def test_full_legal_life() -> None:
    conn = TwilioConnection()
    states = [conn.state]
    for text in (DOC_CONNECTED, DOC_START, media_msg(), DOC_DTMF, "mark", DOC_STOP):
        if text == "mark":
            conn.send_mark("my label")
            text = DOC_MARK
        conn.receive_text(text)
        states.append(conn.state)
    assert states == [
        TwilioState.AWAITING_CONNECTED,
        TwilioState.AWAITING_START,
        TwilioState.STREAMING,
        TwilioState.STREAMING,
        TwilioState.STREAMING,
        TwilioState.STREAMING,
        TwilioState.STOPPED,
    ]


def _in_state(state: TwilioState) -> TwilioConnection:
    conn = TwilioConnection()
    if state is TwilioState.AWAITING_CONNECTED:
        return conn
    conn.receive_text(DOC_CONNECTED)
    if state is TwilioState.AWAITING_START:
        return conn
    conn.receive_text(DOC_START)
    if state is TwilioState.STREAMING:
        return conn
    conn.receive_text(DOC_STOP)
    assert state is TwilioState.STOPPED
    return conn


_VALID_BODIES = {
    "connected": DOC_CONNECTED,
    "start": DOC_START,
    "media": media_msg(),
    "dtmf": DOC_DTMF,
    "mark": mark_msg("x"),
    "stop": DOC_STOP,
}


@pytest.mark.parametrize(
    "state",
    [
        TwilioState.AWAITING_CONNECTED,
        TwilioState.AWAITING_START,
        TwilioState.STREAMING,
        TwilioState.STOPPED,
    ],
)
@pytest.mark.parametrize("event", sorted(_VALID_BODIES))
def test_every_transition_outside_the_table_is_a_protocol_error(
    state: TwilioState, event: str
) -> None:
    if (state, event) in TRANSITIONS:
        return
    conn = _in_state(state)
    before_start = state in (TwilioState.AWAITING_CONNECTED, TwilioState.AWAITING_START)
    code = (
        TwilioErrorCode.MEDIA_BEFORE_START
        if before_start and event in ("media", "dtmf", "mark", "stop")
        else TwilioErrorCode.UNEXPECTED_EVENT
    )
    expect_protocol_error(conn, _VALID_BODIES[event], code)


def test_media_before_start() -> None:
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    expect_protocol_error(conn, media_msg(), TwilioErrorCode.MEDIA_BEFORE_START)


def test_receive_after_failure_is_local_misuse() -> None:
    conn = TwilioConnection()
    expect_protocol_error(conn, "not json", TwilioErrorCode.INVALID_JSON)
    with pytest.raises(TwilioUsageError) as info:
        conn.receive_text(DOC_CONNECTED)
    assert info.value.code is TwilioErrorCode.CONNECTION_FAILED


def test_send_after_failure_is_local_misuse() -> None:
    conn = streaming()
    expect_protocol_error(conn, media_msg(sid="MZother"), TwilioErrorCode.STREAM_SID_MISMATCH)
    with pytest.raises(TwilioUsageError) as info:
        conn.send_media(b"\xff")
    assert info.value.code is TwilioErrorCode.CONNECTION_FAILED


# --------------------------------------------------------------------------- ids

#: Every sid this core reads, as (message, member): "Start message", "Stop message".
ID_FIELDS = [
    ("start", "streamSid"),
    ("start", "accountSid"),
    ("start", "callSid"),
    ("stop", "accountSid"),
    ("stop", "callSid"),
]
ID_ATTRIBUTES = {"streamSid": "stream_sid", "accountSid": "account_sid", "callSid": "call_sid"}


def with_id(where: str, key: str, value: str) -> tuple[TwilioConnection, str]:
    """A connection ready for a ``where`` message, and that message with ``key`` set."""
    if where == "start":
        conn = TwilioConnection()
        conn.receive_text(DOC_CONNECTED)
        doc = json.loads(DOC_START)
        doc["start"][key] = value
        if key == "streamSid":
            doc["streamSid"] = value  # the top-level copy must match
    else:
        conn = streaming()
        doc = json.loads(DOC_STOP)
        doc["stop"][key] = value
    return conn, json.dumps(doc)


@pytest.mark.parametrize(("where", "key"), ID_FIELDS)
@pytest.mark.parametrize(
    "value",
    [
        "C" * 129,  # one over MAX_CALL_ID_CHARS
        "C" * 10_000,
        "CA 1",  # whitespace: space, tab, line and paragraph separators, ideographic space
        "CA\t1",
        "CA\u20281",
        "CA\u30001",
        "CA\x001",  # control and format characters
        "CA\x7f1",
        "CA\x851",
        "CA\u200b1",
    ],
)
def test_ids_too_long_or_not_printable_are_invalid_id(where: str, key: str, value: str) -> None:
    conn, text = with_id(where, key, value)
    with pytest.raises(TwilioProtocolError) as info:
        conn.receive_text(text)
    assert info.value.code is TwilioErrorCode.INVALID_ID
    assert info.value.message.startswith(f"{where}.{key} ")
    assert "C" * 65 not in info.value.message  # never more than 64 characters of the id
    assert len(info.value.message) < 200
    assert info.value.message.isprintable()  # control characters quoted as repr escapes
    assert conn.state is TwilioState.FAILED


@pytest.mark.parametrize(("where", "key"), [f for f in ID_FIELDS if f[1] != "streamSid"])
def test_empty_ids_are_invalid_id(where: str, key: str) -> None:
    conn, text = with_id(where, key, "")
    with pytest.raises(TwilioProtocolError) as info:
        conn.receive_text(text)
    assert info.value.code is TwilioErrorCode.INVALID_ID
    assert info.value.message == f"{where}.{key} '' is empty"


def test_empty_stream_sid_stays_invalid_field() -> None:
    # Refused before ids were checked, with invalid_field; the code is kept.
    conn, text = with_id("start", "streamSid", "")
    expect_protocol_error(conn, text, TwilioErrorCode.INVALID_FIELD)


@pytest.mark.parametrize(("where", "key"), ID_FIELDS)
@pytest.mark.parametrize(
    "value",
    [
        "C" * MAX_CALL_ID_CHARS,  # the bound itself
        "CA" + "0123456789abcdef" * 2,  # a real sid: CA/MZ/AC and 32 hex digits
        "X",  # not the documented 34-character shape: test tools send such ids
        "call-1",
        "sip:alice@example.com;tag=1",
        "呼叫-1",  # printable non-ASCII
    ],
)
def test_ids_of_any_printable_shape_up_to_128_chars_are_accepted(
    where: str, key: str, value: str
) -> None:
    conn, text = with_id(where, key, value)
    [event] = conn.receive_text(text)
    assert isinstance(event, TwilioStart | TwilioStop)
    assert getattr(event, ID_ATTRIBUTES[key]) == value


# --------------------------------------------------------------------------- fuzzer finds
# Bugs tests/telephony/test_twilio_fuzz.py found; each escaped as a non-Twilio exception.


@pytest.mark.parametrize("digits", [21, 4_301, 10_000])
def test_counter_over_20_digits_is_invalid_field_not_value_error(digits: int) -> None:
    # int() refuses strings of over 4,300 digits with ValueError.
    doc = json.loads(unabbreviate(DOC_MEDIA_INBOUND))
    doc["sequenceNumber"] = "9" * digits
    expect_protocol_error(streaming(), json.dumps(doc), TwilioErrorCode.INVALID_FIELD)


def test_counter_of_20_digits_is_accepted() -> None:
    doc = json.loads(unabbreviate(DOC_MEDIA_INBOUND))
    doc["media"]["timestamp"] = "9" * 20
    [event] = streaming().receive_text(json.dumps(doc))
    assert isinstance(event, TwilioMedia)
    assert event.timestamp == 10**20 - 1


@pytest.mark.parametrize(
    "text", ["\ud800", '{"event": "connected", "protocol": "\udc80", "version": "1"}']
)
def test_lone_surrogate_is_invalid_json_not_unicode_error(text: str) -> None:
    # msgspec encodes the str to UTF-8 first: UnicodeEncodeError escaped.
    expect_protocol_error(TwilioConnection(), text, TwilioErrorCode.INVALID_JSON)


def test_error_messages_quote_at_most_64_characters() -> None:
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    text = start_with(mediaFormat={"encoding": "E" * 10_000, "sampleRate": 8000, "channels": 1})
    with pytest.raises(TwilioProtocolError) as info:
        conn.receive_text(text)
    assert info.value.code is TwilioErrorCode.UNSUPPORTED_CODEC
    assert "E" * 65 not in info.value.message
    with pytest.raises(TwilioProtocolError) as info:
        streaming().receive_text(media_msg(sid="S" * 10_000))
    assert info.value.code is TwilioErrorCode.STREAM_SID_MISMATCH
    assert "S" * 65 not in info.value.message


# --------------------------------------------------------------------------- error codes


def test_error_types_separate_remote_from_local() -> None:
    assert issubclass(TwilioProtocolError, TwilioError)
    assert issubclass(TwilioUsageError, TwilioError)
    assert not issubclass(TwilioProtocolError, TwilioUsageError)
    assert not issubclass(TwilioUsageError, TwilioProtocolError)
    err = TwilioProtocolError(TwilioErrorCode.INVALID_JSON, "detail")
    assert (err.code, err.message, str(err)) == ("invalid_json", "detail", "invalid_json: detail")


@pytest.mark.parametrize("text", ["not json", "{", '["event", "connected"]', '"connected"', "null"])
def test_invalid_json(text: str) -> None:
    expect_protocol_error(TwilioConnection(), text, TwilioErrorCode.INVALID_JSON)


def test_message_too_large() -> None:
    conn = TwilioConnection(max_message_chars=100)
    expect_protocol_error(conn, " " * 101, TwilioErrorCode.MESSAGE_TOO_LARGE)


@pytest.mark.parametrize("name", ["Connected", "closed", "clear", "error", ""])
def test_unknown_event(name: str) -> None:
    expect_protocol_error(TwilioConnection(), msg(event=name), TwilioErrorCode.UNKNOWN_EVENT)


@pytest.mark.parametrize(
    ("make", "field_path"),
    [
        (lambda: msg(protocol="Call", version="1.0.0"), "event"),
        (lambda: msg(event="connected", version="1.0.0"), "protocol"),
    ],
)
def test_missing_field_before_start(make: Any, field_path: str) -> None:
    conn = TwilioConnection()
    with pytest.raises(TwilioProtocolError) as info:
        conn.receive_text(make())
    assert info.value.code is TwilioErrorCode.MISSING_FIELD
    assert field_path in info.value.message


def _without(doc: str, *path: str) -> str:
    obj = json.loads(unabbreviate(doc))
    target = obj
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return json.dumps(obj)


@pytest.mark.parametrize(
    ("text", "field_path"),
    [
        (_without(DOC_START, "sequenceNumber"), "sequenceNumber"),
        (_without(DOC_START, "start"), "start"),
        (_without(DOC_START, "start", "streamSid"), "start.streamSid"),
        (_without(DOC_START, "start", "accountSid"), "start.accountSid"),
        (_without(DOC_START, "start", "callSid"), "start.callSid"),
        (_without(DOC_START, "start", "tracks"), "start.tracks"),
        (_without(DOC_START, "start", "mediaFormat"), "start.mediaFormat"),
        (_without(DOC_START, "start", "mediaFormat", "encoding"), "start.mediaFormat.encoding"),
        (
            _without(DOC_START, "start", "mediaFormat", "sampleRate"),
            "start.mediaFormat.sampleRate",
        ),
        (_without(DOC_START, "start", "mediaFormat", "channels"), "start.mediaFormat.channels"),
    ],
)
def test_start_missing_field(text: str, field_path: str) -> None:
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    with pytest.raises(TwilioProtocolError) as info:
        conn.receive_text(text)
    assert info.value.code is TwilioErrorCode.MISSING_FIELD
    assert info.value.message == f"{field_path} is missing"


@pytest.mark.parametrize(
    ("text", "field_path"),
    [
        (_without(DOC_MEDIA_INBOUND, "streamSid"), "streamSid"),
        (_without(DOC_MEDIA_INBOUND, "sequenceNumber"), "sequenceNumber"),
        (_without(DOC_MEDIA_INBOUND, "media"), "media"),
        (_without(DOC_MEDIA_INBOUND, "media", "payload"), "media.payload"),
        (_without(DOC_MEDIA_INBOUND, "media", "track"), "media.track"),
        (_without(DOC_MEDIA_INBOUND, "media", "chunk"), "media.chunk"),
        (_without(DOC_MEDIA_INBOUND, "media", "timestamp"), "media.timestamp"),
        (_without(DOC_DTMF, "dtmf", "digit"), "dtmf.digit"),
        (_without(DOC_DTMF, "dtmf", "track"), "dtmf.track"),
        (_without(DOC_MARK, "mark", "name"), "mark.name"),
        (_without(DOC_MARK, "mark"), "mark"),
        (_without(DOC_STOP, "stop", "callSid"), "stop.callSid"),
        (_without(DOC_STOP, "stop", "accountSid"), "stop.accountSid"),
        (_without(DOC_STOP, "stop"), "stop"),
    ],
)
def test_streaming_missing_field(text: str, field_path: str) -> None:
    conn = streaming()
    with pytest.raises(TwilioProtocolError) as info:
        conn.receive_text(text)
    assert info.value.code is TwilioErrorCode.MISSING_FIELD
    assert info.value.message == f"{field_path} is missing"


@pytest.mark.parametrize(
    "start_changes",
    [
        {"tracks": "inbound"},
        {"tracks": [1]},
        {"customParameters": {"n": 1}},
        {"customParameters": ["token"]},
        {"mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": "8000", "channels": 1}},
        {"mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": True}},
        {"mediaFormat": "audio/x-mulaw"},
        {"streamSid": ""},
        {"callSid": 7},
    ],
)
def test_start_invalid_field(start_changes: dict[str, Any]) -> None:
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    expect_protocol_error(conn, start_with(**start_changes), TwilioErrorCode.INVALID_FIELD)


@pytest.mark.parametrize(
    "text",
    [
        msg(event=1),
        msg(event="media", sequenceNumber="x", streamSid=SID, media={}),
        msg(event="media", sequenceNumber="-1", streamSid=SID, media={}),
        msg(event="media", sequenceNumber=True, streamSid=SID, media={}),
        msg(event="media", sequenceNumber="٣", streamSid=SID, media={}),  # not ASCII digits
        msg(event="media", sequenceNumber="2", streamSid=7),
        msg(event="media", sequenceNumber="2", streamSid=SID, media=[]),
        msg(
            event="media",
            sequenceNumber="2",
            streamSid=SID,
            media={"track": "inbound", "chunk": "1", "timestamp": "0", "payload": 5},
        ),
        msg(event="dtmf", sequenceNumber="2", streamSid=SID, dtmf={"track": "t", "digit": ""}),
    ],
)
def test_streaming_invalid_field(text: str) -> None:
    expect_protocol_error(streaming(), text, TwilioErrorCode.INVALID_FIELD)


def test_integer_counters_are_accepted_as_numbers_too() -> None:
    text = msg(
        event="media",
        sequenceNumber=2,
        streamSid=SID,
        media={"track": "inbound", "chunk": 1, "timestamp": 20, "payload": ""},
    )
    [event] = streaming().receive_text(text)
    assert event == TwilioMedia(2, SID, "inbound", 1, 20, b"")


@pytest.mark.parametrize("payload", ["no+JhoaJjpzS...", "abc", "@@@@", "YQ==YQ==x"])
def test_invalid_base64(payload: str) -> None:
    text = msg(
        event="media",
        sequenceNumber="2",
        streamSid=SID,
        media={"track": "inbound", "chunk": "1", "timestamp": "0", "payload": payload},
    )
    expect_protocol_error(streaming(), text, TwilioErrorCode.INVALID_BASE64)


@pytest.mark.parametrize(
    "media_format",
    [
        {"encoding": "audio/x-alaw", "sampleRate": 8000, "channels": 1},
        {"encoding": "audio/l16", "sampleRate": 8000, "channels": 1},
        {"encoding": "audio/x-mulaw", "sampleRate": 16000, "channels": 1},
        {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 2},
    ],
)
def test_unsupported_codec(media_format: dict[str, Any]) -> None:
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    expect_protocol_error(
        conn, start_with(mediaFormat=media_format), TwilioErrorCode.UNSUPPORTED_CODEC
    )


def test_stream_sid_mismatch_inside_start() -> None:
    doc = json.loads(DOC_START)
    doc["streamSid"] = "MZother"
    conn = TwilioConnection()
    conn.receive_text(DOC_CONNECTED)
    expect_protocol_error(conn, json.dumps(doc), TwilioErrorCode.STREAM_SID_MISMATCH)


@pytest.mark.parametrize(
    "text",
    [
        media_msg(sid="MZother"),
        DOC_DTMF.replace(SID, "MZother"),
        DOC_STOP.replace(SID, "MZother"),
        DOC_MARK.replace(SID, "MZother"),
    ],
)
def test_stream_sid_mismatch_after_start(text: str) -> None:
    expect_protocol_error(streaming(), text, TwilioErrorCode.STREAM_SID_MISMATCH)


def test_unknown_mark() -> None:
    expect_protocol_error(streaming(), DOC_MARK, TwilioErrorCode.UNKNOWN_MARK)


def test_mark_echoed_twice_is_unknown_the_second_time() -> None:
    conn = streaming()
    conn.send_mark("my label")
    conn.receive_text(DOC_MARK)
    expect_protocol_error(conn, DOC_MARK, TwilioErrorCode.UNKNOWN_MARK)


@pytest.mark.parametrize(
    "send", [lambda c: c.send_media(b"\xff"), lambda c: c.send_mark("m"), lambda c: c.send_clear()]
)
@pytest.mark.parametrize(
    "state", [TwilioState.AWAITING_CONNECTED, TwilioState.AWAITING_START, TwilioState.STOPPED]
)
def test_sending_outside_streaming_is_local_misuse(send: Any, state: TwilioState) -> None:
    conn = _in_state(state)
    with pytest.raises(TwilioUsageError) as info:
        send(conn)
    assert info.value.code is TwilioErrorCode.NOT_STREAMING
    assert conn.state is state


def test_empty_media() -> None:
    with pytest.raises(TwilioUsageError) as info:
        streaming().send_media(b"")
    assert info.value.code is TwilioErrorCode.EMPTY_MEDIA


@pytest.mark.parametrize("name", ["", "x" * 257])
def test_invalid_mark_name(name: str) -> None:
    conn = streaming()
    with pytest.raises(TwilioUsageError) as info:
        conn.send_mark(name)
    assert info.value.code is TwilioErrorCode.INVALID_MARK_NAME
    assert conn.pending_marks == ()


def test_too_many_marks() -> None:
    conn = TwilioConnection(max_pending_marks=2)
    conn.receive_text(DOC_CONNECTED)
    conn.receive_text(DOC_START)
    conn.send_mark("a")
    conn.send_mark("b")
    with pytest.raises(TwilioUsageError) as info:
        conn.send_mark("c")
    assert info.value.code is TwilioErrorCode.TOO_MANY_MARKS
    conn.receive_text(mark_msg("a"))
    conn.send_mark("c")  # room again once one is echoed
    assert conn.pending_marks == ("b", "c")


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TwilioConnection(max_message_chars=0)
    with pytest.raises(ValueError):
        TwilioConnection(max_pending_marks=0)


def test_every_error_code_is_exercised() -> None:
    # Keep this list in step with TwilioErrorCode: a new code needs a test above.
    assert {c.value for c in TwilioErrorCode} == {
        "invalid_json",
        "message_too_large",
        "unknown_event",
        "unexpected_event",
        "media_before_start",
        "missing_field",
        "invalid_field",
        "invalid_id",
        "invalid_base64",
        "unsupported_codec",
        "stream_sid_mismatch",
        "unknown_mark",
        "not_streaming",
        "connection_failed",
        "empty_media",
        "invalid_mark_name",
        "too_many_marks",
    }


@pytest.mark.realtime  # Hypothesis's default 200 ms deadline: runs alone
def test_media_builder_matches_build_media_character_for_character() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from telephony.twilio import build_media, media_builder

    @given(sid=st.text(min_size=1, max_size=40), audio=st.binary(min_size=1, max_size=400))
    def check(sid: str, audio: bytes) -> None:
        assert media_builder(sid)(audio) == build_media(sid, audio)

    check()
