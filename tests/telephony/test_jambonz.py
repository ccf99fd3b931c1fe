"""jambonz listen/stream core, byte for byte, without an event loop.

Fixtures follow what jambonz writes: the metadata frame is ``{sampleRate, mixType}`` merged
with ``CallInfo.toJSON()`` and the verb's ``metadata`` (jambonz-feature-server
``lib/tasks/listen.js`` ``_startListening``, ``lib/session/call-info.js``), serialized by
``JSON.stringify`` (compact); the DTMF frame is listen.js ``_onDtmf``'s
``{event:'dtmf', dtmf, duration}`` with FreeSWITCH's ``DTMF-Duration`` header string; the
mark report is freeswitch-modules ``mod_audio_fork/lws_glue.cpp`` ``send_mark_event``'s
layout, spaces included; ``playDone`` is listen.js ``_playAudio``'s.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from telephony.jambonz import (
    MARK_NAME_PATTERN,
    MAX_METADATA_ENTRIES,
    MAX_METADATA_VALUE_CHARS,
    PLAY_AUDIO_MAX_TEXT_BYTES,
    SUBPROTOCOL,
    SUPPORTED_SAMPLE_RATES,
    TRANSITIONS,
    VENDOR_MAX_MARKS,
    AudioReceived,
    DtmfReceived,
    JambonzConnection,
    JambonzError,
    JambonzErrorCode,
    JambonzProtocolError,
    JambonzState,
    JambonzUsageError,
    MarkReported,
    PlayDone,
    StreamStarted,
    Trigger,
)
from telephony.limits import MAX_CALL_ID_CHARS

E = JambonzErrorCode
S = JambonzState

CALL_SID = "b6f5a7c2-3f1e-4c8e-9d2a-5e7f1c3b9a10"

# listen.js: Object.assign({sampleRate, mixType}, callInfo.toJSON(), verb.metadata),
# JSON.stringify'd; "token" and "queue" are the verb's metadata, "customerData" a tag.
METADATA = (
    '{"sampleRate":16000,"mixType":"mono","callSid":"' + CALL_SID + '",'
    '"direction":"inbound","from":"+15083084809","to":"+15083728299",'
    '"callId":"3c1a9c4e7b2d4f10@10.0.0.5","sbcCallid":"7f0e2d1c-aaaa-4bbb-8ccc-0123456789ab",'
    '"sipStatus":200,"sipReason":"OK","callStatus":"in-progress",'
    '"accountSid":"9351f46a-678c-43f5-b8a6-d4eb58d131af","traceId":"0c7b3e9d8f1a2b4c",'
    '"applicationSid":"0dddaabf-0a30-43e3-84e8-426873b1a78b","fsSipAddress":"10.0.1.7:5080",'
    '"customerData":{"crm":"42"},"token":"eyJhbGciOiJIUzI1NiJ9.e30.sig","queue":"billing",'
    '"priority":3}'
)

# listen.js _onDtmf: {event: 'dtmf', dtmf, duration}; DTMF-Duration in 8 kHz ticks
DTMF_5 = '{"event":"dtmf","dtmf":"5","duration":"1280"}'


def vendor_mark(name: str, event: str) -> str:
    """lws_glue.cpp send_mark_event, byte for byte."""
    return '{"type": "mark", "data": {"name":"' + name + '", "event": "' + event + '"}}'


def metadata(**changes: Any) -> str:
    obj = json.loads(METADATA)
    for key, value in changes.items():
        if value is ...:
            obj.pop(key, None)
        else:
            obj[key] = value
    return json.dumps(obj, separators=(",", ":"))


def started(text: str = METADATA, **kwargs: Any) -> JambonzConnection:
    conn = JambonzConnection(**kwargs)
    conn.receive_text(text)
    return conn


def pcm_ramp(samples: int, start: int = 0) -> bytes:
    """Distinct little-endian samples that never contain the 0xFFFF marker value."""
    return b"".join(((start + i) % 30000).to_bytes(2, "little") for i in range(samples))


def state_of(conn: JambonzConnection) -> JambonzState:
    """``conn.state`` without mypy's narrowing from an earlier assertion."""
    return conn.state


def marks_of(conn: JambonzConnection) -> tuple[str, ...]:
    return conn.pending_marks


