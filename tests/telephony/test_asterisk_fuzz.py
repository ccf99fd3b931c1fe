"""Fuzzing the Asterisk chan_websocket core (``telephony/asterisk.py``), bounded, in every run.

Whole scripts go through one :class:`AsteriskConnection`: inbound TEXT frames (the events
of the Asterisk "WebSocket" channel driver page and of ``chan_websocket.c``, in plain-text
and JSON, with parameters dropped, retyped, huge, unicode or deeply nested, cut short or
with characters changed, in the other control format, out of order, and raw text) and
BINARY frames of any size, interleaved with the calls the gateway's ``AsteriskLeg``
makes (``answer`` on ``MEDIA_START``, ``media_frames`` per 20 ms frame, ``flush_tail``
after an utterance, ``mark_media`` per session mark with fresh ``m<n>`` ids,
``flush_media`` on clear and barge-in, ``hangup``) and ``connection_closed``. After
every step:

* inbound frames raise nothing but :class:`AsteriskProtocolError` (or, after a failure
  or close, :class:`AsteriskUsageError` ``connection_failed``/``closed``), never
  ``KeyError``, ``TypeError``, ``RecursionError``, ``UnicodeError`` or ``ValueError``;
* a protocol error leaves the state ``FAILED``, which only ``connection_closed`` leaves;
* every accepted frame and every successful command moves the state along
  :data:`TRANSITIONS` and nowhere else;
* the gateway's calls never raise where the state allows them, raise exactly the
  documented :class:`AsteriskUsageError` code elsewhere, and leave the state alone;
* outbound media is whole ``optimal_frame_size`` frames, never over the message limit,
  and nothing is lost or invented (a small model of the held-back tail);
* accepted ids obey :func:`telephony.limits.call_id_problem`, mark events answer marks
  sent, and error messages stay short and printable (the gateway logs them).

Deterministic (``derandomize=True``) and bounded by ``max_examples``: a few seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telephony.asterisk import (
    CODECS,
    TRANSITIONS,
    AsteriskConnection,
    AsteriskErrorCode,
    AsteriskEvent,
    AsteriskProtocolError,
    AsteriskState,
    AsteriskUsageError,
    Command,
    ControlFormat,
    DriverError,
    DriverStatus,
    DtmfEnd,
    MediaBufferingCompleted,
    MediaMarkProcessed,
    MediaReceived,
    MediaStart,
    MediaXoff,
    MediaXon,
    QueueDrained,
    Trigger,
    encode_command,
)
from telephony.limits import call_id_problem
from tests.telephony.fuzzing import (
    FUZZ,
    BadValues,
    assert_loggable,
    corrupted,
    damaged,
    raw_texts,
    serialized,
    texts,
)
from tests.telephony.test_asterisk import CHANNEL_ID, JSON, PLAIN

CONNECTION_ID: Final = "e226e283-c90a-4ea9-9e37-389000b9ef47"
MARK_IDS: Final = ("m1", "m2", "m3", "m4")  # the gateway's ids, in the order it sends them

STARTED: Final = frozenset({AsteriskState.ACTIVE, AsteriskState.PAUSED})
PROTOCOL_CODES: Final = frozenset(
    {
        AsteriskErrorCode.INVALID_JSON,
        AsteriskErrorCode.MALFORMED_MESSAGE,
        AsteriskErrorCode.WRONG_CONTROL_FORMAT,
        AsteriskErrorCode.MESSAGE_TOO_LARGE,
        AsteriskErrorCode.UNKNOWN_EVENT,
        AsteriskErrorCode.UNEXPECTED_EVENT,
        AsteriskErrorCode.MEDIA_BEFORE_START,
        AsteriskErrorCode.MISSING_FIELD,
        AsteriskErrorCode.INVALID_FIELD,
        AsteriskErrorCode.INVALID_ID,
        AsteriskErrorCode.UNSUPPORTED_CODEC,
        AsteriskErrorCode.INVALID_FRAME_SIZE,
        AsteriskErrorCode.INVALID_MEDIA,
        AsteriskErrorCode.UNKNOWN_MARK,
    }
)
TRIGGERS: Final[dict[type[Any], Trigger]] = {
    MediaStart: Trigger.MEDIA_START,
    MediaXoff: Trigger.MEDIA_XOFF,
    MediaXon: Trigger.MEDIA_XON,
    DtmfEnd: Trigger.NOTIFICATION,
    MediaMarkProcessed: Trigger.NOTIFICATION,
    MediaBufferingCompleted: Trigger.NOTIFICATION,
    QueueDrained: Trigger.NOTIFICATION,
    DriverStatus: Trigger.NOTIFICATION,
    DriverError: Trigger.NOTIFICATION,
}
EVENTS: Final = (
    "MEDIA_START",
    "DTMF_END",
    "MEDIA_XOFF",
    "MEDIA_XON",
    "MEDIA_MARK_PROCESSED",
    "MEDIA_BUFFERING_COMPLETED",
    "QUEUE_DRAINED",
    "STATUS",
    "ERROR",
)


# --------------------------------------------------------------------------- documents

#: (codec, optimal_frame_size) pairs Asterisk writes [src websocket_new], and a few that
#: only fit some legs' max_message_bytes.
FRAMES: Final = [("ulaw", 160), ("alaw", 160), ("slin", 320), ("slin16", 640), ("ulaw", 1_600)]


def _params(event: str, mark: str, codec: str, frame: int) -> dict[str, Any]:
    """One event's parameters, JSON-typed, as [WS Events] and [src _create_event_*]."""
    params: dict[str, dict[str, Any]] = {
        "MEDIA_START": {
            "connection_id": CONNECTION_ID,
            "channel": "WebSocket/connectionid",
            "channel_id": CHANNEL_ID,
            "format": codec,
            "optimal_frame_size": frame,
            "ptime": 20,
            "channel_variables": {"SOME_CHANNEL_VARIABLE": "some value"},
        },
        "DTMF_END": {"digit": "5", "channel_id": CHANNEL_ID},
        "MEDIA_XOFF": {"channel_id": CHANNEL_ID},
        "MEDIA_XON": {"channel_id": CHANNEL_ID},
        "MEDIA_MARK_PROCESSED": {"channel_id": CHANNEL_ID, "correlation_id": mark},
        "MEDIA_BUFFERING_COMPLETED": {"channel_id": CHANNEL_ID, "correlation_id": "b-1"},
        "QUEUE_DRAINED": {"channel_id": CHANNEL_ID},
        "STATUS": {
            "channel_id": CHANNEL_ID,
            "queue_length": 43,
            "xon_level": 800,
            "xoff_level": 900,
            "queue_full": False,
            "bulk_media": True,
            "media_paused": False,
        },
        "ERROR": {"channel_id": CHANNEL_ID, "error_text": "MARK_MEDIA not supported"},
    }
    return params[event]


