"""SDP offer/answer for one audio call: a sans-I/O core (offer text in, answer bytes out).

The SIP layer hands this module the body of an INVITE (or re-INVITE) and gets back what to
do with the call and the body of its 200 OK. Nothing here touches a socket, a clock or a
resolver: a host name where an address should be is refused, never looked up.

References (cited below by section):

* RFC 4566, "SDP: Session Description Protocol": 5 (line format and order), 5.1 ``v=``,
  5.2 ``o=``, 5.3 ``s=``, 5.7 ``c=``, 5.9 ``t=``, 5.13 ``a=``, 5.14 ``m=``, 6 (the
  attributes read here: ``rtpmap``, ``fmtp``, ``ptime``, ``sendrecv``, ``sendonly``,
  ``recvonly``, ``inactive``), 9 (ABNF grammar).
* RFC 3264, "An Offer/Answer Model with SDP": 5 (``o=`` numbers, ``t=0 0``), 6 and 6.1
  (the answer: one ``m=`` line per offered one, in order; rejection by port 0; payload
  types; directions), 8 (modifying a session: re-offers), 8.4 (hold; the older
  ``c=0.0.0.0`` convention).
* RFC 6337, "SIP Usage of the Offer/Answer Model": 5 (hold and resume in re-INVITEs).
* RFC 3551, "RTP Profile for Audio and Video Conferences": 6 (static payload types: 0 is
  PCMU/8000, 8 is PCMA/8000, neither needing ``a=rtpmap``; 96-127 are dynamic).
* RFC 4733, "RTP Payload for DTMF Digits": 2.4.1 (``telephone-event`` in SDP, the
  ``fmtp`` event list) and 3.2 (DTMF events 0-15).
* RFC 3711 (SRTP, the ``RTP/SAVP`` profile), RFC 3605 (``a=rtcp``), RFC 5761 5.1.1
  (``a=rtcp-mux``: an answerer that does not multiplex leaves it out).

Contract:

* :func:`parse_sdp`: text or bytes into a :class:`SessionDescription`. ``v=``, ``o=`` and
  ``s=`` must be the first three lines (RFC 4566 5); CRLF or LF line ends; lines of an
  unknown (or unused) type are ignored; :data:`MAX_SDP_BYTES`, :data:`MAX_MEDIA_SECTIONS`
  and :data:`MAX_FORMATS` bound the work a peer can cause.
* :func:`negotiate`: an offer into :class:`Negotiated`: which ``m=`` line carries our
  audio, in which codec (PCMU or PCMA, the first of the offer's formats we support), the
  offer's ``telephone-event/8000`` payload type, where to send RTP, our direction and
  whether the peer holds the call. Called again on every re-INVITE offer.
* :func:`build_answer`: the answer to an offer, CRLF line ends: the accepted audio stream
  with our address and port, every other stream rejected with port 0.
* :func:`build_offer`: an offer of our own (a later re-INVITE from us).

Errors: a description the peer should not have sent raises :class:`SdpError` (status 400,
RFC 3261 21.4.1 Bad Request); a well-formed one we cannot use (no audio stream we can
take, no common codec, SRTP only, a host name for an address) raises its subclass
:class:`SdpNotAcceptable` (status 488, RFC 3261 21.4.26 Not Acceptable Here). ``code`` is
an :class:`SdpErrorCode` for machines, ``message`` a short line for the log that quotes
at most :data:`telephony.limits.MAX_ECHO_CHARS` characters of remote input. Calling a
builder against its contract (a bad address, port or payload type) is local misuse and
raises :class:`ValueError`.

Hold (RFC 3264 8.4, RFC 6337 5): a peer holds the call with ``a=sendonly`` or
``a=inactive`` (we answer ``recvonly`` or ``inactive``) or, the RFC 2543 way, with
``c=0.0.0.0``, which means "send neither RTP nor RTCP" (``remote_rtp`` is None). In all
three :attr:`Negotiated.on_hold` is True and the caller stops sending audio; a later
re-offer with ``a=sendrecv`` and a real address resumes it. A stream a re-offer disables
with port 0 is not a hold: if no other audio stream is left, :func:`negotiate` raises
:class:`SdpNotAcceptable` and the session in place stays as it is.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from telephony.limits import excerpt

__all__ = [
    "DIRECTIONS",
    "DTMF_EVENTS",
    "MAX_FORMATS",
    "MAX_MEDIA_SECTIONS",
    "MAX_SDP_BYTES",
    "PTIME_MS",
    "STATIC_PAYLOAD_TYPES",
    "Attribute",
    "Codec",
    "MediaSection",
    "Negotiated",
    "SdpError",
    "SdpErrorCode",
    "SdpNotAcceptable",
    "SessionDescription",
    "build_answer",
    "build_offer",
    "is_hold",
    "negotiate",
    "parse_sdp",
]

#: The largest description accepted, in bytes (UTF-8). A SIP INVITE over UDP is expected
#: to fit a datagram (RFC 3261 18.1.1); real offers are well under 2 KiB.
MAX_SDP_BYTES: Final = 16 * 1024
#: The most ``m=`` lines accepted (an audio call needs one; WebRTC bundles reach a dozen).
MAX_MEDIA_SECTIONS: Final = 16
#: The most formats on one ``m=`` line (a browser's video line lists about 40).
MAX_FORMATS: Final = 64
#: Our packetization: we always send, and ask to receive, 20 ms packets (RFC 4566 6 ptime).
PTIME_MS: Final = 20
#: The telephone-events we receive: the 16 DTMF events (RFC 4733 3.2), as an fmtp list.
DTMF_EVENTS: Final = "0-15"

#: RFC 3551 6, table 4: the static payload types we speak, usable without ``a=rtpmap``.
STATIC_PAYLOAD_TYPES: Final[Mapping[int, str]] = {0: "PCMU", 8: "PCMA"}
_CODEC_PAYLOAD_TYPES: Final[Mapping[str, int]] = {"PCMU": 0, "PCMA": 8}
_CLOCK_RATE: Final = 8000  # RFC 3551 6: PCMU and PCMA are 8,000 Hz, mono
_DTMF_ENCODING: Final = "telephone-event"  # RFC 4733 2.4.1, rate 8000 for narrowband
_DYNAMIC_PAYLOAD_TYPES: Final = range(96, 128)  # RFC 3551 3

#: RFC 4566 6 / RFC 3264 5.1: the four direction attributes; none means ``sendrecv``.
DIRECTIONS: Final = ("sendrecv", "sendonly", "recvonly", "inactive")
# RFC 3264 6.1: what we answer to each offered direction.
_ANSWER_DIRECTION: Final[Mapping[str, str]] = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
_SENDING: Final = frozenset({"sendrecv", "sendonly"})  # local directions in which we send

Attribute: TypeAlias = tuple[str, str | None]  # an a= line: (name, value or None)

# RFC 4566 9: token-char = %x21 / %x23-27 / %x2A-2B / %x2D-2E / %x30-39 / %x41-5A / %x5E-7E
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z{|}~]+")
_MAX_ORIGIN_DIGITS: Final = 32  # sess-id/sess-version = 1*DIGIT; bounds int() (RFC 4566 9)
_MAX_RATE_DIGITS: Final = 10  # an rtpmap clock rate


class SdpErrorCode(enum.StrEnum):
    """Machine-readable codes carried by :class:`SdpError` and :class:`SdpNotAcceptable`."""

    # Malformed (SdpError, status 400)
    TOO_LARGE = "too_large"  # over MAX_SDP_BYTES
    BAD_LINE = "bad_line"  # not "<letter>=<value>", a NUL or bare CR, an empty line
    BAD_ORDER = "bad_order"  # v=, o=, s= missing, out of order or repeated (RFC 4566 5)
    BAD_VERSION = "bad_version"  # v= other than 0 (RFC 4566 5.1)
    BAD_ORIGIN = "bad_origin"  # o= without its six fields (RFC 4566 5.2)
    BAD_CONNECTION = "bad_connection"  # c= malformed or contradicting its addrtype (5.7)
    MISSING_CONNECTION = "missing_connection"  # the audio stream has no c= at all (5.7)
    BAD_MEDIA = "bad_media"  # m= malformed: fields, port, formats (RFC 4566 5.14)
    TOO_MANY_MEDIA = "too_many_media"  # over MAX_MEDIA_SECTIONS
    TOO_MANY_FORMATS = "too_many_formats"  # over MAX_FORMATS on one m= line
    BAD_ATTRIBUTE = "bad_attribute"  # a= malformed, or conflicting directions (5.13, 6)
    # Not acceptable (SdpNotAcceptable, status 488)
    NO_AUDIO = "no_audio"  # no audio m= line with a non-zero port
    SRTP_NOT_SUPPORTED = "srtp_not_supported"  # audio only as RTP/SAVP(F) (RFC 3711)
    UNSUPPORTED_TRANSPORT = "unsupported_transport"  # audio only over another transport
    NO_COMMON_CODEC = "no_common_codec"  # neither PCMU nor PCMA (as supported) offered
    UNSUPPORTED_ADDRESS = "unsupported_address"  # a host name or multicast group in c=


class SdpError(Exception):
    """The peer's description is malformed: answer 400 (``status``).

    ``code`` for machines, ``message`` for the log.
    """

    #: The SIP status a UAS answers the offer with (RFC 3261 21.4.1, 400 Bad Request).
    status: int = 400

    def __init__(self, code: SdpErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SdpNotAcceptable(SdpError):
    """The description is well formed but offers nothing we can use: answer 488."""

    #: RFC 3261 21.4.26, 488 Not Acceptable Here.
    status: int = 488


def _fail(code: SdpErrorCode, message: str) -> SdpError:
    return SdpError(code, message)


def _refuse(code: SdpErrorCode, message: str) -> SdpNotAcceptable:
    return SdpNotAcceptable(code, message)


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Codec:
    """The audio codec of a call: ``PCMU`` or ``PCMA`` on the offer's payload type."""

    name: str
    payload_type: int
    clock_rate: int = _CLOCK_RATE