def expect_protocol_error(
    conn: JambonzConnection, frame: str | bytes, code: JambonzErrorCode
) -> JambonzProtocolError:
    with pytest.raises(JambonzProtocolError) as info:
        if isinstance(frame, str):
            conn.receive_text(frame)
        else:
            conn.receive_binary(frame)
    assert info.value.code is code
    assert conn.state is S.FAILED
    return info.value


def expect_usage_error(call: Any, code: JambonzErrorCode) -> None:
    with pytest.raises(JambonzUsageError) as info:
        call()
    assert info.value.code is code


# --- Metadata ----------------------------------------------------------------------------


def test_subprotocol() -> None:
    assert SUBPROTOCOL == "audio.jambonz.org"


def test_realistic_metadata_frame() -> None:
    conn = JambonzConnection()
    assert conn.state is S.AWAITING_METADATA
    assert conn.call_id is None and conn.sample_rate is None
    [event] = conn.receive_text(METADATA)
    assert event == StreamStarted(
        call_id=CALL_SID,
        sample_rate=16000,
        mix_type="mono",
        channels=1,
        from_="+15083084809",
        to="+15083728299",
        direction="inbound",
        # the verb's metadata: string members that are not call attributes; "priority"
        # (a number) and "customerData" (an object, a call attribute) are left out
        metadata={"token": "eyJhbGciOiJIUzI1NiJ9.e30.sig", "queue": "billing"},
    )
    assert state_of(conn) is S.STREAMING
    assert conn.stream_started is event
    assert conn.call_id == CALL_SID
    assert conn.sample_rate == conn.output_sample_rate == 16000
    assert "eyJ" not in repr(event)  # a token in metadata never reaches the log


def test_minimal_metadata() -> None:
    [event] = JambonzConnection().receive_text(
        '{"sampleRate":8000,"mixType":"mixed","callSid":"c1"}'
    )
    assert event == StreamStarted("c1", 8000, "mixed", 1, None, None, None, {})


@pytest.mark.parametrize("rate", SUPPORTED_SAMPLE_RATES)
def test_supported_sample_rates_and_format_names(rate: int) -> None:
    conn = started(metadata(sampleRate=rate))
    assert conn.sample_rate == rate
    assert JambonzConnection.format_name(rate) == f"pcm_{rate}"


@pytest.mark.parametrize("rate", [0, 11025, 22050, 32000, 44100, 64000, 96000])
def test_format_name_refuses_other_rates(rate: int) -> None:
    expect_usage_error(lambda: JambonzConnection.format_name(rate), E.UNSUPPORTED_FORMAT)


@pytest.mark.parametrize("rate", [32000, 64000, 11025, -8000, 0])  # jambonz allows 64000
def test_unsupported_sample_rate(rate: int) -> None:
    expect_protocol_error(JambonzConnection(), metadata(sampleRate=rate), E.UNSUPPORTED_SAMPLE_RATE)


@pytest.mark.parametrize("rate", ["16000", 16000.0, True, None, [16000]])
def test_sample_rate_must_be_an_integer(rate: Any) -> None:
    expect_protocol_error(JambonzConnection(), metadata(sampleRate=rate), E.INVALID_FIELD)


@pytest.mark.parametrize(
    ("key", "code"),
    [("callSid", E.MISSING_FIELD), ("sampleRate", E.MISSING_FIELD), ("mixType", E.MISSING_FIELD)],
)
def test_metadata_required_members(key: str, code: JambonzErrorCode) -> None:
    expect_protocol_error(JambonzConnection(), metadata(**{key: ...}), code)


@pytest.mark.parametrize(
    "sid", ["", "has space", "tab\tx", "nl\nx", "\u200b", "\ud800", "x" * (MAX_CALL_ID_CHARS + 1)]
)
def test_bad_call_ids(sid: str) -> None:
    expect_protocol_error(JambonzConnection(), metadata(callSid=sid), E.INVALID_ID)


def test_call_id_of_128_printable_characters_is_accepted() -> None:
    sid = "C" * MAX_CALL_ID_CHARS
    assert started(metadata(callSid=sid)).call_id == sid