def as_json(event: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"event": event, **params}


def as_plain_tokens(event: str, params: dict[str, Any]) -> list[str]:
    """The plain-text layout [WS Control Commands and Events] [src]: ``key:value`` tokens,
    a bare correlation id, or nothing; STATUS booleans as ``true``/``false``."""
    if event in ("MEDIA_MARK_PROCESSED", "MEDIA_BUFFERING_COMPLETED"):
        return [str(params["correlation_id"])]
    if event in ("MEDIA_XOFF", "MEDIA_XON", "QUEUE_DRAINED"):
        return []
    tokens = []
    for key, value in params.items():
        if key == "channel_variables":
            continue  # JSON only [WS Events footnote 2]
        text = str(value).lower() if isinstance(value, bool) else str(value)
        tokens.append(f"{key}:{text}")
    return tokens


def event_text(
    fmt: ControlFormat, event: str, mark: str = "m1", codec: str = "ulaw", frame: int = 160
) -> str:
    """A well-formed ``event`` in ``fmt``."""
    params = _params(event, mark, codec, frame)
    if fmt is JSON:
        return json.dumps(as_json(event, params))
    return " ".join([event, *as_plain_tokens(event, params)])


def media_start(fmt: ControlFormat, codec: str = "ulaw", frame: int = 160) -> str:
    return event_text(fmt, "MEDIA_START", codec=codec, frame=frame)


