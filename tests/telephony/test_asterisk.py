"""Asterisk chan_websocket core, byte for byte, without an event loop.

Fixtures come from the Asterisk "WebSocket" channel driver page,
https://docs.asterisk.org/Configuration/Channel-Drivers/WebSocket (section "Control
Commands and Events" and the "Events" list), from the commit that added the JSON format
(asterisk/asterisk f08020df80, "chan_websocket: Add capability for JSON control messages
and events"), and, where the page gives no example, from the layouts that
channels/chan_websocket.c writes (its ``_create_event_*`` functions); each is marked.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from telephony.asterisk import (
    CODECS,
    COMMAND_MAX_BYTES,
    MAX_MESSAGE_BYTES,
    TRANSITIONS,
    AsteriskConnection,
    AsteriskError,
    AsteriskErrorCode,
    AsteriskProtocolError,
    AsteriskState,
    AsteriskUsageError,
    Command,
    ControlFormat,
    DriverError,
    DriverStatus,
    DtmfEnd,
    FlushMedia,
    MediaBufferingCompleted,
    MediaDirection,
    MediaMarkProcessed,
    MediaReceived,
    MediaStart,
    MediaXoff,
    MediaXon,
    QueueDrained,
    Trigger,
    encode_command,
    format_for_codec,
)
from telephony.limits import MAX_CALL_ID_CHARS

PLAIN = ControlFormat.PLAIN_TEXT
JSON = ControlFormat.JSON

# --- Documented examples ----------------------------------------------------------------

# "Control Commands and Events": "Example plain-text MEDIA_START event"
DOC_PLAIN_MEDIA_START = (
    "MEDIA_START connection_id:e226e283-c90a-4ea9-9e37-389000b9ef47 "
    "channel:WebSocket/connectionid channel_id:pbx1-123456789.999 format:ulaw "
    "optimal_frame_size:160 ptime:20"
)

# "Control Commands and Events": the original plain-text example (no channel_id, no ptime;
# the first releases, 20.16.0/22.6.0, wrote MEDIA_START like this)
DOC_PLAIN_MEDIA_START_ORIGINAL = (
    "MEDIA_START connection_id:e226e283-c90a-4ea9-9e37-389000b9ef47 "
    "channel:WebSocket/connectionid format:ulaw optimal_frame_size:160"
)

# "Control Commands and Events": "Example MEDIA_START event" (JSON, pretty-printed)
DOC_JSON_MEDIA_START = """{
        "event": "MEDIA_START",
        "connection_id": "e226e283-c90a-4ea9-9e37-389000b9ef47",
        "channel": "WebSocket/connectionid",
        "channel_id": "pbx1-123456789.999",
        "format": "ulaw",
        "optimal_frame_size": 160,
        "ptime": 20,
        "channel_variables": {
            "SOME_CHANNEL_VARIABLE": "some value",
            "ANOTHER_CHANNEL_VARIABLE": "some other value"
        }
    }"""

# Commit f08020df80's MEDIA_START, compact as Asterisk writes it (AST_JSON_COMPACT)
COMMIT_JSON_MEDIA_START = (
    '{"event":"MEDIA_START","connection_id":"media_connection1",'
    '"channel":"WebSocket/media_connection1/0x5140001a0040","channel_id":"1761245643.1",'
    '"format":"ulaw","optimal_frame_size":160,"ptime":20,"channel_variables":'
    '{"DIALEDPEERNUMBER":"media_connection1/c(ulaw)",'
    '"MEDIA_WEBSOCKET_CONNECTION_ID":"media_connection1",'
    '"MEDIA_WEBSOCKET_OPTIMAL_FRAME_SIZE":"160"}}'
)

# "Events": "STATUS" example (plain-text, before channel_id was added)
DOC_PLAIN_STATUS = (
    "STATUS queue_length:43 xon_level:800 xoff_level:900 queue_full:false bulk_media:true "
    "media_paused:false"
)

# "Control Commands and Events": "Example plain-text STOP_MEDIA_BUFFERING command"
DOC_PLAIN_STOP_BUFFERING = "STOP_MEDIA_BUFFERING 61ea9311-d501-46e5-8825-017b342b39f2"

# "Control Commands and Events": "Example STOP_MEDIA_BUFFERING command" (JSON)
DOC_JSON_STOP_BUFFERING = """{
        "command": "STOP_MEDIA_BUFFERING",
        "correlation_id": "61ea9311-d501-46e5-8825-017b342b39f2"
    }"""

CHANNEL_ID = "pbx1-123456789.999"


def active(fmt: ControlFormat = PLAIN, start: str | None = None) -> AsteriskConnection:
    conn = AsteriskConnection(control_format=fmt)
    conn.receive_text(
        start
        if start is not None
        else (DOC_PLAIN_MEDIA_START if fmt is PLAIN else DOC_JSON_MEDIA_START)
    )
    return conn


def json_event(event: str, **fields: Any) -> str:
    return json.dumps({"event": event, "channel_id": CHANNEL_ID, **fields}, separators=(",", ":"))


def plain_media_start(fmt: str, frame: int, ptime: int = 20) -> str:
    return (
        f"MEDIA_START connection_id:c channel:WebSocket/c channel_id:1.1 format:{fmt} "
        f"optimal_frame_size:{frame} ptime:{ptime}"
    )


def expect_protocol_error(
    conn: AsteriskConnection, frame: str | bytes, code: AsteriskErrorCode
) -> AsteriskProtocolError:
    with pytest.raises(AsteriskProtocolError) as info:
        if isinstance(frame, str):
            conn.receive_text(frame)
        else:
            conn.receive_bytes(frame)
    assert info.value.code is code
    assert conn.state is AsteriskState.FAILED
    return info.value


def expect_usage_error(call: Any, code: AsteriskErrorCode) -> None:
    with pytest.raises(AsteriskUsageError) as info:
        call()
    assert info.value.code is code


# --------------------------------------------------------------------------- MEDIA_START


def test_plain_media_start_documented_example() -> None:
    conn = AsteriskConnection()
    [event] = conn.receive_text(DOC_PLAIN_MEDIA_START)
    assert event == MediaStart(
        connection_id="e226e283-c90a-4ea9-9e37-389000b9ef47",
        channel="WebSocket/connectionid",
        channel_id=CHANNEL_ID,
        codec="ulaw",
        format="mulaw_8000",
        sample_rate=8000,
        optimal_frame_size=160,
        ptime=20,
        channel_variables={},
    )
    assert conn.state is AsteriskState.ACTIVE
    assert conn.can_send
    assert conn.control_format is PLAIN
    assert conn.media_start is event


def test_plain_media_start_original_layout() -> None:
    [event] = AsteriskConnection(control_format=PLAIN).receive_text(DOC_PLAIN_MEDIA_START_ORIGINAL)
    assert isinstance(event, MediaStart)
    assert (event.channel_id, event.ptime, event.optimal_frame_size) == (None, 20, 160)


def test_json_media_start_documented_example() -> None:
    conn = AsteriskConnection()
    [event] = conn.receive_text(DOC_JSON_MEDIA_START)
    assert event == MediaStart(
        connection_id="e226e283-c90a-4ea9-9e37-389000b9ef47",
        channel="WebSocket/connectionid",
        channel_id=CHANNEL_ID,
        codec="ulaw",
        format="mulaw_8000",
        sample_rate=8000,
        optimal_frame_size=160,
        ptime=20,
        channel_variables={
            "SOME_CHANNEL_VARIABLE": "some value",
            "ANOTHER_CHANNEL_VARIABLE": "some other value",
        },
    )
    assert conn.control_format is JSON
    assert "some value" not in repr(event)


def test_json_media_start_from_the_commit_compact() -> None:
    [event] = AsteriskConnection(control_format=JSON).receive_text(COMMIT_JSON_MEDIA_START)
    assert isinstance(event, MediaStart)
    assert event.channel == "WebSocket/media_connection1/0x5140001a0040"
    assert event.channel_id == "1761245643.1"
    assert event.channel_variables["MEDIA_WEBSOCKET_OPTIMAL_FRAME_SIZE"] == "160"


def test_plain_parameters_tolerate_extra_spaces_and_unknown_keys() -> None:
    text = (
        "MEDIA_START  connection_id:c channel:WebSocket/a:b format:alaw  "
        "optimal_frame_size:160 new_key:1 "
    )
    [event] = AsteriskConnection().receive_text(text)
    assert isinstance(event, MediaStart)
    assert event.channel == "WebSocket/a:b"  # values split at the first colon only
    assert event.format == "alaw_8000"


@pytest.mark.parametrize(
    ("codec", "fmt", "rate", "frame"),
    [
        # optimal_frame_size = default_ms * minimum_bytes / minimum_ms [src websocket_new]
        ("ulaw", "mulaw_8000", 8000, 160),
        ("alaw", "alaw_8000", 8000, 160),
        ("slin", "pcm_8000", 8000, 320),
        ("slin16", "pcm_16000", 16000, 640),
    ],
)
def test_supported_codecs(codec: str, fmt: str, rate: int, frame: int) -> None:
    assert format_for_codec(codec) == fmt
    assert (CODECS[codec].format, CODECS[codec].sample_rate) == (fmt, rate)
    for control in ControlFormat:
        text = (
            plain_media_start(codec, frame)
            if control is PLAIN
            else json_event(
                "MEDIA_START",
                connection_id="c",
                channel="WebSocket/c",
                format=codec,
                optimal_frame_size=frame,
                ptime=20,
            )
        )
        [event] = AsteriskConnection(control_format=control).receive_text(text)
        assert isinstance(event, MediaStart)
        assert (event.codec, event.format, event.sample_rate, event.optimal_frame_size) == (
            codec,
            fmt,
            rate,
            frame,
        )


@pytest.mark.parametrize("codec", ["opus", "g722", "slin24", "slin48", "g729", "ULAW"])
def test_unsupported_codecs(codec: str) -> None:
    with pytest.raises(AsteriskProtocolError) as info:
        format_for_codec(codec)
    assert info.value.code is AsteriskErrorCode.UNSUPPORTED_CODEC
    expect_protocol_error(
        AsteriskConnection(), plain_media_start(codec, 160), AsteriskErrorCode.UNSUPPORTED_CODEC
    )


# --------------------------------------------------------------------------- other events


@pytest.mark.parametrize(
    ("fmt", "text", "event"),
    [
        # [src _create_event_DTMF_END] "%s digit:%c channel_id:%s"; before 4da19a9459 no id
        (PLAIN, "DTMF_END digit:5 channel_id:pbx1-123456789.999", DtmfEnd("5", CHANNEL_ID)),
        (PLAIN, "DTMF_END digit:#", DtmfEnd("#", None)),
        (JSON, json_event("DTMF_END", digit="*"), DtmfEnd("*", CHANNEL_ID)),
        # [src _create_event_nodata]: the bare name, or {"event", "channel_id"}
        (PLAIN, "MEDIA_XOFF", MediaXoff(None)),
        (JSON, json_event("MEDIA_XOFF"), MediaXoff(CHANNEL_ID)),
        (PLAIN, "QUEUE_DRAINED", QueueDrained(None)),
        (JSON, json_event("QUEUE_DRAINED"), QueueDrained(CHANNEL_ID)),
        # [src _create_event_MEDIA_BUFFERING_COMPLETED] "NAME[ id]" / correlation_id ""
        (
            PLAIN,
            "MEDIA_BUFFERING_COMPLETED 61ea9311-d501-46e5-8825-017b342b39f2",
            MediaBufferingCompleted("61ea9311-d501-46e5-8825-017b342b39f2", None),
        ),
        (PLAIN, "MEDIA_BUFFERING_COMPLETED", MediaBufferingCompleted(None, None)),
        (
            JSON,
            json_event("MEDIA_BUFFERING_COMPLETED", correlation_id="b1"),
            MediaBufferingCompleted("b1", CHANNEL_ID),
        ),
        (
            JSON,
            json_event("MEDIA_BUFFERING_COMPLETED", correlation_id=""),
            MediaBufferingCompleted(None, CHANNEL_ID),
        ),
        # "Events": STATUS example
        (PLAIN, DOC_PLAIN_STATUS, DriverStatus(None, 43, 800, 900, False, True, False)),
        (
            PLAIN,
            "STATUS channel_id:1.2 queue_length:0 xon_level:800 xoff_level:900 "
            "queue_full:true bulk_media:false media_paused:true",
            DriverStatus("1.2", 0, 800, 900, True, False, True),
        ),
        (
            JSON,
            json_event(
                "STATUS",
                queue_length=43,
                xon_level=800,
                xoff_level=900,
                queue_full=False,
                bulk_media=True,
                media_paused=False,
            ),
            DriverStatus(CHANNEL_ID, 43, 800, 900, False, True, False),
        ),
        # [src _create_event_ERROR] "ERROR channel_id:%s error_text:%s"
        (
            PLAIN,
            "ERROR channel_id:1.2 error_text:MARK_MEDIA not supported in passthrough mode",
            DriverError("MARK_MEDIA not supported in passthrough mode", "1.2"),
        ),
        (
            JSON,
            json_event("ERROR", error_text="SET_MEDIA_DIRECTION only supports JSON format.\n"),
            DriverError("SET_MEDIA_DIRECTION only supports JSON format.", CHANNEL_ID),
        ),
    ],
)
def test_notification_events(fmt: ControlFormat, text: str, event: Any) -> None:
    conn = active(fmt)
    assert conn.receive_text(text) == [event]


def test_xoff_xon_drive_can_send_in_both_formats() -> None:
    for fmt, xoff, xon in [
        (PLAIN, "MEDIA_XOFF", "MEDIA_XON"),
        (JSON, json_event("MEDIA_XOFF"), json_event("MEDIA_XON")),
    ]:
        conn = active(fmt)
        assert conn.can_send
        assert conn.receive_text(xoff) == [MediaXoff(None if fmt is PLAIN else CHANNEL_ID)]
        assert conn.state is AsteriskState.PAUSED
        assert not conn.can_send
        expect_usage_error(
            lambda c=conn: c.media_frames(b"\xff" * 160), AsteriskErrorCode.FLOW_PAUSED
        )
        expect_usage_error(lambda c=conn: c.flush_tail(), AsteriskErrorCode.FLOW_PAUSED)
        conn.mark_media("still-ok")  # commands are still allowed while paused
        assert conn.receive_text(xon) == [MediaXon(None if fmt is PLAIN else CHANNEL_ID)]
        assert conn.state is AsteriskState.ACTIVE
        assert conn.can_send
        assert conn.media_frames(b"\xff" * 160) == [b"\xff" * 160]


def test_repeated_xon_and_xoff_are_no_ops() -> None:
    conn = active()
    conn.receive_text("MEDIA_XON")
    assert conn.can_send
    conn.receive_text("MEDIA_XOFF")
    conn.receive_text("MEDIA_XOFF")
    assert conn.state is AsteriskState.PAUSED


def test_binary_media_in() -> None:
    conn = active()
    assert conn.receive_bytes(b"\x7f" * 160) == [MediaReceived(b"\x7f" * 160)]
    assert "payload=" not in repr(MediaReceived(b"x"))
    conn.receive_text("MEDIA_XOFF")
    assert conn.receive_bytes(b"\x7f") == [MediaReceived(b"\x7f")]  # inbound media continues


# --------------------------------------------------------------------------- commands


PLAIN_COMMANDS = {
    Command.ANSWER: "ANSWER",
    Command.HANGUP: "HANGUP",
    Command.START_MEDIA_BUFFERING: "START_MEDIA_BUFFERING",
    Command.STOP_MEDIA_BUFFERING: "STOP_MEDIA_BUFFERING",
    Command.FLUSH_MEDIA: "FLUSH_MEDIA",
    Command.PAUSE_MEDIA: "PAUSE_MEDIA",
    Command.CONTINUE_MEDIA: "CONTINUE_MEDIA",
    Command.MARK_MEDIA: "MARK_MEDIA",
    Command.GET_STATUS: "GET_STATUS",
    Command.REPORT_QUEUE_DRAINED: "REPORT_QUEUE_DRAINED",
}


@pytest.mark.parametrize(("command", "line"), list(PLAIN_COMMANDS.items()))
def test_plain_commands_exact(command: Command, line: str) -> None:
    assert encode_command(command, PLAIN) == line


@pytest.mark.parametrize("command", [c for c in Command if c is not Command.SET_MEDIA_DIRECTION])
def test_json_commands_exact(command: Command) -> None:
    text = encode_command(command, JSON)
    assert text == '{"command":"' + command.value + '"}'
    assert json.loads(text) == {"command": command.value}


def test_stop_media_buffering_documented_examples() -> None:
    cid = "61ea9311-d501-46e5-8825-017b342b39f2"
    assert encode_command(Command.STOP_MEDIA_BUFFERING, PLAIN, correlation_id=cid) == (
        DOC_PLAIN_STOP_BUFFERING
    )
    text = encode_command(Command.STOP_MEDIA_BUFFERING, JSON, correlation_id=cid)
    assert json.loads(text) == json.loads(DOC_JSON_STOP_BUFFERING)
    assert text == '{"command":"STOP_MEDIA_BUFFERING","correlation_id":"' + cid + '"}'


def test_mark_media_both_formats_exact() -> None:
    assert active(PLAIN).mark_media("utt-7.m1") == "MARK_MEDIA utt-7.m1"
    text = active(JSON).mark_media("utt-7.m1")
    assert text == '{"command":"MARK_MEDIA","correlation_id":"utt-7.m1"}'
    assert json.loads(text) == {"command": "MARK_MEDIA", "correlation_id": "utt-7.m1"}


def test_set_media_direction_is_json_only() -> None:
    assert (
        encode_command(Command.SET_MEDIA_DIRECTION, JSON, direction=MediaDirection.OUT)
        == '{"command":"SET_MEDIA_DIRECTION","direction":"out"}'
    )
    expect_usage_error(
        lambda: encode_command(Command.SET_MEDIA_DIRECTION, PLAIN, direction=MediaDirection.IN),
        AsteriskErrorCode.JSON_ONLY,
    )


@pytest.mark.parametrize(
    ("call"),
    [
        lambda: encode_command(Command.ANSWER, PLAIN, correlation_id="x"),
        lambda: encode_command(Command.SET_MEDIA_DIRECTION, JSON),
        lambda: encode_command(Command.ANSWER, JSON, direction=MediaDirection.BOTH),
    ],
)
def test_invalid_command_arguments(call: Any) -> None:
    expect_usage_error(call, AsteriskErrorCode.INVALID_ARGUMENT)


@pytest.mark.parametrize("cid", ["", "has space", 'quote"', "back\\slash", "tab\t", "é", "x" * 129])
def test_invalid_correlation_ids(cid: str) -> None:
    expect_usage_error(
        lambda: encode_command(Command.MARK_MEDIA, PLAIN, correlation_id=cid),
        AsteriskErrorCode.INVALID_CORRELATION_ID,
    )


def test_commands_never_exceed_128_bytes() -> None:
    # Asterisk drops TEXT frames over 128 bytes [src MAX_TEXT_MESSAGE_LEN].
    assert COMMAND_MAX_BYTES == 128
    fits = "x" * 74  # the longest id that fits every command in both formats
    for fmt in ControlFormat:
        for command in (Command.MARK_MEDIA, Command.STOP_MEDIA_BUFFERING):
            assert len(encode_command(command, fmt, correlation_id=fits)) <= 128
    assert len(encode_command(Command.MARK_MEDIA, PLAIN, correlation_id="x" * 117)) == 128
    expect_usage_error(
        lambda: encode_command(Command.MARK_MEDIA, PLAIN, correlation_id="x" * 118),
        AsteriskErrorCode.COMMAND_TOO_LONG,
    )
    expect_usage_error(
        lambda: encode_command(Command.STOP_MEDIA_BUFFERING, JSON, correlation_id="x" * 75),
        AsteriskErrorCode.COMMAND_TOO_LONG,
    )


def test_connection_commands_use_the_negotiated_format() -> None:
    plain, js = active(PLAIN), active(JSON)
    for name, line in [
        ("answer", "ANSWER"),
        ("start_media_buffering", "START_MEDIA_BUFFERING"),
        ("pause_media", "PAUSE_MEDIA"),
        ("continue_media", "CONTINUE_MEDIA"),
        ("get_status", "GET_STATUS"),
        ("report_queue_drained", "REPORT_QUEUE_DRAINED"),
    ]:
        assert getattr(plain, name)() == line
        assert getattr(js, name)() == '{"command":"' + line + '"}'
    assert plain.stop_media_buffering() == "STOP_MEDIA_BUFFERING"
    assert plain.stop_media_buffering("b1") == "STOP_MEDIA_BUFFERING b1"
    assert (
        js.stop_media_buffering("b1") == '{"command":"STOP_MEDIA_BUFFERING","correlation_id":"b1"}'
    )
    assert plain.flush_media() == FlushMedia("FLUSH_MEDIA", ())
    assert js.flush_media() == FlushMedia('{"command":"FLUSH_MEDIA"}', ())
    assert plain.hangup() == "HANGUP"
    assert js.hangup() == '{"command":"HANGUP"}'


# --------------------------------------------------------------------------- outbound media


def test_media_frames_exact_frames_pass_through() -> None:
    conn = active()
    audio = bytes(range(160))
    assert conn.media_frames(audio) == [audio]
    assert conn.buffered_bytes == 0


def test_media_frames_hold_back_a_partial_frame() -> None:
    conn = active()
    audio = bytes(i % 256 for i in range(400))
    assert conn.media_frames(audio) == [audio[:320]]
    assert conn.buffered_bytes == 80
    assert conn.media_frames(b"") == []
    assert conn.media_frames(audio[:80]) == [audio[320:400] + audio[:80]]
    assert conn.buffered_bytes == 0


def test_media_frames_respect_the_65500_byte_cap_with_a_large_buffer() -> None:
    conn = active()
    audio = bytes(i % 251 for i in range(8000 * 60))  # one minute of mu-law
    messages = conn.media_frames(audio)
    assert MAX_MESSAGE_BYTES == 65_500
    assert all(len(m) <= 65_500 for m in messages)
    assert all(len(m) % 160 == 0 for m in messages)
    assert len(messages[0]) == 65_440  # 409 whole 160-byte frames
    assert b"".join(messages) == audio
    assert conn.buffered_bytes == 0


def test_media_frames_cap_for_slin16() -> None:
    conn = active(start=plain_media_start("slin16", 640))
    audio = bytes(1_000_001)
    messages = conn.media_frames(audio)
    assert {len(m) for m in messages[:-1]} == {65_280}  # 102 frames of 640 bytes
    assert all(len(m) <= 65_500 and len(m) % 640 == 0 for m in messages)
    assert b"".join(messages) == audio[: len(audio) - len(audio) % 640]
    assert conn.buffered_bytes == len(audio) % 640


def test_media_frames_smaller_message_limit() -> None:
    conn = AsteriskConnection(control_format=PLAIN, max_message_bytes=500)
    conn.receive_text(DOC_PLAIN_MEDIA_START)
    messages = conn.media_frames(bytes(1000))
    assert [len(m) for m in messages] == [480, 480]
    assert conn.buffered_bytes == 40


@pytest.mark.parametrize(
    ("codec", "frame", "silence"),
    [
        ("ulaw", 160, b"\xff"),
        ("alaw", 160, b"\xd5"),
        ("slin", 320, b"\x00"),
        ("slin16", 640, b"\x00"),
    ],
)
def test_flush_tail_pads_with_codec_silence(codec: str, frame: int, silence: bytes) -> None:
    conn = active(start=plain_media_start(codec, frame))
    assert conn.flush_tail() == []
    assert conn.media_frames(b"\x01\x02" * 5) == []
    [padded] = conn.flush_tail()
    assert padded == b"\x01\x02" * 5 + silence * (frame - 10)
    assert conn.buffered_bytes == 0


def test_flush_media_drops_the_tail() -> None:
    conn = active()
    conn.media_frames(b"\x01" * 10)
    conn.flush_media()
    assert conn.buffered_bytes == 0
    assert conn.flush_tail() == []


def test_message_limit_is_bounded_by_asterisk() -> None:
    with pytest.raises(ValueError):
        AsteriskConnection(max_message_bytes=65_501)
    with pytest.raises(ValueError):
        AsteriskConnection(max_message_bytes=0)
    with pytest.raises(ValueError):
        AsteriskConnection(max_pending_marks=0)


def test_frame_size_larger_than_message_limit_is_rejected() -> None:
    # A frame that cannot fit one message would make every media message impossible.
    conn = AsteriskConnection(max_message_bytes=100)
    expect_protocol_error(conn, DOC_PLAIN_MEDIA_START, AsteriskErrorCode.INVALID_FRAME_SIZE)


# --------------------------------------------------------------------------- marks


def test_mark_processed_in_both_formats() -> None:
    for fmt, echo in [
        # [src _create_event_MEDIA_MARK_PROCESSED]: "MEDIA_MARK_PROCESSED <id>" / JSON
        (PLAIN, "MEDIA_MARK_PROCESSED m-1"),
        (JSON, json_event("MEDIA_MARK_PROCESSED", correlation_id="m-1")),
    ]:
        conn = active(fmt)
        conn.mark_media("m-1")
        assert conn.pending_marks == ("m-1",)
        [event] = conn.receive_text(echo)
        assert event == MediaMarkProcessed("m-1", None if fmt is PLAIN else CHANNEL_ID)
        assert not conn.pending_marks


def test_flush_reports_outstanding_marks_as_cleared() -> None:
    conn = active()
    conn.mark_media("a")
    conn.mark_media("b")
    flushed = conn.flush_media()
    assert flushed == FlushMedia("FLUSH_MEDIA", ("a", "b"))
    assert conn.pending_marks == ()
    # "a" was processed just before Asterisk saw FLUSH_MEDIA: its event is late, and it
    # was already reported cleared, so nothing more is reported.
    assert conn.receive_text("MEDIA_MARK_PROCESSED a") == []
    conn.mark_media("c")
    assert conn.receive_text("MEDIA_MARK_PROCESSED c") == [MediaMarkProcessed("c", None)]
    # after a post-flush mark, no pre-flush mark can still arrive
    expect_protocol_error(conn, "MEDIA_MARK_PROCESSED b", AsteriskErrorCode.UNKNOWN_MARK)


def test_duplicate_and_too_many_marks() -> None:
    conn = AsteriskConnection(max_pending_marks=2)
    conn.receive_text(DOC_PLAIN_MEDIA_START)
    conn.mark_media("a")
    expect_usage_error(lambda: conn.mark_media("a"), AsteriskErrorCode.DUPLICATE_MARK)
    conn.mark_media("b")
    expect_usage_error(lambda: conn.mark_media("c"), AsteriskErrorCode.TOO_MANY_MARKS)
    conn.flush_media()
    expect_usage_error(lambda: conn.mark_media("a"), AsteriskErrorCode.DUPLICATE_MARK)
    expect_usage_error(lambda: conn.mark_media("bad id"), AsteriskErrorCode.INVALID_CORRELATION_ID)
    assert conn.pending_marks == ()


def test_connection_closed_returns_unreported_marks() -> None:
    conn = active()
    conn.mark_media("a")
    assert conn.connection_closed() == ("a",)
    assert conn.state is AsteriskState.CLOSED
    assert conn.connection_closed() == ()  # idempotent


@pytest.mark.parametrize(
    "text",
    [
        "MEDIA_MARK_PROCESSED never-sent",
        "MEDIA_MARK_PROCESSED",
        json_event("MEDIA_MARK_PROCESSED", correlation_id=""),
    ],
)
def test_unknown_mark(text: str) -> None:
    fmt = JSON if text.startswith("{") else PLAIN
    expect_protocol_error(active(fmt), text, AsteriskErrorCode.UNKNOWN_MARK)


# --------------------------------------------------------------------------- state machine


REMOTE_FRAMES: dict[Trigger, str | bytes] = {
    Trigger.MEDIA_START: DOC_PLAIN_MEDIA_START,
    Trigger.MEDIA_XOFF: "MEDIA_XOFF",
    Trigger.MEDIA_XON: "MEDIA_XON",
    Trigger.NOTIFICATION: "DTMF_END digit:1",
    Trigger.MEDIA: b"\xff" * 160,
}


def _in_state(state: AsteriskState) -> AsteriskConnection:
    conn = AsteriskConnection(control_format=PLAIN)
    if state is AsteriskState.AWAITING_MEDIA_START:
        return conn
    if state is AsteriskState.FAILED:
        with pytest.raises(AsteriskProtocolError):
            conn.receive_text("NOT_AN_EVENT")
        return conn
    conn.receive_text(DOC_PLAIN_MEDIA_START)
    if state is AsteriskState.PAUSED:
        conn.receive_text("MEDIA_XOFF")
    elif state is AsteriskState.CLOSING:
        conn.hangup()
    elif state is AsteriskState.CLOSED:
        conn.connection_closed()
    assert conn.state is state
    return conn


def _feed(conn: AsteriskConnection, frame: str | bytes) -> None:
    if isinstance(frame, str):
        conn.receive_text(frame)
    else:
        conn.receive_bytes(frame)


@pytest.mark.parametrize("state", list(AsteriskState))
@pytest.mark.parametrize("trigger", list(REMOTE_FRAMES))
def test_remote_triggers_follow_the_table(state: AsteriskState, trigger: Trigger) -> None:
    conn = _in_state(state)
    frame = REMOTE_FRAMES[trigger]
    expected = TRANSITIONS.get((state, trigger))
    if expected is not None:
        _feed(conn, frame)
        assert conn.state is expected
    elif state is AsteriskState.FAILED:
        expect_usage_error(lambda: _feed(conn, frame), AsteriskErrorCode.CONNECTION_FAILED)
    elif state is AsteriskState.CLOSED:
        expect_usage_error(lambda: _feed(conn, frame), AsteriskErrorCode.CLOSED)
    else:
        code = (
            AsteriskErrorCode.MEDIA_BEFORE_START
            if trigger is Trigger.MEDIA
            else AsteriskErrorCode.UNEXPECTED_EVENT
        )
        expect_protocol_error(conn, frame, code)


@pytest.mark.parametrize("state", list(AsteriskState))
def test_local_triggers_follow_the_table(state: AsteriskState) -> None:
    conn = _in_state(state)
    expected = TRANSITIONS.get((state, Trigger.HANGUP))
    if expected is not None:
        assert conn.hangup() == "HANGUP"
        assert conn.state is expected
    else:
        with pytest.raises(AsteriskUsageError):
            conn.hangup()
        assert conn.state is state
    conn = _in_state(state)
    assert (state, Trigger.CONNECTION_CLOSED) in TRANSITIONS  # closing is always legal
    conn.connection_closed()
    assert conn.state is AsteriskState.CLOSED


def test_media_before_media_start() -> None:
    expect_protocol_error(AsteriskConnection(), b"\xff" * 160, AsteriskErrorCode.MEDIA_BEFORE_START)


def test_media_start_twice() -> None:
    expect_protocol_error(active(), DOC_PLAIN_MEDIA_START, AsteriskErrorCode.UNEXPECTED_EVENT)


def test_closing_still_accepts_events_but_no_commands() -> None:
    conn = active()
    conn.mark_media("m")
    assert conn.hangup() == "HANGUP"
    assert not conn.can_send
    assert conn.receive_text("MEDIA_MARK_PROCESSED m") == [MediaMarkProcessed("m", None)]
    assert conn.receive_bytes(b"\xff") == [MediaReceived(b"\xff")]
    expect_usage_error(conn.answer, AsteriskErrorCode.CLOSED)
    expect_usage_error(lambda: conn.media_frames(b"\xff" * 160), AsteriskErrorCode.CLOSED)
    expect_usage_error(conn.hangup, AsteriskErrorCode.CLOSED)


def test_commands_before_media_start() -> None:
    conn = AsteriskConnection(control_format=JSON)
    expect_usage_error(conn.answer, AsteriskErrorCode.NOT_STARTED)
    expect_usage_error(lambda: conn.mark_media("m"), AsteriskErrorCode.NOT_STARTED)
    expect_usage_error(lambda: conn.media_frames(b"\xff" * 160), AsteriskErrorCode.NOT_STARTED)
    assert conn.hangup() == '{"command":"HANGUP"}'  # bailing out is always possible
    assert conn.state is AsteriskState.CLOSING


def test_hangup_needs_a_known_format() -> None:
    expect_usage_error(AsteriskConnection().hangup, AsteriskErrorCode.FORMAT_UNKNOWN)


def test_after_failure_everything_is_local_misuse() -> None:
    conn = _in_state(AsteriskState.FAILED)
    for call in (
        conn.answer,
        conn.hangup,
        lambda: conn.media_frames(b"x"),
        lambda: conn.receive_bytes(b"x"),
    ):
        expect_usage_error(call, AsteriskErrorCode.CONNECTION_FAILED)


# --------------------------------------------------------------------------- control format


def test_format_is_detected_from_media_start() -> None:
    conn = AsteriskConnection()
    assert conn.control_format is None
    conn.receive_text(COMMIT_JSON_MEDIA_START)
    assert conn.control_format is JSON
    assert conn.answer() == '{"command":"ANSWER"}'


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (PLAIN, COMMIT_JSON_MEDIA_START),
        (JSON, DOC_PLAIN_MEDIA_START),
    ],
)
def test_wrong_control_format(fmt: ControlFormat, text: str) -> None:
    expect_protocol_error(
        AsteriskConnection(control_format=fmt), text, AsteriskErrorCode.WRONG_CONTROL_FORMAT
    )


def test_format_switch_mid_call_is_rejected() -> None:
    expect_protocol_error(
        active(PLAIN), json_event("MEDIA_XON"), AsteriskErrorCode.WRONG_CONTROL_FORMAT
    )
    expect_protocol_error(active(JSON), "MEDIA_XON", AsteriskErrorCode.WRONG_CONTROL_FORMAT)


# --------------------------------------------------------------------------- ids

#: One frame per place an id arrives, in both formats, with "{id}" where the id goes:
#: MEDIA_START connection_id and channel_id, and every other event's channel_id.
ID_FRAMES: list[tuple[ControlFormat, str]] = [
    (PLAIN, plain_media_start("ulaw", 160).replace("connection_id:c", "connection_id:{id}")),
    (PLAIN, plain_media_start("ulaw", 160).replace("channel_id:1.1", "channel_id:{id}")),
    (PLAIN, "DTMF_END digit:5 channel_id:{id}"),
    (PLAIN, DOC_PLAIN_STATUS + " channel_id:{id}"),
    (PLAIN, "ERROR channel_id:{id} error_text:MARK_MEDIA not supported"),
    *[
        (
            JSON,
            json.dumps(
                {
                    "event": "MEDIA_START",
                    "connection_id": "c",
                    "channel": "WebSocket/c",
                    "format": "ulaw",
                    "optimal_frame_size": 160,
                    key: "{id}",
                }
            ),
        )
        for key in ("connection_id", "channel_id")
    ],
    *[
        (JSON, json.dumps({"event": event, "channel_id": "{id}", **extra}))
        for event, extra in [
            ("DTMF_END", {"digit": "1"}),
            ("MEDIA_XOFF", {}),
            ("MEDIA_XON", {}),
            ("QUEUE_DRAINED", {}),
            ("MEDIA_BUFFERING_COMPLETED", {"correlation_id": ""}),
            ("MEDIA_MARK_PROCESSED", {"correlation_id": "m1"}),
            ("ERROR", {"error_text": "x"}),
        ]
    ],
]


def id_frame(fmt: ControlFormat, template: str, value: str) -> tuple[AsteriskConnection, str]:
    """A connection ready for ``template``'s event, and the frame with the id in place."""
    if "MEDIA_START" in template:
        conn = AsteriskConnection(control_format=fmt)
    else:
        conn = active(fmt)
        conn.mark_media("m1")
    if fmt is JSON:
        value = json.dumps(value)[1:-1]  # escaped as Asterisk's JSON writer would
    return conn, template.replace("{id}", value)