@pytest.mark.parametrize("sid", [42, None, {"a": 1}])
def test_call_id_must_be_a_string(sid: Any) -> None:
    expect_protocol_error(JambonzConnection(), metadata(callSid=sid), E.INVALID_FIELD)


@pytest.mark.parametrize("mix", ["MONO", "dual", "", 1])
def test_bad_mix_type(mix: Any) -> None:
    expect_protocol_error(JambonzConnection(), metadata(mixType=mix), E.INVALID_FIELD)


@pytest.mark.parametrize("key", ["from", "to", "direction"])
def test_addresses_must_be_bounded_strings(key: str) -> None:
    expect_protocol_error(JambonzConnection(), metadata(**{key: 5}), E.INVALID_FIELD)
    expect_protocol_error(JambonzConnection(), metadata(**{key: "x" * 257}), E.INVALID_FIELD)
    assert started(metadata(**{key: None})).stream_started is not None


def test_custom_metadata_bounds() -> None:
    many = {f"k{i}": "v" for i in range(MAX_METADATA_ENTRIES - 2)}  # plus token and queue
    conn = started(metadata(**many))
    assert conn.stream_started is not None
    assert len(conn.stream_started.metadata) == MAX_METADATA_ENTRIES
    expect_protocol_error(JambonzConnection(), metadata(**many, extra="v"), E.INVALID_METADATA)
    long_value = "t" * (MAX_METADATA_VALUE_CHARS + 1)
    expect_protocol_error(JambonzConnection(), metadata(token=long_value), E.INVALID_METADATA)
    expect_protocol_error(JambonzConnection(), metadata(**{"k" * 65: "v"}), E.INVALID_METADATA)
    expect_protocol_error(JambonzConnection(), metadata(**{"": "v"}), E.INVALID_METADATA)


# --- Malformed TEXT frames ----------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "{", "not json", "{'type': 'mark'}", '{"type": }'])
def test_not_json(text: str) -> None:
    expect_protocol_error(JambonzConnection(), text, E.INVALID_JSON)
    expect_protocol_error(started(), text, E.INVALID_JSON)


@pytest.mark.parametrize("text", ["[]", '"mark"', "42", "null", "true", '[{"type":"mark"}]'])
def test_json_not_an_object(text: str) -> None:
    expect_protocol_error(JambonzConnection(), text, E.INVALID_JSON)
    expect_protocol_error(started(), text, E.INVALID_JSON)


@pytest.mark.parametrize(
    "text",
    [
        '{"type":"transcription","data":{}}',  # app -> jambonz only
        '{"type":"playAudio","data":{}}',
        '{"type":"killAudio"}',
        '{"type":"clearMarks"}',
        '{"type":"MARK","data":{"name":"a","event":"playout"}}',
        '{"type":3}',
        '{"event":"start"}',
        '{"event":"DTMF","dtmf":"1"}',
        '{"event":null}',
    ],
)
def test_unknown_message_types_are_errors(text: str) -> None:
    # listen.js and mod_audio_fork write only dtmf, mark and playDone after the metadata
    expect_protocol_error(started(), text, E.UNKNOWN_MESSAGE)


def test_message_with_neither_type_nor_event() -> None:
    expect_protocol_error(started(), METADATA, E.MISSING_FIELD)  # a second metadata frame


