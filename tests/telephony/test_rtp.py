"""RTP/RTCP core, byte for byte, without sockets or clocks.

Expected datagrams are written out in hex from the layouts of RFC 3550 (5.1 RTP header,
6.4.1 SR and report block, 6.4.2 RR, 6.5 SDES, 6.6 BYE) and RFC 4733 2.3 (telephone-event
payload); each comment gives the arithmetic. Statistics follow appendix A (A.1 sequence
validation, A.3 loss, A.8 jitter).
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from telephony.rtp import (
    DTMF_EVENTS,
    MAX_DROPOUT,
    MAX_MISORDER,
    NTP_EPOCH_OFFSET,
    DtmfReceiver,
    RtpError,
    RtpErrorCode,
    RtpPacket,
    RtpReceiver,
    RtpSender,
    RtpUsageError,
    build_rtp,
    is_rtcp,
    ntp_timestamp,
    parse_rtp,
)
from tests.telephony.fuzzing import FUZZ


def hx(text: str) -> bytes:
    return bytes.fromhex(text)


FRAME = bytes(range(160))  # one 20 ms PCMU frame
PEER = 0xCAFEBABE
US = 0x11223344


# --------------------------------------------------------------------------- RTP packets

# 5.1: V=2 P=0 X=0 CC=0 -> 0x80; M=1 PT=0 -> 0x80; seq 0x1234; ts 0xDEADBEEF; SSRC 0x01020304
PCMU_MARKED = hx("80 80 1234 deadbeef 01020304") + b"\xff\xfe\xfd"
# M=0 PT=8 (PCMA, RFC 3551 6) -> 0x08; seq 65535; ts 0; SSRC 0xFFFFFFFF
PCMA = hx("80 08 ffff 00000000 ffffffff") + b"\xd5" * 4
# M=1 PT=101 -> 0x80 | 0x65 = 0xE5; seq 7; ts 160; SSRC 0xCAFEBABE; event 5, E=0, volume 10,
# duration 160 (RFC 4733 2.3)
EVENT_START = hx("80 e5 0007 000000a0 cafebabe") + hx("05 0a 00a0")


def test_build_pcmu_with_marker_exact_bytes() -> None:
    packet = RtpPacket(0, 0x1234, 0xDEADBEEF, 0x01020304, True, b"\xff\xfe\xfd")
    assert build_rtp(packet) == PCMU_MARKED


def test_build_pcma_and_telephone_event_exact_bytes() -> None:
    assert build_rtp(RtpPacket(8, 65535, 0, 0xFFFFFFFF, False, b"\xd5" * 4)) == PCMA
    event = RtpPacket(101, 7, 160, PEER, True, hx("05 0a 00a0"))
    assert build_rtp(event) == EVENT_START


def test_parse_the_same_headers() -> None:
    assert parse_rtp(PCMU_MARKED) == RtpPacket(
        0, 0x1234, 0xDEADBEEF, 0x01020304, True, b"\xff\xfe\xfd"
    )
    assert parse_rtp(PCMA) == RtpPacket(8, 65535, 0, 0xFFFFFFFF, False, b"\xd5" * 4)
    packet = parse_rtp(EVENT_START)
    assert (packet.payload_type, packet.marker, packet.sequence) == (101, True, 7)
    assert (packet.timestamp, packet.ssrc, packet.payload) == (160, PEER, hx("050a00a0"))
    assert packet.csrc == ()


def test_header_only_packet_has_empty_payload() -> None:
    assert parse_rtp(hx("80 00 0001 00000002 00000003")).payload == b""


def test_csrc_list_built_and_parsed() -> None:
    # CC=2 -> 0x82; the two CSRCs follow the SSRC (5.1)
    data = hx("82 00 0001 00000002 00000003 0000000a 0000000b") + b"pcm"
    packet = RtpPacket(0, 1, 2, 3, False, b"pcm", (10, 11))
    assert build_rtp(packet) == data
    assert parse_rtp(data) == packet


def test_header_extension_is_skipped() -> None:
    # X=1 -> 0x90; extension: profile 0xBEDE, length 2 words (5.3.1), then 8 octets
    data = hx("90 00 0001 00000002 00000003 bede 0002 1122334455667788") + b"audio"
    packet = parse_rtp(data)
    assert packet.payload == b"audio"
    assert (packet.sequence, packet.timestamp, packet.ssrc) == (1, 2, 3)


def test_empty_header_extension_is_skipped() -> None:
    data = hx("90 00 0001 00000002 00000003 1000 0000") + b"audio"
    assert parse_rtp(data).payload == b"audio"


def test_padding_is_removed() -> None:
    # P=1 -> 0xA0; 3 octets of padding, the last one the count "including itself" (5.1)
    data = hx("a0 00 0001 00000002 00000003") + b"audio" + hx("000003")
    assert parse_rtp(data).payload == b"audio"


def test_padding_extension_and_csrc_together() -> None:
    # V=2 P=1 X=1 CC=1 -> 0xB1; M=1 PT=8 -> 0x88
    data = (
        hx("b1 88 0001 00000002 00000003 00000004 abcd 0001 deadbeef")
        + b"audio"
        + hx("00000000000000 08")  # 8 octets of padding, the last one the count
    )
    packet = parse_rtp(data)
    assert packet == RtpPacket(8, 1, 2, 3, True, b"audio", (4,))


def test_padding_may_take_the_whole_payload() -> None:
    data = hx("a0 00 0001 00000002 00000003 00000004")
    assert parse_rtp(data).payload == b""


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", RtpErrorCode.TOO_SHORT),
        (hx("80 00 0001 00000002 000000"), RtpErrorCode.TOO_SHORT),  # 11 octets
        (hx("40 00 0001 00000002 00000003") + b"x", RtpErrorCode.BAD_VERSION),  # V=1
        (hx("00 00 0001 00000002 00000003") + b"x", RtpErrorCode.BAD_VERSION),  # V=0
        (hx("c0 00 0001 00000002 00000003") + b"x", RtpErrorCode.BAD_VERSION),  # V=3
        # padding count 6, but only 5 octets follow the header
        (hx("a0 00 0001 00000002 00000003") + b"abcd\x06", RtpErrorCode.BAD_PADDING),
        # padding count 0: the count includes itself, so at least 1
        (hx("a0 00 0001 00000002 00000003") + b"abcd\x00", RtpErrorCode.BAD_PADDING),
        # padding count 9, with 4 octets after the header and its empty extension
        (hx("b0 00 0001 00000002 00000003 bede 0000") + b"abc\x09", RtpErrorCode.BAD_PADDING),
        # extension says 3 words (12 octets); only 4 follow
        (hx("90 00 0001 00000002 00000003 bede 0003 00000000"), RtpErrorCode.BAD_EXTENSION),
        # X=1 but the extension header itself is cut
        (hx("90 00 0001 00000002 00000003 bede"), RtpErrorCode.BAD_EXTENSION),
        # CC=3, two CSRCs present
        (hx("83 00 0001 00000002 00000003 00000004 00000005"), RtpErrorCode.BAD_CSRC),
        (hx("8f 00 0001 00000002 00000003"), RtpErrorCode.BAD_CSRC),
    ],
)
def test_malformed_rtp_raises_typed_error(data: bytes, code: RtpErrorCode) -> None:
    with pytest.raises(RtpError) as caught:
        parse_rtp(data)
    assert caught.value.code == code
    assert caught.value.code in str(caught.value)


@pytest.mark.parametrize(
    ("packet", "what"),
    [
        (RtpPacket(128, 0, 0, 0, False, b""), "payload type"),
        (RtpPacket(-1, 0, 0, 0, False, b""), "payload type"),
        (RtpPacket(0, 65536, 0, 0, False, b""), "sequence"),
        (RtpPacket(0, -1, 0, 0, False, b""), "sequence"),
        (RtpPacket(0, 0, 1 << 32, 0, False, b""), "timestamp"),
        (RtpPacket(0, 0, 0, 1 << 32, False, b""), "SSRC"),
        (RtpPacket(0, 0, 0, 0, False, b"", (1 << 32,)), "CSRC"),
        (RtpPacket(0, 0, 0, 0, False, b"", tuple(range(16))), "CSRC count"),
    ],
)
def test_build_rejects_fields_out_of_range(packet: RtpPacket, what: str) -> None:
    with pytest.raises(RtpUsageError) as caught:
        build_rtp(packet)
    assert caught.value.code == RtpErrorCode.INVALID_FIELD
    assert what in caught.value.message


def test_usage_error_is_not_an_rtp_error() -> None:
    # The UDP layer catches RtpError to drop a peer's bad datagram; our own bugs must not
    # be swallowed with it.
    assert not issubclass(RtpUsageError, RtpError)
    assert not issubclass(RtpError, RtpUsageError)


_packets = st.builds(
    RtpPacket,
    payload_type=st.integers(0, 127),
    sequence=st.integers(0, 0xFFFF),
    timestamp=st.integers(0, 0xFFFFFFFF),
    ssrc=st.integers(0, 0xFFFFFFFF),
    marker=st.booleans(),
    payload=st.binary(max_size=300),
    csrc=st.lists(st.integers(0, 0xFFFFFFFF), max_size=15).map(tuple),
)


@FUZZ
@given(packet=_packets)
def test_build_then_parse_round_trips(packet: RtpPacket) -> None:
    data = build_rtp(packet)
    assert len(data) == 12 + 4 * len(packet.csrc) + len(packet.payload)
    assert parse_rtp(data) == packet


@FUZZ
@given(data=st.binary(max_size=80))
def test_parse_arbitrary_bytes_returns_a_packet_or_raises_rtp_error(data: bytes) -> None:
    try:
        packet = parse_rtp(data)
    except RtpError as exc:
        assert exc.code in set(RtpErrorCode)
    else:
        assert len(packet.payload) <= len(data) - 12


@FUZZ
@given(packet=_packets, extension=st.binary(max_size=40), padding=st.integers(1, 255))
def test_parse_skips_any_extension_and_padding(
    packet: RtpPacket, extension: bytes, padding: int
) -> None:
    data = bytearray(build_rtp(packet))
    data[0] |= 0x30  # X and P
    words = -(-len(extension) // 4)
    ext = hx("abcd") + struct.pack("!H", words) + extension.ljust(4 * words, b"\0")
    head = 12 + 4 * len(packet.csrc)
    wire = bytes(data[:head]) + ext + packet.payload + bytes(padding - 1) + bytes((padding,))
    assert parse_rtp(wire) == packet


# --------------------------------------------------------------------------- is_rtcp


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        (200, True),  # SR
        (201, True),  # RR
        (202, True),  # SDES
        (203, True),  # BYE
        (192, True),  # M=1 PT=64: the first value RFC 5761 4 gives to RTCP
        (223, True),  # M=1 PT=95: the last
        (191, False),  # M=1 PT=63
        (224, False),  # M=1 PT=96 (dynamic)
        (0x00, False),  # PCMU
        (0x80, False),  # PCMU with marker
        (0x08, False),  # PCMA
        (0xE5, False),  # telephone-event 101 with marker
        (0x65, False),  # telephone-event 101
    ],
)
def test_is_rtcp_by_second_octet(second: int, expected: bool) -> None:
    assert is_rtcp(bytes((0x80, second)) + bytes(10)) is expected


def test_is_rtcp_too_short() -> None:
    assert not is_rtcp(b"")
    assert not is_rtcp(b"\x80")


# --------------------------------------------------------------------------- NTP


def test_ntp_timestamp_epoch_offset() -> None:
    assert NTP_EPOCH_OFFSET == 2_208_988_800  # 70 years of 365 days + 17 leap days
    assert NTP_EPOCH_OFFSET == (70 * 365 + 17) * 86_400
    assert ntp_timestamp(0.0) == (2_208_988_800, 0)


def test_ntp_timestamp_fraction() -> None:
    # 1_700_000_000 + 2_208_988_800 = 3_908_988_800 = 0xE8FE6F80; .5 s = 2**31
    assert ntp_timestamp(1_700_000_000.5) == (0xE8FE6F80, 0x80000000)
    assert ntp_timestamp(1_700_000_000.25) == (0xE8FE6F80, 0x40000000)
    assert ntp_timestamp(1.75) == (2_208_988_801, 0xC0000000)


def test_ntp_timestamp_wraps_into_era_1() -> None:
    # 2036-02-07T06:28:16Z is 2**32 s after 1900: seconds wrap to 0
    assert ntp_timestamp(float((1 << 32) - NTP_EPOCH_OFFSET)) == (0, 0)
    assert ntp_timestamp(float((1 << 32) - NTP_EPOCH_OFFSET) + 1.5) == (1, 0x80000000)


@pytest.mark.parametrize("wallclock", [-1.0, math.nan, math.inf])
def test_ntp_timestamp_rejects_bad_wallclock(wallclock: float) -> None:
    with pytest.raises(RtpUsageError) as caught:
        ntp_timestamp(wallclock)
    assert caught.value.code == RtpErrorCode.INVALID_TIME


@FUZZ
@given(wallclock=st.floats(0, 4e9))
def test_ntp_timestamp_is_within_a_fraction_unit(wallclock: float) -> None:
    seconds, fraction = ntp_timestamp(wallclock)
    assert 0 <= fraction < 1 << 32
    unwrapped = seconds + (1 << 32 if seconds < NTP_EPOCH_OFFSET else 0) - NTP_EPOCH_OFFSET
    assert unwrapped + fraction / 2**32 == pytest.approx(wallclock, abs=2**-31 + 1e-6)


# --------------------------------------------------------------------------- RtpSender


def sender(**overrides: int) -> RtpSender:
    args = {
        "ssrc": US,
        "payload_type": 0,
        "first_sequence": 1000,
        "first_timestamp": 50_000,
    }
    args.update(overrides)
    return RtpSender(**args)


def header(data: bytes) -> tuple[bool, int, int, int]:
    """(marker, payload type, sequence, timestamp) of a packet we built."""
    packet = parse_rtp(data)
    return packet.marker, packet.payload_type, packet.sequence, packet.timestamp


def test_first_packet_exact_bytes_with_marker() -> None:
    s = sender()
    # 0x80; M=1 PT=0 -> 0x80; seq 1000 = 0x03E8; ts 50000 = 0xC350; SSRC 0x11223344
    assert s.packet(FRAME, 10.0) == hx("80 80 03e8 0000c350 11223344") + FRAME
    assert (s.packets_sent, s.octets_sent, s.last_timestamp) == (1, 160, 50_000)


def test_paced_packets_advance_160_without_marker() -> None:
    s = sender()
    headers = [header(s.packet(FRAME, 10.0 + 0.02 * i)) for i in range(5)]
    assert headers == [
        (True, 0, 1000, 50_000),
        (False, 0, 1001, 50_160),
        (False, 0, 1002, 50_320),
        (False, 0, 1003, 50_480),
        (False, 0, 1004, 50_640),
    ]
    assert s.packet(FRAME, 10.1)[:12] == hx("80 00 03ed 0000c670 11223344")  # 1005, 50800
    assert (s.packets_sent, s.octets_sent, s.last_timestamp, s.next_sequence) == (
        6,
        960,
        50_800,
        1006,
    )


def test_sequence_wraps_to_zero() -> None:
    s = sender(first_sequence=65534)
    seqs = [header(s.packet(FRAME, 0.02 * i))[2] for i in range(4)]
    assert seqs == [65534, 65535, 0, 1]


def test_timestamp_wraps_at_2_32() -> None:
    s = sender(first_timestamp=(1 << 32) - 320)
    stamps = [header(s.packet(FRAME, 0.02 * i))[3] for i in range(4)]
    assert stamps == [(1 << 32) - 320, (1 << 32) - 160, 0, 160]
    assert s.packet(FRAME, 0.08)[4:8] == hx("00000140")  # 320


def test_timestamp_wraps_on_a_silence_jump() -> None:
    s = sender(first_timestamp=(1 << 32) - 160)
    s.packet(FRAME, 0.0)
    marker, _, seq, ts = header(s.packet(FRAME, 1.0))
    assert (marker, seq, ts) == (True, 1001, 8000 - 160)  # 2**32 - 160 + 8000, wrapped


def test_pacing_lead_never_makes_a_gap_or_a_marker() -> None:
    s = sender()
    # 3 frames at once (a 60 ms lead), then one every 20 ms, always 60 ms early
    times = [0.0, 0.0, 0.0] + [0.02 * i for i in range(1, 200)]
    headers = [header(s.packet(FRAME, now)) for now in times]
    assert [h[0] for h in headers] == [True] + [False] * (len(times) - 1)
    assert [h[2] for h in headers] == [1000 + i for i in range(len(times))]
    assert [h[3] for h in headers] == [50_000 + 160 * i for i in range(len(times))]


def test_late_by_two_packets_is_not_a_gap_but_more_is() -> None:
    s = sender()
    for i in range(5):
        s.packet(FRAME, 0.02 * i)
    # packet 5 is due at 0.10 (offset 800); at 0.14 the media clock is at 1120: exactly
    # 2 packets ahead of 800 + 160 - not "more than 2" - so no gap
    assert header(s.packet(FRAME, 0.14)) == (False, 0, 1005, 50_800)
    # packet 6: offset 960; at 0.2201 the clock is floor(1760.8) = 1760 > 960 + 320:
    # a gap; 1760 is 11 packets exactly
    assert header(s.packet(FRAME, 0.2201)) == (True, 0, 1006, 50_000 + 1760)


def test_one_second_silence_jumps_about_8000_samples_with_marker() -> None:
    s = sender()
    for i in range(10):  # a talkspurt: 0.00 .. 0.18, last ts 50000 + 1440
        s.packet(FRAME, 10.0 + 0.02 * i)
    # the next frame was due at 10.20; it comes 1 s (and a bit) later
    marker, _, seq, ts = header(s.packet(FRAME, 11.2031))
    # media clock: floor(1.2031 * 8000) = 9624 -> rounded down to 60 packets = 9600
    assert (marker, seq, ts) == (True, 1010, 50_000 + 9600)
    assert ts - (50_000 + 1440) == 8160  # 8000 of silence + the one frame
    # the talkspurt goes on paced: +160, no marker, no sequence gap
    assert header(s.packet(FRAME, 11.22)) == (False, 0, 1011, 50_000 + 9760)
    assert header(s.packet(FRAME, 11.24)) == (False, 0, 1012, 50_000 + 9920)


def test_payload_type_change_keeps_sequence_and_timestamps() -> None:
    s = sender()
    s.packet(FRAME, 0.0)
    s.set_payload_type(8)
    assert s.payload_type == 8
    assert s.packet(FRAME, 0.02)[:12] == hx("80 08 03e9 0000c3f0 11223344")  # 1001, 50160
    s.set_payload_type(101)
    assert header(s.packet(FRAME, 0.04)) == (False, 101, 1002, 50_320)
    with pytest.raises(RtpUsageError) as caught:
        s.set_payload_type(128)
    assert caught.value.code == RtpErrorCode.INVALID_FIELD


def test_sender_rejects_empty_frame_and_bad_arguments() -> None:
    with pytest.raises(RtpUsageError) as caught:
        sender().packet(b"", 0.0)
    assert caught.value.code == RtpErrorCode.EMPTY_PAYLOAD
    for overrides in (
        {"ssrc": 1 << 32},
        {"payload_type": 128},
        {"first_sequence": 65536},
        {"first_timestamp": -1},
        {"clock_rate": 0},
        {"samples_per_packet": 0},
    ):
        with pytest.raises(RtpUsageError) as caught:
            sender(**overrides)
        assert caught.value.code == RtpErrorCode.INVALID_FIELD


def test_other_clock_and_frame_size() -> None:
    # a 48 kHz clock, 20 ms frames of 960 samples: the same rules in other units
    s = sender(clock_rate=48_000, samples_per_packet=960, first_timestamp=0)
    assert [header(s.packet(b"x", 0.02 * i))[3] for i in range(3)] == [0, 960, 1920]
    assert header(s.packet(b"x", 0.5)) == (True, 0, 1003, 24_000)


@FUZZ
@given(
    steps=st.lists(
        st.one_of(
            st.just(0.0),  # a burst (lead)
            st.floats(0.0, 0.04),  # paced, jittery
            st.floats(0.04, 3.0),  # a silence
        ),
        min_size=1,
        max_size=60,
    ),
    first_sequence=st.integers(0, 0xFFFF),
    first_timestamp=st.integers(0, 0xFFFFFFFF),
)
def test_sender_invariants(steps: list[float], first_sequence: int, first_timestamp: int) -> None:
    s = sender(first_sequence=first_sequence, first_timestamp=first_timestamp)
    now = first_now = 100.0
    offset = -160
    for index, step in enumerate(steps):
        if index:
            now += step
        marker, _, seq, ts = header(s.packet(FRAME, now))
        assert seq == (first_sequence + index) & 0xFFFF  # never a sequence gap
        advance = (ts - first_timestamp - offset) & 0xFFFFFFFF
        assert advance % 160 == 0 and advance >= 160
        assert marker == (index == 0 or advance != 160)  # a jump is always marked
        offset += advance
        clock = math.floor((now - first_now) * 8000)
        assert clock - offset <= 2 * 160  # never more than 2 packets behind real time
        assert s.media_clock(now) == (first_timestamp + clock) & 0xFFFFFFFF


# --------------------------------------------------------------------------- sender report


def test_sender_report_exact_bytes_without_receiver() -> None:
    s = sender()
    for i in range(3):
        s.packet(FRAME, 10.0 + 0.02 * i)
    data = s.sender_report(wallclock=1_700_000_000.25, now=10.5, cname="gw@example")
    assert data == hx(
        # SR (6.4.1): V=2 P=0 RC=0 -> 0x80, PT 200 = 0xC8, length 6 (7 words - 1)
        "80 c8 0006 11223344"
        "e8fe6f80 40000000"  # NTP 3_908_988_800 s, .25 s = 2**30
        "0000d2f0"  # RTP ts: media clock at now: 50000 + 0.5 s * 8000 = 54000
        "00000003 000001e0"  # 3 packets, 480 payload octets
        # SDES (6.5): SC=1 -> 0x81, PT 202 = 0xCA, length 5 (24 octets: 6 words - 1)
        "81 ca 0005 11223344"
        "01 0a 6777406578616d706c65"  # CNAME (1), 10 octets, "gw@example"
        "00000000"  # 2 + 10 = 12 octets: 4 nulls (at least one, to the 32-bit boundary)
    )


def test_sender_report_fields_decoded() -> None:
    s = sender(first_timestamp=(1 << 32) - 1000)
    s.packet(FRAME, 0.0)
    s.packet(FRAME[:80], 0.02)
    data = s.sender_report(wallclock=1_700_000_000.5, now=1.0, cname="a")
    first, packet_type, length, ssrc, ntp_sec, ntp_frac, rtp_ts, packets, octets = (
        struct.unpack_from("!BBHIIIIII", data)
    )
    assert (first >> 6, first & 0x20, first & 0x1F) == (2, 0, 0)
    assert (packet_type, length, ssrc) == (200, 6, US)
    assert (ntp_sec, ntp_frac) == (1_700_000_000 + 2_208_988_800, 1 << 31)
    assert rtp_ts == 7000  # 2**32 - 1000 + 8000, wrapped
    assert (packets, octets) == (2, 240)
    sdes = data[4 * (length + 1) :]
    assert struct.unpack_from("!BBHI", sdes) == (0x81, 202, 2, US)  # 12 octets
    assert sdes[8:] == hx("01 01 61 00")  # 2 + 1 octets, 1 null
    assert len(data) % 4 == 0


@pytest.mark.parametrize(
    ("cname", "nulls"),
    [("ab", 4), ("abc", 3), ("abcd", 2), ("abcde", 1), ("é", 4), ("x" * 255, 3)],
)
def test_sdes_cname_padding_to_32_bits(cname: str, nulls: int) -> None:
    s = sender()
    s.packet(FRAME, 0.0)
    data = s.sender_report(wallclock=0.0, now=0.0, cname=cname)
    sdes = data[28:]
    octets = cname.encode()
    assert sdes[8:10] == bytes((1, len(octets)))
    assert sdes[10 : 10 + len(octets)] == octets
    assert sdes[10 + len(octets) :] == bytes(nulls)
    assert struct.unpack_from("!H", sdes, 2)[0] == len(sdes) // 4 - 1


@pytest.mark.parametrize("cname", ["", "x" * 256, "é" * 128, "\ud800"])
def test_sender_report_rejects_bad_cname(cname: str) -> None:
    with pytest.raises(RtpUsageError) as caught:
        sender().sender_report(wallclock=0.0, now=0.0, cname=cname)
    assert caught.value.code == RtpErrorCode.INVALID_TEXT


def peer_packet(seq: int, ts: int, *, ssrc: int = PEER, pt: int = 0) -> RtpPacket:
    return RtpPacket(pt, seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc, False, FRAME)


# A peer's SR (6.4.1) with one report block about us. SSRC 0xCAFEBABE, NTP 0x12345678.9ABCDEF0
# (middle 32 bits 0x56789ABC), RTP ts 0x1000, 250 packets / 40000 octets; report block
# about 0x11223344: fraction 64/256 lost, cumulative 300 = 0x00012C, extended max 0x0001_0005,
# jitter 40, LSR 0x0A0B0C0D, DLSR 0x00008000 (0.5 s); then SDES CNAME "pbx".
PEER_SR = hx(
    "81 c8 000c cafebabe"
    "12345678 9abcdef0 00001000 000000fa 00009c40"
    "11223344 4000012c 00010005 00000028 0a0b0c0d 00008000"
    "81 ca 0003 cafebabe 01 03 706278 000000"
)


def test_on_rtcp_reads_the_report_about_us() -> None:
    r = RtpReceiver(local_ssrc=US)
    r.on_rtcp(PEER_SR, 20.0)
    assert r.peer_fraction_lost == 64
    assert r.peer_cumulative_lost == 300
    assert r.peer_extended_max == 0x10005
    assert r.peer_jitter == 40
    assert r.peer_jitter_ms == pytest.approx(5.0)
    assert (r.peer_lsr, r.peer_dlsr, r.peer_report_arrival) == (0x0A0B0C0D, 0x8000, 20.0)


def test_on_rtcp_skips_blocks_about_other_sources() -> None:
    r = RtpReceiver(local_ssrc=0x99)
    r.on_rtcp(PEER_SR, 20.0)
    assert r.peer_fraction_lost is None and r.peer_jitter_ms is None
    any_block = RtpReceiver()  # no local SSRC: any block is about us
    any_block.on_rtcp(PEER_SR, 20.0)
    assert any_block.peer_fraction_lost == 64


def test_negative_cumulative_loss_from_the_peer() -> None:
    data = bytearray(PEER_SR)
    data[32:36] = hx("00fffffe")  # fraction 0, cumulative -2 (24-bit two's complement)
    r = RtpReceiver()
    r.on_rtcp(bytes(data), 1.0)
    assert (r.peer_fraction_lost, r.peer_cumulative_lost) == (0, -2)


def stream(r: RtpReceiver, seqs: list[int], *, start: float = 0.0, ssrc: int = PEER) -> list[bool]:
    """Feed packets with these sequence numbers, each with ts 160*seq, arriving on time."""
    return [r.on_packet(peer_packet(seq, 160 * seq, ssrc=ssrc), start + 0.02 * seq) for seq in seqs]


def test_sender_report_with_report_block_lsr_dlsr() -> None:
    r = RtpReceiver()
    stream(r, [100, 101, 102, 103, 104, 106, 107, 108, 109])  # 105 lost
    # 100 is A.1 probation; valid from 101: base 101, max 109, expected 9, received 8
    assert (r.expected, r.received, r.lost, r.extended_max) == (9, 8, 1, 109)
    r.on_rtcp(PEER_SR, 20.0)
    s = sender()
    s.packet(FRAME, 19.0)
    data = s.sender_report(wallclock=1_700_000_000.0, now=21.5, receiver=r, cname="gw")
    assert data[:4] == hx("81 c8 000c")  # RC=1, length 12: 13 words
    assert data[28:52] == hx(
        "cafebabe"  # SSRC_1: the source reported on
        "1c 000001"  # fraction 256 * 1 / 9 = 28.4 -> 28, cumulative 1
        "0000006d"  # extended highest sequence number 109
        "00000000"  # jitter: a perfectly paced stream
        "56789abc"  # LSR: middle 32 bits of 0x12345678.9ABCDEF0
        "00018000"  # DLSR: 21.5 - 20.0 = 1.5 s = 0x18000 / 65536
    )
    assert data[52:56] == hx("81 ca 0003")  # SDES follows the report


def test_report_block_interval_fraction_and_no_sr_yet() -> None:
    r = RtpReceiver()
    stream(r, list(range(0, 11)))  # valid from 1; 1..10
    stream(r, list(range(12, 21)))  # 11 lost
    first = r.report_block(5.0)
    # fraction: expected 20, received 19 -> 256/20 = 12.8 -> 12; no SR: LSR = DLSR = 0
    assert first == hx("cafebabe 0c000001 00000014 00000000 00000000 00000000")
    stream(r, list(range(21, 31)))  # nothing lost in the next interval
    assert r.report_block(6.0)[4:8] == hx("00000001")  # fraction 0, cumulative still 1
    stream(r, [31, 34])  # 32, 33 lost: 2 of the 4 expected
    assert r.fraction_lost_since_last_report() == 128  # 256 * 2 // 4
    assert r.fraction_lost_since_last_report() == 0  # an empty interval


def test_report_block_clamps_cumulative_loss() -> None:
    r = RtpReceiver()
    stream(r, [1, 2, 3, 3, 3])  # two duplicates: received 4, expected 2
    assert r.lost == -2
    assert r.report_block(0.0)[4:8] == hx("00fffffe")  # fraction 0 (more than expected)
    # A.3: "clamped at 0x7fffff for positive loss or 0x800000 for negative loss". Counts
    # that large take millions of packets; the counters are set directly instead.
    r.received -= 10_000_000
    assert r.report_block(0.0)[4:8] == hx("00 7fffff")  # lost 9_999_998
    r.received += 30_000_000
    assert r.report_block(0.0)[4:8] == hx("00 800000")  # lost -20_000_002


def test_sender_report_without_a_valid_source_has_no_block() -> None:
    r = RtpReceiver()
    r.on_packet(peer_packet(1, 160), 0.0)  # probation: not valid yet
    s = sender()
    s.packet(FRAME, 0.0)
    data = s.sender_report(wallclock=0.0, now=0.0, receiver=r, cname="gw")
    assert data[:4] == hx("80 c8 0006")
    with pytest.raises(RtpUsageError):
        r.report_block(0.0)


def test_receiver_report_when_nothing_was_sent() -> None:
    r = RtpReceiver()
    stream(r, [1, 2, 3])
    s = sender()
    data = s.sender_report(wallclock=0.0, now=1.0, receiver=r, cname="gw")
    # RR (6.4.2): RC=1, PT 201 = 0xC9, length 7 (8 words - 1), our SSRC, the block
    assert data[:8] == hx("81 c9 0007 11223344")
    assert data[8:12] == hx("cafebabe")
    assert data[32:36] == hx("81 ca 0003")
    assert sender().sender_report(wallclock=0.0, now=1.0, cname="gw")[:8] == hx(
        "80 c9 0001 11223344"
    )


def test_sr_while_sending_rr_after_two_silent_intervals() -> None:
    # 6.4: SR "if a site has sent any data packets during the interval since issuing the
    # last report or the previous one, otherwise the RR"
    s = sender()
    s.packet(FRAME, 0.0)
    kinds = [s.sender_report(wallclock=0.0, now=float(i), cname="gw")[1] for i in range(4)]
    assert kinds == [200, 200, 201, 201]
    s.packet(FRAME, 5.0)
    assert s.sender_report(wallclock=0.0, now=5.0, cname="gw")[1] == 200


def test_reports_parse_as_valid_compound_rtcp_for_the_peer() -> None:
    # Two ends of a call: what one sends, the other's RtpReceiver takes.
    ours, theirs = sender(), sender(ssrc=PEER, first_sequence=7, first_timestamp=0)
    at_them = RtpReceiver(local_ssrc=PEER)
    at_us = RtpReceiver(local_ssrc=US)
    for i in range(50):
        if i != 20:  # one of ours lost on the way
            at_them.on_packet(parse_rtp(ours.packet(FRAME, 0.02 * i)), 0.02 * i + 0.05)
        else:
            ours.packet(FRAME, 0.02 * i)
        at_us.on_packet(parse_rtp(theirs.packet(FRAME, 0.02 * i)), 0.02 * i + 0.05)
    their_sr = theirs.sender_report(
        wallclock=1_700_000_001.0, now=1.0, receiver=at_them, cname="pbx"
    )
    assert is_rtcp(their_sr)
    at_us.on_rtcp(their_sr, 1.05)
    assert at_us.peer_cumulative_lost == 1
    assert at_us.peer_fraction_lost == 256 // 49  # 49 expected from the validated 2nd
    assert at_us.peer_extended_max == 1049
    our_sr = ours.sender_report(wallclock=1_700_000_001.1, now=1.1, receiver=at_us, cname="gw")
    at_them.on_rtcp(our_sr, 1.15)
    # their SR's NTP was 0xE8FE6F81.00000000: middle 32 bits 0x6F810000; DLSR 0.05 s
    assert at_them.peer_lsr == 0x6F810000
    assert at_them.peer_dlsr == math.floor(0.05 * 65536)
    assert at_them.peer_cumulative_lost == 0
    at_them.on_rtcp(ours.bye("done"), 2.0)


# --------------------------------------------------------------------------- BYE


def test_bye_without_cname_or_reason() -> None:
    s = sender()
    # empty RR (6.1: "an empty RR MUST be sent ... even if the only other RTCP packet in
    # the compound packet is a BYE"), then BYE (6.6): SC=1 -> 0x81, PT 203 = 0xCB, length 1
    assert s.bye() == hx("80 c9 0001 11223344 81 cb 0001 11223344")


def test_bye_with_reason_and_the_cname_sent_before() -> None:
    s = sender()
    s.packet(FRAME, 0.0)
    s.sender_report(wallclock=0.0, now=0.0, cname="gw")
    assert s.bye("done") == hx(
        "80 c9 0001 11223344"
        "81 ca 0003 11223344 01 02 6777 00000000"  # SDES CNAME "gw", 4 nulls
        "81 cb 0003 11223344 04 646f6e65 000000"  # length 4, "done", 3 nulls: 3 words
    )


def test_bye_empty_reason_and_limits() -> None:
    assert sender().bye("")[8:] == hx("81 cb 0002 11223344 00 000000")
    assert len(sender().bye("x" * 255)) == 8 + 8 + 256
    with pytest.raises(RtpUsageError) as caught:
        sender().bye("x" * 256)
    assert caught.value.code == RtpErrorCode.INVALID_TEXT


def test_nothing_is_sent_after_bye() -> None:
    s = sender()
    s.packet(FRAME, 0.0)
    s.bye()
    calls: list[Callable[[], bytes]] = [
        lambda: s.packet(FRAME, 0.02),
        lambda: s.bye(),
        lambda: s.sender_report(wallclock=0.0, now=0.0, cname="gw"),
    ]
    for call in calls:
        with pytest.raises(RtpUsageError) as caught:
            call()
        assert caught.value.code == RtpErrorCode.STREAM_ENDED


def test_a_bad_reason_leaves_the_stream_open() -> None:
    s = sender()
    with pytest.raises(RtpUsageError):
        s.bye("x" * 300)
    s.packet(FRAME, 0.0)
    s.bye()


# --------------------------------------------------------------------------- RtpReceiver


def test_in_order_stream_without_loss() -> None:
    r = RtpReceiver()
    accepted = stream(r, list(range(1000, 1050)))
    # A.1: "s->probation = MIN_SEQUENTIAL" (2): the first packet is not yet valid
    assert accepted == [False] + [True] * 49
    assert r.ssrc == PEER
    assert (r.received, r.expected, r.lost, r.extended_max) == (49, 49, 0, 1049)
    assert (r.duplicates, r.rejected) == (0, 1)
    assert r.fraction_lost_since_last_report() == 0


def test_lost_packets_are_counted() -> None:
    r = RtpReceiver()
    stream(r, [1, 2, 3, 5, 6, 9, 10])
    assert (r.received, r.expected, r.lost) == (6, 9, 3)


def test_duplicate_is_rejected_but_counted_as_received() -> None:
    r = RtpReceiver()
    assert stream(r, [1, 2, 3, 4]) == [False, True, True, True]
    assert r.on_packet(peer_packet(4, 640), 0.1) is False  # the newest again
    assert r.on_packet(peer_packet(3, 480), 0.1) is False  # an older one again
    assert r.on_packet(peer_packet(5, 800), 0.1) is True
    # 6.4.1: "the number of packets received includes any which are late or duplicates"
    assert (r.duplicates, r.received, r.expected, r.lost) == (2, 6, 4, -2)


def test_reordered_packets_are_accepted_once() -> None:
    r = RtpReceiver()
    assert stream(r, [1, 2, 4, 3, 5, 8, 6, 7]) == [False] + [True] * 7
    assert (r.received, r.expected, r.lost, r.extended_max) == (7, 7, 0, 8)
    assert stream(r, [6]) == [False]
    assert r.duplicates == 1


def test_packet_max_misorder_behind_is_rejected() -> None:
    r = RtpReceiver()
    late, too_late = 299 - MAX_MISORDER + 1, 299 - MAX_MISORDER
    stream(r, [seq for seq in range(1, 300) if seq not in (late, too_late)])
    assert stream(r, [late]) == [True]  # 99 behind: a late packet...
    assert stream(r, [late]) == [False]  # ...and then a duplicate
    assert r.duplicates == 1
    # A.1: "udelta <= RTP_SEQ_MOD - MAX_MISORDER" (100 behind) is a "very large jump":
    # rejected unless the next packet follows it
    before = r.received
    assert stream(r, [too_late]) == [False]
    assert (r.received, r.rejected) == (before, 2)
    assert r.lost == 0  # too_late missing, one duplicate received: A.3 nets them out


def test_sequence_wrap_extends_the_maximum() -> None:
    r = RtpReceiver()
    seqs = [65530 + i for i in range(20)]  # 65530 .. 65549, wire values wrap after 65535
    assert stream(r, [s & 0xFFFF for s in seqs]) == [False] + [True] * 19
    assert r.extended_max == 65536 + 13  # one cycle, max_seq 13
    assert (r.expected, r.received, r.lost) == (19, 19, 0)
    # a late packet from before the wrap is still in the window
    assert stream(r, [65535]) == [False]  # received already
    assert r.duplicates == 1


def test_wrap_with_loss_across_the_boundary() -> None:
    r = RtpReceiver()
    stream(r, [65533, 65534, 65535, 2, 3])  # valid from 65534; 0 and 1 lost
    assert (r.extended_max, r.expected, r.received, r.lost) == (65536 + 3, 6, 4, 2)


def test_large_jump_is_a_restart_once_confirmed() -> None:
    r = RtpReceiver()
    stream(r, list(range(1, 11)))
    jump = 10 + MAX_DROPOUT + 500
    assert stream(r, [jump]) == [False]  # A.1: bad_seq = jump + 1
    assert r.received == 9
    assert stream(r, [jump + 1]) == [True]  # "assume that the other side restarted"
    assert (r.received, r.expected, r.lost, r.extended_max) == (1, 1, 0, jump + 1)
    assert stream(r, [jump + 2]) == [True]


def test_jump_below_max_dropout_is_loss_not_restart() -> None:
    r = RtpReceiver()
    stream(r, [1, 2])
    assert stream(r, [2 + MAX_DROPOUT - 1]) == [True]
    assert r.lost == MAX_DROPOUT - 2


def test_probation_needs_sequential_packets() -> None:
    r = RtpReceiver()
    assert stream(r, [10, 20, 30]) == [False, False, False]
    assert (r.ssrc, r.received, r.expected, r.extended_max) == (None, 0, 0, 0)
    assert stream(r, [31]) == [True]
    assert (r.ssrc, r.received, r.expected) == (PEER, 1, 1)


def test_new_ssrc_replaces_the_source_only_after_probation() -> None:
    r = RtpReceiver()
    stream(r, list(range(1, 21)))
    other = 0x0BADCAFE
    assert r.on_packet(peer_packet(5000, 0, ssrc=other), 0.5) is False
    assert r.ssrc == PEER
    # the current source goes on meanwhile
    assert r.on_packet(peer_packet(21, 160 * 21), 0.42) is True
    assert r.on_packet(peer_packet(7000, 0, ssrc=other), 0.52) is False  # not in sequence
    assert r.on_packet(peer_packet(7001, 160, ssrc=other), 0.54) is True  # 2 in sequence
    assert r.ssrc == other
    assert (r.received, r.expected, r.extended_max, r.lost) == (1, 1, 7001, 0)
    assert r.jitter == 0.0
    # the old source is now the stranger on probation
    assert r.on_packet(peer_packet(22, 160 * 22), 0.44) is False
    assert r.rejected == 4  # 1 (first probation) + 5000 + 7000 + 22


def test_jitter_of_a_perfectly_paced_stream_is_zero() -> None:
    r = RtpReceiver()
    stream(r, list(range(500)), start=1234.5)
    assert r.jitter == pytest.approx(0.0, abs=1e-6)
    assert r.jitter_ms == pytest.approx(0.0, abs=1e-6)


def test_jitter_with_alternating_10ms_offsets_converges_as_a8_predicts() -> None:
    r = RtpReceiver()
    count = 200
    for i in range(count):
        offset = 0.01 if i % 2 == 0 else -0.01
        r.on_packet(peer_packet(i, 160 * i), 50.0 + 0.02 * i + offset)
    # Every D(i-1,i) is (0.02 +- 0.02) s * 8000 - 160 = +-160 samples. A.8 with J(0) = 0 and
    # J += (|D| - J)/16 gives J(n) = 160 * (1 - (15/16)**n); the first packet is probation
    # and the second starts A.8, so n = count - 2 differences are taken.
    assert r.jitter == pytest.approx(160 * (1 - (15 / 16) ** (count - 2)), rel=1e-9)
    assert r.jitter_ms == pytest.approx(20.0, rel=1e-4)
    # first steps, exactly: after 3 packets one D: 160/16 = 10
    r2 = RtpReceiver()
    for i in range(3):
        r2.on_packet(peer_packet(i, 160 * i), 0.02 * i + (0.01 if i % 2 == 0 else -0.01))
    assert r2.jitter == pytest.approx(10.0)


def test_jitter_ignores_packets_sharing_a_timestamp() -> None:
    r = RtpReceiver()
    stream(r, list(range(10)))
    # a telephone-event: 4 packets, 50 ms apart, all with the event's start timestamp
    for k in range(4):
        r.on_packet(peer_packet(10 + k, 1600, pt=101), 0.2 + 0.05 * k)
    # audio resumes at its media time
    for seq in range(14, 20):
        r.on_packet(peer_packet(seq, 160 * seq + 1600), 0.02 * seq + 0.2)
    assert r.jitter == pytest.approx(0.0, abs=1e-6)


def test_jitter_across_a_timestamp_wrap() -> None:
    r = RtpReceiver()
    base = (1 << 32) - 800
    for i in range(20):
        r.on_packet(peer_packet(i, base + 160 * i), 0.02 * i)
    assert r.jitter == pytest.approx(0.0, abs=1e-6)


@FUZZ
@given(
    start=st.integers(0, 0xFFFF),
    kept=st.lists(st.booleans(), min_size=2, max_size=400),
)
def test_loss_count_matches_what_was_dropped(start: int, kept: list[bool]) -> None:
    kept[0] = kept[1] = True  # the source must pass probation on the first two
    r = RtpReceiver()
    last = max(i for i, keep in enumerate(kept) if keep)
    for i, keep in enumerate(kept):
        if keep:
            r.on_packet(peer_packet(start + i, 160 * i), 0.02 * i)
    # valid from the second packet: A.1 counts cycles from there
    assert r.extended_max == ((start + 1) & 0xFFFF) + last - 1
    assert r.expected == last
    assert r.lost == kept[: last + 1].count(False)
    assert r.duplicates == 0


@FUZZ
@given(
    data=st.data(),
    start=st.integers(0, 0xFFFF),
    size=st.integers(3, 120),
)
def test_reordering_and_duplication_within_the_window(
    data: st.DataObject, start: int, size: int
) -> None:
    # the first two in order (probation), the rest shuffled in blocks of 8 with repeats
    r = RtpReceiver()
    order = [0, 1]
    rest = list(range(2, size))
    for block in range(0, len(rest), 8):
        order += data.draw(st.permutations(rest[block : block + 8]))
    # repeats no more than MAX_MISORDER - 1 behind the newest: duplicates, not jumps
    recent = [seq for seq in order[2:] if seq > size - MAX_MISORDER]
    repeats = data.draw(st.lists(st.sampled_from(recent), max_size=10)) if recent else []
    for position, seq in enumerate(order + repeats):
        r.on_packet(peer_packet(start + seq, 160 * seq), 0.02 * position)
    assert r.extended_max == ((start + 1) & 0xFFFF) + size - 2
    assert r.duplicates == len(repeats)
    assert r.received == size - 1 + len(repeats)
    assert r.lost == -len(repeats)


# --------------------------------------------------------------------------- on_rtcp


def test_on_rtcp_remembers_the_last_sr_of_the_source() -> None:
    r = RtpReceiver()
    stream(r, [1, 2, 3])
    r.on_rtcp(PEER_SR, 20.0)
    assert r.report_block(20.25)[16:24] == hx("56789abc 00004000")  # DLSR 0.25 s
    # an RR-only compound packet leaves the SR as it was
    rr = hx("80 c9 0001 cafebabe 81 ca 0002 cafebabe 01 01 61 00")
    r.on_rtcp(rr, 21.0)
    assert r.report_block(21.0)[16:24] == hx("56789abc 00010000")


def test_an_sr_from_another_source_gives_no_lsr() -> None:
    r = RtpReceiver()
    stream(r, [1, 2, 3], ssrc=0x5555)
    r.on_rtcp(PEER_SR, 20.0)  # from 0xCAFEBABE, not the source
    assert r.report_block(21.0)[16:24] == bytes(8)


def test_on_rtcp_accepts_padding_on_the_last_packet_and_unknown_types() -> None:
    data = (
        hx("80 c9 0001 cafebabe")
        + hx("80 cc 0002 cafebabe 6e616d65")  # APP (6.7), skipped
        + hx("a1 cb 0002 cafebabe 00000004")  # BYE, 4 octets of padding
    )
    RtpReceiver().on_rtcp(data, 0.0)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (hx("80 c9 0001"), RtpErrorCode.TOO_SHORT),
        (hx("40 c9 0001 cafebabe"), RtpErrorCode.BAD_VERSION),  # V=1
        # 6.1: the first packet must be SR or RR; here SDES
        (hx("81 ca 0002 cafebabe 01 01 61 00"), RtpErrorCode.BAD_COMPOUND),
        (hx("80 c8 0001 cafebabe"), RtpErrorCode.BAD_REPORT),  # SR without sender info
        (hx("a0 c9 0001 cafebabe"), RtpErrorCode.BAD_PADDING),  # padding on the first
        (hx("80 c9 0002 cafebabe"), RtpErrorCode.BAD_LENGTH),  # says 12 octets, has 8
        (hx("80 c9 0001 cafebabe 81"), RtpErrorCode.BAD_LENGTH),  # trailing octet
        (hx("80 c9 0001 cafebabe 81ca"), RtpErrorCode.BAD_LENGTH),
        (hx("80 c9 0001 cafebabe 00000000"), RtpErrorCode.BAD_VERSION),  # trailing zeros
        # RC=1 but no report block
        (hx("81 c9 0001 cafebabe"), RtpErrorCode.BAD_REPORT),
        # SR with RC=2, one block
        (PEER_SR[:4].replace(b"\x81", b"\x82") + PEER_SR[4:], RtpErrorCode.BAD_REPORT),
        # padding on a packet that is not the last
        (
            hx("80 c9 0001 cafebabe a1 cb 0002 cafebabe 00000004 80 c9 0001 cafebabe"),
            RtpErrorCode.BAD_PADDING,
        ),
        # padding count larger than the packet body
        (hx("80 c9 0001 cafebabe a0 cb 0001 000000ff"), RtpErrorCode.BAD_PADDING),
        (hx("80 c9 0001 cafebabe a0 cb 0001 00000000"), RtpErrorCode.BAD_PADDING),
    ],
)
def test_malformed_rtcp_raises_typed_error(data: bytes, code: RtpErrorCode) -> None:
    r = RtpReceiver()
    with pytest.raises(RtpError) as caught:
        r.on_rtcp(data, 0.0)
    assert caught.value.code == code


def test_an_invalid_compound_packet_changes_nothing() -> None:
    r = RtpReceiver()
    with pytest.raises(RtpError):
        r.on_rtcp(PEER_SR + hx("00"), 0.0)
    assert r.peer_fraction_lost is None
    stream(r, [1, 2])
    assert r.report_block(1.0)[16:24] == bytes(8)


@FUZZ
@given(data=st.binary(max_size=120))
def test_on_rtcp_arbitrary_bytes_raise_only_rtp_error(data: bytes) -> None:
    try:
        RtpReceiver().on_rtcp(data, 0.0)
    except RtpError as exc:
        assert exc.code in set(RtpErrorCode)


@FUZZ
@given(data=st.binary(min_size=8, max_size=120))
def test_on_rtcp_mutated_report_raises_only_rtp_error(data: bytes) -> None:
    # a valid first header over random bytes: exercises the walk over lengths and blocks
    try:
        RtpReceiver().on_rtcp(PEER_SR[:4] + data, 0.0)
    except RtpError as exc:
        assert exc.code in set(RtpErrorCode)


# --------------------------------------------------------------------------- DTMF


def event(
    seq: int, ts: int, code: int, *, end: bool = False, duration: int = 0, marker: bool = False
) -> RtpPacket:
    # RFC 4733 2.3: event, E R volume(6), duration; volume 10 (-10 dBm0)
    payload = bytes((code, (0x80 if end else 0) | 10)) + duration.to_bytes(2, "big")
    return RtpPacket(101, seq, ts, PEER, marker, payload)


def press(code: int, seq: int, ts: int) -> list[RtpPacket]:
    """What a sender does for one key press (RFC 4733 2.5.1): a start packet with the marker
    bit, updates every 50 ms with the duration growing, then the final packet sent 3 times
    (2.5.1.4); every packet with the event's start timestamp, each with its own sequence."""
    packets = [event(seq, ts, code, duration=400, marker=True)]
    packets += [event(seq + k, ts, code, duration=400 * (k + 1)) for k in range(1, 4)]
    packets += [event(seq + 4 + k, ts, code, end=True, duration=1760) for k in range(3)]
    return packets