@pytest.mark.parametrize(("fmt", "template"), ID_FRAMES)
@pytest.mark.parametrize(
    "value",
    [
        "C" * 129,  # one over MAX_CALL_ID_CHARS
        "C" * 10_000,
        "1.1\t2",  # whitespace: tab, line separator, ideographic space
        "1.1\u20282",
        "1.1\u30002",
        "1.1\x002",  # control and format characters
        "1.1\x7f2",
        "1.1\u200b2",
    ],
)
def test_ids_too_long_or_not_printable_are_invalid_id(
    fmt: ControlFormat, template: str, value: str
) -> None:
    conn, text = id_frame(fmt, template, value)
    err = expect_protocol_error(conn, text, AsteriskErrorCode.INVALID_ID)
    assert "C" * 65 not in err.message  # never more than 64 characters of the id
    assert len(err.message) < 200
    assert err.message.isprintable()  # control characters quoted as repr escapes


@pytest.mark.parametrize(("fmt", "template"), [f for f in ID_FRAMES if f[0] is JSON])
@pytest.mark.parametrize("value", ["", "1.1 2", "\ud800"])  # json.loads gives lone surrogates
def test_json_ids_empty_with_space_or_surrogate_are_invalid_id(
    fmt: ControlFormat, template: str, value: str
) -> None:
    conn, text = id_frame(fmt, template, value)
    expect_protocol_error(conn, text, AsteriskErrorCode.INVALID_ID)