def test_oversize_text_is_measured_in_utf8_bytes() -> None:
    limit = 1024
    base = metadata()
    pad = limit - len(base.encode()) - len(',"p":""')
    exact = base[:-1] + ',"p":"' + "x" * pad + '"}'
    assert len(exact.encode()) == limit
    assert started(exact, max_text_bytes=limit).state is S.STREAMING
    over = base[:-1] + ',"p":"' + "x" * (pad + 1) + '"}'
    expect_protocol_error(JambonzConnection(max_text_bytes=limit), over, E.MESSAGE_TOO_LARGE)
    # 3-byte characters: few enough characters, too many bytes
    wide = base[:-1] + ',"p":"' + "\u20ac" * (pad // 3 + 1) + '"}'
    assert len(wide) < limit < len(wide.encode())
    expect_protocol_error(JambonzConnection(max_text_bytes=limit), wide, E.MESSAGE_TOO_LARGE)
    expect_protocol_error(started(max_text_bytes=limit), "x" * (limit + 1), E.MESSAGE_TOO_LARGE)


def test_default_text_limit_is_64_kib() -> None:
    conn = started()
    expect_protocol_error(conn, '"' + "x" * (64 * 1024 - 1) + '"', E.MESSAGE_TOO_LARGE)


# --- Inbound audio ------------------------------------------------------------------------


def test_binary_audio_in_exact_bytes() -> None:
    conn = started()
    frame = pcm_ramp(320)  # 20 ms at 16 kHz
    assert conn.receive_binary(frame) == [AudioReceived(frame)]
    assert conn.receive_binary(b"\x01\x80") == [AudioReceived(b"\x01\x80")]
    assert conn.state is S.STREAMING


def test_zero_length_binary_is_a_graceful_shutdown_flush() -> None:
    conn = started()
    assert conn.receive_binary(b"") == []
    assert conn.state is S.STREAMING


def test_audio_before_metadata() -> None:
    expect_protocol_error(JambonzConnection(), b"\x00\x00", E.AUDIO_BEFORE_METADATA)
    expect_protocol_error(JambonzConnection(), b"", E.AUDIO_BEFORE_METADATA)


@pytest.mark.parametrize("size", [1, 3, 641])
def test_odd_length_audio(size: int) -> None:
    expect_protocol_error(started(), b"\x00" * size, E.INVALID_AUDIO)


def test_stereo_audio_must_be_whole_sample_pairs() -> None:
    conn = started(metadata(mixType="stereo", sampleRate=8000))
    assert conn.stream_started is not None and conn.stream_started.channels == 2
    assert conn.receive_binary(b"\x01\x00\x02\x00") == [AudioReceived(b"\x01\x00\x02\x00")]
    expect_protocol_error(conn, b"\x01\x00\x02\x00\x03\x00", E.INVALID_AUDIO)


def test_oversize_binary_frame() -> None:
    conn = started(metadata(sampleRate=8000))
    limit = 8000 * 2 * 5  # five seconds, mod_audio_fork's largest buffer
    assert conn.receive_binary(b"\x00" * limit) == [AudioReceived(b"\x00" * limit)]
    expect_protocol_error(conn, b"\x00" * (limit + 2), E.MESSAGE_TOO_LARGE)


# --- DTMF ---------------------------------------------------------------------------------


def test_dtmf_frame() -> None:
    # listen.js: msDuration = Math.floor((duration / 8000) * 1000); 1280 ticks -> 160 ms
    assert started().receive_text(DTMF_5) == [DtmfReceived("5", 160)]


@pytest.mark.parametrize(
    ("text", "event"),
    [
        ('{"event":"dtmf","dtmf":"#","duration":"2000"}', DtmfReceived("#", 250)),
        ('{"event":"dtmf","dtmf":"*","duration":1000}', DtmfReceived("*", 125)),
        ('{"event":"dtmf","dtmf":"A","duration":"7"}', DtmfReceived("A", 0)),
        ('{"event":"dtmf","dtmf":"0"}', DtmfReceived("0", None)),  # no DTMF-Duration header
        ('{"event":"dtmf","dtmf":"9","duration":null}', DtmfReceived("9", None)),
        # one character outside 0-9*#A-D passes: the gateway's leg drops it (limits.py)
        ('{"event":"dtmf","dtmf":"x","duration":"0"}', DtmfReceived("x", 0)),
    ],
)
def test_dtmf_variants(text: str, event: DtmfReceived) -> None:
    assert started().receive_text(text) == [event]


@pytest.mark.parametrize(
    "text",
    [
        '{"event":"dtmf"}',
        '{"event":"dtmf","dtmf":""}',
        '{"event":"dtmf","dtmf":"12"}',
        '{"event":"dtmf","dtmf":5}',
        '{"event":"dtmf","dtmf":null}',
        '{"event":"dtmf","dtmf":"5","duration":"abc"}',
        '{"event":"dtmf","dtmf":"5","duration":"-1"}',
        '{"event":"dtmf","dtmf":"5","duration":""}',
        '{"event":"dtmf","dtmf":"5","duration":"\u0661\u0662"}',  # non-ASCII digits
        '{"event":"dtmf","dtmf":"5","duration":"' + "1" * 21 + '"}',
        '{"event":"dtmf","dtmf":"5","duration":-1}',
        '{"event":"dtmf","dtmf":"5","duration":true}',
        '{"event":"dtmf","dtmf":"5","duration":1.5}',
    ],
)
def test_bad_dtmf(text: str) -> None:
    expect_protocol_error(started(), text, E.INVALID_DTMF)


# --- Outbound audio -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "frame_bytes"), [(8000, 320), (16000, 640), (24000, 960), (48000, 1920)]
)
def test_streaming_audio_is_20_ms_binary_frames(rate: int, frame_bytes: int) -> None:
    conn = started(metadata(sampleRate=rate))
    pcm = pcm_ramp(frame_bytes * 3 // 2 + 7)  # 3.5 frames and a bit
    frames = conn.audio(pcm)
    assert all(isinstance(f, bytes) for f in frames)
    assert [len(f) for f in frames][:-1] == [frame_bytes] * (len(frames) - 1)
    assert 0 < len(frames[-1]) <= frame_bytes
    assert b"".join(f for f in frames if isinstance(f, bytes)) == pcm


def test_streaming_audio_exact_frames() -> None:
    conn = started(metadata(sampleRate=8000))
    pcm = bytes(range(256)) * 2 + b"\x10\x20"  # 514 bytes, no aligned 0xFFFF
    assert conn.audio(pcm) == [pcm[:320], pcm[320:]]


def test_output_sample_rate_sets_the_frame_size() -> None:
    conn = started(metadata(sampleRate=16000), output_sample_rate=8000)
    assert conn.sample_rate == 16000 and conn.output_sample_rate == 8000
    assert [len(f) for f in conn.audio(pcm_ramp(400))] == [320, 320, 160]


def test_minus_one_samples_are_sent_as_minus_two() -> None:
    # 0xFFFF is mod_audio_fork's in-band mark marker; only aligned samples are touched
    conn = started(metadata(sampleRate=8000))
    pcm = b"\xff\xff\x00\xff\xff\x00\xff\xff\xff\xff\x01\x02"
    # samples: -1, 0xFF00, 0x00FF, -1, -1, 0x0201
    assert conn.audio(pcm) == [b"\xfe\xff\x00\xff\xff\x00\xfe\xff\xfe\xff\x01\x02"]


def test_play_audio_frame_exact() -> None:
    conn = started(bidirectional_streaming=False)
    pcm = pcm_ramp(160)
    [frame] = conn.audio(pcm)
    assert isinstance(frame, str)
    assert json.loads(frame) == {
        "type": "playAudio",
        "data": {
            "audioContentType": "raw",
            "sampleRate": 16000,  # a number: mod_audio_fork reads valueint
            "audioContent": base64.b64encode(pcm).decode(),
            "queuePlay": True,
            "id": "1",
        },
    }
    # -1 samples are not rewritten: files carry no markers
    [frame] = conn.audio(b"\xff\xff")
    assert isinstance(frame, str)
    data = json.loads(frame)["data"]
    assert base64.b64decode(data["audioContent"]) == b"\xff\xff"
    assert data["id"] == "2"


def test_play_audio_splits_large_audio_into_bounded_frames() -> None:
    conn = started(bidirectional_streaming=False, output_sample_rate=48000)
    pcm = pcm_ramp(500_000)  # 1,000,000 bytes: over two frames' worth
    frames = conn.audio(pcm)
    assert len(frames) == 3
    decoded = b""
    for index, frame in enumerate(frames, start=1):
        assert isinstance(frame, str)
        assert len(frame.encode()) <= PLAY_AUDIO_MAX_TEXT_BYTES
        data = json.loads(frame)["data"]
        assert data["sampleRate"] == 48000 and data["id"] == str(index)
        decoded += base64.b64decode(data["audioContent"], validate=True)
    assert decoded == pcm


def test_audio_usage_errors() -> None:
    expect_usage_error(lambda: JambonzConnection().audio(b"\x00\x00"), E.NOT_STARTED)
    conn = started()
    expect_usage_error(lambda: conn.audio(b""), E.EMPTY_AUDIO)
    expect_usage_error(lambda: conn.audio(b"\x00\x00\x00"), E.INVALID_PCM)
    assert conn.state is S.STREAMING


# --- Control frames -----------------------------------------------------------------------


def test_control_frames_exact() -> None:
    conn = started()
    assert json.loads(conn.mark("utt-1")) == {"type": "mark", "data": {"name": "utt-1"}}
    text, cleared = conn.kill_audio()
    assert json.loads(text) == {"type": "killAudio"}
    assert cleared == ["utt-1"]
    assert json.loads(conn.disconnect()) == {"type": "disconnect"}
    assert conn.state is S.CLOSING


def test_mark_round_trip() -> None:
    conn = started()
    conn.audio(pcm_ramp(320))
    conn.mark("a")
    conn.audio(pcm_ramp(320))
    conn.mark("b")
    assert conn.pending_marks == ("a", "b")
    assert conn.receive_text(vendor_mark("a", "playout")) == [MarkReported("a", cleared=False)]
    assert marks_of(conn) == ("b",)
    assert conn.receive_text(vendor_mark("b", "playout")) == [MarkReported("b", cleared=False)]
    assert marks_of(conn) == ()
    conn.mark("a")  # a reported name may be used again


def test_kill_audio_clears_marks_and_swallows_their_echoes() -> None:
    conn = started()
    conn.audio(pcm_ramp(320))
    conn.mark("a")
    conn.audio(pcm_ramp(320))
    conn.mark("b")
    conn.mark("c")
    text, cleared = conn.kill_audio()
    assert text == '{"type":"killAudio"}'
    assert cleared == ["a", "b", "c"]
    assert conn.pending_marks == ()
    expect_usage_error(lambda: conn.mark("b"), E.DUPLICATE_MARK)  # echo still due
    # "a" played while the kill was on its way; "b" and "c" come back cleared
    assert conn.receive_text(vendor_mark("a", "playout")) == []
    assert conn.receive_text(vendor_mark("b", "cleared")) == []
    assert conn.receive_text(vendor_mark("c", "cleared")) == []
    conn.mark("b")
    assert conn.receive_text(vendor_mark("b", "playout")) == [MarkReported("b", False)]


def test_kill_audio_without_marks() -> None:
    assert started().kill_audio() == ('{"type":"killAudio"}', [])


def test_a_later_mark_report_ends_the_wait_for_flushed_echoes() -> None:
    conn = started()
    conn.mark("old")
    conn.kill_audio()
    conn.mark("new")
    # jambonz sends the kill's "cleared" batch before any later report, so once "new" is
    # reported no echo for "old" can still be due
    assert conn.receive_text(vendor_mark("new", "cleared")) == [MarkReported("new", True)]
    conn.mark("old")  # no longer a duplicate
    expect_protocol_error(conn, vendor_mark("ghost", "playout"), E.UNKNOWN_MARK)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (vendor_mark("never-sent", "playout"), E.UNKNOWN_MARK),
        (vendor_mark("a", "played"), E.INVALID_FIELD),
        ('{"type":"mark"}', E.MISSING_FIELD),
        ('{"type":"mark","data":"a"}', E.INVALID_FIELD),
        ('{"type":"mark","data":{"event":"playout"}}', E.MISSING_FIELD),
        ('{"type":"mark","data":{"name":"a"}}', E.MISSING_FIELD),
        ('{"type":"mark","data":{"name":1,"event":"playout"}}', E.INVALID_FIELD),
    ],
)
def test_bad_mark_reports(text: str, code: JambonzErrorCode) -> None:
    conn = started()
    conn.mark("a")
    expect_protocol_error(conn, text, code)