# --------------------------------------------------------------------------- strategies

#: Wrong values: the shared ones, the plain-text separator, a channel id with a NUL, frame
#: sizes that are not whole samples, around the 65,500-byte message limit, or strings.
BAD: Final = BadValues(texts=["a:b", ":", "1.1\x00"], numbers=[1, 3, 65_500, 65_502, "160"])


@st.composite
def corrupted_tokens(draw: st.DrawFn, tokens: list[str]) -> list[str]:
    """Plain-text ``key:value`` tokens with one or two dropped, changed or added."""
    tokens = list(tokens)
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(("value", "value", "value", "token", "drop", "extra")))
        if op == "extra" or not tokens:
            key = draw(st.sampled_from(["channel_id", "digit", "format", "x"]) | texts(6))
            value = draw(BAD.nasty_for("1") | BAD.nasty_for("x") | texts(8))
            tokens.insert(draw(st.integers(0, len(tokens))), f"{key}:{value}")
            continue
        at = draw(st.integers(0, len(tokens) - 1))
        key, colon, value = tokens[at].partition(":")
        if op == "drop":
            del tokens[at]
        elif op == "token":
            tokens[at] = str(draw(BAD.nasty_for(tokens[at])))
        else:
            tokens[at] = f"{key}{colon}{draw(BAD.nasty_for(value) | texts(8))}"
    return tokens


@st.composite
def structured(draw: st.DrawFn, fmt: ControlFormat, event: str | None = None) -> str:
    """A documented event in ``fmt``, mostly with a parameter or two wrong, perhaps then
    damaged as text."""
    codec, frame = draw(st.sampled_from(FRAMES))
    documented = event or draw(st.sampled_from(EVENTS))
    params = _params(documented, draw(st.sampled_from(MARK_IDS) | texts(8)), codec, frame)
    tokens = as_plain_tokens(documented, params)
    how = draw(st.sampled_from(("corrupt", "corrupt", "corrupt", "valid", "rename")))
    name = documented
    if how == "rename":  # another event's name on these parameters, or no event at all
        name = draw(st.sampled_from(["ANSWER", "MEDIA_STOP", "media_xon", "", *EVENTS]))
    if fmt is JSON:
        doc = as_json(name, params)
        if how == "corrupt":
            doc = draw(corrupted(doc, BAD))
        text = draw(serialized(doc))
    else:
        if how == "corrupt":
            tokens = draw(corrupted_tokens(tokens))
        separator = draw(st.sampled_from((" ",) * 6 + ("  ", "\t", "\n", "\r\n")))
        text = separator.join([name, *tokens])
    return draw(damaged(text))


#: Raw text (see :func:`~tests.telephony.fuzzing.raw_texts`), deep nesting inside
#: ``channel_variables``, and one huge line.
RAW: Final = raw_texts(
    words=['"MEDIA_XON"', "MEDIA_START"],
    nested_in='{"event":"MEDIA_START","channel_variables":',
    extras=[
        st.integers(1, 20_000).map(lambda n: "STATUS " + "a:b " * n),
        st.integers(1, 70_000).map(lambda n: "MEDIA_MARK_PROCESSED " + "x" * n),
    ],
)

#: BINARY frames: small, whole and partial samples, and around the 65,500-byte limit.
BINARY: Final[st.SearchStrategy[bytes]] = st.one_of(
    st.binary(max_size=700),
    st.sampled_from([0, 1, 2, 3, 159, 160, 161, 320, 65_500, 65_501]).map(bytes),
)


@dataclass(frozen=True)
class RecvText:
    text: str


@dataclass(frozen=True)
class RecvBytes:
    data: bytes


@dataclass(frozen=True)
class MediaFrames:
    audio: bytes


@dataclass(frozen=True)
class Call:
    """A call without arguments: answer, hangup, flush_tail, flush_media, mark_media
    (with the next fresh id, as the gateway does) or connection_closed."""

    name: str


@dataclass(frozen=True)
class MarkProcessed:
    """Asterisk's ``MEDIA_MARK_PROCESSED`` for the oldest outstanding mark, as it sends
    them [WS Commands]; for a flushed one when none is outstanding (the late event of
    [src handle_command]); a ``DTMF_END`` when there is neither."""