@dataclass(frozen=True, slots=True)
class MediaSection:
    """One ``m=`` line and the lines under it (RFC 4566 5.14).

    ``connection`` is the address of the section's first ``c=`` line, else the
    session-level one (RFC 4566 5.7), without any multicast ``/ttl`` suffix; None when
    there is neither. ``attributes`` are the section's ``a=`` lines in order, as
    ``(name, value)``, value None for a property attribute such as ``a=sendonly``
    (RFC 4566 5.13). ``session_direction`` is the session-level direction attribute,
    which a section without its own inherits (RFC 3264 5.1).
    """

    media: str
    port: int
    proto: str
    formats: tuple[str, ...]
    connection: str | None
    attributes: tuple[Attribute, ...]
    session_direction: str = "sendrecv"
    # Built from ``attributes`` once (a peer may send thousands of lines): payload type
    # -> (encoding, rate, channels); format -> fmtp parameters; the section's direction.
    _rtpmaps: dict[int, tuple[str, int, int]] = field(
        init=False, repr=False, compare=False, hash=False
    )
    _fmtps: dict[str, str] = field(init=False, repr=False, compare=False, hash=False)
    _direction: str | None = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        rtpmaps: dict[int, tuple[str, int, int]] = {}
        fmtps: dict[str, str] = {}
        direction: str | None = None
        for name, value in self.attributes:
            if name == "rtpmap" and value is not None:
                parsed = _parse_rtpmap(value)
                if parsed is not None:
                    rtpmaps.setdefault(parsed[0], parsed[1])  # the first one counts
            elif name == "fmtp" and value is not None:
                fmt, _, params = value.strip().partition(" ")
                fmtps.setdefault(fmt, params.strip())
            elif name in _ANSWER_DIRECTION and direction is None:
                direction = name
        object.__setattr__(self, "_rtpmaps", rtpmaps)
        object.__setattr__(self, "_fmtps", fmtps)
        object.__setattr__(self, "_direction", direction)

    def rtpmap(self, pt: int | str) -> tuple[str, int, int] | None:
        """``a=rtpmap:<pt>`` as ``(encoding name, clock rate, channels)``, channels 1 when
        not given (RFC 4566 6); None when the section has none for ``pt``."""
        number = pt if isinstance(pt, int) else _payload_type(pt)
        return None if number is None else self._rtpmaps.get(number)

    def fmtp(self, pt: int | str) -> str | None:
        """The parameters of ``a=fmtp:<pt>`` (RFC 4566 6), None when there is none."""
        return self._fmtps.get(str(pt))

    @property
    def direction(self) -> str:
        """``sendrecv``, ``sendonly``, ``recvonly`` or ``inactive``: the section's own
        direction attribute, else the session-level one, else ``sendrecv`` (RFC 3264 5.1,
        RFC 4566 6)."""
        return self._direction if self._direction is not None else self.session_direction

    @property
    def ptime(self) -> int | None:
        """``a=ptime`` in milliseconds (RFC 4566 6); None when absent or not an integer."""
        for name, value in self.attributes:
            if name == "ptime" and value is not None:
                text = value.strip()
                if text.isascii() and text.isdigit() and len(text) <= 6:
                    return int(text)
                return None
        return None

    @property
    def is_rtp(self) -> bool:
        """Whether the transport is an RTP profile, whose formats are payload types."""
        return "RTP/" in self.proto.upper()