@pytest.mark.parametrize("name", ["", 'quo"te', "back\\slash", "sp ace", "tab\t", "é", "x" * 65])
def test_invalid_mark_names(name: str) -> None:
    # jambonz writes names into its JSON without escaping them
    expect_usage_error(lambda: started().mark(name), E.INVALID_MARK_NAME)


def test_mark_name_pattern_accepts_64_safe_characters() -> None:
    name = "Az09._:@/+=~-" + "x" * 51
    assert MARK_NAME_PATTERN.fullmatch(name) and len(name) == 64
    assert json.loads(started().mark(name))["data"]["name"] == name


def test_mark_limits() -> None:
    conn = started(max_marks=2)
    conn.mark("a")
    expect_usage_error(lambda: conn.mark("a"), E.DUPLICATE_MARK)
    conn.mark("b")
    expect_usage_error(lambda: conn.mark("c"), E.TOO_MANY_MARKS)
    assert conn.pending_marks == ("a", "b")
    default = started()
    for index in range(VENDOR_MAX_MARKS):
        default.mark(f"m{index}")
    expect_usage_error(lambda: default.mark("one-more"), E.TOO_MANY_MARKS)


def test_marks_need_streaming() -> None:
    expect_usage_error(
        lambda: started(bidirectional_streaming=False).mark("a"), E.MARKS_NEED_STREAMING
    )