@pytest.mark.parametrize(("fmt", "template"), [f for f in ID_FRAMES if f[0] is PLAIN])
def test_plain_empty_ids_are_invalid_id(fmt: ControlFormat, template: str) -> None:
    conn, text = id_frame(fmt, template, "")
    err = expect_protocol_error(conn, text, AsteriskErrorCode.INVALID_ID)
    assert err.message.endswith("'' is empty")


@pytest.mark.parametrize(("fmt", "template"), ID_FRAMES)
@pytest.mark.parametrize(
    "value",
    [
        "C" * MAX_CALL_ID_CHARS,  # the bound itself
        CHANNEL_ID,
        "1761245643.1",
        "e226e283-c90a-4ea9-9e37-389000b9ef47",
        "通道-1",  # printable non-ASCII
    ],
)
def test_ids_of_any_printable_shape_up_to_128_chars_are_accepted(
    fmt: ControlFormat, template: str, value: str
) -> None:
    conn, text = id_frame(fmt, template, value)
    [event] = conn.receive_text(text)
    assert not isinstance(event, MediaReceived)
    assert value in (event.channel_id, getattr(event, "connection_id", None))


def test_plain_media_start_without_channel_id_is_still_accepted() -> None:
    [event] = AsteriskConnection().receive_text(DOC_PLAIN_MEDIA_START_ORIGINAL)
    assert isinstance(event, MediaStart) and event.channel_id is None