Action = RecvText | RecvBytes | MediaFrames | Call | MarkProcessed
CALLS: Final = (
    ("mark_media",) * 3
    + ("flush_tail", "flush_media") * 2
    + (
        "answer",
        "hangup",
        "connection_closed",
    )
)
#: Well-formed events a live channel sends, weighted roughly as a call sends them.
_LIVE: Final = (
    ("mark",) * 4
    + ("MEDIA_XOFF", "MEDIA_XON", "DTMF_END") * 2
    + (
        "STATUS",
        "ERROR",
        "QUEUE_DRAINED",
        "MEDIA_BUFFERING_COMPLETED",
        "rare",
    )
)
_RARE: Final = ("MEDIA_START", "MEDIA_MARK_PROCESSED")  # both fail a started leg
_WHOLE: Final = [b"\x7f" * 160, b"\x00" * 320, b"\x00" * 640]  # whole frames, every codec


@st.composite
def actions(draw: st.DrawFn, fmt: ControlFormat) -> Action:
    """One step. Most inbound frames are well-formed, so a script lives long enough to
    interleave many calls; a few are corrupted, raw or in the other control format."""
    kind = draw(
        st.sampled_from(
            ("live",) * 12
            + ("bad", "raw", "other")
            + ("bytes",) * 3
            + ("media",) * 5
            + ("call",) * 6
        )
    )
    if kind == "live":
        live = draw(st.sampled_from(_LIVE))
        if live == "mark":
            return MarkProcessed()
        if live == "rare":
            live = draw(st.sampled_from(_RARE))
        codec, frame = draw(st.sampled_from(FRAMES))
        return RecvText(event_text(fmt, live, draw(st.sampled_from(MARK_IDS)), codec, frame))
    if kind == "bad":
        return RecvText(draw(structured(fmt)))
    if kind == "other":  # the other control format: refused
        return RecvText(draw(structured(PLAIN if fmt is JSON else JSON)))
    if kind == "raw":
        return RecvText(draw(RAW))
    if kind == "bytes":
        return RecvBytes(draw(st.sampled_from(_WHOLE) | BINARY))
    if kind == "media":
        # AsteriskLeg.vendor_media: one 20 ms frame in the codec; any bytes are legal
        return MediaFrames(draw(st.sampled_from(_WHOLE) | st.binary(max_size=2_000)))
    return Call(draw(st.sampled_from(CALLS)))


@dataclass(frozen=True)
class Leg:
    """How the connection is made: its control format (None: detected) and limits."""

    control_format: ControlFormat | None
    max_message_bytes: int
    max_pending_marks: int


LEGS: Final = st.builds(
    Leg,
    st.sampled_from([None, PLAIN, JSON]),
    st.sampled_from([65_500, 1_000, 320, 160]),
    st.sampled_from([1_000, 2]),
)


@st.composite
def scripts(draw: st.DrawFn) -> tuple[Leg, list[Action]]:
    """Mostly a legal opening (MEDIA_START, then answer), then anything."""
    leg = draw(LEGS)
    fmt = leg.control_format or draw(st.sampled_from([PLAIN, JSON]))
    codec, frame = draw(st.sampled_from(FRAMES))
    opening: list[Action] = [RecvText(media_start(fmt, codec, frame)), Call("answer")]
    prefix = opening[: draw(st.sampled_from((2,) * 8 + (1, 0)))]
    return leg, prefix + draw(st.lists(actions(fmt), max_size=30))


# --------------------------------------------------------------------------- the oracle