@pytest.mark.parametrize(
    ("text", "event"),
    [
        (
            '{"type":"playDone","data":{"id":"1","playbackSeconds":"2",'
            '"playbackMilliseconds":"2040","playbackLastOffsetPos":"32640"}}',
            PlayDone("1"),
        ),
        ('{"type":"playDone"}', PlayDone(None)),  # the listen page's example
        ('{"type":"playDone","data":{"id":7}}', PlayDone(None)),
    ],
)
def test_play_done(text: str, event: PlayDone) -> None:
    assert started(bidirectional_streaming=False).receive_text(text) == [event]


def test_play_done_data_must_be_an_object() -> None:
    expect_protocol_error(started(), '{"type":"playDone","data":[]}', E.INVALID_FIELD)


# --- A session ----------------------------------------------------------------------------


def test_session_transcript() -> None:
    conn = JambonzConnection(output_sample_rate=8000)
    assert conn.receive_text(METADATA)[0].call_id == CALL_SID  # type: ignore[union-attr]
    caller = pcm_ramp(320, start=100)
    assert conn.receive_binary(caller) == [AudioReceived(caller)]

    prompt = pcm_ramp(8000)  # one second at 8 kHz
    out = conn.audio(prompt)
    assert len(out) == 50 and b"".join(f for f in out if isinstance(f, bytes)) == prompt
    assert conn.mark("prompt-1") == '{"type":"mark","data":{"name":"prompt-1"}}'
    assert conn.receive_text(DTMF_5) == [DtmfReceived("5", 160)]
    assert conn.receive_text(vendor_mark("prompt-1", "playout")) == [
        MarkReported("prompt-1", False)
    ]

    conn.audio(pcm_ramp(4000))
    conn.mark("prompt-2")
    conn.audio(pcm_ramp(4000))
    conn.mark("prompt-3")
    conn.receive_binary(caller)  # the caller barges in
    assert conn.kill_audio() == ('{"type":"killAudio"}', ["prompt-2", "prompt-3"])
    assert conn.receive_text(vendor_mark("prompt-2", "cleared")) == []
    assert conn.receive_text(vendor_mark("prompt-3", "cleared")) == []
    assert conn.pending_marks == ()

    assert conn.disconnect() == '{"type":"disconnect"}'
    assert conn.state is S.CLOSING
    assert conn.receive_binary(caller) == [AudioReceived(caller)]  # still in flight
    conn.connection_closed()
    assert state_of(conn) is S.CLOSED


