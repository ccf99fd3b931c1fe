"""Fuzzing the Twilio Media Streams core (``telephony/twilio.py``), bounded, in every run.

Whole scripts go through one :class:`TwilioConnection`: inbound text frames (the messages
of Twilio's "Media Streams - WebSocket Messages" page, the same messages with fields
dropped, retyped, huge, unicode or deeply nested, cut short or with characters changed,
events out of order, and raw text), interleaved with the calls the gateway's
``TwilioLeg`` makes (``send_media`` per 20 ms frame, ``send_mark`` per session mark,
``send_clear`` on clear and barge-in). After every step:

* inbound input raises nothing but :class:`TwilioProtocolError` (or, once the connection
  has failed, :class:`TwilioUsageError` ``connection_failed``), never ``KeyError``,
  ``TypeError``, ``RecursionError``, ``UnicodeError`` or ``ValueError``;
* a protocol error leaves the state ``FAILED``, and ``FAILED`` is never left;
* every accepted message moves the state along :data:`TRANSITIONS` and nowhere else;
* the senders never raise in ``STREAMING`` with the arguments the gateway passes, raise
  exactly the documented :class:`TwilioUsageError` otherwise, and never change the state;
* accepted ids obey :func:`telephony.limits.call_id_problem`, mark echoes match a small
  model of the marks sent and cleared, and error messages stay short and printable (the
  gateway logs them).

Deterministic (``derandomize=True``) and bounded by ``max_examples``: a few seconds.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telephony.limits import call_id_problem
from telephony.twilio import (
    MAX_MARK_NAME_CHARS,
    TRANSITIONS,
    TwilioConnected,
    TwilioConnection,
    TwilioDtmf,
    TwilioErrorCode,
    TwilioEvent,
    TwilioMark,
    TwilioMedia,
    TwilioMediaFormat,
    TwilioProtocolError,
    TwilioStart,
    TwilioState,
    TwilioStop,
    TwilioUsageError,
)
from tests.telephony.fuzzing import (
    FUZZ,
    BadValues,
    assert_loggable,
    corrupted,
    damaged,
    mutated,
    raw_texts,
    serialized,
    texts,
)

SID: Final = "MZ" + "0123456789abcdef" * 2
ACCOUNT: Final = "AC" + "0123456789abcdef" * 2
CALL: Final = "CA" + "0123456789abcdef" * 2
MARK_NAMES: Final = ("m1", "m2", "m3", "my label")

EVENT_NAMES: Final[dict[type[Any], str]] = {
    TwilioConnected: "connected",
    TwilioStart: "start",
    TwilioMedia: "media",
    TwilioDtmf: "dtmf",
    TwilioMark: "mark",
    TwilioStop: "stop",
}
PROTOCOL_CODES: Final = frozenset(
    {
        TwilioErrorCode.INVALID_JSON,
        TwilioErrorCode.MESSAGE_TOO_LARGE,
        TwilioErrorCode.UNKNOWN_EVENT,
        TwilioErrorCode.UNEXPECTED_EVENT,
        TwilioErrorCode.MEDIA_BEFORE_START,
        TwilioErrorCode.MISSING_FIELD,
        TwilioErrorCode.INVALID_FIELD,
        TwilioErrorCode.INVALID_ID,
        TwilioErrorCode.INVALID_BASE64,
        TwilioErrorCode.UNSUPPORTED_CODEC,
        TwilioErrorCode.STREAM_SID_MISMATCH,
        TwilioErrorCode.UNKNOWN_MARK,
    }
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _templates(mark_name: str) -> dict[str, dict[str, Any]]:
    """One message per event, as "WebSocket messages from Twilio" shows them, with real
    34-character sids and a decodable payload."""
    return {
        "connected": {"event": "connected", "protocol": "Call", "version": "1.0.0"},
        "start": {
            "event": "start",
            "sequenceNumber": "1",
            "start": {
                "accountSid": ACCOUNT,
                "streamSid": SID,
                "callSid": CALL,
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                "customParameters": {"token": "eyJ.x.y", "say": "hello"},
            },
            "streamSid": SID,
        },
        "media": {
            "event": "media",
            "sequenceNumber": "3",
            "media": {
                "track": "inbound",
                "chunk": "1",
                "timestamp": "5",
                "payload": _b64(b"\xff" * 160),
            },
            "streamSid": SID,
        },
        "dtmf": {
            "event": "dtmf",
            "streamSid": SID,
            "sequenceNumber": "5",
            "dtmf": {"track": "inbound_track", "digit": "1"},
        },
        "mark": {
            "event": "mark",
            "sequenceNumber": "4",
            "streamSid": SID,
            "mark": {"name": mark_name},
        },
        "stop": {
            "event": "stop",
            "sequenceNumber": "5",
            "stop": {"accountSid": ACCOUNT, "callSid": CALL},
            "streamSid": SID,
        },
    }


# --------------------------------------------------------------------------- strategies

#: Wrong values: the shared ones, a sid prefix with a NUL, the sample rate as a string.
BAD: Final = BadValues(texts=["CA\x00"], numbers=["8000"])

EVENTS: Final = ("connected", "start", "media", "dtmf", "mark", "stop")


@st.composite
def structured(draw: st.DrawFn, event: str | None = None) -> str:
    """A documented message, mostly with a member or two wrong, serialized, perhaps then
    damaged as text."""
    templates = _templates(draw(st.sampled_from(MARK_NAMES) | texts(10)))
    doc: Any = templates[event or draw(st.sampled_from(EVENTS))]
    how = draw(st.sampled_from(("corrupt", "corrupt", "corrupt", "valid", "wild", "rename")))
    if how == "corrupt":
        doc = draw(corrupted(doc, BAD))
    elif how == "wild":
        doc = draw(mutated(doc, BAD))
    elif how == "rename":
        doc = {**doc, "event": draw(st.sampled_from(["clear", "Connected", "", *EVENTS]))}
    return draw(damaged(draw(serialized(doc))))


#: Raw text (see :func:`~tests.telephony.fuzzing.raw_texts`), deep nesting inside ``start``.
RAW: Final = raw_texts(words=['"connected"'], nested_in='{"event":"start","start":')


@dataclass(frozen=True)
class Recv:
    text: str


@dataclass(frozen=True)
class SendMedia:
    audio: bytes


@dataclass(frozen=True)
class SendMark:
    name: str


@dataclass(frozen=True)
class SendClear:
    pass


@dataclass(frozen=True)
class EchoMark:
    """Twilio's echo of the oldest outstanding mark, as it sends them ("Mark message");
    a media message when no mark is outstanding."""


Action = Recv | SendMedia | SendMark | SendClear | EchoMark

_CONNECTED: Final = Recv(json.dumps(_templates("m1")["connected"]))
_START: Final = Recv(json.dumps(_templates("m1")["start"]))

#: Well-formed messages a live stream gets, weighted as a call gets them: mostly media and
#: echoes of marks sent; rarely an echo from the pool (some match, some do not), a stop,
#: a connected or a start out of turn.
_LIVE: Final = ("media",) * 6 + ("echo",) * 4 + ("dtmf",) * 2 + ("rare",)
_RARE: Final = ("mark", "stop", "connected", "start")


@st.composite
def actions(draw: st.DrawFn) -> Action:
    """One step. Most inbound messages are well-formed, so a script lives long enough to
    interleave many sends; a few are corrupted, raw or out of turn."""
    kind = draw(st.sampled_from(("live",) * 12 + ("bad", "raw") + ("send",) * 10))
    if kind == "live":
        live = draw(st.sampled_from(_LIVE))
        if live == "echo":
            return EchoMark()
        if live == "rare":
            live = draw(st.sampled_from(_RARE))
        return Recv(json.dumps(_templates(draw(st.sampled_from(MARK_NAMES)))[live]))
    if kind == "bad":
        return Recv(draw(structured()))
    if kind == "raw":
        return Recv(draw(RAW))
    send = draw(st.sampled_from(("media",) * 4 + ("mark",) * 3 + ("clear",) * 2 + ("odd",)))
    if send == "media":  # TwilioLeg.vendor_media: one 20 ms frame; any length > 0 is legal
        return SendMedia(draw(st.just(b"\xff" * 160) | st.binary(min_size=1, max_size=400)))
    if send == "mark":  # TwilioLeg.vendor_mark: "m<n>"; a pool, so names repeat and match
        return SendMark(draw(st.sampled_from(MARK_NAMES)))
    if send == "clear":
        return SendClear()
    # arguments the gateway never passes: refused with their documented codes
    odd: list[Action] = [SendMedia(b""), SendMark(""), SendMark("x" * (MAX_MARK_NAME_CHARS + 1))]
    return draw(st.sampled_from(odd))


@st.composite
def scripts(draw: st.DrawFn) -> list[Action]:
    """Mostly a legal opening (connected, start), then anything."""
    prefix = draw(st.sampled_from((2,) * 8 + (1, 0)))
    return [_CONNECTED, _START][:prefix] + draw(st.lists(actions(), max_size=30))


# --------------------------------------------------------------------------- the oracle


class Checked:
    """A connection plus the little the oracle must remember: marks sent, and cleared."""

    def __init__(self, max_pending_marks: int) -> None:
        self.conn = TwilioConnection(max_pending_marks=max_pending_marks)
        self.max_pending_marks = max_pending_marks
        self.marks: list[tuple[str, bool]] = []  # (name, cleared), oldest first

    def run(self, action: Action) -> None:
        before = self.conn.state
        if isinstance(action, EchoMark):  # nothing to echo: a media message instead
            event = "mark" if self.marks else "media"
            action = Recv(json.dumps(_templates(self.marks[0][0] if self.marks else "")[event]))
        if isinstance(action, Recv):
            self.receive(action.text)
        else:
            self.send(action)
        assert self.conn.state in TwilioState
        assert before is not TwilioState.FAILED or self.conn.state is TwilioState.FAILED
        assert self.conn.pending_marks == tuple(name for name, _ in self.marks)

    def receive(self, text: str) -> None:
        conn, before = self.conn, self.conn.state
        try:
            events = conn.receive_text(text)
        except TwilioProtocolError as exc:
            assert before is not TwilioState.FAILED
            assert exc.code in PROTOCOL_CODES, exc
            assert conn.state is TwilioState.FAILED
            assert_loggable(exc.message, exc.code)
            return
        except TwilioUsageError as exc:
            assert before is TwilioState.FAILED
            assert exc.code is TwilioErrorCode.CONNECTION_FAILED
            assert conn.state is TwilioState.FAILED
            return
        assert before is not TwilioState.FAILED
        assert len(events) == 1
        [event] = events
        assert conn.state is TRANSITIONS[(before, EVENT_NAMES[type(event)])]
        self.check_event(event)

    def check_event(self, event: TwilioEvent) -> None:
        conn = self.conn
        if isinstance(event, TwilioStart):
            for sid in (event.stream_sid, event.account_sid, event.call_sid):
                assert call_id_problem(sid) is None, sid
            assert conn.start is event and conn.stream_sid == event.stream_sid
            assert event.media_format == TwilioMediaFormat("audio/x-mulaw", 8000, 1)
            assert all(isinstance(t, str) for t in event.tracks)
            assert all(isinstance(v, str) for v in event.custom_parameters.values())
            assert isinstance(event.sequence_number, int) and event.sequence_number >= 0
        elif isinstance(event, TwilioMedia):
            assert event.stream_sid == conn.stream_sid
            assert isinstance(event.payload, bytes)
            assert min(event.sequence_number, event.chunk, event.timestamp) >= 0
        elif isinstance(event, TwilioDtmf):
            assert event.stream_sid == conn.stream_sid
            assert len(event.digit) == 1  # one character; which ones count: the gateway
        elif isinstance(event, TwilioMark):
            assert event.stream_sid == conn.stream_sid
            index = [name for name, _ in self.marks].index(event.name)  # oldest first
            assert event.cleared is self.marks.pop(index)[1]
        elif isinstance(event, TwilioStop):
            assert event.stream_sid == conn.stream_sid
            assert call_id_problem(event.account_sid) is None
            assert call_id_problem(event.call_sid) is None
            assert event.unechoed_marks == tuple(name for name, _ in self.marks)
            self.marks.clear()
        else:
            assert isinstance(event, TwilioConnected)
            assert isinstance(event.protocol, str) and isinstance(event.version, str)

    def expected_send_error(self, action: Action) -> TwilioErrorCode | None:
        state = self.conn.state
        if state is TwilioState.FAILED:
            return TwilioErrorCode.CONNECTION_FAILED
        if state is not TwilioState.STREAMING:
            return TwilioErrorCode.NOT_STREAMING
        if isinstance(action, SendMedia) and not action.audio:
            return TwilioErrorCode.EMPTY_MEDIA
        if isinstance(action, SendMark):
            if not 0 < len(action.name) <= MAX_MARK_NAME_CHARS:
                return TwilioErrorCode.INVALID_MARK_NAME
            if len(self.marks) >= self.max_pending_marks:
                return TwilioErrorCode.TOO_MANY_MARKS
        return None

    def send(self, action: Action) -> None:
        conn, before = self.conn, self.conn.state
        expected = self.expected_send_error(action)
        try:
            if isinstance(action, SendMedia):
                text = conn.send_media(action.audio)
            elif isinstance(action, SendMark):
                text = conn.send_mark(action.name)
            else:
                text = conn.send_clear()
        except TwilioUsageError as exc:
            assert exc.code is expected, (exc.code, expected)
            assert conn.state is before
            return
        assert expected is None, expected
        assert conn.state is before is TwilioState.STREAMING
        sent = json.loads(text)
        assert sent["streamSid"] == conn.stream_sid
        if isinstance(action, SendMedia):
            assert sent["event"] == "media"
            assert base64.b64decode(sent["media"]["payload"], validate=True) == action.audio
        elif isinstance(action, SendMark):
            assert sent == {
                "event": "mark",
                "streamSid": conn.stream_sid,
                "mark": {"name": action.name},
            }
            self.marks.append((action.name, False))
        else:
            assert sent == {"event": "clear", "streamSid": conn.stream_sid}
            self.marks = [(name, True) for name, _ in self.marks]


# --------------------------------------------------------------------------- the targets


@FUZZ
@given(script=scripts(), max_pending_marks=st.sampled_from([1_000, 2]))
def test_fuzz_whole_scripts_through_one_connection(
    script: list[Action], max_pending_marks: int
) -> None:
    checked = Checked(max_pending_marks)
    for action in script:
        checked.run(action)


#: How many legal messages (connected, start) put a connection where ``event`` is legal.
_LEGAL_PREFIX: Final = {"connected": 0, "start": 1}


@pytest.mark.parametrize("event", EVENTS)
@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_fuzz_each_message_where_it_is_legal(data: st.DataObject, event: str) -> None:
    """Each documented message, corrupted, in the one state where it is legal: only its
    fields can be wrong there, so every member's parser is reached."""
    checked = Checked(1_000)
    for action in [_CONNECTED, _START][: _LEGAL_PREFIX.get(event, 2)]:
        checked.run(action)
    checked.run(SendMark("m1"))
    checked.run(Recv(data.draw(structured(event), label="text")))
    checked.run(SendMedia(b"\xff" * 160))
    checked.run(SendMark("m2"))
    checked.run(SendClear())


@FUZZ
@given(text=RAW, prefix=st.integers(0, 3))
def test_fuzz_raw_text_in_every_state(text: str, prefix: int) -> None:
    checked = Checked(1_000)
    stop = Recv(json.dumps(_templates("m1")["stop"]))
    for action in [_CONNECTED, _START, stop][:prefix]:
        checked.run(action)
    checked.run(Recv(text))
    checked.run(SendMedia(b"\xff" * 160))


def test_oracle_sees_a_documented_life() -> None:
    """The oracle itself: a legal life passes and ends in STOPPED."""
    checked = Checked(1_000)
    templates = _templates("m1")
    life: list[Action] = [
        _CONNECTED,
        _START,
        SendMedia(b"\xff" * 160),
        SendMark("m1"),
        Recv(json.dumps(templates["media"])),
        Recv(json.dumps(templates["mark"])),
        SendMark("m1"),
        SendClear(),
        Recv(json.dumps(templates["mark"])),
        Recv(json.dumps(templates["stop"])),
    ]
    for action in life:
        checked.run(action)
    assert checked.conn.state is TwilioState.STOPPED