class Checked:
    """A connection plus the little the oracle must remember: the outbound tail, the
    mark ids handed out, and those a flush reported cleared."""

    def __init__(self, leg: Leg) -> None:
        self.leg = leg
        self.conn = AsteriskConnection(
            control_format=leg.control_format,
            max_message_bytes=leg.max_message_bytes,
            max_pending_marks=leg.max_pending_marks,
        )
        self.tail = b""
        self.next_mark = 1
        self.flushed: set[str] = set()  # ever reported cleared by flush_media

    def run(self, action: Action) -> None:
        before = self.conn.state
        if isinstance(action, MarkProcessed):
            fmt = self.conn.control_format or PLAIN
            pending, flushed = self.conn.pending_marks, sorted(self.flushed)
            if pending or flushed:
                mark = pending[0] if pending else flushed[0]
                action = RecvText(event_text(fmt, "MEDIA_MARK_PROCESSED", mark))
            else:
                action = RecvText(event_text(fmt, "DTMF_END"))
        if isinstance(action, RecvText | RecvBytes):
            self.receive(action)
        elif isinstance(action, MediaFrames):
            self.media_frames(action.audio)
        else:
            self.call(action.name)
        after = self.conn.state
        assert after in AsteriskState
        if before is AsteriskState.FAILED:  # only connection_closed() leaves FAILED
            closed = isinstance(action, Call) and action.name == "connection_closed"
            assert after is (AsteriskState.CLOSED if closed else AsteriskState.FAILED)
        assert self.conn.buffered_bytes == len(self.tail)

    # ----------------------------------------------------------------- inbound

    def receive(self, action: RecvText | RecvBytes) -> None:
        conn, before, pending = self.conn, self.conn.state, self.conn.pending_marks
        try:
            if isinstance(action, RecvText):
                events = conn.receive_text(action.text)
            else:
                events = conn.receive_bytes(action.data)
        except AsteriskProtocolError as exc:
            assert before not in (AsteriskState.FAILED, AsteriskState.CLOSED)
            assert exc.code in PROTOCOL_CODES, exc
            assert conn.state is AsteriskState.FAILED
            assert_loggable(exc.message, exc.code)
            if exc.code is AsteriskErrorCode.UNKNOWN_MARK:
                assert conn.pending_marks == pending
            return
        except AsteriskUsageError as exc:
            expected = {
                AsteriskState.FAILED: AsteriskErrorCode.CONNECTION_FAILED,
                AsteriskState.CLOSED: AsteriskErrorCode.CLOSED,
            }.get(before)
            assert exc.code is expected, (exc.code, before)
            assert conn.state is before
            return
        assert before not in (AsteriskState.FAILED, AsteriskState.CLOSED)
        if isinstance(action, RecvBytes):
            assert events == [MediaReceived(action.data)]
            assert conn.state is TRANSITIONS[(before, Trigger.MEDIA)]
            return
        if not events:  # a late event for a mark flush_media already reported cleared
            assert conn.state is before is TRANSITIONS[(before, Trigger.NOTIFICATION)]
            assert conn.pending_marks == pending
            return
        [event] = events
        assert conn.state is TRANSITIONS[(before, TRIGGERS[type(event)])]
        self.check_event(event, pending)

    def check_event(self, event: AsteriskEvent, pending: tuple[str, ...]) -> None:
        conn = self.conn
        assert not isinstance(event, MediaReceived)
        if event.channel_id is not None:
            assert call_id_problem(event.channel_id) is None, event.channel_id
        if isinstance(event, MediaStart):
            assert call_id_problem(event.connection_id) is None, event.connection_id
            codec = CODECS[event.codec]
            assert (event.format, event.sample_rate) == (codec.format, codec.sample_rate)
            assert 0 < event.optimal_frame_size <= self.leg.max_message_bytes
            assert event.optimal_frame_size % codec.sample_bytes == 0
            assert event.ptime > 0
            assert all(isinstance(v, str) for v in event.channel_variables.values())
            assert conn.media_start is event and conn.control_format is not None
        elif isinstance(event, DtmfEnd):
            assert len(event.digit) == 1
        elif isinstance(event, MediaMarkProcessed):
            assert event.correlation_id in pending
            assert event.correlation_id not in conn.pending_marks
        elif isinstance(event, DriverStatus):
            assert all(type(n) is int for n in (event.queue_length, event.xon_level))
            assert all(type(b) is bool for b in (event.queue_full, event.media_paused))
        elif isinstance(event, DriverError):
            assert isinstance(event.error_text, str)

    # ----------------------------------------------------------------- outbound

    def usage_code(self, *, media: bool) -> AsteriskErrorCode | None:
        """The documented refusal of a gateway call in the current state, or None."""
        state = self.conn.state
        if state is AsteriskState.FAILED:
            return AsteriskErrorCode.CONNECTION_FAILED
        if state is AsteriskState.AWAITING_MEDIA_START:
            return AsteriskErrorCode.NOT_STARTED
        if state in (AsteriskState.CLOSING, AsteriskState.CLOSED):
            return AsteriskErrorCode.CLOSED
        if media and state is AsteriskState.PAUSED:
            return AsteriskErrorCode.FLOW_PAUSED
        return None

    def media_frames(self, audio: bytes) -> None:
        conn, before = self.conn, self.conn.state
        expected = self.usage_code(media=True)
        try:
            messages = conn.media_frames(audio)
        except AsteriskUsageError as exc:
            assert exc.code is expected, (exc.code, expected)
            assert conn.state is before
            return
        assert expected is None, expected
        assert conn.media_start is not None
        frame = conn.media_start.optimal_frame_size
        for message in messages:
            assert 0 < len(message) <= self.leg.max_message_bytes
            assert len(message) % frame == 0
        data = self.tail + audio
        sent = b"".join(messages)
        assert data.startswith(sent)
        self.tail = data[len(sent) :]
        assert len(self.tail) < frame
        assert conn.state is before

    def call(self, name: str) -> None:
        conn, before, pending = self.conn, self.conn.state, self.conn.pending_marks
        fmt = conn.control_format
        if name == "connection_closed":
            assert conn.connection_closed() == pending
            assert conn.state is TRANSITIONS[(before, Trigger.CONNECTION_CLOSED)]
            assert conn.pending_marks == ()
            self.tail = b""
            return
        if name == "hangup":
            if before is AsteriskState.FAILED:
                expected = AsteriskErrorCode.CONNECTION_FAILED
            elif fmt is None:
                expected = AsteriskErrorCode.FORMAT_UNKNOWN
            elif (before, Trigger.HANGUP) not in TRANSITIONS:
                expected = AsteriskErrorCode.CLOSED
            else:
                expected = None
        else:
            expected = self.usage_code(media=name == "flush_tail")
        mark = f"m{self.next_mark}"
        if name == "mark_media" and expected is None and len(pending) >= self.leg.max_pending_marks:
            expected = AsteriskErrorCode.TOO_MANY_MARKS
        try:
            result: Any = (
                getattr(conn, name)(mark) if name == "mark_media" else getattr(conn, name)()
            )
        except AsteriskUsageError as exc:
            assert exc.code is expected, (name, exc.code, expected)
            assert conn.state is before
            assert conn.pending_marks == pending
            return
        assert expected is None, (name, expected)
        assert fmt is not None
        if name == "hangup":
            assert result == encode_command(Command.HANGUP, fmt)
            assert conn.state is TRANSITIONS[(before, Trigger.HANGUP)]
            return
        assert conn.state is before
        if name == "answer":
            assert result == encode_command(Command.ANSWER, fmt)
        elif name == "mark_media":
            assert result == encode_command(Command.MARK_MEDIA, fmt, correlation_id=mark)
            assert conn.pending_marks == (*pending, mark)
            self.next_mark += 1
        elif name == "flush_media":
            assert result.text == encode_command(Command.FLUSH_MEDIA, fmt)
            assert result.cleared_marks == pending
            assert conn.pending_marks == ()
            self.flushed.update(pending)
            self.tail = b""
        else:
            assert name == "flush_tail"
            assert conn.media_start is not None
            if not self.tail:
                assert result == []
            else:
                [frame] = result
                assert len(frame) == conn.media_start.optimal_frame_size
                assert frame.startswith(self.tail)
            self.tail = b""