# --- The state table ----------------------------------------------------------------------

REMOTE = {Trigger.METADATA, Trigger.AUDIO, Trigger.MESSAGE}


@pytest.mark.parametrize("state", list(JambonzState))
@pytest.mark.parametrize("trigger", list(Trigger))
def test_step_follows_the_table(state: JambonzState, trigger: Trigger) -> None:
    conn = JambonzConnection()
    conn._state = state
    expected = TRANSITIONS.get((state, trigger))
    if expected is not None:
        conn._step(trigger)
        assert conn.state is expected
        return
    remote_fault = trigger in REMOTE and state not in (S.CLOSED, S.FAILED)
    with pytest.raises(JambonzProtocolError if remote_fault else JambonzUsageError) as info:
        conn._step(trigger)
    assert conn.state is state  # _step itself changes nothing on refusal
    if state is S.FAILED:
        assert info.value.code is E.CONNECTION_FAILED
    elif state is S.CLOSED or (state is S.CLOSING and not remote_fault):
        assert info.value.code is E.CLOSED
    elif trigger is Trigger.AUDIO:
        assert info.value.code is E.AUDIO_BEFORE_METADATA
    elif remote_fault:
        assert info.value.code is E.UNEXPECTED_MESSAGE
    else:
        assert info.value.code is E.NOT_STARTED


