"""RTP and RTCP for one audio call: a sans-I/O core (packets in, bytes out).

This module turns datagrams into typed values and intents into datagrams; it never touches
a socket, a clock or an event loop. Time comes in as arguments: ``now`` and ``arrival`` are
seconds on one monotonic clock (any origin), ``wallclock`` is seconds since the Unix epoch
(only for the NTP timestamp of a sender report).

References (cited below by section):

* RFC 3550, "RTP: A Transport Protocol for Real-Time Applications": 5.1 (RTP fixed
  header), 5.3.1 (header extension), 6.1 (compound RTCP packets), 6.4.1 (SR), 6.4.2 (RR),
  6.5 (SDES), 6.6 (BYE), appendix A.1 (sequence number validation), A.2 (RTCP header
  validity), A.3 (expected and lost packets), A.8 (interarrival jitter).
* RFC 3551, "RTP Profile for Audio and Video Conferences with Minimal Control": 4.1
  (marker bit: first packet of a talkspurt), 4.5 and 6 (PCMU/PCMA, payload types 0 and 8,
  clock rate 8000: one 20 ms frame is 160 samples).
* RFC 4733, "RTP Payload for DTMF Digits, Telephony Tones, and Telephony Signals": 2.3
  (payload format), 2.5.1 (sender rules a receiver relies on), 3.2 (DTMF events 0-15).
* RFC 5761, "Multiplexing RTP Data and Control Packets on a Single Port": 4
  (distinguishing RTP from RTCP).

Contract:

* :func:`parse_rtp` / :func:`build_rtp`: one RTP packet (5.1). Parsing skips a header
  extension (5.3.1) and removes padding; the CSRC list is kept.
* :class:`RtpSender`: one outbound stream. Sequence numbers are consecutive forever (a
  silence is not a loss); timestamps advance one frame per packet and jump forward, with
  the marker bit, after a silence (RFC 3551 4.1). It also writes the RTCP we send: SR or RR
  with SDES CNAME (6.1, 6.4.1, 6.5) and BYE (6.6).
* :class:`RtpReceiver`: statistics for one inbound source (appendix A) and what the peer's
  RTCP says about us (:meth:`RtpReceiver.on_rtcp`).
* :class:`DtmfReceiver`: RFC 4733 telephone-events, one digit per key press.

Errors: a datagram the peer should not have sent raises :class:`RtpError` (remote
misbehaviour; the caller drops the datagram and carries on, UDP being what it is). Calling
this module against its contract (a field out of range, an empty frame, sending after
:meth:`RtpSender.bye`) raises :class:`RtpUsageError` (local misuse). Both carry a ``code``
from :class:`RtpErrorCode`.

Speed: a call is 50 packets a second each way, and a gateway carries hundreds of calls, so
the per-packet paths (:func:`parse_rtp`, :meth:`RtpSender.packet`,
:meth:`RtpReceiver.on_packet`) use precompiled :class:`struct.Struct` objects, keep their
state in slots and allocate little beyond the packet's bytes (and, for parsing, the
:class:`RtpPacket`): 100,000 packets build and parse in a fraction of a second.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DTMF_EVENTS",
    "MAX_DROPOUT",
    "MAX_MISORDER",
    "MIN_SEQUENTIAL",
    "NTP_EPOCH_OFFSET",
    "RTCP_BYE",
    "RTCP_RR",
    "RTCP_SDES",
    "RTCP_SR",
    "DtmfReceiver",
    "RtpError",
    "RtpErrorCode",
    "RtpPacket",
    "RtpReceiver",
    "RtpSender",
    "RtpUsageError",
    "build_rtp",
    "is_rtcp",
    "ntp_timestamp",
    "parse_rtp",
]

RTP_VERSION: Final = 2
# Appendix A.1: "RTP_SEQ_MOD (1<<16)"; timestamps and RTCP counters are 32 bits (5.1, 6.4.1)
RTP_SEQ_MOD: Final = 1 << 16
_SEQ_MASK: Final = 0xFFFF
_U32_MASK: Final = 0xFFFFFFFF
_U32_HALF: Final = 0x80000000

# Appendix A.1, update_seq(): the constants of the sequence number validation.
MAX_DROPOUT: Final = 3000
MAX_MISORDER: Final = 100
MIN_SEQUENTIAL: Final = 2

# RFC 3550 12.1: RTCP packet types.
RTCP_SR: Final = 200
RTCP_RR: Final = 201
RTCP_SDES: Final = 202
RTCP_BYE: Final = 203
_SDES_CNAME: Final = 1  # 6.5: "CNAME = 1"

#: Seconds from the NTP epoch (1900-01-01) to the Unix epoch (1970-01-01): 70 years with
#: 17 leap days (RFC 3550 4 gives NTP timestamps "relative to 0h UTC on 1 January 1900").
NTP_EPOCH_OFFSET: Final = 2_208_988_800

#: RFC 4733 3.2: DTMF named events 0-15 ("0"-"9", "*", "#", "A"-"D").
DTMF_EVENTS: Final = "0123456789*#ABCD"

# 5.1: V(2) P(1) X(1) CC(4) | M(1) PT(7) | sequence number(16) | timestamp(32) | SSRC(32)
_RTP_HEADER: Final = struct.Struct("!BBHII")
_RTP_HEADER_SIZE: Final = 12
# 5.1: up to 15 CSRC identifiers, one Struct per count so parsing makes one call
_CSRC_LISTS: Final = tuple(struct.Struct(f"!{count}I") for count in range(16))
_U16: Final = struct.Struct("!H")
# 6.4.1: common header (V P RC | PT | length), SSRC of sender, NTP timestamp (2 x 32),
# RTP timestamp, sender's packet count, sender's octet count
_SR: Final = struct.Struct("!BBHIIIIII")
# 6.4.2 (and the RR/BYE/SDES common header plus first SSRC, 6.4.1 / 6.5 / 6.6)
_HEADER_SSRC: Final = struct.Struct("!BBHI")
_RTCP_HEADER: Final = struct.Struct("!BBH")
# 6.4.1 report block: SSRC_n, fraction lost(8) + cumulative lost(24), extended highest
# sequence number received, interarrival jitter, LSR, DLSR
_REPORT_BLOCK: Final = struct.Struct("!IIIIII")
_REPORT_BLOCK_SIZE: Final = 24
_SR_SIZE: Final = 28  # header + sender info, before report blocks
_RR_SIZE: Final = 8  # header + SSRC of packet sender
# 6.4.1 "cumulative number of packets lost": a signed 24-bit field; A.3 clamps rather
# than wraps ("clamped at 0x7fffff for positive loss or 0x800000 for negative loss")
_LOST_MAX: Final = 0x7FFFFF
_LOST_MIN: Final = -0x800000
# 6.5 / 6.6: an SDES item's text and a BYE reason are prefixed by an 8-bit length
_MAX_TEXT_OCTETS: Final = 255
# RFC 4733 2.3: event(8) | E(1) R(1) volume(6) | duration(16)
_EVENT: Final = struct.Struct("!BBH")
_EVENT_SIZE: Final = 4
_EVENT_END: Final = 0x80
_MAX_SEGMENT_DURATION: Final = 0xFFFF  # RFC 4733 2.5.1.3
# How far before the current event a telephone-event packet may start and still be a late
# packet of an earlier event (at most a segment and a reorder delay before): further back,
# the sender's timestamps jumped, and it is a new event.
_LATE_EVENT_WINDOW: Final = 2 * _MAX_SEGMENT_DURATION
# Duplicate detection window (bits): must cover MAX_MISORDER (A.1's reorder allowance).
_WINDOW_BITS: Final = 128
_WINDOW_MASK: Final = (1 << _WINDOW_BITS) - 1
_JITTER_GAIN: Final = 1.0 / 16.0  # 6.4.1, A.8: "J(i) = J(i-1) + (|D(i-1,i)| - J(i-1))/16"


class RtpErrorCode(enum.StrEnum):
    """Machine-readable codes carried by :class:`RtpError` and :class:`RtpUsageError`."""

    # Remote misbehaviour (RtpError)
    TOO_SHORT = "too_short"  # under the 12-octet RTP header (5.1) or 8-octet RR (6.4.2)
    BAD_VERSION = "bad_version"  # V is not 2 (5.1; A.1, A.2)
    BAD_PADDING = "bad_padding"  # padding count 0 or beyond the payload (5.1; A.1, A.2)
    BAD_EXTENSION = "bad_extension"  # header extension past the end (5.3.1)
    BAD_CSRC = "bad_csrc"  # CC larger than the packet holds (5.1)
    BAD_LENGTH = "bad_length"  # RTCP lengths do not sum to the datagram (6.1, A.2)
    BAD_COMPOUND = "bad_compound"  # compound RTCP not starting with SR or RR (6.1, A.2)
    BAD_REPORT = "bad_report"  # SR/RR shorter than its report count says (6.4)
    BAD_EVENT = "bad_event"  # telephone-event payload under 4 octets (RFC 4733 2.3)
    # Local misuse (RtpUsageError)
    INVALID_FIELD = "invalid_field"  # a header field or argument out of range
    EMPTY_PAYLOAD = "empty_payload"  # RtpSender.packet without audio
    INVALID_TEXT = "invalid_text"  # CNAME empty or over 255 octets, BYE reason too long
    INVALID_TIME = "invalid_time"  # a wallclock before 1970 or not finite
    STREAM_ENDED = "stream_ended"  # RtpSender used after bye()


class RtpError(Exception):
    """The peer sent a datagram RTP/RTCP does not allow (remote misbehaviour).

    ``code`` for machines, ``message`` for the log (it quotes no packet bytes)."""

    def __init__(self, code: RtpErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RtpUsageError(Exception):
    """This process called the core in a way its contract forbids (local misuse)."""

    def __init__(self, code: RtpErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _field(name: str, value: int, limit: int) -> None:
    """Raise :class:`RtpUsageError` unless ``0 <= value < limit``."""
    if not 0 <= value < limit:
        raise RtpUsageError(RtpErrorCode.INVALID_FIELD, f"{name} {value} not in 0..{limit - 1}")


# --------------------------------------------------------------------------- RTP packets


@dataclass(frozen=True, slots=True)
class RtpPacket:
    """One RTP data packet (5.1), header extension and padding already removed.

    ``payload_type`` 0..127, ``sequence`` 0..65535, ``timestamp`` and ``ssrc`` 32-bit
    unsigned, ``csrc`` at most 15 identifiers. :func:`build_rtp` checks the ranges.
    """

    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    marker: bool
    payload: bytes
    csrc: tuple[int, ...] = ()


def parse_rtp(data: bytes) -> RtpPacket:
    """The RTP packet in ``data`` (5.1), or :class:`RtpError`.

    Checks what A.1 calls the header validity: version 2, a CSRC list (``bad_csrc``) and a
    header extension (``bad_extension``, 5.3.1: "a 16-bit length field that counts the
    number of 32-bit words in the extension, excluding the four-octet extension header")
    that fit, and padding whose count (the last octet, "including itself") is at least 1
    and no more than what follows the header (``bad_padding``). The payload type is not
    checked against a profile; RTCP on a multiplexed port should be told apart first, with
    :func:`is_rtcp`.
    """
    size = len(data)
    if size < _RTP_HEADER_SIZE:
        raise RtpError(RtpErrorCode.TOO_SHORT, f"{size} octets, an RTP header is 12")
    first, second, sequence, timestamp, ssrc = _RTP_HEADER.unpack_from(data)
    if first >> 6 != RTP_VERSION:
        raise RtpError(RtpErrorCode.BAD_VERSION, f"version {first >> 6}, need 2")
    offset = _RTP_HEADER_SIZE
    count = first & 0x0F
    csrc: tuple[int, ...] = ()
    if count:
        offset += 4 * count
        if offset > size:
            raise RtpError(RtpErrorCode.BAD_CSRC, f"{count} CSRCs do not fit in {size} octets")
        csrc = _CSRC_LISTS[count].unpack_from(data, _RTP_HEADER_SIZE)
    if first & 0x10:  # X: one header extension follows the CSRC list (5.3.1)
        if offset + 4 > size:
            raise RtpError(RtpErrorCode.BAD_EXTENSION, "header extension header truncated")
        offset += 4 + 4 * _U16.unpack_from(data, offset + 2)[0]
        if offset > size:
            raise RtpError(RtpErrorCode.BAD_EXTENSION, "header extension runs past the end")
    end = size
    if first & 0x20:  # P: "the last octet of the padding contains a count" (5.1)
        padding = data[-1]
        if padding == 0 or padding > size - offset:
            raise RtpError(
                RtpErrorCode.BAD_PADDING, f"padding {padding} with {size - offset} after header"
            )
        end -= padding
    return RtpPacket(
        second & 0x7F, sequence, timestamp, ssrc, second >= 0x80, data[offset:end], csrc
    )


def build_rtp(packet: RtpPacket) -> bytes:
    """The wire form of ``packet`` (5.1): version 2, no padding, no header extension.

    Fields out of range raise :class:`RtpUsageError` (``invalid_field``).
    """
    payload_type = packet.payload_type
    if not 0 <= payload_type <= 0x7F:
        _field("payload type", payload_type, 0x80)
    csrc = packet.csrc
    count = len(csrc)
    second = (0x80 | payload_type) if packet.marker else payload_type
    try:
        header = _RTP_HEADER.pack(
            0x80 | count, second, packet.sequence, packet.timestamp, packet.ssrc
        )
        if count:
            if count > 15:
                _field("CSRC count", count, 16)
            header += _CSRC_LISTS[count].pack(*csrc)
    except struct.error:
        _field("sequence", packet.sequence, RTP_SEQ_MOD)
        _field("timestamp", packet.timestamp, 1 << 32)
        _field("SSRC", packet.ssrc, 1 << 32)
        for identifier in csrc:
            _field("CSRC", identifier, 1 << 32)
        raise RtpUsageError(RtpErrorCode.INVALID_FIELD, "header fields must be int") from None
    return header + packet.payload


def is_rtcp(data: bytes) -> bool:
    """True when a datagram on a port carrying both RTP and RTCP is RTCP (RFC 5761 4).

    RTCP packet types 192-223 fall where an RTP packet has the marker bit and payload type
    64-95, which RFC 5761 4 forbids RTP from using on a multiplexed port; the second octet
    alone tells them apart (SR 200, RR 201, SDES 202, BYE 203, APP 204, RTPFB 205, PSFB 206).
    """
    return len(data) >= 2 and 192 <= data[1] <= 223


def ntp_timestamp(wallclock: float) -> tuple[int, int]:
    """``wallclock`` (seconds since 1970) as a 64-bit NTP timestamp (seconds, fraction).

    RFC 3550 4: seconds since 1900 in the high word, the fraction in units of 2**-32 s in
    the low one. The seconds wrap modulo 2**32 (NTP era 1 starts in 2036).
    """
    if not math.isfinite(wallclock) or wallclock < 0:
        raise RtpUsageError(RtpErrorCode.INVALID_TIME, f"wallclock {wallclock!r}")
    seconds = math.floor(wallclock)
    fraction = int((wallclock - seconds) * 4_294_967_296.0)  # exact: seconds = floor
    return (seconds + NTP_EPOCH_OFFSET) & _U32_MASK, fraction


def _ntp_middle(seconds: int, fraction: int) -> int:
    """The "middle 32 bits out of 64 in the NTP timestamp" (6.4.1, LSR)."""
    return ((seconds & 0xFFFF) << 16) | (fraction >> 16)


def _text(what: str, value: str, *, allow_empty: bool) -> bytes:
    """``value`` in UTF-8 (6.5: SDES text "is encoded according to the UTF-8 encoding"),
    within the 255 octets an 8-bit length allows."""
    try:
        octets = value.encode("utf-8")
    except UnicodeEncodeError:
        raise RtpUsageError(RtpErrorCode.INVALID_TEXT, f"{what} is not Unicode text") from None
    if len(octets) > _MAX_TEXT_OCTETS or not (octets or allow_empty):
        raise RtpUsageError(
            RtpErrorCode.INVALID_TEXT,
            f"{what} is {len(octets)} octets of UTF-8, need 1..{_MAX_TEXT_OCTETS}",
        )
    return octets


def _sdes_cname(ssrc: int, cname: bytes) -> bytes:
    """An SDES packet with one chunk holding one CNAME item (6.5, 6.5.1).

    The item list "MUST be terminated by one or more null octets ... additional null
    octets MUST be included if needed to pad until the next 32-bit boundary" (6.5): 1 to 4
    nulls after the 2-octet item header and the text.
    """
    nulls = 4 - (2 + len(cname)) % 4
    words = (8 + 2 + len(cname) + nulls) // 4  # header, SSRC, item, nulls
    return (
        _HEADER_SSRC.pack(0x81, RTCP_SDES, words - 1, ssrc)
        + bytes((_SDES_CNAME, len(cname)))
        + cname
        + bytes(nulls)
    )


# --------------------------------------------------------------------------- sender


class RtpSender:
    """One outbound stream: continuous sequence numbers and timestamps across talkspurts.

    Timestamps (5.1: "the sampling instant of the first octet in the RTP data packet"):
    the first packet carries ``first_timestamp`` and the marker bit. Each following packet
    carries the previous timestamp plus ``samples_per_packet`` while packets keep coming,
    even when they come early (a pacer sends frames up to ~60 ms ahead of time: the media
    clock is then behind, which is not a gap). When the media clock at ``now``
    (``first_timestamp + (now - first_now) * clock_rate``) is more than two packets ahead
    of that, there was a silence: the timestamp jumps to the media clock, rounded down to
    a whole number of packets after ``first_timestamp``, and the marker bit is set
    (RFC 3551 4.1: "the first packet of a talkspurt"). Sequence numbers go up by one per
    packet, modulo 2**16, whatever happens: a silence sends nothing, it loses nothing.

    ``octets_sent`` counts payload octets, "not including header or padding" (6.4.1).
    ``last_timestamp`` is the last packet's timestamp (``first_timestamp`` before one).
    """

    __slots__ = (
        "_clock_rate",
        "_cname",
        "_ended",
        "_first_now",
        "_first_timestamp",
        "_offset",
        "_payload_type",
        "_report_counts",
        "_samples_per_packet",
        "_sequence",
        "_ssrc",
        "last_timestamp",
        "octets_sent",
        "packets_sent",
    )

    def __init__(
        self,
        *,
        ssrc: int,
        payload_type: int,
        clock_rate: int = 8000,
        samples_per_packet: int = 160,
        first_sequence: int,
        first_timestamp: int,
    ) -> None:
        _field("SSRC", ssrc, 1 << 32)
        _field("payload type", payload_type, 0x80)
        _field("first sequence", first_sequence, RTP_SEQ_MOD)
        _field("first timestamp", first_timestamp, 1 << 32)
        if clock_rate <= 0 or samples_per_packet <= 0:
            raise RtpUsageError(
                RtpErrorCode.INVALID_FIELD, "clock rate and samples per packet must be positive"
            )
        self._ssrc = ssrc
        self._payload_type = payload_type
        self._clock_rate = clock_rate
        self._samples_per_packet = samples_per_packet
        self._sequence = first_sequence
        self._first_timestamp = first_timestamp
        self._first_now: float | None = None
        # Samples from first_timestamp to the last packet's timestamp, not wrapped.
        self._offset = 0
        self._cname: bytes | None = None  # the last CNAME sent, for bye()
        self._ended = False
        # packets_sent when the last two reports were built: 6.4 "the SR is issued if a
        # site has sent any data packets during the interval since issuing the last report
        # or the previous one, otherwise the RR is issued"
        self._report_counts = (0, 0)
        self.packets_sent = 0
        self.octets_sent = 0
        self.last_timestamp = first_timestamp

    @property
    def ssrc(self) -> int:
        return self._ssrc

    @property
    def payload_type(self) -> int:
        return self._payload_type

    @property
    def clock_rate(self) -> int:
        return self._clock_rate

    @property
    def samples_per_packet(self) -> int:
        return self._samples_per_packet

    @property
    def next_sequence(self) -> int:
        """The sequence number the next packet will carry."""
        return self._sequence

    def set_payload_type(self, pt: int) -> None:
        """Carry payload type ``pt`` from the next packet on (a codec change after a
        re-INVITE; RFC 3551 6: "An RTP source MAY change payload types within the same
        media type during a session"). Same clock rate: sequence and timestamps go on."""
        _field("payload type", pt, 0x80)
        self._payload_type = pt

    def packet(self, payload: bytes, now: float) -> bytes:
        """The next RTP packet carrying ``payload`` (one frame), sent at ``now``."""
        if self._ended:
            raise RtpUsageError(RtpErrorCode.STREAM_ENDED, "packet after bye()")
        if not payload:
            raise RtpUsageError(RtpErrorCode.EMPTY_PAYLOAD, "no audio to send")
        first_now = self._first_now
        if first_now is None:
            self._first_now = now
            offset = 0
            second = 0x80 | self._payload_type  # the first packet starts a talkspurt
        else:
            spp = self._samples_per_packet
            offset = self._offset + spp
            clock = math.floor((now - first_now) * self._clock_rate)
            if clock - offset > 2 * spp:  # a silence: RFC 3551 4.1 talkspurt
                offset = clock - clock % spp
                second = 0x80 | self._payload_type
            else:
                second = self._payload_type
        self._offset = offset
        timestamp = (self._first_timestamp + offset) & _U32_MASK
        sequence = self._sequence
        self._sequence = (sequence + 1) & _SEQ_MASK
        self.last_timestamp = timestamp
        self.packets_sent += 1
        self.octets_sent += len(payload)
        return _RTP_HEADER.pack(0x80, second, sequence, timestamp, self._ssrc) + payload

    def media_clock(self, now: float) -> int:
        """The RTP timestamp that corresponds to ``now`` (6.4.1 "RTP timestamp": "the same
        time as the NTP timestamp ... in the same units and with the same random offset as
        the RTP timestamps in data packets"): ``first_timestamp`` before the first packet."""
        if self._first_now is None:
            return self._first_timestamp
        elapsed = math.floor((now - self._first_now) * self._clock_rate)
        return (self._first_timestamp + elapsed) & _U32_MASK

    def sender_report(
        self,
        *,
        wallclock: float,
        now: float,
        receiver: RtpReceiver | None = None,
        cname: str,
    ) -> bytes:
        """A compound RTCP packet: SR (6.4.1), then SDES with our CNAME (6.5), as 6.1
        requires ("The first RTCP packet in the compound packet MUST always be a report
        packet", and "An SDES packet containing a CNAME item MUST be included in each
        compound RTCP packet").

        With a ``receiver`` whose source is valid, the report carries one report block
        about it (fraction and cumulative lost from A.3, extended highest sequence number,
        jitter from A.8, LSR/DLSR from the last SR :meth:`RtpReceiver.on_rtcp` saw) and
        starts a new A.3 interval. If this stream sent no packet since the report before
        the last one, it is an RR instead (6.4: "otherwise the RR is issued"), with the
        same report block and SDES.
        """
        if self._ended:
            raise RtpUsageError(RtpErrorCode.STREAM_ENDED, "sender_report after bye()")
        cname_octets = _text("CNAME", cname, allow_empty=False)
        sec, frac = ntp_timestamp(wallclock)  # checked before any state changes
        block = b""
        if receiver is not None and receiver.ssrc is not None:
            block = receiver.report_block(now)
        count = 1 if block else 0
        oldest, last = self._report_counts
        self._report_counts = (last, self.packets_sent)
        if self.packets_sent > oldest:
            report = _SR.pack(
                0x80 | count,
                RTCP_SR,
                6 + 6 * count,  # 6.4.1 length: 32-bit words minus one (7 or 13 words)
                self._ssrc,
                sec,
                frac,
                self.media_clock(now),
                self.packets_sent & _U32_MASK,  # 6.4.1: counts wrap
                self.octets_sent & _U32_MASK,
            )
        else:
            report = _HEADER_SSRC.pack(0x80 | count, RTCP_RR, 1 + 6 * count, self._ssrc)
        self._cname = cname_octets
        return report + block + _sdes_cname(self._ssrc, cname_octets)

    def bye(self, reason: str | None = None) -> bytes:
        """A compound RTCP packet ending this stream: an empty RR first (6.1: "even if no
        data has been sent or received, in which case an empty RR MUST be sent, and even
        if the only other RTCP packet in the compound packet is a BYE"), SDES CNAME when a
        :meth:`sender_report` has named one, then BYE (6.6) with an optional reason.

        After this the sender refuses to send: BYE says the source is "no longer active"
        (6.6), and that is local misuse (``stream_ended``).
        """
        if self._ended:
            raise RtpUsageError(RtpErrorCode.STREAM_ENDED, "bye() twice")
        text = b"" if reason is None else _text("BYE reason", reason, allow_empty=True)
        self._ended = True
        parts = [_HEADER_SSRC.pack(0x80, RTCP_RR, 1, self._ssrc)]
        if self._cname is not None:
            parts.append(_sdes_cname(self._ssrc, self._cname))
        if reason is None:
            parts.append(_HEADER_SSRC.pack(0x81, RTCP_BYE, 1, self._ssrc))
        else:
            # 6.6: an 8-bit octet count, the text, then null octets to a 32-bit boundary
            tail = bytes((len(text),)) + text
            tail += bytes(-len(tail) % 4)
            parts.append(_HEADER_SSRC.pack(0x81, RTCP_BYE, 1 + len(tail) // 4, self._ssrc))
            parts.append(tail)
        return b"".join(parts)


# --------------------------------------------------------------------------- receiver


class RtpReceiver:
    """Statistics for one inbound source (RFC 3550 appendix A).

    :meth:`on_packet` runs A.1's sequence number validation: a source is valid after
    :data:`MIN_SEQUENTIAL` packets in sequence (the first is reported as rejected), a jump
    of :data:`MAX_DROPOUT` or more is believed only when the next packet follows it (the
    sender restarted), and a packet up to :data:`MAX_MISORDER` behind is a late one.
    Packets of another SSRC go through the same probation as a candidate source and
    replace the current one only when it passes (a re-INVITE or a transfer upstream
    changes the SSRC); until then, the current source's packets are accepted as usual.

    Counters (A.3): ``received`` counts accepted packets including duplicates (6.4.1:
    "the number of packets received includes any which are late or duplicates"),
    ``expected`` is ``extended_max - base + 1``, ``lost`` their difference (negative
    when duplicates outnumber losses). ``duplicates`` counts packets seen before (a window
    of 128 sequence numbers), ``rejected`` packets refused by validation or probation.

    Jitter (A.8) is in timestamp units, over packets with distinct timestamps: a packet
    sharing its predecessor's timestamp (RFC 4733 event updates, 2.5.1.2) was sent later
    than its timestamp says on purpose, and would otherwise count as jitter.

    :meth:`on_rtcp` takes the peer's RTCP: its last SR (for LSR/DLSR in our report) and
    its report block about us (``peer_*`` attributes; a block about ``local_ssrc`` when
    that is set, else any block).
    """

    __slots__ = (
        "_bad_seq",
        "_base_seq",
        "_candidate",
        "_candidate_max",
        "_candidate_probation",
        "_cycles",
        "_expected_prior",
        "_last_arrival",
        "_last_timestamp",
        "_max_seq",
        "_received_prior",
        "_sr_arrival",
        "_sr_lsr",
        "_sr_ssrc",
        "_window",
        "clock_rate",
        "duplicates",
        "jitter",
        "local_ssrc",
        "peer_cumulative_lost",
        "peer_dlsr",
        "peer_extended_max",
        "peer_fraction_lost",
        "peer_jitter",
        "peer_lsr",
        "peer_report_arrival",
        "received",
        "rejected",
        "ssrc",
    )

    def __init__(self, *, clock_rate: int = 8000, local_ssrc: int | None = None) -> None:
        if clock_rate <= 0:
            raise RtpUsageError(RtpErrorCode.INVALID_FIELD, "clock rate must be positive")
        self.clock_rate = clock_rate
        #: Our own SSRC: when set, on_rtcp only takes report blocks about it.
        self.local_ssrc = local_ssrc
        self.ssrc: int | None = None  # the valid source, None until one passes probation
        self.received = 0
        self.duplicates = 0
        self.rejected = 0
        self.jitter = 0.0
        self._max_seq = 0
        self._cycles = 0
        self._base_seq = 0
        self._bad_seq = RTP_SEQ_MOD + 1
        self._received_prior = 0
        self._expected_prior = 0
        self._window = 0  # bit i: extended sequence number extended_max - i was received
        self._last_timestamp: int | None = None  # A.8: previous packet's timestamp...
        self._last_arrival = 0.0  # ...and arrival, seconds
        self._candidate: int | None = None  # an SSRC on probation (A.1)
        self._candidate_max = 0
        self._candidate_probation = 0
        self._sr_ssrc: int | None = None  # the last SR received: its sender...
        self._sr_lsr = 0  # ...the middle 32 bits of its NTP timestamp...
        self._sr_arrival = 0.0  # ...and when it arrived
        self.peer_fraction_lost: int | None = None  # 0..255: lost/256 (6.4.1)
        self.peer_cumulative_lost: int | None = None
        self.peer_extended_max: int | None = None
        self.peer_jitter: int | None = None  # timestamp units of our stream
        self.peer_lsr: int | None = None
        self.peer_dlsr: int | None = None  # 1/65536 s
        self.peer_report_arrival: float | None = None

    # ----------------------------------------------------------------- counters (A.3)

    @property
    def extended_max(self) -> int:
        """Extended highest sequence number received: 16-bit wraps counted (A.1)."""
        return self._cycles + self._max_seq

    @property
    def expected(self) -> int:
        """A.3: ``extended_max - base_seq + 1`` (0 before a source is valid)."""
        if self.ssrc is None:
            return 0
        return self._cycles + self._max_seq - self._base_seq + 1

    @property
    def lost(self) -> int:
        """Cumulative packets lost, A.3: ``expected - received`` (may be negative)."""
        return self.expected - self.received

    @property
    def jitter_ms(self) -> float:
        """Interarrival jitter in milliseconds."""
        return self.jitter * 1000.0 / self.clock_rate

    @property
    def peer_jitter_ms(self) -> float | None:
        """The peer's jitter about our stream in ms (our stream's clock rate assumed equal
        to this receiver's, true of a call with one codec clock)."""
        if self.peer_jitter is None:
            return None
        return self.peer_jitter * 1000.0 / self.clock_rate

    def fraction_lost_since_last_report(self) -> int:
        """A.3: packets lost in the interval since the last call, as a fraction of those
        expected, in 1/256 (0..255; 0 when none were expected or more arrived than were
        expected). Starts the next interval."""
        expected = self.expected
        expected_interval = expected - self._expected_prior
        self._expected_prior = expected
        received_interval = self.received - self._received_prior
        self._received_prior = self.received
        lost_interval = expected_interval - received_interval
        if expected_interval == 0 or lost_interval <= 0:
            return 0
        return (lost_interval << 8) // expected_interval

    def report_block(self, now: float) -> bytes:
        """One 6.4.1 report block about the current source (24 octets), built at ``now``.

        Starts a new A.3 interval (through :meth:`fraction_lost_since_last_report`). LSR and
        DLSR are 0 when no SR of this source has arrived (6.4.1). Local misuse before a
        source is valid (``invalid_field``)."""
        ssrc = self.ssrc
        if ssrc is None:
            raise RtpUsageError(RtpErrorCode.INVALID_FIELD, "no valid source to report on")
        fraction = self.fraction_lost_since_last_report()
        lost = min(max(self.lost, _LOST_MIN), _LOST_MAX) & 0xFFFFFF
        lsr = dlsr = 0
        if self._sr_ssrc == ssrc:
            lsr = self._sr_lsr
            # 6.4.1 DLSR: "expressed in units of 1/65536 seconds"
            dlsr = min(max(math.floor((now - self._sr_arrival) * 65536.0), 0), _U32_MASK)
        return _REPORT_BLOCK.pack(
            ssrc,
            (fraction << 24) | lost,
            self.extended_max & _U32_MASK,
            min(int(self.jitter), _U32_MASK),
            lsr,
            dlsr,
        )

    # ----------------------------------------------------------------- RTP (A.1, A.8)

    def _init_seq(self, seq: int) -> None:
        # A.1 init_seq()
        self._base_seq = seq
        self._max_seq = seq
        self._bad_seq = RTP_SEQ_MOD + 1  # "so seq == bad_seq is false"
        self._cycles = 0
        self.received = 0
        self._received_prior = 0
        self._expected_prior = 0
        self._window = 1
        self._last_timestamp = None  # the next packet starts A.8 afresh

    def on_packet(self, packet: RtpPacket, arrival: float) -> bool:
        """Account for ``packet``, which arrived at ``arrival`` (seconds).

        True when the caller should use it; False for a duplicate, for a packet A.1's
        validation rejects (a source on probation, a large jump not yet confirmed) and for
        a packet of an SSRC that is not (yet) the source.
        """
        if packet.ssrc != self.ssrc:
            return self._probe(packet, arrival)
        seq = packet.sequence
        max_seq = self._max_seq
        udelta = (seq - max_seq) & _SEQ_MASK
        if udelta == 0:
            self.received += 1  # 6.4.1: duplicates count as received
            self.duplicates += 1
            return False
        if udelta < MAX_DROPOUT:
            # "in order, with permissible gap"
            if seq < max_seq:
                self._cycles += RTP_SEQ_MOD  # "Sequence number wrapped"
            self._max_seq = seq
            self._window = ((self._window << udelta) | 1) & _WINDOW_MASK
        elif udelta <= RTP_SEQ_MOD - MAX_MISORDER:
            # "the sequence number made a very large jump"
            if seq != self._bad_seq:
                self._bad_seq = (seq + 1) & _SEQ_MASK
                self.rejected += 1
                return False
            # "Two sequential packets -- assume that the other side restarted without
            # telling us so just re-sync (i.e., pretend this was the first packet)."
            self._init_seq(seq)
        else:
            # "duplicate or reordered packet": up to MAX_MISORDER behind
            bit = 1 << (RTP_SEQ_MOD - udelta)
            if self._window & bit:
                self.received += 1
                self.duplicates += 1
                return False
            self._window |= bit
        self.received += 1
        self._jitter(packet.timestamp, arrival)
        return True

    def _probe(self, packet: RtpPacket, arrival: float) -> bool:
        """A.1's probation for an SSRC that is not the source: MIN_SEQUENTIAL packets in
        sequence make it the source, with fresh statistics."""
        seq = packet.sequence
        if packet.ssrc != self._candidate:
            # A.1: "s->max_seq = seq - 1; s->probation = MIN_SEQUENTIAL"
            self._candidate = packet.ssrc
            self._candidate_max = (seq - 1) & _SEQ_MASK
            self._candidate_probation = MIN_SEQUENTIAL
        if seq == (self._candidate_max + 1) & _SEQ_MASK:  # "packet is in sequence"
            self._candidate_probation -= 1
            self._candidate_max = seq
            if self._candidate_probation == 0:
                self.ssrc = packet.ssrc
                self._candidate = None
                self._init_seq(seq)
                self.received = 1
                self.jitter = 0.0  # a new source: A.8 state is per source
                self._jitter(packet.timestamp, arrival)
                return True
        else:
            self._candidate_probation = MIN_SEQUENTIAL - 1
            self._candidate_max = seq
        self.rejected += 1
        return False

    def _jitter(self, timestamp: int, arrival: float) -> None:
        # A.8: D(i,j) = (Rj - Ri) - (Sj - Si) in timestamp units; J += (|D| - J)/16.
        last = self._last_timestamp
        if last is None:
            self._last_timestamp = timestamp
            self._last_arrival = arrival
            return
        if timestamp == last:
            return  # sent late on purpose (RFC 4733 updates): not network jitter
        sent = ((timestamp - last + _U32_HALF) & _U32_MASK) - _U32_HALF  # signed, wraps
        d = (arrival - self._last_arrival) * self.clock_rate - sent
        if d < 0:
            d = -d
        self.jitter += (d - self.jitter) * _JITTER_GAIN
        self._last_timestamp = timestamp
        self._last_arrival = arrival

    # ----------------------------------------------------------------- RTCP (6.1, A.2)

    def on_rtcp(self, data: bytes, arrival: float) -> None:
        """Take a compound RTCP packet from the peer, which arrived at ``arrival``.

        Validity (6.1, A.2): version 2 throughout; the first packet an SR or RR without
        padding; padding only in the last packet; the packets' lengths summing to the
        datagram's. SR: remembered for LSR/DLSR. SR/RR report blocks about us: the
        ``peer_*`` attributes. SDES, BYE, APP and feedback packets are skipped.
        """
        size = len(data)
        if size < _RR_SIZE:
            raise RtpError(RtpErrorCode.TOO_SHORT, f"{size} octets, an RTCP RR is 8")
        first, packet_type, _ = _RTCP_HEADER.unpack_from(data)
        if first >> 6 != RTP_VERSION:
            raise RtpError(RtpErrorCode.BAD_VERSION, f"version {first >> 6}, need 2")
        if packet_type not in (RTCP_SR, RTCP_RR):
            # 6.1: "The first RTCP packet in the compound packet MUST always be a report
            # packet"; A.2 checks it with RTCP_VALID_MASK
            raise RtpError(RtpErrorCode.BAD_COMPOUND, f"first packet type {packet_type}")
        if first & 0x20:
            raise RtpError(RtpErrorCode.BAD_PADDING, "padding in the first RTCP packet")
        # A.2 walks the lengths first: nothing is taken from an invalid compound packet.
        reports: list[tuple[int, int, int, int]] = []  # (offset, end, type, count)
        offset = 0
        while offset < size:
            if size - offset < 4:
                raise RtpError(RtpErrorCode.BAD_LENGTH, "RTCP packets do not fill the datagram")
            first, packet_type, length = _RTCP_HEADER.unpack_from(data, offset)
            if first >> 6 != RTP_VERSION:
                raise RtpError(RtpErrorCode.BAD_VERSION, f"version {first >> 6} at {offset}")
            end = offset + 4 * (length + 1)
            if end > size:
                raise RtpError(RtpErrorCode.BAD_LENGTH, f"packet at {offset} runs past {size}")
            body_end = end
            if first & 0x20:
                # 6.4.1 "padding (P)": "padding MUST only be added to the last individual
                # packet"; its last octet counts the padding octets, including itself
                padding = data[end - 1]
                if end != size or padding == 0 or padding > end - offset - 4:
                    raise RtpError(RtpErrorCode.BAD_PADDING, f"padding at {offset}")
                body_end = end - padding
            if packet_type in (RTCP_SR, RTCP_RR):
                reports.append((offset, body_end, packet_type, first & 0x1F))
            offset = end
        for offset, body_end, packet_type, count in reports:
            head = _SR_SIZE if packet_type == RTCP_SR else _RR_SIZE
            blocks = offset + head
            if blocks + count * _REPORT_BLOCK_SIZE > body_end:
                raise RtpError(
                    RtpErrorCode.BAD_REPORT,
                    f"report count {count} does not fit in packet type {packet_type}",
                )
        for offset, _body_end, packet_type, count in reports:
            self._take_report(data, offset, packet_type, count, arrival)

    def _take_report(
        self, data: bytes, offset: int, packet_type: int, count: int, arrival: float
    ) -> None:
        if packet_type == RTCP_SR:
            _, _, _, ssrc, seconds, fraction, _, _, _ = _SR.unpack_from(data, offset)
            self._sr_ssrc = ssrc
            self._sr_lsr = _ntp_middle(seconds, fraction)
            self._sr_arrival = arrival
            offset += _SR_SIZE
        else:
            offset += _RR_SIZE
        local = self.local_ssrc
        for _ in range(count):
            about, lost_word, extended, jitter, lsr, dlsr = _REPORT_BLOCK.unpack_from(data, offset)
            offset += _REPORT_BLOCK_SIZE
            if local is not None and about != local:
                continue
            lost = lost_word & 0xFFFFFF
            self.peer_fraction_lost = lost_word >> 24
            self.peer_cumulative_lost = lost - 0x1000000 if lost & 0x800000 else lost
            self.peer_extended_max = extended
            self.peer_jitter = jitter
            self.peer_lsr = lsr
            self.peer_dlsr = dlsr
            self.peer_report_arrival = arrival


# --------------------------------------------------------------------------- DTMF


class DtmfReceiver:
    """RFC 4733 telephone-events (section 2.3 payload format): one digit per event.

    An event is identified by its RTP timestamp: the time the event began, the same in
    every packet of it, updates and retransmissions included (2.3.1, 2.5.1.2). The
    digit is reported on the first packet of a new event (a lost start packet does not lose
    the digit: any packet of the event starts it), never again for its updates or the
    (usually three) retransmissions of its final packet (2.5.1.4). A packet whose timestamp
    is up to two segments (2 x 0xFFFF) older than the current event's is a late packet of an
    earlier event, and absorbed too (further back, the sender's timestamps jumped: a new
    event). A long event continues
    in a new segment whose timestamp is the old one plus 0xFFFF (2.5.1.3): same event, no
    new digit.

    Events 0-15 are DTMF ("0123456789*#ABCD", 3.2); a new event with another code (16,
    flash, and up) is counted in ``ignored``. ``duplicates`` counts the packets absorbed,
    ``events`` the digits reported. A packet of another payload type is not ours: None.
    Only the first event of a packet is read: packing several events into one packet
    (2.5.1.5) is not supported.
    """

    __slots__ = (
        "_code",
        "_ended",
        "_ssrc",
        "_timestamp",
        "duplicates",
        "events",
        "ignored",
        "payload_type",
    )

    def __init__(self, *, payload_type: int) -> None:
        _field("payload type", payload_type, 0x80)
        self.payload_type = payload_type
        self.ignored = 0
        self.duplicates = 0
        self.events = 0
        self._ssrc: int | None = None  # the current event: its source...
        self._timestamp = 0  # ...start timestamp...
        self._code = 0  # ...code...
        self._ended = False  # ...and whether its E bit was seen

    def on_packet(self, packet: RtpPacket) -> str | None:
        """The digit ``packet`` starts, or None (not ours, not new, not DTMF)."""
        if packet.payload_type != self.payload_type:
            return None
        payload = packet.payload
        if len(payload) < _EVENT_SIZE:
            raise RtpError(
                RtpErrorCode.BAD_EVENT, f"telephone-event payload of {len(payload)} octets"
            )
        code, flags, _duration = _EVENT.unpack_from(payload)
        timestamp = packet.timestamp
        if packet.ssrc == self._ssrc:
            since = (timestamp - self._timestamp) & _U32_MASK
            if since == 0 or since >= (1 << 32) - _LATE_EVENT_WINDOW:  # this one, or late
                if since == 0 and flags & _EVENT_END:
                    self._ended = True
                self.duplicates += 1
                return None
            if since == _MAX_SEGMENT_DURATION and code == self._code and not self._ended:
                # 2.5.1.3: the next segment of a long event
                self._timestamp = timestamp
                self._ended = bool(flags & _EVENT_END)
                self.duplicates += 1
                return None
        self._ssrc = packet.ssrc
        self._timestamp = timestamp
        self._code = code
        self._ended = bool(flags & _EVENT_END)
        if code < len(DTMF_EVENTS):
            self.events += 1
            return DTMF_EVENTS[code]
        self.ignored += 1
        return None