# --------------------------------------------------------------------------- the targets


@FUZZ
@given(script=scripts())
def test_fuzz_whole_scripts_through_one_connection(script: tuple[Leg, list[Action]]) -> None:
    leg, steps = script
    checked = Checked(leg)
    for action in steps:
        checked.run(action)


@pytest.mark.parametrize("fmt", [PLAIN, JSON])
@pytest.mark.parametrize("event", EVENTS)
@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_fuzz_each_event_where_it_is_legal(
    data: st.DataObject, event: str, fmt: ControlFormat
) -> None:
    """Each event, corrupted, in a state where it is legal (MEDIA_START first, the rest
    once started), after a mark so that mark events can match: only its parameters can
    be wrong there, so every parameter's parser is reached."""
    checked = Checked(Leg(fmt, 65_500, 1_000))
    if event != "MEDIA_START":
        checked.run(RecvText(media_start(fmt)))
        checked.run(Call("mark_media"))
    checked.run(RecvText(data.draw(structured(fmt, event), label="text")))
    checked.run(MediaFrames(b"\xff" * 200))
    checked.run(Call("flush_tail"))
    checked.run(Call("flush_media"))
    checked.run(Call("hangup"))


@FUZZ
@given(
    leg=LEGS,
    frame=st.one_of(RAW.map(RecvText), BINARY.map(RecvBytes)),
    opening=st.sampled_from(["started", "none", "hangup"]),
)
def test_fuzz_raw_frames(leg: Leg, frame: RecvText | RecvBytes, opening: str) -> None:
    """Raw text and bytes after MEDIA_START (with two marks outstanding, the limit of
    some legs), before it, or after a hangup before it; then every gateway call."""
    checked = Checked(leg)
    if opening == "started":
        checked.run(RecvText(media_start(leg.control_format or PLAIN)))
        checked.run(Call("mark_media"))
        checked.run(Call("mark_media"))
    elif opening == "hangup":
        checked.run(Call("hangup"))  # CLOSING when the leg's format is configured
    checked.run(frame)
    for name in ("answer", "mark_media", "flush_tail", "flush_media", "hangup"):
        checked.run(Call(name))