# --------------------------------------------------------------------------- error codes


def test_error_types_separate_remote_from_local() -> None:
    assert issubclass(AsteriskProtocolError, AsteriskError)
    assert issubclass(AsteriskUsageError, AsteriskError)
    assert not issubclass(AsteriskProtocolError, AsteriskUsageError)
    assert not issubclass(AsteriskUsageError, AsteriskProtocolError)
    err = AsteriskUsageError(AsteriskErrorCode.CLOSED, "detail")
    assert (err.code, err.message, str(err)) == ("closed", "detail", "closed: detail")


@pytest.mark.parametrize("text", ["{", '{"event": }', "{'event': 'MEDIA_XON'}"])
def test_invalid_json(text: str) -> None:
    expect_protocol_error(active(JSON), text, AsteriskErrorCode.INVALID_JSON)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "MEDIA_XON\nMEDIA_XOFF",
        "MEDIA_START connection_id",
        "MEDIA_START :value",
        "DTMF_END 5",
    ],
)
def test_malformed_plain_text(text: str) -> None:
    conn = AsteriskConnection(control_format=PLAIN)
    if text.startswith("DTMF"):
        conn.receive_text(DOC_PLAIN_MEDIA_START)
    expect_protocol_error(conn, text, AsteriskErrorCode.MALFORMED_MESSAGE)