@dataclass(frozen=True, slots=True)
class SessionDescription:
    """A parsed description. ``username`` .. ``address`` are the ``o=`` fields (RFC 4566
    5.2: ``address`` is the origin's unicast-address, not where media goes);
    ``connection`` is the session-level ``c=`` address or None; ``attributes`` the
    session-level ``a=`` lines; ``media`` the ``m=`` sections in order."""

    username: str
    session_id: int
    session_version: int
    nettype: str
    addrtype: str
    address: str
    session_name: str
    connection: str | None
    attributes: tuple[Attribute, ...]
    media: tuple[MediaSection, ...]

    @property
    def direction(self) -> str:
        """The session-level direction attribute, ``sendrecv`` when there is none."""
        return _direction_of(self.attributes) or "sendrecv"


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What :func:`negotiate` decided for one offer.

    ``remote_rtp`` is None when the offer's address is ``0.0.0.0`` (or ``::``): send
    neither RTP nor RTCP (RFC 3264 8.4). ``on_hold`` is True when we must not send audio:
    the peer offered ``sendonly`` or ``inactive`` (or ``remote_rtp`` is None).
    ``remote_rtcp`` is where RTCP goes: the offer's ``a=rtcp`` (RFC 3605) or the RTP port
    plus one (RFC 3550 11; None past 65535, or with ``remote_rtp``); we never accept
    ``a=rtcp-mux`` (RFC 5761 5.1.1).
    """

    codec: Codec
    dtmf_payload_type: int | None
    remote_rtp: tuple[str, int] | None
    local_direction: str
    ptime: int
    audio_index: int
    on_hold: bool
    remote_rtcp: tuple[str, int] | None = None


# --------------------------------------------------------------------------- parsing


def parse_sdp(data: bytes | str) -> SessionDescription:
    """Parse a session description (RFC 4566 5).

    ``v=``, ``o=`` and ``s=`` must come first, in that order; after them, lines before
    the first ``m=`` are session-level and the rest belong to the ``m=`` above them. Of
    the other types only ``c=``, ``m=`` and ``a=`` are read; the rest (``t=``, ``b=``,
    ``i=``, ...) and unknown type letters are ignored. Raises :class:`SdpError` (400).
    """
    lines = _lines(_text(data))
    if len(lines) < 3 or [line[0] for line in lines[:3]] != ["v", "o", "s"]:
        got = "".join(line[0] for line in lines[:3])
        raise _fail(SdpErrorCode.BAD_ORDER, f"must begin v=, o=, s= (RFC 4566 5), got {got!r}")
    # RFC 4566 5.1: "v=0"; there is no other version.
    if lines[0][2:] != "0":
        raise _fail(SdpErrorCode.BAD_VERSION, f"v={excerpt(lines[0][2:])}, need v=0")
    origin = _parse_origin(lines[1][2:])
    session_name = lines[2][2:]  # RFC 4566 5.3: free text, "s=-" or "s= " when unnamed

    session_connection: str | None = None
    session_attributes: list[Attribute] = []
    # Each section: [m= fields, its first c= address, its attributes]
    sections: list[tuple[tuple[str, int, str, tuple[str, ...]], list[str], list[Attribute]]] = []
    for number, line in enumerate(lines[3:], start=4):
        kind, value = line[0], line[2:]
        if kind in "vos":
            raise _fail(SdpErrorCode.BAD_ORDER, f"line {number}: a second {kind}= line")
        if kind == "m":
            if len(sections) == MAX_MEDIA_SECTIONS:
                raise _fail(SdpErrorCode.TOO_MANY_MEDIA, f"more than {MAX_MEDIA_SECTIONS} m= lines")
            sections.append((_parse_media(value, number), [], []))
        elif kind == "c":
            address = _parse_connection(value, number)
            if sections:
                sections[-1][1].append(address)  # several for layered multicast; first used
            elif session_connection is None:
                session_connection = address
            else:
                # RFC 4566 9: session-description has at most one connection-field
                raise _fail(SdpErrorCode.BAD_CONNECTION, f"line {number}: a second c= line")
        elif kind == "a":
            attribute = _parse_attribute(value, number)
            (sections[-1][2] if sections else session_attributes).append(attribute)
        # RFC 4566 5 says an unknown type letter makes a parser ignore the whole
        # description; like most SIP stacks we ignore just the line. Known letters that
        # an offer/answer over SIP does not use (t= r= z= b= i= u= e= p= k=) likewise.

    session_direction = _direction_of(session_attributes, where="session") or "sendrecv"
    media = []
    for (kind, port, proto, formats), connections, attributes in sections:
        _direction_of(attributes, where=f"m={kind}")  # conflicts are errors
        media.append(
            MediaSection(
                media=kind,
                port=port,
                proto=proto,
                formats=formats,
                connection=connections[0] if connections else session_connection,
                attributes=tuple(attributes),
                session_direction=session_direction,
            )
        )
    return SessionDescription(
        username=origin[0],
        session_id=origin[1],
        session_version=origin[2],
        nettype=origin[3],
        addrtype=origin[4],
        address=origin[5],
        session_name=session_name,
        connection=session_connection,
        attributes=tuple(session_attributes),
        media=tuple(media),
    )


def _text(data: bytes | str) -> str:
    """The description as text, its size checked before any other work."""
    if isinstance(data, str):
        size = len(data)
        if size <= MAX_SDP_BYTES and not data.isascii():
            size = len(data.encode("utf-8", "surrogatepass"))
        text = data
    else:
        size = len(data)
        # RFC 4566 5: text is UTF-8 unless a=charset says otherwise. We read only ASCII
        # fields (numbers, tokens, addresses), so a free-text field in another character
        # set (s=, i=) is decoded with replacement characters rather than refused.
        text = data.decode("utf-8", "replace") if size <= MAX_SDP_BYTES else ""
    if size > MAX_SDP_BYTES:
        raise _fail(SdpErrorCode.TOO_LARGE, f"more than the limit of {MAX_SDP_BYTES} bytes")
    return text


def _lines(text: str) -> list[str]:
    """The lines of ``text``: CRLF or LF ends (RFC 4566 5: parsers "SHOULD be tolerant
    and also accept records terminated with a single newline character"), trailing
    spaces and tabs dropped, empty lines at the end ignored; each is ``<letter>=...``."""
    if "\x00" in text:
        # RFC 4566 9: text = byte-string, which excludes NUL, CR and LF
        raise _fail(SdpErrorCode.BAD_LINE, "a NUL character")
    lines = [line.rstrip("\r").rstrip(" \t") for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    for number, line in enumerate(lines, start=1):
        # RFC 4566 5: "<type>=<value>", type exactly one case-significant character
        if len(line) < 2 or line[1] != "=" or not (line[0].isascii() and line[0].isalpha()):
            raise _fail(SdpErrorCode.BAD_LINE, f"line {number} {excerpt(line)} is not x=...")
        if "\r" in line:
            raise _fail(SdpErrorCode.BAD_LINE, f"line {number}: a CR not followed by LF")
    return lines


def _parse_origin(value: str) -> tuple[str, int, int, str, str, str]:
    # RFC 4566 5.2: o=<username> <sess-id> <sess-version> <nettype> <addrtype>
    #                 <unicast-address>; sess-id and sess-version are 1*DIGIT (9)
    fields = value.split()
    if len(fields) != 6:
        raise _fail(SdpErrorCode.BAD_ORIGIN, f"o={excerpt(value)} does not have 6 fields")
    for number in fields[1:3]:
        if not (number.isascii() and number.isdigit() and len(number) <= _MAX_ORIGIN_DIGITS):
            raise _fail(SdpErrorCode.BAD_ORIGIN, f"o= {excerpt(number)} is not a number")
    return fields[0], int(fields[1]), int(fields[2]), fields[3], fields[4], fields[5]


def _parse_connection(value: str, number: int) -> str:
    # RFC 4566 5.7: c=<nettype> <addrtype> <connection-address>; nettype "IN", addrtype
    # "IP4" or "IP6"; a multicast address carries /<ttl>[/<count>] (IP4) or /<count>.
    fields = value.split()
    if len(fields) != 3 or fields[0] != "IN" or fields[1] not in ("IP4", "IP6"):
        raise _fail(
            SdpErrorCode.BAD_CONNECTION,
            f"line {number}: c={excerpt(value)} is not 'IN IP4|IP6 <address>'",
        )
    address = fields[2].split("/", 1)[0]
    if not address:
        raise _fail(SdpErrorCode.BAD_CONNECTION, f"line {number}: c= has no address")
    ip = _ip(address)
    if ip is not None and f"IP{ip.version}" != fields[1]:
        raise _fail(
            SdpErrorCode.BAD_CONNECTION,
            f"line {number}: {excerpt(address)} is not an {fields[1]} address",
        )
    return address  # a literal or, which the grammar allows, a host name


def _parse_media(value: str, number: int) -> tuple[str, int, str, tuple[str, ...]]:
    # RFC 4566 5.14: m=<media> <port>[/<number of ports>] <proto> <fmt> ...
    fields = value.split()
    if len(fields) < 4:
        raise _fail(
            SdpErrorCode.BAD_MEDIA,
            f"line {number}: m={excerpt(value)} needs media, port, proto and a format",
        )
    media, port_text, proto = fields[:3]
    formats = tuple(fields[3:])
    if len(formats) > MAX_FORMATS:
        raise _fail(
            SdpErrorCode.TOO_MANY_FORMATS,
            f"line {number}: {len(formats)} formats, limit {MAX_FORMATS}",
        )
    port_part, slash, count = port_text.partition("/")
    port = _decimal(port_part, 5)
    if port is None or port > 65535 or (slash and not _decimal(count, 5)):
        raise _fail(
            SdpErrorCode.BAD_MEDIA, f"line {number}: port {excerpt(port_text)} is not 0-65535"
        )
    # RFC 4566 9: media = token, proto = token *("/" token), fmt = token
    if not _TOKEN.fullmatch(media) or not all(_TOKEN.fullmatch(p) for p in proto.split("/")):
        raise _fail(SdpErrorCode.BAD_MEDIA, f"line {number}: m={excerpt(value)}")
    rtp = "RTP/" in proto.upper()
    for fmt in formats:
        # RFC 4566 5.14: for an RTP profile the formats are RTP payload types (0-127)
        if not _TOKEN.fullmatch(fmt) or (rtp and _payload_type(fmt) is None):
            raise _fail(SdpErrorCode.BAD_MEDIA, f"line {number}: format {excerpt(fmt)} on {proto}")
    return media, port, proto, formats


def _parse_attribute(value: str, number: int) -> Attribute:
    # RFC 4566 5.13: a=<attribute> or a=<attribute>:<value>; att-field = token (9)
    name, colon, rest = value.partition(":")
    if not _TOKEN.fullmatch(name):
        raise _fail(SdpErrorCode.BAD_ATTRIBUTE, f"line {number}: a={excerpt(value)}")
    if name == "rtpmap" and _parse_rtpmap(rest) is None:
        raise _fail(
            SdpErrorCode.BAD_ATTRIBUTE,
            f"line {number}: a=rtpmap:{excerpt(rest)} is not '<pt> <name>/<rate>[/<n>]'",
        )
    return name, rest if colon else None


def _parse_rtpmap(value: str) -> tuple[int, tuple[str, int, int]] | None:
    # RFC 4566 6: a=rtpmap:<payload type> <encoding name>/<clock rate>[/<encoding params>];
    # for audio the parameters are the number of channels, 1 when absent.
    pt_text, _, rest = value.strip().partition(" ")
    pt = _payload_type(pt_text)
    parts = rest.strip().split("/")
    if pt is None or len(parts) not in (2, 3) or not _TOKEN.fullmatch(parts[0]):
        return None
    rate = _decimal(parts[1], _MAX_RATE_DIGITS)
    channels = _decimal(parts[2], 3) if len(parts) == 3 else 1
    if not rate or not channels:
        return None
    return pt, (parts[0], rate, channels)


def _payload_type(text: str) -> int | None:
    """An RTP payload type, 0-127 (RFC 3550 5.1: seven bits), or None."""
    value = _decimal(text, 3)
    return value if value is not None and value <= 127 else None


def _decimal(text: str, digits: int) -> int | None:
    """``text`` as a non-negative integer of at most ``digits`` ASCII digits, or None."""
    if text.isascii() and text.isdigit() and len(text) <= digits:
        return int(text)
    return None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _direction_of(attributes: Sequence[Attribute], *, where: str = "") -> str | None:
    """The direction attribute among ``attributes`` (RFC 3264 5.1), None when there is
    none; two different ones contradict each other and are an error."""
    found = {name for name, _ in attributes if name in _ANSWER_DIRECTION}
    if len(found) > 1:
        raise _fail(
            SdpErrorCode.BAD_ATTRIBUTE,
            f"{where}: conflicting direction attributes {', '.join(sorted(found))}",
        )
    return found.pop() if found else None


# --------------------------------------------------------------------------- offer/answer


def negotiate(
    offer: bytes | str | SessionDescription, *, supported: Sequence[str] = ("PCMU", "PCMA")
) -> Negotiated:
    """Decide how to answer ``offer`` (RFC 3264 6).

    The accepted stream is the first ``audio`` ``m=`` line with a non-zero port, the
    ``RTP/AVP`` profile and a format we support; its codec is the first of its formats,
    in the offer's order, that is in ``supported``: payload type 0 (PCMU) or 8 (PCMA)
    with or without ``a=rtpmap`` (RFC 3551 6), any other by its ``a=rtpmap`` name (case
    does not matter) at 8,000 Hz, mono. ``telephone-event/8000`` among that line's formats
    gives :attr:`Negotiated.dtmf_payload_type` (RFC 4733 2.4.1).

    Raises :class:`SdpError` if the offer is malformed and :class:`SdpNotAcceptable` if
    nothing in it is usable: no audio, audio only over SRTP (``RTP/SAVP``, ``RTP/SAVPF``:
    we do not do SRTP) or another transport, no common codec, or a host name or multicast
    group as the stream's address. Raises :class:`ValueError` if ``supported`` names a
    codec other than PCMU and PCMA, or none.
    """
    wanted = _supported(supported)
    sdp = offer if isinstance(offer, SessionDescription) else parse_sdp(offer)
    seen_srtp = seen_other = False
    offered: list[str] = []  # what the RTP/AVP audio lines offered, for the message
    for index, media in enumerate(sdp.media):
        if media.media != "audio" or media.port == 0:
            continue  # RFC 3264 6: port 0 is a stream the offerer disabled
        proto = media.proto.upper()
        if proto != "RTP/AVP":
            # RFC 3711 12 (RTP/SAVP), RFC 5124 (RTP/SAVPF), RFC 5764 (UDP/TLS/RTP/SAVP...)
            seen_srtp = seen_srtp or "SAVP" in proto
            seen_other = seen_other or "SAVP" not in proto
            continue
        codec = _choose_codec(media, wanted)
        if codec is not None:
            return _accept(index, media, codec)
        offered.extend(_format_name(media, fmt) for fmt in media.formats)
    if offered:
        listed = excerpt(" ".join(offered))
        raise _refuse(
            SdpErrorCode.NO_COMMON_CODEC,
            f"audio offered as {listed}; we take {'/'.join(sorted(wanted))} at 8000 Hz",
        )
    if seen_srtp:
        raise _refuse(
            SdpErrorCode.SRTP_NOT_SUPPORTED,
            "audio is offered only as SRTP (RTP/SAVP); this gateway does not do SRTP, "
            "offer RTP/AVP",
        )
    if seen_other:
        raise _refuse(SdpErrorCode.UNSUPPORTED_TRANSPORT, "no audio stream over RTP/AVP")
    raise _refuse(SdpErrorCode.NO_AUDIO, "no audio m= line with a non-zero port")


def is_hold(
    offer: bytes | str | SessionDescription, *, supported: Sequence[str] = ("PCMU", "PCMA")
) -> bool:
    """Whether ``offer`` holds the call (:attr:`Negotiated.on_hold`); raises as
    :func:`negotiate` does."""
    return negotiate(offer, supported=supported).on_hold


def _supported(supported: Sequence[str]) -> frozenset[str]:
    if isinstance(supported, str):
        raise ValueError("supported is a sequence of codec names, not one string")
    wanted = frozenset(name.upper() for name in supported)
    if not wanted or not wanted <= _CODEC_PAYLOAD_TYPES.keys():
        raise ValueError(f"supported must name PCMU and/or PCMA, got {list(supported)!r}")
    return wanted


def _choose_codec(media: MediaSection, wanted: frozenset[str]) -> Codec | None:
    """The first of ``media``'s formats, in the offer's order, that we support."""
    for fmt in media.formats:
        pt = _payload_type(fmt)
        if pt is None:
            continue
        rtpmap = media.rtpmap(pt)
        if rtpmap is not None:
            # RFC 4566 6: the rtpmap names the encoding, whatever the number
            name, rate, channels = rtpmap
            name = name.upper()
            if name in wanted and rate == _CLOCK_RATE and channels == 1:
                return Codec(name, pt)
        elif STATIC_PAYLOAD_TYPES.get(pt) in wanted:
            return Codec(STATIC_PAYLOAD_TYPES[pt], pt)  # RFC 3551 6: no rtpmap needed
    return None


def _format_name(media: MediaSection, fmt: str) -> str:
    rtpmap = media.rtpmap(fmt)
    if rtpmap is not None:
        return f"{rtpmap[0]}/{rtpmap[1]}"
    pt = _payload_type(fmt)
    return STATIC_PAYLOAD_TYPES.get(pt, fmt) if pt is not None else fmt


def _accept(index: int, media: MediaSection, codec: Codec) -> Negotiated:
    dtmf = None
    for fmt in media.formats:
        rtpmap = media.rtpmap(fmt)
        # RFC 4733 2.4.1: telephone-event at the 8,000 Hz of our audio (Linphone also
        # offers /16000 and /48000, for wideband codecs)
        if rtpmap is not None and rtpmap[0].lower() == _DTMF_ENCODING and rtpmap[1] == 8000:
            dtmf = _payload_type(fmt)
            break
    remote_rtp, remote_rtcp = _remote(media)
    direction = media.direction
    local = _ANSWER_DIRECTION[direction]  # RFC 3264 6.1
    return Negotiated(
        codec=codec,
        dtmf_payload_type=dtmf,
        remote_rtp=remote_rtp,
        local_direction=local,
        ptime=PTIME_MS,
        audio_index=index,
        on_hold=remote_rtp is None or local not in _SENDING,
        remote_rtcp=remote_rtcp,
    )


def _remote(media: MediaSection) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """Where to send the stream's RTP and RTCP; (None, None) for ``c=0.0.0.0``."""
    if media.connection is None:
        # RFC 4566 5.7: a c= in every media description or one at session level
        raise _fail(SdpErrorCode.MISSING_CONNECTION, f"m={media.media} has no c= line")
    ip = _ip(media.connection)
    if ip is None:
        raise _refuse(
            SdpErrorCode.UNSUPPORTED_ADDRESS,
            f"c= {excerpt(media.connection)} is not an IP address (no DNS here)",
        )
    if ip.is_multicast:
        raise _refuse(
            SdpErrorCode.UNSUPPORTED_ADDRESS, f"c= {excerpt(media.connection)} is multicast"
        )
    if ip.is_unspecified:
        # RFC 3264 8.4: 0.0.0.0 means "neither RTP nor RTCP should be sent to the peer";
        # :: taken the same way for IPv6.
        return None, None
    address = str(ip)
    rtcp = (address, media.port + 1) if media.port < 65535 else None  # RFC 3550 11
    for name, value in media.attributes:
        if name == "rtcp" and value is not None:
            rtcp = _parse_rtcp(value, address)
            break
    return (address, media.port), rtcp


def _parse_rtcp(value: str, address: str) -> tuple[str, int]:
    # RFC 3605 2.1: a=rtcp:<port> [<nettype> <addrtype> <connection-address>]
    fields = value.split()
    port = _decimal(fields[0], 5) if fields else None
    if port is None or not 0 < port <= 65535 or len(fields) not in (1, 4):
        raise _fail(SdpErrorCode.BAD_ATTRIBUTE, f"a=rtcp:{excerpt(value)}")
    if len(fields) == 4:
        ip = _ip(fields[3])
        if ip is not None and not ip.is_unspecified:
            address = str(ip)
    return address, port


# --------------------------------------------------------------------------- building


def build_answer(
    offer: SessionDescription,
    negotiated: Negotiated,
    *,
    address: str,
    port: int,
    session_id: int,
    session_version: int,
    username: str = "-",
) -> bytes:
    """The answer to ``offer`` as :func:`negotiate` decided it (RFC 3264 6), CRLF ends.

    One ``m=`` line per offered one, in the offer's order: the accepted audio stream with
    ``port``, the chosen codec's payload type and, when the offer had one, its
    ``telephone-event`` payload type (``a=fmtp:<pt> 0-15``), then ``a=ptime:20`` and our
    direction; every other stream rejected with port 0 and its first format. One ``c=``
    at session level, ``IP4`` or ``IP6`` by ``address``. No ``a=rtcp-mux``: RTCP goes
    to ``port + 1`` (RFC 3550 11, RFC 5761 5.1.1), so ``port`` should be even.

    The caller keeps ``session_id`` for the dialog and increments ``session_version`` for
    every answer it sends (RFC 3264 5 and 8). Raises :class:`ValueError` on an argument
    that breaks this contract.
    """
    index = negotiated.audio_index
    if not 0 <= index < len(offer.media) or offer.media[index].media != "audio":
        raise ValueError(f"audio_index {index} is not an audio m= line of the offer")
    if negotiated.local_direction not in _ANSWER_DIRECTION:
        raise ValueError(f"local_direction {negotiated.local_direction!r}")
    _check_payload_type(negotiated.codec.payload_type, "codec payload type")
    if negotiated.codec.name not in _CODEC_PAYLOAD_TYPES:
        raise ValueError(f"codec {negotiated.codec.name!r} is not PCMU or PCMA")
    lines = _session_lines(address, port, session_id, session_version, username)
    for number, media in enumerate(offer.media):
        if number == index:
            lines += _audio_lines(
                port,
                media.proto,
                (negotiated.codec,),
                negotiated.dtmf_payload_type,
                negotiated.ptime,
                negotiated.local_direction,
            )
        else:
            # RFC 3264 6: "To reject an offered stream, the port number in the
            # corresponding stream in the answer MUST be set to zero. Any media formats
            # listed are ignored. At least one MUST be present"
            lines.append(f"m={media.media} 0 {media.proto} {media.formats[0]}")
    return _encode(lines)


def build_offer(
    *,
    address: str,
    port: int,
    session_id: int,
    session_version: int,
    codecs: Sequence[str] = ("PCMU", "PCMA"),
    dtmf_payload_type: int | None = 101,
    direction: str = "sendrecv",
    username: str = "-",
) -> bytes:
    """An offer of one ``RTP/AVP`` audio stream (RFC 3264 5): ``codecs`` in order of
    preference on their static payload types (RFC 3551 6), ``telephone-event/8000`` on
    ``dtmf_payload_type`` (a dynamic type, 96-127; None for no DTMF), ``a=ptime:20``
    and ``direction`` (``a=sendonly`` to hold the peer, RFC 3264 8.4). CRLF ends.
    Raises :class:`ValueError` on an argument that breaks this contract."""
    if isinstance(codecs, str):
        raise ValueError("codecs is a sequence of codec names, not one string")
    names = [name.upper() for name in codecs]
    if not names or len(set(names)) != len(names) or not set(names) <= _CODEC_PAYLOAD_TYPES.keys():
        raise ValueError(f"codecs must be PCMU and/or PCMA, each once, got {list(codecs)!r}")
    if dtmf_payload_type is not None and dtmf_payload_type not in _DYNAMIC_PAYLOAD_TYPES:
        raise ValueError(f"dtmf_payload_type {dtmf_payload_type} is not 96-127 (RFC 3551 3)")
    if direction not in _ANSWER_DIRECTION:
        raise ValueError(f"direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
    lines = _session_lines(address, port, session_id, session_version, username)
    offered = tuple(Codec(name, _CODEC_PAYLOAD_TYPES[name]) for name in names)
    lines += _audio_lines(port, "RTP/AVP", offered, dtmf_payload_type, PTIME_MS, direction)
    return _encode(lines)


def _session_lines(
    address: str, port: int, session_id: int, session_version: int, username: str
) -> list[str]:
    ip = _ip(address)
    if ip is None or ip.is_unspecified or ip.is_multicast:
        raise ValueError(f"address {address!r} is not a unicast IP address")
    if isinstance(port, bool) or not 0 < port <= 65535:
        raise ValueError(f"port {port} is not 1-65535")
    # RFC 3264 5: session id and version "MUST be representable with a 64 bit signed
    # integer"
    for name, value in (("session_id", session_id), ("session_version", session_version)):
        if isinstance(value, bool) or not 0 <= value < 2**63:
            raise ValueError(f"{name} {value} is not 0..2**63-1")
    # RFC 4566 5.2: "<username> ... MUST NOT contain spaces"; "-" when there is none
    if not _TOKEN.fullmatch(username):
        raise ValueError(f"username {username!r} is not a token")
    addrtype = f"IP{ip.version}"
    return [
        "v=0",  # RFC 4566 5.1
        f"o={username} {session_id} {session_version} IN {addrtype} {ip}",  # 5.2
        "s=-",  # 5.3; RFC 3264 5 recommends a dash for unicast sessions
        f"c=IN {addrtype} {ip}",  # 5.7, session level: covers every m= line
        "t=0 0",  # RFC 3264 5: for SIP-signalled sessions t= "SHOULD have a value of 0 0"
    ]


def _audio_lines(
    port: int,
    proto: str,
    codecs: Sequence[Codec],
    dtmf: int | None,
    ptime: int,
    direction: str,
) -> list[str]:
    formats = [str(codec.payload_type) for codec in codecs]
    if dtmf is not None:
        _check_payload_type(dtmf, "dtmf payload type")
        formats.append(str(dtmf))
    lines = [f"m=audio {port} {proto} {' '.join(formats)}"]  # RFC 4566 5.14
    # RFC 4566 6: rtpmap is optional for static types; written anyway, as most UAs do
    lines += [f"a=rtpmap:{c.payload_type} {c.name}/{c.clock_rate}" for c in codecs]
    if dtmf is not None:
        # RFC 4733 2.4.1: telephone-event/8000 and the events we receive, DTMF 0-15 (3.2)
        lines += [f"a=rtpmap:{dtmf} {_DTMF_ENCODING}/8000", f"a=fmtp:{dtmf} {DTMF_EVENTS}"]
    lines += [f"a=ptime:{ptime}", f"a={direction}"]  # RFC 4566 6; RFC 3264 6.1
    return lines


def _check_payload_type(pt: int, what: str) -> None:
    if isinstance(pt, bool) or not 0 <= pt <= 127:
        raise ValueError(f"{what} {pt} is not 0-127")


def _encode(lines: list[str]) -> bytes:
    # RFC 4566 5: records end with CRLF. Every piece is ASCII: ours, or tokens of the
    # offer's m= line that the parser checked against RFC 4566 9.
    return ("\r\n".join(lines) + "\r\n").encode("ascii")