_AUDIO: Final = bytes(range(256)) * 274  # 70,144 bytes, none like its neighbour


@FUZZ
@given(
    start=st.sampled_from(FRAMES),
    message_frames=st.integers(1, 5),
    steps=st.lists(
        st.one_of(
            st.integers(0, 2_000).map(lambda n: MediaFrames(_AUDIO[:n])),
            st.integers(0, 2_000).map(lambda n: MediaFrames(_AUDIO[:n])),
            st.integers(0, 70_000).map(lambda n: MediaFrames(_AUDIO[:n])),
            st.just(Call("flush_tail")),
            st.sampled_from(["flush_tail", "flush_media", "mark_media"]).map(Call),
            st.sampled_from(["MEDIA_XOFF", "MEDIA_XON"]).map(RecvText),
        ),
        max_size=20,
    ),
)
def test_fuzz_outbound_media(
    start: tuple[str, int], message_frames: int, steps: list[Action]
) -> None:
    """Audio in chunks of any size, odd ones included, through media_frames, flush_tail,
    flush_media and flow control, on legs whose message limit holds 1..5 frames: whole
    frames out, never over the limit, nothing lost, nothing invented."""
    codec, frame = start
    checked = Checked(Leg(PLAIN, min(frame * message_frames, 65_500), 2))
    checked.run(RecvText(media_start(PLAIN, codec, frame)))
    for step in steps:
        checked.run(step)


def test_oracle_sees_a_documented_life() -> None:
    """The oracle itself: a legal life passes, with marks, a flush and a late mark."""
    for fmt in (PLAIN, JSON):
        checked = Checked(Leg(None, 65_500, 1_000))
        life: list[Action] = [
            RecvText(media_start(fmt)),
            Call("answer"),
            MediaFrames(b"\xff" * 250),
            Call("mark_media"),
            Call("mark_media"),
            RecvText(event_text(fmt, "MEDIA_XOFF")),
            Call("flush_media"),
            RecvText(event_text(fmt, "MEDIA_XON")),
            RecvText(event_text(fmt, "MEDIA_MARK_PROCESSED", "m1")),  # late, reported cleared
            Call("mark_media"),
            RecvText(event_text(fmt, "MEDIA_MARK_PROCESSED", "m3")),
            MediaFrames(b"\xff" * 100),
            Call("flush_tail"),
            RecvBytes(b"\x7f" * 160),
            Call("hangup"),
            Call("connection_closed"),
        ]
        for action in life:
            checked.run(action)
        assert checked.conn.state is AsteriskState.CLOSED