def digits(receiver: DtmfReceiver, packets: list[RtpPacket]) -> list[str]:
    return [d for d in map(receiver.on_packet, packets) if d is not None]


def test_the_event_payload_on_the_wire() -> None:
    # seq 7, ts 160: event 5, E=0, volume 10, duration 160; parsed back for the receiver
    d = DtmfReceiver(payload_type=101)
    assert d.on_packet(parse_rtp(EVENT_START)) == "5"


def test_digit_5_reported_once() -> None:
    d = DtmfReceiver(payload_type=101)
    packets = press(5, 200, 80_000)
    results = [d.on_packet(p) for p in packets]
    assert results == ["5"] + [None] * 6  # on the first packet: lowest latency
    assert (d.events, d.duplicates, d.ignored) == (1, 6, 0)


def test_two_presses_of_the_same_digit_are_two_events() -> None:
    d = DtmfReceiver(payload_type=101)
    packets = press(5, 200, 80_000) + press(5, 207, 80_000 + 1760 + 800)
    assert digits(d, packets) == ["5", "5"]


@pytest.mark.parametrize(("code", "digit"), [(10, "*"), (11, "#"), (0, "0"), (9, "9")])
def test_star_hash_and_digits(code: int, digit: str) -> None:
    assert digits(DtmfReceiver(payload_type=101), press(code, 1, 1000)) == [digit]