def test_message_too_large() -> None:
    conn = AsteriskConnection(max_text_chars=50)
    expect_protocol_error(conn, DOC_PLAIN_MEDIA_START, AsteriskErrorCode.MESSAGE_TOO_LARGE)
    expect_protocol_error(active(), bytes(65_502), AsteriskErrorCode.MESSAGE_TOO_LARGE)


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (PLAIN, "MEDIA_STOP"),
        (PLAIN, "media_xon"),  # commands and events are case-sensitive
        (PLAIN, "ANSWER"),  # a command, not an event
        (JSON, json_event("MEDIA_PAUSED")),
    ],
)
def test_unknown_event(fmt: ControlFormat, text: str) -> None:
    expect_protocol_error(active(fmt), text, AsteriskErrorCode.UNKNOWN_EVENT)


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (PLAIN, "MEDIA_START connection_id:c channel:x format:ulaw"),
        (PLAIN, "MEDIA_START channel:x format:ulaw optimal_frame_size:160"),
        (PLAIN, "MEDIA_START connection_id:c format:ulaw optimal_frame_size:160"),
        (PLAIN, "MEDIA_START connection_id:c channel:x optimal_frame_size:160"),
        (JSON, '{"event":"MEDIA_START","connection_id":"c","channel":"x","format":"ulaw"}'),
        (JSON, '{"channel_id":"1.1"}'),
    ],
)
def test_missing_field_in_media_start(fmt: ControlFormat, text: str) -> None:
    expect_protocol_error(
        AsteriskConnection(control_format=fmt), text, AsteriskErrorCode.MISSING_FIELD
    )


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (PLAIN, "DTMF_END channel_id:1.1"),
        (PLAIN, "STATUS queue_length:1"),
        (PLAIN, "ERROR channel_id:1.1"),
        (JSON, json_event("DTMF_END")),
        (JSON, json_event("STATUS", queue_length=1)),
    ],
)
def test_missing_field_in_other_events(fmt: ControlFormat, text: str) -> None:
    expect_protocol_error(active(fmt), text, AsteriskErrorCode.MISSING_FIELD)


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (
            PLAIN,
            plain_media_start("ulaw", 160).replace(
                "optimal_frame_size:160", "optimal_frame_size:abc"
            ),
        ),
        (PLAIN, plain_media_start("ulaw", 160, ptime=0)),
        (PLAIN, plain_media_start("ulaw", 160).replace("ptime:20", "ptime:-20")),
        (
            JSON,
            '{"event":"MEDIA_START","connection_id":"c","channel":"x","format":"ulaw","optimal_frame_size":"160"}',
        ),
        (
            JSON,
            '{"event":"MEDIA_START","connection_id":"c","channel":"x","format":"ulaw","optimal_frame_size":true}',
        ),
        (
            JSON,
            '{"event":"MEDIA_START","connection_id":1,"channel":"x","format":"ulaw","optimal_frame_size":160}',
        ),
        (
            JSON,
            '{"event":"MEDIA_START","connection_id":"c","channel":"x","format":"ulaw",'
            '"optimal_frame_size":160,"channel_variables":{"A":1}}',
        ),
        (JSON, '{"event":5}'),
    ],
)
def test_invalid_field_in_media_start(fmt: ControlFormat, text: str) -> None:
    expect_protocol_error(
        AsteriskConnection(control_format=fmt), text, AsteriskErrorCode.INVALID_FIELD
    )


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (PLAIN, "DTMF_END digit:12"),
        (PLAIN, DOC_PLAIN_STATUS.replace("queue_full:false", "queue_full:maybe")),
        (JSON, json_event("DTMF_END", digit="")),
        (
            JSON,
            json_event(
                "STATUS",
                queue_length=1,
                xon_level=800,
                xoff_level=900,
                queue_full="false",
                bulk_media=False,
                media_paused=False,
            ),
        ),
        (JSON, json_event("MEDIA_XON", channel_id=7)),
    ],
)
def test_invalid_field_in_other_events(fmt: ControlFormat, text: str) -> None:
    expect_protocol_error(active(fmt), text, AsteriskErrorCode.INVALID_FIELD)


