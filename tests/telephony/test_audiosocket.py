"""Asterisk AudioSocket core, byte for byte, without an event loop.

Fixtures are hand-written hex. Their sources: the Asterisk "AudioSocket" page,
https://docs.asterisk.org/Configuration/Channel-Drivers/AudioSocket/ ("Hangup indication
... is 0x00 0x00 0x00", the kind list), the CyCoreSystems/audiosocket README (the example
UUID ``40325ec2-5efd-4bd3-805f-53576e581d13``, the Asterisk error codes), the ``audiosocket``
Rust crate's documented example (docs.rs/audiosocket: a UUID message as bytes), and the
layouts asterisk/asterisk ``res/res_audiosocket.c`` writes (``ast_audiosocket_init``,
``ast_audiosocket_send_frame``); each is marked.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from telephony.audiosocket import (
    ASTERISK_ERROR_BITS,
    AUDIO_KINDS,
    GATEWAY_FORMATS,
    HANGUP_MESSAGE,
    HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    TRANSITIONS,
    AudioReceived,
    AudioSocketConnection,
    AudioSocketError,
    AudioSocketErrorCode,
    AudioSocketEvent,
    AudioSocketProtocolError,
    AudioSocketState,
    AudioSocketUsageError,
    CallStarted,
    DtmfReceived,
    ErrorReceived,
    HangupReceived,
    Header,
    Kind,
    Trigger,
    decode_header,
    describe_error_code,
    encode_message,
    frame_bytes,
)
from telephony.limits import DTMF_DIGITS, call_id_problem
from tests.telephony.fuzzing import FUZZ

Code = AudioSocketErrorCode
State = AudioSocketState

# --- Documented and source-derived messages ----------------------------------------------

# [docs "Protocol definition"]: "Hangup indication, for instance, is 0x00 0x00 0x00"
DOC_HANGUP = bytes.fromhex("00 0000")

# [README "Asterisk usage"] example UUID, as ast_audiosocket_init writes it: kind 0x01,
# length 0x0010, then uuid_parse()'s 16 bytes
README_UUID = "40325ec2-5efd-4bd3-805f-53576e581d13"
README_UUID_MESSAGE = bytes.fromhex("01 0010 40325ec2 5efd 4bd3 805f 53576e581d13")

# docs.rs/audiosocket crate example: [1, 0, 16, 4, 54, 67, 12, 43, 2, 98, 76, 32, 50, 87,
# 5, 1, 33, 43, 87] is the identifier 0436430c-2b02-624c-2032-570501212b57
CRATE_UUID = "0436430c-2b02-624c-2032-570501212b57"
CRATE_UUID_MESSAGE = bytes([1, 0, 16, 4, 54, 67, 12, 43, 2, 98, 76, 32, 50, 87, 5, 1, 33, 43, 87])

# ast_audiosocket_send_frame, AST_FRAME_DTMF: kind 0x03, length 0x0001, the ASCII digit
DTMF_5 = bytes.fromhex("03 0001 35")
DTMF_HASH = bytes.fromhex("03 0001 23")

# ast_audiosocket_send_frame, AST_FRAME_VOICE slin: 0x10, htons(datalen), the samples.
# Two samples, +1 and -1, little-endian.
AUDIO_TWO_SAMPLES = bytes.fromhex("10 0004 0100 ffff")
# One 20 ms slin frame: 320 bytes (0x0140)
PCM_20MS = bytes(range(256)) + bytes(range(64))
AUDIO_20MS = bytes.fromhex("10 0140") + PCM_20MS

# [README "Asterisk error codes"]: 0x01 hangup of calling party
ERROR_HANGUP = bytes.fromhex("ff 0001 01")


def started(call: bytes = README_UUID_MESSAGE, **kwargs: Any) -> AudioSocketConnection:
    conn = AudioSocketConnection(**kwargs)
    assert len(conn.receive(call)) == 1
    assert conn.state is State.ACTIVE
    return conn


def expect_protocol_error(
    conn: AudioSocketConnection, data: bytes, code: AudioSocketErrorCode
) -> AudioSocketProtocolError:
    with pytest.raises(AudioSocketProtocolError) as info:
        conn.receive(data)
    assert info.value.code is code
    assert conn.state is State.FAILED
    assert conn.buffered_bytes == 0
    return info.value


def expect_usage_error(call: Callable[[], object], code: AudioSocketErrorCode) -> None:
    with pytest.raises(AudioSocketUsageError) as info:
        call()
    assert info.value.code is code


# --------------------------------------------------------------------------- inbound, exact


def test_uuid_from_the_readme_example() -> None:
    assert AudioSocketConnection().state is State.AWAITING_UUID
    conn = AudioSocketConnection()
    assert conn.receive(README_UUID_MESSAGE) == [CallStarted(README_UUID)]
    assert conn.call_id == README_UUID
    assert conn.state is State.ACTIVE


def test_uuid_from_the_crate_example() -> None:
    assert AudioSocketConnection().receive(CRATE_UUID_MESSAGE) == [CallStarted(CRATE_UUID)]


@pytest.mark.parametrize(
    ("raw", "call_id"),
    [
        (bytes(16), "00000000-0000-0000-0000-000000000000"),  # uuid_parse accepts nil
        (b"\xff" * 16, "ffffffff-ffff-ffff-ffff-ffffffffffff"),
        (bytes.fromhex("ABCDEF0123456789abcdef0123456789"), "abcdef01-2345-6789-abcd-ef0123456789"),
    ],
)
def test_uuid_is_canonical_lowercase(raw: bytes, call_id: str) -> None:
    event = AudioSocketConnection().receive(b"\x01\x00\x10" + raw)
    assert event == [CallStarted(call_id)]
    assert call_id_problem(call_id) is None


def test_audio_exact() -> None:
    conn = started()
    assert conn.sample_rate is None
    assert conn.receive(AUDIO_TWO_SAMPLES) == [AudioReceived(b"\x01\x00\xff\xff", 8000)]
    assert conn.receive(AUDIO_20MS) == [AudioReceived(PCM_20MS, 8000)]
    assert conn.sample_rate == 8000


@pytest.mark.parametrize(
    ("kind_byte", "rate"),
    [
        (0x10, 8000),
        (0x11, 12000),
        (0x12, 16000),
        (0x13, 24000),
        (0x14, 32000),
        (0x15, 44100),
        (0x16, 48000),
        (0x17, 96000),
        (0x18, 192000),
    ],
)
def test_every_audio_kind(kind_byte: int, rate: int) -> None:
    conn = started()
    message = bytes([kind_byte]) + bytes.fromhex("0002 3412")
    assert conn.receive(message) == [AudioReceived(b"\x34\x12", rate)]
    assert conn.sample_rate == rate
    assert AUDIO_KINDS[Kind(kind_byte)] == rate


@pytest.mark.parametrize("digit", sorted(DTMF_DIGITS))
def test_every_dtmf_digit(digit: str) -> None:
    message = bytes.fromhex("03 0001") + digit.encode("ascii")
    assert started().receive(message) == [DtmfReceived(digit)]


def test_dtmf_exact() -> None:
    assert started().receive(DTMF_5 + DTMF_HASH) == [DtmfReceived("5"), DtmfReceived("#")]


@pytest.mark.parametrize("digit", "abcd")
def test_lowercase_dtmf_from_sip_info_is_uppercased(digit: str) -> None:
    # res_pjsip_dtmf_info get_event() passes a-d through as they came
    message = bytes.fromhex("03 0001") + digit.encode()
    assert started().receive(message) == [DtmfReceived(digit.upper())]


def test_hangup_exact() -> None:
    conn = started()
    assert conn.receive(DOC_HANGUP) == [HangupReceived()]
    assert conn.state is State.CLOSING


@pytest.mark.parametrize(
    ("hex_message", "code", "description"),
    [
        ("ff 0001 01", 1, "hangup of calling party"),
        ("ff 0001 02", 2, "frame forwarding error"),
        ("ff 0001 04", 4, "memory (allocation) error"),
        (
            "ff 0001 07",
            7,
            "hangup of calling party; frame forwarding error; memory (allocation) error",
        ),
        ("ff 0001 09", 9, "hangup of calling party; unknown error bits 0x08"),
        ("ff 0001 00", 0, "no error bits set"),
        ("ff 0000", None, "no error code"),  # the code is "optional" [docs Types]
    ],
)
def test_error_messages(hex_message: str, code: int | None, description: str) -> None:
    payload = bytes.fromhex(hex_message)[HEADER_BYTES:]
    conn = started()
    assert conn.receive(bytes.fromhex(hex_message)) == [ErrorReceived(code, description, payload)]
    assert conn.state is State.ACTIVE  # the caller decides what an error means
    assert describe_error_code(code) == description


def test_application_specific_error_payload_is_kept() -> None:
    events = started().receive(bytes.fromhex("ff 0003 02 abcd"))
    assert events == [ErrorReceived(2, "frame forwarding error", b"\x02\xab\xcd")]


def test_error_bits_are_the_readme_ones() -> None:
    assert dict(ASTERISK_ERROR_BITS) == {
        0x01: "hangup of calling party",
        0x02: "frame forwarding error",
        0x04: "memory (allocation) error",
    }


def test_audio_payload_is_not_in_repr() -> None:
    assert "payload" not in repr(AudioReceived(b"\x00" * 320, 8000))


# --------------------------------------------------------------------------- outbound, exact


def test_hangup_bytes() -> None:
    conn = started()
    assert conn.hangup() == DOC_HANGUP == HANGUP_MESSAGE == bytes.fromhex("000000")
    assert conn.state is State.CLOSING


def test_audio_out_exact_two_samples() -> None:
    assert started().audio(b"\x01\x00\xff\xff") == [AUDIO_TWO_SAMPLES]


def test_audio_out_is_cut_into_20ms_messages_at_8k() -> None:
    pcm = PCM_20MS * 2 + b"\x02\x00"
    messages = started().audio(pcm)
    assert messages == [AUDIO_20MS, AUDIO_20MS, bytes.fromhex("10 0002 0200")]


@pytest.mark.parametrize(
    ("rate", "header"),
    [
        (8000, "10 0140"),  # 320 bytes
        (12000, "11 01e0"),  # 480
        (16000, "12 0280"),  # 640
        (24000, "13 03c0"),  # 960
        (32000, "14 0500"),  # 1280
        (44100, "15 06e4"),  # 1764: 882 samples
        (48000, "16 0780"),  # 1920
        (96000, "17 0f00"),  # 3840
        (192000, "18 1e00"),  # 7680
    ],
)
def test_audio_out_frame_per_rate(rate: int, header: str) -> None:
    size = frame_bytes(rate)
    pcm = bytes(range(256)) * (2 * size // 256 + 1)
    pcm = pcm[: 2 * size + 4]
    messages = started().audio(pcm, rate)
    assert [m[:HEADER_BYTES] for m in messages[:2]] == [bytes.fromhex(header)] * 2
    assert messages[2][:HEADER_BYTES] == bytes.fromhex(header)[:1] + b"\x00\x04"
    assert b"".join(m[HEADER_BYTES:] for m in messages) == pcm


def test_empty_audio_out_is_no_message() -> None:
    # Asterisk ends the call on a zero-length audio message [src
    # ast_audiosocket_receive_frame_with_hangup], so none is ever built
    assert started().audio(b"") == []


@given(
    pcm_samples=st.integers(0, 5000),
    rate=st.sampled_from(sorted(AUDIO_KINDS.values())),
    seed=st.integers(0, 255),
)
@FUZZ
def test_audio_out_reassembles_to_the_input(pcm_samples: int, rate: int, seed: int) -> None:
    pcm = bytes((seed + i) % 256 for i in range(2 * pcm_samples))
    messages = started().audio(pcm, rate)
    size = frame_bytes(rate)
    receiver = AudioSocketConnection()
    receiver.receive(README_UUID_MESSAGE)
    events = receiver.receive(b"".join(messages))
    assert b"".join(e.payload for e in events if isinstance(e, AudioReceived)) == pcm
    assert all(isinstance(e, AudioReceived) and e.sample_rate == rate for e in events)
    assert all(len(m) == HEADER_BYTES + size for m in messages[:-1])
    assert all(0 < len(m) - HEADER_BYTES <= size for m in messages)


def test_odd_audio_out_is_a_usage_error() -> None:
    conn = started()
    expect_usage_error(lambda: conn.audio(b"\x00\x00\x00"), Code.ODD_AUDIO_LENGTH)
    assert conn.state is State.ACTIVE


@pytest.mark.parametrize("rate", [0, 11025, 22050, 44000, 64000, -8000])
def test_audio_out_at_an_unknown_rate_is_a_usage_error(rate: int) -> None:
    conn = started()
    with pytest.raises(AudioSocketUsageError) as info:
        conn.audio(b"\x00\x00", rate)
    assert info.value.code is Code.UNSUPPORTED_SAMPLE_RATE
    assert str(rate) in info.value.message


# --------------------------------------------------------------------------- framing helpers


@pytest.mark.parametrize(
    ("kind", "payload", "hex_message"),
    [
        (Kind.HANGUP, b"", "00 0000"),
        (Kind.UUID, bytes(16), "01 0010" + "00" * 16),
        (Kind.DTMF, b"9", "03 0001 39"),
        (Kind.AUDIO_8K, b"\x01\x00", "10 0002 0100"),
        (Kind.ERROR, b"\x04", "ff 0001 04"),
        (0x02, b"", "02 0000"),  # any byte is framed: tests build bad streams with it
        (Kind.AUDIO_48K, b"\x00" * 0x1234, "16 1234" + "00" * 0x1234),
    ],
)
def test_encode_message_exact(kind: Kind | int, payload: bytes, hex_message: str) -> None:
    message = bytes.fromhex(hex_message)
    assert encode_message(kind, payload) == message
    assert decode_header(message) == Header(int(kind), len(payload))


def test_encode_message_largest_payload() -> None:
    message = encode_message(Kind.AUDIO_8K, bytes(MAX_PAYLOAD_BYTES))
    assert message[:HEADER_BYTES] == bytes.fromhex("10 ffff")
    assert decode_header(message) == Header(0x10, 65_535)


@pytest.mark.parametrize(
    "call",
    [
        lambda: encode_message(Kind.AUDIO_8K, bytes(MAX_PAYLOAD_BYTES + 1)),
        lambda: encode_message(0x100, b""),
        lambda: encode_message(-1, b""),
        lambda: decode_header(b"\x10\x00"),
        lambda: decode_header(b""),
    ],
)
def test_framing_helpers_refuse_bad_arguments(call: Callable[[], object]) -> None:
    expect_usage_error(call, Code.INVALID_ARGUMENT)


def test_kinds_are_the_documented_bytes() -> None:
    assert {k.name: k.value for k in Kind} == {
        "HANGUP": 0x00,
        "UUID": 0x01,
        "DTMF": 0x03,
        "AUDIO_8K": 0x10,
        "AUDIO_12K": 0x11,
        "AUDIO_16K": 0x12,
        "AUDIO_24K": 0x13,
        "AUDIO_32K": 0x14,
        "AUDIO_44K": 0x15,
        "AUDIO_48K": 0x16,
        "AUDIO_96K": 0x17,
        "AUDIO_192K": 0x18,
        "ERROR": 0xFF,
    }


# --------------------------------------------------------------------------- fragmentation

# A realistic call: Asterisk's UUID, three 20 ms frames, a key press, more audio, an
# error byte and a terminate: every kind, 1,366 bytes.
STREAM_MESSAGES = [
    README_UUID_MESSAGE,
    AUDIO_20MS,
    AUDIO_20MS,
    AUDIO_TWO_SAMPLES,
    DTMF_5,
    AUDIO_20MS,
    DTMF_HASH,
    ERROR_HANGUP,
    AUDIO_20MS,
    DOC_HANGUP,
]
STREAM = b"".join(STREAM_MESSAGES)
STREAM_EVENTS: list[AudioSocketEvent] = [
    CallStarted(README_UUID),
    AudioReceived(PCM_20MS, 8000),
    AudioReceived(PCM_20MS, 8000),
    AudioReceived(b"\x01\x00\xff\xff", 8000),
    DtmfReceived("5"),
    AudioReceived(PCM_20MS, 8000),
    DtmfReceived("#"),
    ErrorReceived(1, "hangup of calling party", b"\x01"),
    AudioReceived(PCM_20MS, 8000),
    HangupReceived(),
]


def feed(chunks: list[bytes]) -> list[AudioSocketEvent]:
    conn = AudioSocketConnection()
    events: list[AudioSocketEvent] = []
    for chunk in chunks:
        events += conn.receive(chunk)
    assert conn.buffered_bytes == 0
    conn.connection_closed()  # no truncation: raises otherwise
    return events


def test_stream_all_at_once() -> None:
    assert feed([STREAM]) == STREAM_EVENTS


def test_stream_one_byte_at_a_time() -> None:
    conn = AudioSocketConnection()
    events: list[AudioSocketEvent] = []
    held = []
    for i in range(len(STREAM)):
        events += conn.receive(STREAM[i : i + 1])
        held.append(conn.buffered_bytes)
    assert events == STREAM_EVENTS
    assert max(held) == len(AUDIO_20MS) - 1
    assert conn.state is State.CLOSING


def test_stream_split_at_every_point() -> None:
    for split in range(len(STREAM) + 1):
        assert feed([STREAM[:split], STREAM[split:]]) == STREAM_EVENTS, split


def test_stream_message_by_message_with_empty_reads() -> None:
    chunks = [part for message in STREAM_MESSAGES for part in (b"", message)]
    assert feed(chunks) == STREAM_EVENTS


@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=40))
@FUZZ
def test_stream_any_fragmentation(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    assert feed([STREAM[a:b] for a, b in itertools.pairwise(bounds)]) == STREAM_EVENTS


def _outcome(chunks: list[bytes]) -> tuple[list[AudioSocketEvent], str | None, int]:
    """Events, the error code (or None), and the bytes held, however ``chunks`` cut it."""
    conn = AudioSocketConnection()
    events: list[AudioSocketEvent] = []
    for chunk in chunks:
        try:
            events += conn.receive(chunk)
        except AudioSocketProtocolError as exc:
            return events + list(exc.events), exc.code, 0
    return events, None, conn.buffered_bytes


@given(
    tail=st.binary(max_size=300)
    | st.lists(
        st.sampled_from([*STREAM_MESSAGES[1:], b"\x02", b"\x10\x00\x03", b"\x03\x00\x01X"]),
        max_size=12,
    ).map(b"".join),
    cuts=st.lists(st.integers(0, 2000), max_size=20),
)
@FUZZ
def test_outcome_does_not_depend_on_fragmentation(tail: bytes, cuts: list[int]) -> None:
    """Good or bad, any stream gives the same events and the same error however it is cut:
    the events a failing read decoded before the bad message travel on the exception."""
    stream = README_UUID_MESSAGE + tail
    bounds = [0, *sorted(c for c in cuts if c <= len(stream)), len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    assert _outcome(chunks) == _outcome([stream])


def test_events_before_a_bad_message_travel_on_the_exception() -> None:
    conn = AudioSocketConnection()
    error = expect_protocol_error(conn, README_UUID_MESSAGE + DTMF_5 + b"\x02", Code.UNKNOWN_KIND)
    assert error.events == (CallStarted(README_UUID), DtmfReceived("5"))


@pytest.mark.realtime  # a speed bound: runs alone (Makefile)
def test_many_messages_in_one_read_are_fast() -> None:
    stream = README_UUID_MESSAGE + AUDIO_20MS * 20_000  # 400 s of audio, 6.5 MB
    conn = AudioSocketConnection()
    begin = time.perf_counter()
    events = conn.receive(stream)
    elapsed = time.perf_counter() - begin
    assert len(events) == 20_001
    assert elapsed < 1.0


# --------------------------------------------------------------------------- remote misbehaviour


@pytest.mark.parametrize("kind", [0x02, 0x04, 0x0F, 0x19, 0x20, 0x7F, 0x80, 0xFE])
def test_unknown_kinds_are_refused_at_their_first_byte(kind: int) -> None:
    conn = started()
    # Only the kind byte: the error waits neither for a length nor for a payload.
    error = expect_protocol_error(conn, bytes([kind]), Code.UNKNOWN_KIND)
    assert f"0x{kind:02x}" in error.message


def test_unknown_kind_before_the_uuid() -> None:
    expect_protocol_error(AudioSocketConnection(), b"\x02\x00\x00", Code.UNKNOWN_KIND)


def test_oversize_length_is_refused_at_the_header() -> None:
    conn = started(max_payload=1000)
    expect_protocol_error(conn, bytes.fromhex("10 03ea"), Code.FRAME_TOO_LARGE)  # 1002


def test_payload_at_the_limit_is_accepted() -> None:
    conn = started(max_payload=1000)
    message = encode_message(Kind.AUDIO_8K, bytes(1000))
    held = []
    for i in range(0, len(message), 7):
        assert conn.buffered_bytes < HEADER_BYTES + 1000
        events = conn.receive(message[i : i + 7])
        held.append(conn.buffered_bytes)
    assert events == [AudioReceived(bytes(1000), 8000)]
    assert max(held) < HEADER_BYTES + 1000


def test_the_buffer_is_bounded_by_one_message() -> None:
    conn = started(max_payload=100)
    conn.receive(bytes.fromhex("10 0064") + bytes(99))  # one byte short of 100
    assert conn.buffered_bytes == HEADER_BYTES + 99
    expect_protocol_error(
        AudioSocketConnection(max_payload=100),
        README_UUID_MESSAGE + bytes.fromhex("10 0065"),
        Code.FRAME_TOO_LARGE,
    )


@pytest.mark.parametrize("max_payload", [0, 15, 65_536, -1])
def test_max_payload_is_bounded(max_payload: int) -> None:
    with pytest.raises(ValueError):
        AudioSocketConnection(max_payload=max_payload)


@pytest.mark.parametrize(
    ("data", "held"),
    [
        (b"\x01", 1),  # inside the first header
        (README_UUID_MESSAGE[:10], 10),  # inside the UUID
        (README_UUID_MESSAGE + AUDIO_20MS[:2], 2),  # inside a header
        (README_UUID_MESSAGE + AUDIO_20MS[:100], 100),  # inside a payload
    ],
)
def test_truncated_stream_at_close(data: bytes, held: int) -> None:
    conn = AudioSocketConnection()
    conn.receive(data)
    assert conn.buffered_bytes == held
    with pytest.raises(AudioSocketProtocolError) as info:
        conn.connection_closed()
    assert info.value.code is Code.TRUNCATED
    assert str(held) in info.value.message
    assert conn.state is State.CLOSED  # the socket is gone either way
    assert conn.buffered_bytes == 0


@pytest.mark.parametrize(
    "message",
    [AUDIO_20MS, DTMF_5, ERROR_HANGUP, DOC_HANGUP],
    ids=["audio", "dtmf", "error", "hangup"],
)
def test_anything_before_the_uuid_is_unexpected(message: bytes) -> None:
    expect_protocol_error(AudioSocketConnection(), message, Code.UNEXPECTED_MESSAGE)


def test_audio_before_the_uuid_is_refused_at_the_header() -> None:
    expect_protocol_error(AudioSocketConnection(), AUDIO_20MS[:3], Code.UNEXPECTED_MESSAGE)


def test_a_second_uuid_is_unexpected() -> None:
    conn = started()
    expect_protocol_error(conn, CRATE_UUID_MESSAGE, Code.UNEXPECTED_MESSAGE)
    assert conn.call_id == README_UUID


@pytest.mark.parametrize("length", [0, 1, 15, 17, 36])
def test_uuid_of_the_wrong_length(length: int) -> None:
    message = b"\x01" + length.to_bytes(2, "big") + bytes(length)
    expect_protocol_error(AudioSocketConnection(), message, Code.BAD_UUID)


@pytest.mark.parametrize("byte", [b"X", b"!", b"e", b"E", b" ", b"\x00", b"\x0a", b"\x80", b"\xff"])
def test_bad_dtmf_byte(byte: bytes) -> None:
    error = expect_protocol_error(started(), b"\x03\x00\x01" + byte, Code.BAD_DTMF)
    assert f"0x{byte[0]:02x}" in error.message


@pytest.mark.parametrize("payload", [b"", b"12"])
def test_dtmf_of_the_wrong_length(payload: bytes) -> None:
    expect_protocol_error(started(), encode_message(Kind.DTMF, payload), Code.BAD_DTMF)


@pytest.mark.parametrize("length", [0, 1, 3, 319, 321])
@pytest.mark.parametrize("kind", [Kind.AUDIO_8K, Kind.AUDIO_16K, Kind.AUDIO_192K])
def test_odd_or_empty_audio_is_refused_at_the_header(kind: Kind, length: int) -> None:
    header = bytes([kind]) + length.to_bytes(2, "big")
    expect_protocol_error(started(), header, Code.BAD_AUDIO_LENGTH)


def test_terminate_with_a_payload() -> None:
    expect_protocol_error(started(), bytes.fromhex("00 0001 00"), Code.BAD_HANGUP)


def test_sample_rate_change_mid_call() -> None:
    conn = started()
    conn.receive(AUDIO_20MS)
    error = expect_protocol_error(conn, bytes.fromhex("12 0002 0000"), Code.SAMPLE_RATE_CHANGED)
    assert "16000" in error.message and "8000" in error.message


def test_the_first_audio_sets_the_rate() -> None:
    conn = started()
    conn.receive(bytes.fromhex("12 0002 0000"))
    assert conn.sample_rate == 16000
    assert AudioSocketConnection.format_name(conn.sample_rate) == "pcm_16000"


def test_error_messages_are_short_and_printable() -> None:
    for data in (b"\x7f\xff\xff", bytes.fromhex("10 ffff"), b"\x03\x00\x01\xff"):
        conn = started(max_payload=16)
        with pytest.raises(AudioSocketError) as info:
            conn.receive(data)
        assert len(str(info.value)) < 200 and str(info.value).isprintable()


def test_error_types_separate_remote_from_local() -> None:
    assert issubclass(AudioSocketProtocolError, AudioSocketError)
    assert issubclass(AudioSocketUsageError, AudioSocketError)
    assert not issubclass(AudioSocketProtocolError, AudioSocketUsageError)
    assert f"{Code.BAD_DTMF}" == "bad_dtmf"  # StrEnum: logs and JSON see the plain string
    with pytest.raises(AudioSocketProtocolError):
        started().receive(b"\x02\x00\x00")  # the peer's fault
    with pytest.raises(AudioSocketUsageError):
        started().audio(b"\x00")  # ours


# --------------------------------------------------------------------------- state table

REMOTE_MESSAGES: dict[Trigger, bytes] = {
    Trigger.UUID: CRATE_UUID_MESSAGE,
    Trigger.AUDIO: AUDIO_TWO_SAMPLES,
    Trigger.DTMF: DTMF_5,
    Trigger.ERROR: ERROR_HANGUP,
    Trigger.REMOTE_HANGUP: DOC_HANGUP,
}

LOCAL_ACTIONS: dict[Trigger, Callable[[AudioSocketConnection], object]] = {
    Trigger.SEND_AUDIO: lambda conn: conn.audio(b"\x00\x00"),
    Trigger.HANGUP: lambda conn: conn.hangup(),
    Trigger.CONNECTION_CLOSED: lambda conn: conn.connection_closed(),
}


def test_every_trigger_is_exercised() -> None:
    assert set(REMOTE_MESSAGES) | set(LOCAL_ACTIONS) == set(Trigger)
    assert {state for state, _ in TRANSITIONS} == set(State)


def in_state(state: AudioSocketState) -> AudioSocketConnection:
    conn = AudioSocketConnection()
    if state is State.AWAITING_UUID:
        return conn
    if state is State.FAILED:
        with pytest.raises(AudioSocketProtocolError):
            conn.receive(b"\x02\x00\x00")
        return conn
    conn.receive(README_UUID_MESSAGE)
    if state is State.CLOSING:
        conn.hangup()
    elif state is State.CLOSED:
        conn.connection_closed()
    assert conn.state is state
    return conn


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("trigger", list(REMOTE_MESSAGES))
def test_remote_triggers_follow_the_table(state: AudioSocketState, trigger: Trigger) -> None:
    conn = in_state(state)
    message = REMOTE_MESSAGES[trigger]
    expected = TRANSITIONS.get((state, trigger))
    if expected is not None:
        assert len(conn.receive(message)) == 1
        assert conn.state is expected
    elif state is State.FAILED:
        expect_usage_error(lambda: conn.receive(message), Code.CONNECTION_FAILED)
        assert conn.state is State.FAILED
    elif state is State.CLOSED:
        expect_usage_error(lambda: conn.receive(message), Code.CLOSED)
        assert conn.state is State.CLOSED
    else:
        expect_protocol_error(conn, message, Code.UNEXPECTED_MESSAGE)


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("trigger", list(LOCAL_ACTIONS))
def test_local_triggers_follow_the_table(state: AudioSocketState, trigger: Trigger) -> None:
    conn = in_state(state)
    expected = TRANSITIONS.get((state, trigger))
    if expected is not None:
        LOCAL_ACTIONS[trigger](conn)
        assert conn.state is expected
        return
    code = {
        State.AWAITING_UUID: Code.NOT_STARTED,
        State.FAILED: Code.CONNECTION_FAILED,
    }.get(state, Code.CLOSED)
    expect_usage_error(lambda: LOCAL_ACTIONS[trigger](conn), code)
    assert conn.state is state


def test_the_table_exactly() -> None:
    s, t = State, Trigger
    inbound = (t.AUDIO, t.DTMF, t.ERROR, t.REMOTE_HANGUP)
    assert dict(TRANSITIONS) == {
        (s.AWAITING_UUID, t.UUID): s.ACTIVE,
        **{(s.ACTIVE, x): s.ACTIVE for x in (t.AUDIO, t.DTMF, t.ERROR, t.SEND_AUDIO)},
        (s.ACTIVE, t.REMOTE_HANGUP): s.CLOSING,
        (s.ACTIVE, t.HANGUP): s.CLOSING,
        **{(s.CLOSING, x): s.CLOSING for x in inbound},
        **{(state, t.CONNECTION_CLOSED): s.CLOSED for state in State},
    }


def test_closing_still_accepts_inbound_but_sends_nothing() -> None:
    conn = started()
    conn.hangup()
    assert conn.receive(AUDIO_20MS + DTMF_5 + DOC_HANGUP) == [
        AudioReceived(PCM_20MS, 8000),
        DtmfReceived("5"),
        HangupReceived(),  # the peer's terminate crossed ours
    ]
    expect_usage_error(lambda: conn.audio(PCM_20MS), Code.CLOSED)
    expect_usage_error(conn.hangup, Code.CLOSED)


def test_after_a_remote_terminate_we_send_nothing() -> None:
    conn = started()
    conn.receive(DOC_HANGUP)
    expect_usage_error(lambda: conn.audio(PCM_20MS), Code.CLOSED)
    expect_usage_error(conn.hangup, Code.CLOSED)
    conn.connection_closed()
    assert conn.state is State.CLOSED


def test_before_the_uuid_nothing_can_be_sent() -> None:
    conn = AudioSocketConnection()
    expect_usage_error(lambda: conn.audio(PCM_20MS), Code.NOT_STARTED)
    expect_usage_error(conn.hangup, Code.NOT_STARTED)  # close the socket instead
    assert conn.state is State.AWAITING_UUID


def test_after_failure_everything_is_local_misuse() -> None:
    conn = in_state(State.FAILED)
    for call in (conn.hangup, lambda: conn.audio(b"\x00\x00"), lambda: conn.receive(b"")):
        expect_usage_error(call, Code.CONNECTION_FAILED)
    conn.connection_closed()  # closing is always legal
    assert conn.state is State.CLOSED


def test_after_close_receiving_is_local_misuse() -> None:
    conn = in_state(State.CLOSED)
    expect_usage_error(lambda: conn.receive(AUDIO_20MS), Code.CLOSED)
    conn.connection_closed()
    assert conn.state is State.CLOSED


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize(
    ("rate", "name"),
    [(8000, "pcm_8000"), (16000, "pcm_16000"), (24000, "pcm_24000"), (48000, "pcm_48000")],
)
def test_format_name(rate: int, name: str) -> None:
    assert AudioSocketConnection.format_name(rate) == name
    assert GATEWAY_FORMATS[rate] == name


@pytest.mark.parametrize("rate", [12000, 32000, 44100, 96000, 192000, 11025, 0])
def test_format_name_unknown_rate(rate: int) -> None:
    with pytest.raises(AudioSocketUsageError) as info:
        AudioSocketConnection.format_name(rate)
    assert info.value.code is Code.UNSUPPORTED_SAMPLE_RATE
    assert str(rate) in info.value.message


def test_frame_bytes() -> None:
    assert [frame_bytes(rate) for rate in sorted(AUDIO_KINDS.values())] == [
        320,
        480,
        640,
        960,
        1280,
        1764,
        1920,
        3840,
        7680,
    ]