def test_all_sixteen_dtmf_events() -> None:
    d = DtmfReceiver(payload_type=101)
    packets: list[RtpPacket] = []
    for code in range(16):
        packets += press(code, 10 * code, 4000 * code)
    assert "".join(digits(d, packets)) == "0123456789*#ABCD" == DTMF_EVENTS


def test_event_16_flash_is_ignored() -> None:
    d = DtmfReceiver(payload_type=101)
    assert digits(d, press(16, 1, 1000)) == []
    assert (d.ignored, d.duplicates, d.events) == (1, 6, 0)
    assert digits(d, press(1, 8, 9000)) == ["1"]


def test_wrong_payload_type_is_not_ours() -> None:
    d = DtmfReceiver(payload_type=101)
    audio = RtpPacket(0, 1, 160, PEER, True, b"\x05\x0a\x00\xa0")  # looks like an event
    assert d.on_packet(audio) is None
    assert (d.events, d.duplicates, d.ignored) == (0, 0, 0)
    other = DtmfReceiver(payload_type=96)
    assert digits(other, press(5, 1, 1000)) == []


def test_lost_start_packet_still_reports_on_the_first_update() -> None:
    d = DtmfReceiver(payload_type=101)
    assert [d.on_packet(p) for p in press(3, 1, 1000)[2:]] == ["3", None, None, None, None]