@pytest.mark.parametrize(
    ("codec", "frame"), [("ulaw", 0), ("slin", 321), ("slin16", 65_502), ("alaw", 70_000)]
)
def test_invalid_frame_size(codec: str, frame: int) -> None:
    expect_protocol_error(
        AsteriskConnection(), plain_media_start(codec, frame), AsteriskErrorCode.INVALID_FRAME_SIZE
    )


def test_invalid_media() -> None:
    expect_protocol_error(active(), b"", AsteriskErrorCode.INVALID_MEDIA)
    slin = active(start=plain_media_start("slin", 320))
    assert slin.receive_bytes(b"\x00\x01") == [MediaReceived(b"\x00\x01")]
    expect_protocol_error(slin, b"\x00\x01\x02", AsteriskErrorCode.INVALID_MEDIA)


def test_every_error_code_is_exercised() -> None:
    # Keep this list in step with AsteriskErrorCode: a new code needs a test above.
    assert {c.value for c in AsteriskErrorCode} == {
        "invalid_json",
        "malformed_message",
        "wrong_control_format",
        "message_too_large",
        "unknown_event",
        "unexpected_event",
        "media_before_start",
        "missing_field",
        "invalid_field",
        "invalid_id",
        "unsupported_codec",
        "invalid_frame_size",
        "invalid_media",
        "unknown_mark",
        "not_started",
        "flow_paused",
        "closed",
        "connection_failed",
        "format_unknown",
        "invalid_correlation_id",
        "invalid_argument",
        "command_too_long",
        "json_only",
        "duplicate_mark",
        "too_many_marks",
    }