def test_table_shape() -> None:
    # every state can close; only STREAMING sends; nothing leaves CLOSED or FAILED but a close
    for state in JambonzState:
        assert TRANSITIONS[(state, Trigger.CONNECTION_CLOSED)] is S.CLOSED
    assert {s for (s, t) in TRANSITIONS if t is Trigger.SEND} == {S.STREAMING}
    assert {t for (s, t) in TRANSITIONS if s in (S.CLOSED, S.FAILED)} == {Trigger.CONNECTION_CLOSED}


def test_closing_accepts_frames_but_no_intents() -> None:
    conn = started()
    conn.mark("a")
    conn.disconnect()
    assert conn.receive_text(DTMF_5) == [DtmfReceived("5", 160)]
    assert conn.receive_text(vendor_mark("a", "cleared")) == [MarkReported("a", True)]
    for call in (
        lambda: conn.audio(b"\x00\x00"),
        lambda: conn.mark("b"),
        conn.kill_audio,
        conn.disconnect,
    ):
        expect_usage_error(call, E.CLOSED)
    assert conn.state is S.CLOSING


def test_disconnect_before_metadata() -> None:
    conn = JambonzConnection()
    expect_usage_error(lambda: conn.audio(b"\x00\x00"), E.NOT_STARTED)
    expect_usage_error(conn.kill_audio, E.NOT_STARTED)
    expect_usage_error(lambda: conn.mark("a"), E.NOT_STARTED)
    assert conn.disconnect() == '{"type":"disconnect"}'
    expect_protocol_error(conn, b"\x00\x00", E.AUDIO_BEFORE_METADATA)
    conn = JambonzConnection()
    conn.disconnect()
    assert conn.receive_text(METADATA)[0].call_id == CALL_SID  # type: ignore[union-attr]
    assert conn.state is S.CLOSING
    assert conn.receive_binary(b"\x00\x00") == [AudioReceived(b"\x00\x00")]


def test_after_close_everything_is_local_misuse() -> None:
    conn = started()
    conn.mark("a")
    conn.connection_closed()
    assert conn.state is S.CLOSED
    assert conn.pending_marks == ("a",)  # never reported, still readable
    expect_usage_error(lambda: conn.receive_text(DTMF_5), E.CLOSED)
    expect_usage_error(lambda: conn.receive_binary(b"\x00\x00"), E.CLOSED)
    expect_usage_error(lambda: conn.audio(b"\x00\x00"), E.CLOSED)
    expect_usage_error(conn.disconnect, E.CLOSED)
    conn.connection_closed()  # idempotent
    assert conn.state is S.CLOSED


def test_after_failure_everything_is_local_misuse() -> None:
    conn = started()
    expect_protocol_error(conn, "nope", E.INVALID_JSON)
    for call in (
        lambda: conn.receive_text(DTMF_5),
        lambda: conn.receive_binary(b"\x00\x00"),
        lambda: conn.audio(b"\x00\x00"),
        lambda: conn.mark("a"),
        conn.kill_audio,
        conn.disconnect,
    ):
        expect_usage_error(call, E.CONNECTION_FAILED)
    assert conn.state is S.FAILED
    conn.connection_closed()
    assert state_of(conn) is S.CLOSED


def test_failure_before_metadata_keeps_nothing() -> None:
    conn = JambonzConnection()
    expect_protocol_error(conn, metadata(sampleRate=64000), E.UNSUPPORTED_SAMPLE_RATE)
    assert conn.stream_started is None and conn.call_id is None


def test_error_types_separate_remote_from_local() -> None:
    assert issubclass(JambonzProtocolError, JambonzError)
    assert issubclass(JambonzUsageError, JambonzError)
    assert not issubclass(JambonzProtocolError, JambonzUsageError)
    error = JambonzProtocolError(E.INVALID_JSON, "detail")
    assert str(error) == "invalid_json: detail" and error.message == "detail"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_text_bytes": 0},
        {"max_marks": 0},
        {"max_marks": VENDOR_MAX_MARKS + 1},
        {"output_sample_rate": 32000},
        {"output_sample_rate": 11025},
    ],
)
def test_constructor_limits(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        JambonzConnection(**kwargs)