def test_late_packet_of_the_previous_event_is_absorbed() -> None:
    d = DtmfReceiver(payload_type=101)
    first, second = press(1, 1, 1000), press(2, 8, 4000)
    order = first[:-1] + second[:2] + first[-1:] + second[2:]
    assert digits(d, order) == ["1", "2"]
    assert d.duplicates == 12


def test_long_event_segments_are_one_press() -> None:
    # RFC 4733 2.5.1.3: an event longer than 0xFFFF samples continues in a new segment
    # whose timestamp is the previous one plus 0xFFFF, without an E bit in between
    d = DtmfReceiver(payload_type=101)
    first = [event(1, 1000, 7, duration=0xFFFF, marker=True)]
    second = [event(2, 1000 + 0xFFFF, 7, duration=400), event(3, 1000 + 0xFFFF, 7, end=True)]
    assert digits(d, first + second) == ["7"]
    # ... but after an end, the same offset is a new press
    assert digits(d, [event(4, 1000 + 2 * 0xFFFF, 7)]) == ["7"]


def test_new_ssrc_or_timestamp_jump_starts_afresh() -> None:
    d = DtmfReceiver(payload_type=101)
    assert digits(d, press(1, 1, 1_000_000)) == ["1"]
    # the same timestamp from another source is another event
    other = [RtpPacket(101, 1, 1_000_000, 0x77, True, hx("020a0190"))]
    assert digits(d, other) == ["2"]
    # a sender whose timestamps jumped far back (a restart): a new event, not a late one
    assert digits(d, [RtpPacket(101, 9, 10, 0x77, True, hx("030a0190"))]) == ["3"]