# --------------------------------------------------------------------------- fuzzer finds
# Bugs tests/telephony/test_asterisk_fuzz.py found.


@pytest.mark.parametrize(
    "text",
    [
        plain_media_start("ulaw", 160).replace(
            "optimal_frame_size:160", "optimal_frame_size:" + "9" * 4_301
        ),
        plain_media_start("ulaw", 160).replace("ptime:20", "ptime:" + "0" * 21),
    ],
)
def test_plain_integer_over_20_digits_is_invalid_field_not_value_error(text: str) -> None:
    # int() refuses strings of over 4,300 digits with ValueError, which escaped.
    expect_protocol_error(AsteriskConnection(), text, AsteriskErrorCode.INVALID_FIELD)
    status = DOC_PLAIN_STATUS.replace("queue_length:43", "queue_length:" + "9" * 5_000)
    expect_protocol_error(active(), status, AsteriskErrorCode.INVALID_FIELD)


def test_plain_integer_of_20_digits_is_accepted() -> None:
    status = DOC_PLAIN_STATUS.replace("queue_length:43", "queue_length:" + "9" * 20)
    [event] = active().receive_text(status)
    assert isinstance(event, DriverStatus) and event.queue_length == 10**20 - 1


@pytest.mark.parametrize("first", [" " * 100, b"\xff" * 160])
def test_hangup_after_a_failure_before_the_format_is_known(first: str | bytes) -> None:
    # The failure came before any frame set the control format: hangup said
    # format_unknown, where every other call says connection_failed.
    conn = AsteriskConnection(max_text_chars=50)
    with pytest.raises(AsteriskProtocolError):
        _feed(conn, first)
    assert conn.control_format is None
    expect_usage_error(conn.hangup, AsteriskErrorCode.CONNECTION_FAILED)


def test_mark_media_after_a_failure_is_connection_failed_whatever_the_marks() -> None:
    # mark_media checked duplicates and the limit before the state.
    conn = AsteriskConnection(max_pending_marks=1)
    conn.receive_text(DOC_PLAIN_MEDIA_START)
    conn.mark_media("a")
    expect_protocol_error(conn, "NOT_AN_EVENT", AsteriskErrorCode.UNKNOWN_EVENT)
    expect_usage_error(lambda: conn.mark_media("b"), AsteriskErrorCode.CONNECTION_FAILED)
    expect_usage_error(lambda: conn.mark_media("a"), AsteriskErrorCode.CONNECTION_FAILED)
    closing = active()
    closing.mark_media("a")
    closing.hangup()
    expect_usage_error(lambda: closing.mark_media("a"), AsteriskErrorCode.CLOSED)


def test_media_after_a_hangup_before_media_start_is_media_before_start() -> None:
    # CLOSING admits media, but this leg never started: the codec was None and an
    # AssertionError escaped (AttributeError under python -O).
    conn = AsteriskConnection(control_format=PLAIN)
    conn.hangup()
    assert conn.state is AsteriskState.CLOSING
    expect_protocol_error(conn, b"\x7f" * 160, AsteriskErrorCode.MEDIA_BEFORE_START)


@pytest.mark.parametrize(("codec", "frame"), [("slin", 320), ("slin16", 640)])
@pytest.mark.parametrize("odd", [1, 3, 319])
def test_flush_tail_of_part_of_a_sample_is_still_one_whole_frame(
    codec: str, frame: int, odd: int
) -> None:
    # Audio handed over in odd-sized chunks left half a sample in the tail, and the
    # padded frame came out one byte short: Asterisk drops a partial frame.
    conn = active(start=plain_media_start(codec, frame))
    assert conn.media_frames(b"\x01" * odd) == []
    [padded] = conn.flush_tail()
    assert len(padded) == frame
    assert padded == b"\x01" * odd + b"\x00" * (frame - odd)
    assert conn.buffered_bytes == 0