def test_short_event_payload_raises() -> None:
    d = DtmfReceiver(payload_type=101)
    with pytest.raises(RtpError) as caught:
        d.on_packet(RtpPacket(101, 1, 1, PEER, True, b"\x05\x0a\x00"))
    assert caught.value.code == RtpErrorCode.BAD_EVENT


def test_dtmf_receiver_rejects_bad_payload_type() -> None:
    with pytest.raises(RtpUsageError):
        DtmfReceiver(payload_type=200)


@FUZZ
@given(data=st.data(), code=st.integers(0, 15), ts=st.integers(0, 0xFFFFFFFF))
def test_any_order_of_one_press_gives_one_digit(data: st.DataObject, code: int, ts: int) -> None:
    packets = press(code, 1, ts)
    packets += data.draw(st.lists(st.sampled_from(packets), max_size=5))  # duplicates
    shuffled = data.draw(st.permutations(packets))
    d = DtmfReceiver(payload_type=101)
    assert digits(d, shuffled) == [DTMF_EVENTS[code]]
    assert d.duplicates == len(packets) - 1


# --------------------------------------------------------------------------- codes, speed


def test_error_codes() -> None:
    assert {code.value for code in RtpErrorCode} == {
        "too_short",
        "bad_version",
        "bad_padding",
        "bad_extension",
        "bad_csrc",
        "bad_length",
        "bad_compound",
        "bad_report",
        "bad_event",
        "invalid_field",
        "empty_payload",
        "invalid_text",
        "invalid_time",
        "stream_ended",
    }


@pytest.mark.realtime  # a speed bound: runs alone (Makefile)
def test_100k_packets_build_and_parse_well_under_a_second() -> None:
    packet = RtpPacket(0, 1, 2, 3, True, FRAME)
    started = time.perf_counter()
    for _ in range(100_000):
        parse_rtp(build_rtp(packet))
    assert time.perf_counter() - started < 1.0


@pytest.mark.realtime  # a speed bound: runs alone (Makefile)
def test_100k_packets_through_sender_parser_and_receiver_quickly() -> None:
    s = sender(first_sequence=65000)
    r = RtpReceiver()
    started = time.perf_counter()
    for i in range(100_000):
        now = 0.02 * i
        r.on_packet(parse_rtp(s.packet(FRAME, now)), now)
    elapsed = time.perf_counter() - started
    assert (r.received, r.lost) == (99_999, 0)
    assert elapsed < 1.5
