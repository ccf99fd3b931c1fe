"""SDP offer/answer core, byte for byte, on offers as real user agents write them.

Offers are the SDP bodies of INVITEs from Asterisk (chan_pjsip), FreeSWITCH (mod_sofia),
baresip, sipp's built-in ``uac_pcap`` scenario (``sipp -sn uac_pcap``, its ``[...]``
keywords filled in), a Polycom phone (session-level ``a=sendrecv``), Linphone (three
``telephone-event`` rates), a softphone offering video before audio, an IPv6 offer, an
offer of static types 0 and 8 without ``a=rtpmap`` (RFC 3551 6), and RFC 3264 10.1's
example (empty ``s=``, host names in ``c=``). Addresses are the documentation ranges
(RFC 5737, RFC 3849); layout, attributes and their order are the agents'. Expected
answers are written out from RFC 3264 6 and RFC 4566 5.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from telephony.sdp import (
    MAX_FORMATS,
    MAX_MEDIA_SECTIONS,
    MAX_SDP_BYTES,
    Codec,
    MediaSection,
    Negotiated,
    SdpError,
    SdpErrorCode,
    SdpNotAcceptable,
    SessionDescription,
    build_answer,
    build_offer,
    is_hold,
    negotiate,
    parse_sdp,
)
from tests.telephony.fuzzing import FUZZ, assert_loggable, damaged, sdp_addresses, texts


def wire(text: str) -> bytes:
    """An SDP body as it travels: CRLF line ends (RFC 4566 5)."""
    return text.replace("\n", "\r\n").encode()


ASTERISK = wire("""v=0
o=- 1948196556 1948196556 IN IP4 192.0.2.10
s=Asterisk
c=IN IP4 192.0.2.10
t=0 0
m=audio 17290 RTP/AVP 0 8 3 101
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:3 GSM/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-16
a=ptime:20
a=maxptime:150
a=sendrecv
""")

OPUS_FMTP = (
    "useinbandfec=1; maxaveragebitrate=30000; maxplaybackrate=48000; ptime=20; minptime=10;"
    " maxptime=40"
)
FREESWITCH = wire(f"""v=0
o=FreeSWITCH 1700031839 1700031840 IN IP4 198.51.100.7
s=FreeSWITCH
c=IN IP4 198.51.100.7
t=0 0
m=audio 21464 RTP/AVP 102 9 0 8 101 13
a=rtpmap:102 opus/48000/2
a=fmtp:102 {OPUS_FMTP}
a=rtpmap:9 G722/8000
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-16
a=rtpmap:13 CN/8000
a=ptime:20
a=sendrecv
a=rtcp:21465 IN IP4 198.51.100.7
""")

BARESIP = wire("""v=0
o=- 1916713283 1423468171 IN IP4 192.0.2.33
s=-
c=IN IP4 192.0.2.33
t=0 0
m=audio 10306 RTP/AVP 96 9 0 8 101
b=AS:96
a=rtpmap:96 opus/48000/2
a=fmtp:96 stereo=1;sprop-stereo=1
a=rtpmap:9 G722/8000
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-15
a=rtcp-mux
a=sendrecv
a=label:1
a=ssrc:3367436217 cname:33a5d1ac-6b0a-4a7f-9d5e-0f1c2b3a4d5e
a=mid:1
""")

# sipp's embedded uac_pcap scenario, [local_ip]=127.0.0.1, [auto_media_port]=6000.
SIPP_UAC_PCAP = wire("""v=0
o=user1 53655765 2353687637 IN IP4 127.0.0.1
s=-
c=IN IP4 127.0.0.1
t=0 0
m=audio 6000 RTP/AVP 8 101
a=rtpmap:8 PCMA/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-11,16
""")

POLYCOM = wire("""v=0
o=- 1700000000 1700000000 IN IP4 192.0.2.80
s=Polycom IP Phone
c=IN IP4 192.0.2.80
t=0 0
a=sendrecv
m=audio 2222 RTP/AVP 9 102 0 8 18 127
a=rtpmap:9 G722/8000
a=rtpmap:102 G7221/16000
a=fmtp:102 bitrate=32000
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:18 G729/8000
a=fmtp:18 annexb=no
a=rtpmap:127 telephone-event/8000
""")

LINPHONE = wire("""v=0
o=alice 3393 2838 IN IP4 192.0.2.12
s=Talk
c=IN IP4 192.0.2.12
t=0 0
a=rtcp-xr:rcvr-rtt=all:10000 stat-summary=loss,dup,jitt,TTL voip-metrics
m=audio 7078 RTP/AVP 96 97 98 0 8 18 101 99 100
a=rtpmap:96 opus/48000/2
a=fmtp:96 useinbandfec=1
a=rtpmap:97 speex/16000
a=fmtp:97 vbr=on
a=rtpmap:98 speex/8000
a=fmtp:98 vbr=on
a=fmtp:18 annexb=yes
a=rtpmap:101 telephone-event/48000
a=rtpmap:99 telephone-event/16000
a=rtpmap:100 telephone-event/8000
a=rtcp-fb:* trr-int 1000
a=rtcp-fb:* ccm tmmbr
""")

VIDEO_AUDIO = wire("""v=0
o=- 20518 0 IN IP4 203.0.113.5
s=-
c=IN IP4 203.0.113.5
t=0 0
m=video 54402 RTP/AVP 97 98
a=rtpmap:97 H264/90000
a=fmtp:97 profile-level-id=42e01f;packetization-mode=1
a=rtpmap:98 VP8/90000
a=sendrecv
m=audio 54400 RTP/AVP 8 0 96
a=rtpmap:96 telephone-event/8000
a=fmtp:96 0-15
a=sendrecv
""")

IPV6 = wire("""v=0
o=- 3866477013 3866477013 IN IP6 2001:db8::5
s=-
c=IN IP6 2001:db8::5
t=0 0
m=audio 20000 RTP/AVP 0 101
a=rtpmap:0 PCMU/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-15
a=ptime:20
a=sendrecv
""")

# RFC 3551 6: static types need no a=rtpmap.
STATIC_NO_RTPMAP = wire("""v=0
o=- 2890844526 2890844526 IN IP4 192.0.2.1
s=-
c=IN IP4 192.0.2.1
t=0 0
m=audio 49170 RTP/AVP 8 0
""")

# RFC 3264 10.1, Alice's offer (her s= has no value).
RFC3264_ALICE = wire("""v=0
o=alice 2890844526 2890844526 IN IP4 host.atlanta.example.com
s=
c=IN IP4 host.atlanta.example.com
t=0 0
m=audio 49170 RTP/AVP 0 8 97
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=rtpmap:97 iLBC/8000
m=video 51372 RTP/AVP 31 32
a=rtpmap:31 H261/90000
a=rtpmap:32 MPV/90000
""")

OFFERS = {
    "asterisk": ASTERISK,
    "freeswitch": FREESWITCH,
    "baresip": BARESIP,
    "sipp_uac_pcap": SIPP_UAC_PCAP,
    "polycom": POLYCOM,
    "linphone": LINPHONE,
    "video_audio": VIDEO_AUDIO,
    "ipv6": IPV6,
    "static_no_rtpmap": STATIC_NO_RTPMAP,
    "rfc3264_alice": RFC3264_ALICE,
}
USABLE = {name: offer for name, offer in OFFERS.items() if name != "rfc3264_alice"}


def audio_offer(formats: str, *lines: str, c: str = "c=IN IP4 192.0.2.1", head: str = "") -> str:
    """A minimal offer: one audio line with ``formats`` and ``lines`` under it."""
    body = ["v=0", "o=- 1 1 IN IP4 192.0.2.1", "s=-", c, "t=0 0"]
    body += [head] if head else []
    body += [f"m=audio 4000 RTP/AVP {formats}", *lines]
    return "\r\n".join(line for line in body if line) + "\r\n"


def answer(offer: bytes | str, **kwargs: int | str) -> bytes:
    args: dict[str, int | str] = dict(
        address="192.0.2.50", port=40000, session_id=1234, session_version=1
    )
    args.update(kwargs)
    return build_answer(
        parse_sdp(offer),
        negotiate(offer),
        address=str(args["address"]),
        port=int(args["port"]),
        session_id=int(args["session_id"]),
        session_version=int(args["session_version"]),
    )


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Parsed:
    username: str
    session_id: int
    session_version: int
    session_name: str
    connection: str | None
    media: tuple[tuple[str, int, str, tuple[str, ...]], ...]


PARSED = {
    "asterisk": Parsed(
        "-",
        1948196556,
        1948196556,
        "Asterisk",
        "192.0.2.10",
        (("audio", 17290, "RTP/AVP", ("0", "8", "3", "101")),),
    ),
    "freeswitch": Parsed(
        "FreeSWITCH",
        1700031839,
        1700031840,
        "FreeSWITCH",
        "198.51.100.7",
        (("audio", 21464, "RTP/AVP", ("102", "9", "0", "8", "101", "13")),),
    ),
    "baresip": Parsed(
        "-",
        1916713283,
        1423468171,
        "-",
        "192.0.2.33",
        (("audio", 10306, "RTP/AVP", ("96", "9", "0", "8", "101")),),
    ),
    "sipp_uac_pcap": Parsed(
        "user1",
        53655765,
        2353687637,
        "-",
        "127.0.0.1",
        (("audio", 6000, "RTP/AVP", ("8", "101")),),
    ),
    "polycom": Parsed(
        "-",
        1700000000,
        1700000000,
        "Polycom IP Phone",
        "192.0.2.80",
        (("audio", 2222, "RTP/AVP", ("9", "102", "0", "8", "18", "127")),),
    ),
    "linphone": Parsed(
        "alice",
        3393,
        2838,
        "Talk",
        "192.0.2.12",
        (("audio", 7078, "RTP/AVP", ("96", "97", "98", "0", "8", "18", "101", "99", "100")),),
    ),
    "video_audio": Parsed(
        "-",
        20518,
        0,
        "-",
        "203.0.113.5",
        (
            ("video", 54402, "RTP/AVP", ("97", "98")),
            ("audio", 54400, "RTP/AVP", ("8", "0", "96")),
        ),
    ),
    "ipv6": Parsed(
        "-",
        3866477013,
        3866477013,
        "-",
        "2001:db8::5",
        (("audio", 20000, "RTP/AVP", ("0", "101")),),
    ),
    "static_no_rtpmap": Parsed(
        "-", 2890844526, 2890844526, "-", "192.0.2.1", (("audio", 49170, "RTP/AVP", ("8", "0")),)
    ),
    "rfc3264_alice": Parsed(
        "alice",
        2890844526,
        2890844526,
        "",
        "host.atlanta.example.com",
        (
            ("audio", 49170, "RTP/AVP", ("0", "8", "97")),
            ("video", 51372, "RTP/AVP", ("31", "32")),
        ),
    ),
}


@pytest.mark.parametrize("name", list(OFFERS))
def test_parse_real_offers(name: str) -> None:
    sdp = parse_sdp(OFFERS[name])
    got = Parsed(
        sdp.username,
        sdp.session_id,
        sdp.session_version,
        sdp.session_name,
        sdp.connection,
        tuple((m.media, m.port, m.proto, m.formats) for m in sdp.media),
    )
    assert got == PARSED[name]
    assert sdp.nettype == "IN"
    assert all(m.connection == sdp.connection for m in sdp.media)  # session-level c= only
    assert all(m.direction == "sendrecv" for m in sdp.media)


@pytest.mark.parametrize("name", list(OFFERS))
def test_lf_only_and_str_parse_as_crlf_bytes(name: str) -> None:
    crlf = OFFERS[name]
    lf = crlf.replace(b"\r\n", b"\n")
    assert b"\r" not in lf
    assert parse_sdp(lf) == parse_sdp(crlf) == parse_sdp(crlf.decode()) == parse_sdp(lf.decode())


def test_parse_attributes_in_order_session_and_media() -> None:
    linphone = parse_sdp(LINPHONE)
    assert linphone.attributes == (
        ("rtcp-xr", "rcvr-rtt=all:10000 stat-summary=loss,dup,jitt,TTL voip-metrics"),
    )
    polycom = parse_sdp(POLYCOM)
    assert polycom.attributes == (("sendrecv", None),)
    assert polycom.direction == "sendrecv"
    assert [name for name, _ in parse_sdp(BARESIP).media[0].attributes] == [
        "rtpmap",
        "fmtp",
        "rtpmap",
        "rtpmap",
        "rtpmap",
        "rtpmap",
        "fmtp",
        "rtcp-mux",
        "sendrecv",
        "label",
        "ssrc",
        "mid",
    ]


@pytest.mark.parametrize(
    ("pt", "rtpmap", "fmtp"),
    [
        (
            102,
            ("opus", 48000, 2),
            "useinbandfec=1; maxaveragebitrate=30000; maxplaybackrate=48000;"
            " ptime=20; minptime=10; maxptime=40",
        ),
        ("9", ("G722", 8000, 1), None),
        (0, ("PCMU", 8000, 1), None),
        (101, ("telephone-event", 8000, 1), "0-16"),
        (13, ("CN", 8000, 1), None),
        (18, None, None),  # not offered
        ("x", None, None),
    ],
)
def test_media_section_rtpmap_and_fmtp(
    pt: int | str, rtpmap: tuple[str, int, int] | None, fmtp: str | None
) -> None:
    audio = parse_sdp(FREESWITCH).media[0]
    assert audio.rtpmap(pt) == rtpmap
    assert audio.fmtp(pt) == fmtp


@pytest.mark.parametrize(
    ("offer", "ptime"),
    [
        (ASTERISK, 20),
        (SIPP_UAC_PCAP, None),
        (audio_offer("0", "a=ptime:30"), 30),
        (audio_offer("0", "a=ptime:20.5"), None),
    ],
)
def test_media_section_ptime(offer: bytes | str, ptime: int | None) -> None:
    assert parse_sdp(offer).media[0].ptime == ptime


FIELDS = ("media", "port", "proto", "formats", "connection", "attributes", "session_direction")


def test_media_section_built_directly() -> None:
    section = MediaSection(
        media="audio",
        port=5004,
        proto="RTP/AVP",
        formats=("96", "101"),
        connection="192.0.2.9",
        attributes=(
            ("rtpmap", "96 PCMA/8000"),
            ("rtpmap", "101 telephone-event/8000"),
            ("inactive", None),
        ),
    )
    assert section.rtpmap(96) == ("PCMA", 8000, 1)
    assert section.direction == "inactive"
    assert section == MediaSection(
        "audio", 5004, "RTP/AVP", ("96", "101"), "192.0.2.9", section.attributes
    )
    assert hash(section) == hash(MediaSection(**{k: getattr(section, k) for k in FIELDS}))
    sdp = SessionDescription("-", 1, 1, "IN", "IP4", "192.0.2.9", "-", None, (), (section,))
    got = negotiate(sdp)
    assert (got.codec, got.dtmf_payload_type, got.on_hold) == (Codec("PCMA", 96), 101, True)


@pytest.mark.parametrize(
    "extra",
    [
        "x=unknown type letter",
        "b=AS:64",
        "i=session information",
        "u=http://www.example.com/seminars/sdp.pdf",
        "e=j.doe@example.com (Jane Doe)",
        "p=+1 617 555-6011",
        "z=2882844526 -1h 2898848070 0",
        "k=prompt",
        "r=7d 1h 0 25h",
        "Y=capital letters too",
    ],
)
def test_unknown_and_unused_lines_ignored(extra: str) -> None:
    text = SIPP_UAC_PCAP.decode()
    assert parse_sdp(text.replace("t=0 0\r\n", f"t=0 0\r\n{extra}\r\n")) == parse_sdp(text)
    assert parse_sdp(text + extra + "\r\n") == parse_sdp(text)


@pytest.mark.parametrize(
    "variant",
    [
        lambda t: t.replace("t=0 0\r\n", ""),  # no t=: tolerated, it says nothing to us
        lambda t: t + "\r\n\r\n",  # blank lines after the last record
        lambda t: t.replace("\r\n", " \r\n"),  # trailing spaces (sipp's templates have some)
        lambda t: t.replace("\r\n", "\t\r\n"),
        lambda t: t.rstrip("\r\n"),  # no line end after the last record
        lambda t: t.replace("m=audio 6000", "m=audio 6000/2"),  # port/count (RFC 4566 5.14)
    ],
)
def test_tolerated_variants(variant: Callable[[str], str]) -> None:
    text = variant(SIPP_UAC_PCAP.decode())
    got = negotiate(text)
    assert (got.codec, got.dtmf_payload_type, got.remote_rtp) == (
        Codec("PCMA", 8),
        101,
        ("127.0.0.1", 6000),
    )


def test_text_not_utf8_is_decoded_with_replacement() -> None:
    # RFC 4566 5: UTF-8 by default; a Latin-1 session name must not cost the call
    latin1 = SIPP_UAC_PCAP.replace(b"s=-", "s=Anruf für Jürgen".encode("latin-1"))
    sdp = parse_sdp(latin1)
    assert sdp.session_name == "Anruf f\ufffdr J\ufffdrgen"
    assert negotiate(latin1).codec == Codec("PCMA", 8)


# --------------------------------------------------------------------------- negotiation


@dataclass(frozen=True)
class Expected:
    codec: Codec
    dtmf: int | None
    remote: tuple[str, int]
    audio_index: int = 0
    rtcp: tuple[str, int] | None = None


NEGOTIATED = {
    "asterisk": Expected(Codec("PCMU", 0), 101, ("192.0.2.10", 17290)),
    "freeswitch": Expected(
        Codec("PCMU", 0), 101, ("198.51.100.7", 21464), rtcp=("198.51.100.7", 21465)
    ),
    "baresip": Expected(Codec("PCMU", 0), 101, ("192.0.2.33", 10306)),
    "sipp_uac_pcap": Expected(Codec("PCMA", 8), 101, ("127.0.0.1", 6000)),
    "polycom": Expected(Codec("PCMU", 0), 127, ("192.0.2.80", 2222)),
    "linphone": Expected(Codec("PCMU", 0), 100, ("192.0.2.12", 7078)),
    "video_audio": Expected(Codec("PCMA", 8), 96, ("203.0.113.5", 54400), audio_index=1),
    "ipv6": Expected(Codec("PCMU", 0), 101, ("2001:db8::5", 20000)),
    "static_no_rtpmap": Expected(Codec("PCMA", 8), None, ("192.0.2.1", 49170)),
}


@pytest.mark.parametrize("name", list(USABLE))
def test_negotiate_real_offers(name: str) -> None:
    want = NEGOTIATED[name]
    rtcp = want.rtcp or (want.remote[0], want.remote[1] + 1)
    assert negotiate(OFFERS[name]) == Negotiated(
        codec=want.codec,
        dtmf_payload_type=want.dtmf,
        remote_rtp=want.remote,
        local_direction="sendrecv",
        ptime=20,
        audio_index=want.audio_index,
        on_hold=False,
        remote_rtcp=rtcp,
    )
    assert negotiate(parse_sdp(OFFERS[name])) == negotiate(OFFERS[name])
    assert not is_hold(OFFERS[name])


@pytest.mark.parametrize(
    ("offer", "supported", "codec"),
    [
        (audio_offer("0 8"), ("PCMU", "PCMA"), Codec("PCMU", 0)),
        (audio_offer("8 0"), ("PCMU", "PCMA"), Codec("PCMA", 8)),  # the offer's order wins
        (audio_offer("8 0"), ("PCMA", "PCMU"), Codec("PCMA", 8)),
        (audio_offer("0 8"), ("PCMA", "PCMU"), Codec("PCMU", 0)),  # ... not ours
        (audio_offer("8 0"), ("PCMU",), Codec("PCMU", 0)),
        (audio_offer("0 8"), ("pcma",), Codec("PCMA", 8)),  # names in any case
        (audio_offer("18 8 0", "a=rtpmap:18 G729/8000"), ("PCMU", "PCMA"), Codec("PCMA", 8)),
        (audio_offer("3 0"), ("PCMU", "PCMA"), Codec("PCMU", 0)),  # GSM, static, unknown to us
        (audio_offer("97 8"), ("PCMU", "PCMA"), Codec("PCMA", 8)),  # 97 has no rtpmap
    ],
)
def test_codec_choice_follows_the_offers_order(
    offer: str, supported: tuple[str, ...], codec: Codec
) -> None:
    assert negotiate(offer, supported=supported).codec == codec


@pytest.mark.parametrize(
    ("offer", "codec"),
    [
        (STATIC_NO_RTPMAP, Codec("PCMA", 8)),
        (audio_offer("0"), Codec("PCMU", 0)),
        (audio_offer("8"), Codec("PCMA", 8)),
        (audio_offer("0", "a=rtpmap:101 telephone-event/8000"), Codec("PCMU", 0)),
    ],
)
def test_static_payload_types_without_rtpmap(offer: bytes | str, codec: Codec) -> None:
    assert parse_sdp(offer).media[0].rtpmap(codec.payload_type) is None
    assert negotiate(offer).codec == codec


@pytest.mark.parametrize(
    ("offer", "codec"),
    [
        (audio_offer("96 0", "a=rtpmap:96 PCMA/8000"), Codec("PCMA", 96)),
        (audio_offer("96 8", "a=rtpmap:96 pcmu/8000"), Codec("PCMU", 96)),  # case-insensitive
        (audio_offer("110 8", "a=rtpmap:110 PCMU/8000/1"), Codec("PCMU", 110)),
        (audio_offer("96 8", "a=rtpmap:96 PCMU/16000"), Codec("PCMA", 8)),  # not 8000 Hz
        (audio_offer("96 8", "a=rtpmap:96 PCMU/8000/2"), Codec("PCMA", 8)),  # stereo
        (audio_offer("0 8", "a=rtpmap:0 PCMA/8000"), Codec("PCMA", 0)),  # the rtpmap names it
    ],
)
def test_dynamic_payload_types_mapped_by_name(offer: str, codec: Codec) -> None:
    assert negotiate(offer).codec == codec


@pytest.mark.parametrize(
    ("offer", "dtmf"),
    [
        (ASTERISK, 101),
        (VIDEO_AUDIO, 96),
        (POLYCOM, 127),
        (LINPHONE, 100),  # /48000 and /16000 come first; ours is 8000 Hz
        (STATIC_NO_RTPMAP, None),
        (audio_offer("0 101", "a=rtpmap:101 telephone-event/16000"), None),
        (audio_offer("0 96", "a=rtpmap:96 TELEPHONE-EVENT/8000"), 96),
        (audio_offer("0", "a=rtpmap:101 telephone-event/8000"), None),  # not on the m= line
    ],
)
def test_telephone_event_payload_type_carried_through(offer: bytes | str, dtmf: int | None) -> None:
    got = negotiate(offer)
    assert got.dtmf_payload_type == dtmf
    text = answer(offer).decode()
    if dtmf is None:
        assert "telephone-event" not in text
    else:
        assert f"a=rtpmap:{dtmf} telephone-event/8000\r\na=fmtp:{dtmf} 0-15\r\n" in text
        assert f" {got.codec.payload_type} {dtmf}\r\n" in text


@pytest.mark.parametrize(
    ("offer", "supported"),
    [
        (
            audio_offer("18 101", "a=rtpmap:18 G729/8000", "a=rtpmap:101 telephone-event/8000"),
            ("PCMU", "PCMA"),
        ),
        (audio_offer("111", "a=rtpmap:111 opus/48000/2"), ("PCMU", "PCMA")),
        (audio_offer("96"), ("PCMU", "PCMA")),  # a dynamic type without rtpmap is nothing
        (audio_offer("3 9"), ("PCMU", "PCMA")),
        (audio_offer("96", "a=rtpmap:96 PCMU/16000"), ("PCMU", "PCMA")),
        (audio_offer("0"), ("PCMA",)),
        (SIPP_UAC_PCAP, ("PCMU",)),
    ],
)
def test_no_common_codec_is_488(offer: bytes | str, supported: tuple[str, ...]) -> None:
    with pytest.raises(SdpNotAcceptable) as caught:
        negotiate(offer, supported=supported)
    assert caught.value.status == 488
    assert caught.value.code == SdpErrorCode.NO_COMMON_CODEC
    assert str(caught.value.code) == "no_common_codec"
    assert isinstance(caught.value, SdpError)


@pytest.mark.parametrize("proto", ["RTP/SAVP", "RTP/SAVPF", "UDP/TLS/RTP/SAVPF", "rtp/savp"])
def test_srtp_is_488(proto: str) -> None:
    offer = audio_offer(
        "0 8", "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR"
    ).replace("RTP/AVP", proto)
    with pytest.raises(SdpNotAcceptable) as caught:
        negotiate(offer)
    assert (caught.value.status, caught.value.code) == (488, SdpErrorCode.SRTP_NOT_SUPPORTED)
    assert "SRTP" in caught.value.message


def test_srtp_line_rejected_when_plain_rtp_is_offered_too() -> None:
    offer = wire("""v=0
o=- 7 7 IN IP4 192.0.2.44
s=-
c=IN IP4 192.0.2.44
t=0 0
m=audio 30000 RTP/SAVP 0 8
a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:PS1uQCVeeCFCanVmcjkpPywjNWhcYD0mXXtxaVBR
m=audio 30002 RTP/AVP 0 8
""")
    got = negotiate(offer)
    assert (got.audio_index, got.remote_rtp, got.codec) == (
        1,
        ("192.0.2.44", 30002),
        Codec("PCMU", 0),
    )
    lines = answer(offer).decode().split("\r\n")
    assert [line for line in lines if line.startswith("m=")] == [
        "m=audio 0 RTP/SAVP 0",
        "m=audio 40000 RTP/AVP 0",
    ]
    assert not any(line.startswith("a=crypto") for line in lines)


@pytest.mark.parametrize(
    ("offer", "code"),
    [
        (VIDEO_AUDIO.replace(b"m=audio 54400", b"m=audio 0"), SdpErrorCode.NO_AUDIO),
        (audio_offer("0").replace("m=audio", "m=video"), SdpErrorCode.NO_AUDIO),
        (
            audio_offer("t38").replace("m=audio 4000 RTP/AVP", "m=image 4000 udptl"),
            SdpErrorCode.NO_AUDIO,
        ),
        (audio_offer("0").replace("RTP/AVP", "RTP/AVPF"), SdpErrorCode.UNSUPPORTED_TRANSPORT),
        (audio_offer("0").replace("RTP/AVP", "TCP/RTP/AVP"), SdpErrorCode.UNSUPPORTED_TRANSPORT),
        (RFC3264_ALICE, SdpErrorCode.UNSUPPORTED_ADDRESS),  # a host name: no DNS here
        (audio_offer("0", c="c=IN IP4 224.2.1.1/127"), SdpErrorCode.UNSUPPORTED_ADDRESS),
        (audio_offer("0", c="c=IN IP6 ff15::101"), SdpErrorCode.UNSUPPORTED_ADDRESS),
    ],
)
def test_not_acceptable_is_488(offer: bytes | str, code: SdpErrorCode) -> None:
    with pytest.raises(SdpNotAcceptable) as caught:
        negotiate(offer)
    assert (caught.value.status, caught.value.code) == (488, code)


def test_audio_without_any_connection_is_400() -> None:
    offer = audio_offer("0", c="c=IN IP4 192.0.2.1").replace("c=IN IP4 192.0.2.1\r\n", "")
    assert parse_sdp(offer).media[0].connection is None
    with pytest.raises(SdpError) as caught:
        negotiate(offer)
    assert not isinstance(caught.value, SdpNotAcceptable)
    assert (caught.value.status, caught.value.code) == (400, SdpErrorCode.MISSING_CONNECTION)


@pytest.mark.parametrize(
    ("rtcp", "remote_rtcp"),
    [
        ("a=rtcp:4001", ("192.0.2.1", 4001)),
        ("a=rtcp:53020", ("192.0.2.1", 53020)),
        ("a=rtcp:53020 IN IP4 198.51.100.9", ("198.51.100.9", 53020)),
        ("a=rtcp-mux", ("192.0.2.1", 4001)),  # not accepted: RTCP on port + 1
    ],
)
def test_remote_rtcp(rtcp: str, remote_rtcp: tuple[str, int]) -> None:
    assert negotiate(audio_offer("0", rtcp)).remote_rtcp == remote_rtcp


@pytest.mark.parametrize(
    "rtcp", ["a=rtcp:", "a=rtcp:x", "a=rtcp:0", "a=rtcp:70000", "a=rtcp:5000 IN IP4"]
)
def test_malformed_rtcp_is_400(rtcp: str) -> None:
    with pytest.raises(SdpError) as caught:
        negotiate(audio_offer("0", rtcp))
    assert (caught.value.status, caught.value.code) == (400, SdpErrorCode.BAD_ATTRIBUTE)


# --------------------------------------------------------------------------- hold


@pytest.mark.parametrize(
    ("offer", "remote", "local_direction", "on_hold"),
    [
        (audio_offer("0", "a=sendrecv"), ("192.0.2.1", 4000), "sendrecv", False),
        (audio_offer("0"), ("192.0.2.1", 4000), "sendrecv", False),
        (audio_offer("0", "a=sendonly"), ("192.0.2.1", 4000), "recvonly", True),
        (audio_offer("0", "a=inactive"), ("192.0.2.1", 4000), "inactive", True),
        (audio_offer("0", "a=recvonly"), ("192.0.2.1", 4000), "sendonly", False),
        # RFC 3264 8.4: the RFC 2543 way, c=0.0.0.0 with or without a direction
        (audio_offer("0", c="c=IN IP4 0.0.0.0"), None, "sendrecv", True),
        (audio_offer("0", "a=sendonly", c="c=IN IP4 0.0.0.0"), None, "recvonly", True),
        (audio_offer("0", c="c=IN IP6 ::"), None, "sendrecv", True),
        # Polycom holds with a session-level a=sendonly
        (POLYCOM.replace(b"a=sendrecv", b"a=sendonly"), ("192.0.2.80", 2222), "recvonly", True),
        (ASTERISK.replace(b"a=sendrecv", b"a=sendonly"), ("192.0.2.10", 17290), "recvonly", True),
        (
            FREESWITCH.replace(b"a=sendrecv", b"a=inactive"),
            ("198.51.100.7", 21464),
            "inactive",
            True,
        ),
    ],
)
def test_hold(
    offer: bytes | str, remote: tuple[str, int] | None, local_direction: str, on_hold: bool
) -> None:
    got = negotiate(offer)
    assert (got.remote_rtp, got.local_direction, got.on_hold) == (remote, local_direction, on_hold)
    assert is_hold(offer) is on_hold
    if remote is None:
        assert got.remote_rtcp is None  # "neither RTP nor RTCP should be sent"
    text = answer(offer).decode()
    assert f"a={local_direction}\r\n" in text
    assert "m=audio 40000 RTP/AVP " in text  # a held stream keeps its port


def test_hold_then_unhold_in_re_invites() -> None:
    # RFC 6337 5: hold is a re-offer with sendonly, resume one with sendrecv; each answer
    # carries the next o= version (RFC 3264 8).
    offers = [
        ASTERISK,
        ASTERISK.replace(b"a=sendrecv", b"a=sendonly"),
        ASTERISK,
        ASTERISK.replace(b"c=IN IP4 192.0.2.10", b"c=IN IP4 0.0.0.0"),
        ASTERISK.replace(b"c=IN IP4 192.0.2.10", b"c=IN IP4 192.0.2.11"),
    ]
    states = []
    for version, offer in enumerate(offers, start=1):
        got = negotiate(offer, supported=("PCMU",))
        text = answer(offer, session_version=version).decode()
        assert f"o=- 1234 {version} IN IP4 192.0.2.50\r\n" in text
        states.append((got.on_hold, got.local_direction, got.remote_rtp))
    assert states == [
        (False, "sendrecv", ("192.0.2.10", 17290)),
        (True, "recvonly", ("192.0.2.10", 17290)),
        (False, "sendrecv", ("192.0.2.10", 17290)),
        (True, "sendrecv", None),
        (False, "sendrecv", ("192.0.2.11", 17290)),  # resumed, and the peer moved
    ]


# --------------------------------------------------------------------------- levels


def two_level(session: str, media: str) -> str:
    lines = [
        "v=0",
        "o=- 1 1 IN IP4 192.0.2.1",
        "s=-",
        *session.split("|"),
        "t=0 0",
        "m=audio 4000 RTP/AVP 0",
        *media.split("|"),
    ]
    return "\r\n".join(line for line in lines if line) + "\r\n"


@pytest.mark.parametrize(
    ("session", "media", "connection", "direction"),
    [
        ("c=IN IP4 198.51.100.1", "c=IN IP4 192.0.2.7", "192.0.2.7", "sendrecv"),
        ("c=IN IP4 0.0.0.0", "c=IN IP4 192.0.2.7", "192.0.2.7", "sendrecv"),
        ("c=IN IP4 192.0.2.7", "c=IN IP4 0.0.0.0", "0.0.0.0", "sendrecv"),
        ("", "c=IN IP4 192.0.2.7", "192.0.2.7", "sendrecv"),
        ("c=IN IP4 192.0.2.7|a=sendonly", "a=sendrecv", "192.0.2.7", "sendrecv"),
        ("c=IN IP4 192.0.2.7|a=inactive", "", "192.0.2.7", "inactive"),
        ("c=IN IP4 192.0.2.7|a=sendrecv", "a=recvonly", "192.0.2.7", "recvonly"),
        ("c=IN IP4 192.0.2.7|a=sendonly", "a=sendonly", "192.0.2.7", "sendonly"),
        ("c=IN IP4 192.0.2.7", "c=IN IP4 192.0.2.8|c=IN IP4 192.0.2.9", "192.0.2.8", "sendrecv"),
    ],
)
def test_media_level_overrides_session_level(
    session: str, media: str, connection: str, direction: str
) -> None:
    offer = two_level(session, media)
    section = parse_sdp(offer).media[0]
    assert (section.connection, section.direction) == (connection, direction)
    got = negotiate(offer)
    sending = direction in ("sendrecv", "recvonly") and connection != "0.0.0.0"
    assert got.on_hold is not sending


def test_each_section_takes_its_own_connection() -> None:
    offer = wire("""v=0
o=- 1 1 IN IP4 192.0.2.1
s=-
c=IN IP4 192.0.2.1
t=0 0
m=video 5000 RTP/AVP 96
a=rtpmap:96 VP8/90000
m=audio 4000 RTP/AVP 0
c=IN IP4 198.51.100.2
a=sendonly
""")
    sdp = parse_sdp(offer)
    assert [(m.connection, m.direction) for m in sdp.media] == [
        ("192.0.2.1", "sendrecv"),
        ("198.51.100.2", "sendonly"),
    ]
    assert negotiate(offer).remote_rtp == ("198.51.100.2", 4000)


# --------------------------------------------------------------------------- answers


CANONICAL_ANSWER = (
    b"v=0\r\n"
    b"o=- 1234 1 IN IP4 192.0.2.50\r\n"
    b"s=-\r\n"
    b"c=IN IP4 192.0.2.50\r\n"
    b"t=0 0\r\n"
    b"m=audio 40000 RTP/AVP 8 101\r\n"
    b"a=rtpmap:8 PCMA/8000\r\n"
    b"a=rtpmap:101 telephone-event/8000\r\n"
    b"a=fmtp:101 0-15\r\n"
    b"a=ptime:20\r\n"
    b"a=sendrecv\r\n"
)


def test_answer_to_sipp_byte_for_byte() -> None:
    assert answer(SIPP_UAC_PCAP) == CANONICAL_ANSWER


def test_answer_to_video_and_audio_byte_for_byte() -> None:
    assert answer(VIDEO_AUDIO, session_id=42, session_version=7) == (
        b"v=0\r\n"
        b"o=- 42 7 IN IP4 192.0.2.50\r\n"
        b"s=-\r\n"
        b"c=IN IP4 192.0.2.50\r\n"
        b"t=0 0\r\n"
        b"m=video 0 RTP/AVP 97\r\n"
        b"m=audio 40000 RTP/AVP 8 96\r\n"
        b"a=rtpmap:8 PCMA/8000\r\n"
        b"a=rtpmap:96 telephone-event/8000\r\n"
        b"a=fmtp:96 0-15\r\n"
        b"a=ptime:20\r\n"
        b"a=sendrecv\r\n"
    )


def test_answer_to_ipv6_offer_byte_for_byte() -> None:
    assert answer(IPV6, address="2001:db8::1", port=30000) == (
        b"v=0\r\n"
        b"o=- 1234 1 IN IP6 2001:db8::1\r\n"
        b"s=-\r\n"
        b"c=IN IP6 2001:db8::1\r\n"
        b"t=0 0\r\n"
        b"m=audio 30000 RTP/AVP 0 101\r\n"
        b"a=rtpmap:0 PCMU/8000\r\n"
        b"a=rtpmap:101 telephone-event/8000\r\n"
        b"a=fmtp:101 0-15\r\n"
        b"a=ptime:20\r\n"
        b"a=sendrecv\r\n"
    )


@pytest.mark.parametrize(
    ("address", "addrtype", "written"),
    [
        ("192.0.2.50", "IP4", "192.0.2.50"),
        ("2001:db8::1", "IP6", "2001:db8::1"),
        ("2001:DB8:0:0:0:0:0:1", "IP6", "2001:db8::1"),
    ],
)
def test_answer_addrtype_follows_our_address(address: str, addrtype: str, written: str) -> None:
    text = answer(IPV6, address=address).decode()
    assert f"o=- 1234 1 IN {addrtype} {written}\r\n" in text
    assert f"\r\nc=IN {addrtype} {written}\r\n" in text
    assert parse_sdp(text).connection == written


@pytest.mark.parametrize("name", list(USABLE))
def test_answer_has_one_m_line_per_offered_one_in_order(name: str) -> None:
    offer = parse_sdp(OFFERS[name])
    got = negotiate(offer)
    reply = parse_sdp(answer(OFFERS[name]))
    assert [(m.media, m.proto) for m in reply.media] == [(m.media, m.proto) for m in offer.media]
    for index, (ours, theirs) in enumerate(zip(reply.media, offer.media, strict=True)):
        if index == got.audio_index:
            assert ours.port == 40000
        else:
            assert (ours.port, ours.formats) == (0, theirs.formats[:1])
            assert ours.attributes == ()


@pytest.mark.parametrize("name", list(USABLE))
def test_answer_round_trip(name: str) -> None:
    got = negotiate(OFFERS[name])
    raw = answer(OFFERS[name], session_id=98765, session_version=3)
    assert raw.count(b"\r\n") == raw.count(b"\n")  # CRLF only (RFC 4566 5)
    assert raw.endswith(b"\r\n")
    reply = parse_sdp(raw)
    assert (reply.username, reply.session_id, reply.session_version) == ("-", 98765, 3)
    assert (reply.nettype, reply.addrtype, reply.address) == ("IN", "IP4", "192.0.2.50")
    assert reply.session_name == "-"
    assert reply.connection == "192.0.2.50"
    audio = reply.media[got.audio_index]
    dtmf = () if got.dtmf_payload_type is None else (str(got.dtmf_payload_type),)
    assert audio.formats == (str(got.codec.payload_type), *dtmf)
    assert audio.rtpmap(got.codec.payload_type) == (got.codec.name, 8000, 1)
    if got.dtmf_payload_type is not None:
        assert audio.rtpmap(got.dtmf_payload_type) == ("telephone-event", 8000, 1)
        assert audio.fmtp(got.dtmf_payload_type) == "0-15"
    assert (audio.ptime, audio.direction) == (20, "sendrecv")
    assert "rtcp-mux" not in [attr for attr, _ in audio.attributes]
    # The answer, read as an offer, agrees with itself.
    back = negotiate(raw)
    assert (back.codec, back.dtmf_payload_type, back.remote_rtp, back.audio_index) == (
        got.codec,
        got.dtmf_payload_type,
        ("192.0.2.50", 40000),
        got.audio_index,
    )


def test_answer_ptime_is_20_whatever_the_offer_asks() -> None:
    offer = audio_offer("8 0", "a=ptime:30", "a=maxptime:60")
    assert parse_sdp(offer).media[0].ptime == 30
    assert negotiate(offer).ptime == 20
    assert b"a=ptime:20\r\n" in answer(offer)
    assert b"maxptime" not in answer(offer)


def test_answer_does_not_offer_rtcp_mux_back() -> None:
    assert b"a=rtcp-mux" in BARESIP
    reply = answer(BARESIP)
    assert b"rtcp-mux" not in reply
    assert b"a=rtcp" not in reply
    assert b"ssrc" not in reply and b"mid" not in reply


def test_answer_to_rfc3264_like_offer_with_disabled_streams() -> None:
    # RFC 3264 8.2-style re-offer: a stream disabled earlier keeps its place, port 0.
    offer = wire("""v=0
o=- 1 2 IN IP4 192.0.2.1
s=-
c=IN IP4 192.0.2.1
t=0 0
m=audio 0 RTP/AVP 0
m=image 0 udptl t38
m=audio 4000 RTP/AVP 0 8
a=recvonly
m=text 4004 RTP/AVP 98
a=rtpmap:98 t140/1000
""")
    assert answer(offer).split(b"t=0 0\r\n")[1] == (
        b"m=audio 0 RTP/AVP 0\r\n"
        b"m=image 0 udptl t38\r\n"
        b"m=audio 40000 RTP/AVP 0\r\n"
        b"a=rtpmap:0 PCMU/8000\r\n"
        b"a=ptime:20\r\n"
        b"a=sendonly\r\n"
        b"m=text 0 RTP/AVP 98\r\n"
    )


# --------------------------------------------------------------------------- offers


def test_build_offer_byte_for_byte() -> None:
    assert build_offer(address="192.0.2.50", port=40000, session_id=1234, session_version=2) == (
        b"v=0\r\n"
        b"o=- 1234 2 IN IP4 192.0.2.50\r\n"
        b"s=-\r\n"
        b"c=IN IP4 192.0.2.50\r\n"
        b"t=0 0\r\n"
        b"m=audio 40000 RTP/AVP 0 8 101\r\n"
        b"a=rtpmap:0 PCMU/8000\r\n"
        b"a=rtpmap:8 PCMA/8000\r\n"
        b"a=rtpmap:101 telephone-event/8000\r\n"
        b"a=fmtp:101 0-15\r\n"
        b"a=ptime:20\r\n"
        b"a=sendrecv\r\n"
    )


@pytest.mark.parametrize(
    ("kwargs", "codec", "dtmf", "on_hold"),
    [
        ({}, Codec("PCMU", 0), 101, False),
        ({"codecs": ("PCMA", "PCMU")}, Codec("PCMA", 8), 101, False),
        ({"codecs": ["pcma"], "dtmf_payload_type": 96}, Codec("PCMA", 8), 96, False),
        ({"dtmf_payload_type": None}, Codec("PCMU", 0), None, False),
        ({"direction": "sendonly"}, Codec("PCMU", 0), 101, True),  # we hold the peer
        ({"direction": "inactive"}, Codec("PCMU", 0), 101, True),
        ({"address": "2001:db8::7"}, Codec("PCMU", 0), 101, False),
    ],
)
def test_build_offer_round_trip(
    kwargs: dict[str, object], codec: Codec, dtmf: int | None, on_hold: bool
) -> None:
    args: dict[str, object] = {
        "address": "192.0.2.50",
        "port": 40000,
        "session_id": 1,
        "session_version": 1,
    }
    args.update(kwargs)
    offer = build_offer(**args)  # type: ignore[arg-type]
    got = negotiate(offer)
    assert (got.codec, got.dtmf_payload_type, got.on_hold) == (codec, dtmf, on_hold)
    assert got.remote_rtp == (args["address"], 40000)


# --------------------------------------------------------------------------- malformed


def sized(size: int) -> bytes:
    """The sipp offer padded with one attribute line to exactly ``size`` bytes."""
    out = SIPP_UAC_PCAP + b"a=x:" + b"y" * (size - len(SIPP_UAC_PCAP) - 6) + b"\r\n"
    assert len(out) == size
    return out


def m_lines(count: int) -> str:
    return audio_offer("0") + "m=video 0 RTP/AVP 96\r\n" * (count - 1)


MALFORMED = [
    ("empty", "", SdpErrorCode.BAD_ORDER),
    ("only blank lines", "\r\n\r\n", SdpErrorCode.BAD_ORDER),
    ("missing v=", audio_offer("0").replace("v=0\r\n", ""), SdpErrorCode.BAD_ORDER),
    ("o= first", "o=- 1 1 IN IP4 192.0.2.1\r\nv=0\r\ns=-\r\n", SdpErrorCode.BAD_ORDER),
    ("missing s=", audio_offer("0").replace("s=-\r\n", ""), SdpErrorCode.BAD_ORDER),
    ("second v=", audio_offer("0") + "v=0\r\n", SdpErrorCode.BAD_ORDER),
    ("second o=", audio_offer("0") + "o=- 2 2 IN IP4 192.0.2.1\r\n", SdpErrorCode.BAD_ORDER),
    ("v=1", audio_offer("0").replace("v=0", "v=1"), SdpErrorCode.BAD_VERSION),
    ("v= empty", audio_offer("0").replace("v=0", "v="), SdpErrorCode.BAD_VERSION),
    ("o= 5 fields", audio_offer("0").replace("o=- 1 1", "o=1 1"), SdpErrorCode.BAD_ORIGIN),
    (
        "o= id not a number",
        audio_offer("0").replace("o=- 1 1", "o=- abc 1"),
        SdpErrorCode.BAD_ORIGIN,
    ),
    (
        "o= version negative",
        audio_offer("0").replace("o=- 1 1", "o=- 1 -1"),
        SdpErrorCode.BAD_ORIGIN,
    ),
    (
        "o= id of 33 digits",
        audio_offer("0").replace("o=- 1 1", "o=- " + "9" * 33 + " 1"),
        SdpErrorCode.BAD_ORIGIN,
    ),
    ("not x=", audio_offer("0") + "hello\r\n", SdpErrorCode.BAD_LINE),
    ("leading space", audio_offer("0") + " a=sendrecv\r\n", SdpErrorCode.BAD_LINE),
    ("space before =", audio_offer("0") + "a =sendrecv\r\n", SdpErrorCode.BAD_LINE),
    ("digit type", audio_offer("0") + "1=x\r\n", SdpErrorCode.BAD_LINE),
    ("non-ASCII type", audio_offer("0") + "\u0130=x\r\n", SdpErrorCode.BAD_LINE),
    (
        "blank line inside",
        audio_offer("0").replace("t=0 0\r\n", "t=0 0\r\n\r\n"),
        SdpErrorCode.BAD_LINE,
    ),
    ("NUL", audio_offer("0").replace("s=-", "s=\x00"), SdpErrorCode.BAD_LINE),
    ("bare CR", audio_offer("0").replace("s=-\r\n", "s=-\rt=0 0\r\n"), SdpErrorCode.BAD_LINE),
    ("m= without formats", audio_offer(""), SdpErrorCode.BAD_MEDIA),
    ("m= alone", audio_offer("0") + "m=audio\r\n", SdpErrorCode.BAD_MEDIA),
    ("port not an integer", audio_offer("0").replace("4000", "four"), SdpErrorCode.BAD_MEDIA),
    ("port negative", audio_offer("0").replace("4000", "-4000"), SdpErrorCode.BAD_MEDIA),
    ("port too big", audio_offer("0").replace("4000", "65536"), SdpErrorCode.BAD_MEDIA),
    ("port of 6 digits", audio_offer("0").replace("4000", "004000"), SdpErrorCode.BAD_MEDIA),
    (
        "port count not an integer",
        audio_offer("0").replace("4000", "4000/x"),
        SdpErrorCode.BAD_MEDIA,
    ),
    ("port unicode digits", audio_offer("0").replace("4000", "٤٠٠٠"), SdpErrorCode.BAD_MEDIA),
    ("RTP format not a number", audio_offer("PCMU"), SdpErrorCode.BAD_MEDIA),
    ("RTP format 128", audio_offer("0 128"), SdpErrorCode.BAD_MEDIA),
    (
        "format not a token",
        audio_offer("0").replace("RTP/AVP 0", "udptl t38,x"),
        SdpErrorCode.BAD_MEDIA,
    ),
    ("proto not tokens", audio_offer("0").replace("RTP/AVP", "RTP//AVP"), SdpErrorCode.BAD_MEDIA),
    ("c= two fields", audio_offer("0", c="c=IN IP4"), SdpErrorCode.BAD_CONNECTION),
    ("c= nettype", audio_offer("0", c="c=TN RFC2543 x"), SdpErrorCode.BAD_CONNECTION),
    ("c= addrtype", audio_offer("0", c="c=IN IP5 192.0.2.1"), SdpErrorCode.BAD_CONNECTION),
    ("c= IP4 with IPv6", audio_offer("0", c="c=IN IP4 2001:db8::1"), SdpErrorCode.BAD_CONNECTION),
    ("c= IP6 with IPv4", audio_offer("0", c="c=IN IP6 192.0.2.1"), SdpErrorCode.BAD_CONNECTION),
    ("c= empty address", audio_offer("0", c="c=IN IP4 /127"), SdpErrorCode.BAD_CONNECTION),
    ("two session c=", audio_offer("0", head="c=IN IP4 192.0.2.2"), SdpErrorCode.BAD_CONNECTION),
    ("a= empty", audio_offer("0", "a="), SdpErrorCode.BAD_ATTRIBUTE),
    ("a= name not a token", audio_offer("0", "a=send recv"), SdpErrorCode.BAD_ATTRIBUTE),
    ("rtpmap no rate", audio_offer("0", "a=rtpmap:0 PCMU"), SdpErrorCode.BAD_ATTRIBUTE),
    ("rtpmap bad type", audio_offer("0", "a=rtpmap:x PCMU/8000"), SdpErrorCode.BAD_ATTRIBUTE),
    ("rtpmap bad rate", audio_offer("0", "a=rtpmap:0 PCMU/eight"), SdpErrorCode.BAD_ATTRIBUTE),
    ("rtpmap rate 0", audio_offer("0", "a=rtpmap:0 PCMU/0"), SdpErrorCode.BAD_ATTRIBUTE),
    ("rtpmap bad channels", audio_offer("0", "a=rtpmap:0 PCMU/8000/x"), SdpErrorCode.BAD_ATTRIBUTE),
    ("rtpmap no value", audio_offer("0", "a=rtpmap"), SdpErrorCode.BAD_ATTRIBUTE),
    (
        "two media directions",
        audio_offer("0", "a=sendonly", "a=recvonly"),
        SdpErrorCode.BAD_ATTRIBUTE,
    ),
    (
        "two session directions",
        audio_offer("0", head="a=sendonly\r\na=inactive"),
        SdpErrorCode.BAD_ATTRIBUTE,
    ),
    ("over the size limit", sized(MAX_SDP_BYTES + 1), SdpErrorCode.TOO_LARGE),
    ("over the size limit as text", sized(MAX_SDP_BYTES + 1).decode(), SdpErrorCode.TOO_LARGE),
    (
        "over the size limit in UTF-8",
        sized(MAX_SDP_BYTES).decode().replace("s=-", "s=\xe9"),
        SdpErrorCode.TOO_LARGE,
    ),
    ("far over the size limit", b"v=0\r\n" * 100_000, SdpErrorCode.TOO_LARGE),
    ("too many m= lines", m_lines(MAX_MEDIA_SECTIONS + 1), SdpErrorCode.TOO_MANY_MEDIA),
    (
        "too many formats",
        audio_offer(" ".join(["0"] * (MAX_FORMATS + 1))),
        SdpErrorCode.TOO_MANY_FORMATS,
    ),
]


@pytest.mark.parametrize(
    ("text", "code"), [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED]
)
def test_malformed_is_400(text: bytes | str, code: SdpErrorCode) -> None:
    for call in (parse_sdp, negotiate):
        with pytest.raises(SdpError) as caught:
            call(text)
        assert not isinstance(caught.value, SdpNotAcceptable)
        assert (caught.value.status, caught.value.code) == (400, code)
        assert str(caught.value).startswith(f"{code}: ")
        assert_loggable(caught.value.message, code)


@pytest.mark.parametrize(
    "text",
    [
        sized(MAX_SDP_BYTES),
        sized(MAX_SDP_BYTES).decode(),
        m_lines(MAX_MEDIA_SECTIONS),
        audio_offer(" ".join(["0"] * MAX_FORMATS)),
        audio_offer(" ".join(str(pt) for pt in range(64, 128))),
    ],
    ids=["size", "size as text", "m= lines", "formats", "formats 64-127"],
)
def test_limits_are_inclusive(text: bytes | str) -> None:
    parse_sdp(text)


def test_error_messages_quote_little_of_the_input() -> None:
    with pytest.raises(SdpError) as caught:
        parse_sdp(audio_offer("0", c="c=IN IP4 " + "h" * 10_000 + " x"))
    assert caught.value.code == SdpErrorCode.BAD_CONNECTION
    assert len(caught.value.message) < 200
    with pytest.raises(SdpNotAcceptable) as refused:
        negotiate(
            audio_offer(
                " ".join(str(pt) for pt in range(MAX_FORMATS)),
                *(f"a=rtpmap:{pt} {'X' * 200}/8000" for pt in range(MAX_FORMATS)),
            )
        )
    assert len(refused.value.message) < 300


# --------------------------------------------------------------------------- misuse


ANSWER_ARGS: dict[str, object] = {
    "address": "192.0.2.50",
    "port": 40000,
    "session_id": 1,
    "session_version": 1,
}


@pytest.mark.parametrize(
    "bad",
    [
        {"address": "gateway.example.com"},
        {"address": "0.0.0.0"},
        {"address": "224.0.0.1"},
        {"port": 0},
        {"port": 65536},
        {"port": True},
        {"session_id": -1},
        {"session_version": 2**63},
        {"username": "two words"},
        {"username": ""},
    ],
)
def test_build_answer_misuse_is_value_error(bad: dict[str, object]) -> None:
    offer = parse_sdp(SIPP_UAC_PCAP)
    with pytest.raises(ValueError):
        build_answer(offer, negotiate(offer), **{**ANSWER_ARGS, **bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        build_offer(**{**ANSWER_ARGS, **bad})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "negotiated",
    [
        Negotiated(Codec("PCMA", 8), 101, ("127.0.0.1", 6000), "sendrecv", 20, 1, False),
        Negotiated(Codec("PCMA", 8), 101, ("127.0.0.1", 6000), "sendrecv", 20, -1, False),
        Negotiated(Codec("PCMA", 8), 101, ("127.0.0.1", 6000), "both", 20, 0, False),
        Negotiated(Codec("G729", 18), None, ("127.0.0.1", 6000), "sendrecv", 20, 0, False),
        Negotiated(Codec("PCMA", 128), None, ("127.0.0.1", 6000), "sendrecv", 20, 0, False),
        Negotiated(Codec("PCMA", 8), 300, ("127.0.0.1", 6000), "sendrecv", 20, 0, False),
    ],
)
def test_build_answer_with_inconsistent_negotiation_is_value_error(negotiated: Negotiated) -> None:
    with pytest.raises(ValueError):
        build_answer(parse_sdp(SIPP_UAC_PCAP), negotiated, **ANSWER_ARGS)  # type: ignore[arg-type]


def test_build_answer_audio_index_must_be_audio() -> None:
    offer = parse_sdp(VIDEO_AUDIO)
    wrong = Negotiated(Codec("PCMA", 8), None, ("203.0.113.5", 54400), "sendrecv", 20, 0, False)
    with pytest.raises(ValueError):
        build_answer(offer, wrong, **ANSWER_ARGS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"codecs": ()},
        {"codecs": ("G729",)},
        {"codecs": ("PCMU", "pcmu")},
        {"codecs": "PCMU"},
        {"dtmf_payload_type": 95},
        {"dtmf_payload_type": 128},
        {"direction": "both"},
    ],
)
def test_build_offer_misuse_is_value_error(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        build_offer(**{**ANSWER_ARGS, **bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("supported", [(), ("G729",), ("PCMU", "opus"), "PCMU"])
def test_negotiate_misuse_is_value_error(supported: tuple[str, ...]) -> None:
    with pytest.raises(ValueError):
        negotiate(SIPP_UAC_PCAP, supported=supported)


# --------------------------------------------------------------------------- fuzzing


@st.composite
def line_damaged(draw: st.DrawFn, text: str) -> str:
    """``text`` with a line or two dropped, duplicated, or replaced by junk of its type."""
    lines = text.split("\r\n")
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(("drop", "dup", "junk", "fields")))
        if op == "drop":
            del lines[at]
        elif op == "dup":
            lines.insert(at, lines[at])
        elif op == "junk":
            lines[at] = lines[at][:2] + draw(texts(30))
        elif lines[at][:2]:
            words = lines[at][2:].split(" ")
            words[draw(st.integers(0, len(words) - 1))] = draw(
                st.sampled_from(["", "-1", "0", "65536", "x", "0.0.0.0", "::", "99999999999"])
                | texts(6)
            )
            lines[at] = lines[at][:2] + " ".join(words)
    return "\r\n".join(lines)


OFFER_TEXTS = [offer.decode() for offer in OFFERS.values()]


@FUZZ
@given(
    st.one_of(
        st.sampled_from(OFFER_TEXTS).flatmap(line_damaged),
        st.sampled_from(OFFER_TEXTS).flatmap(damaged),
        texts(200),
        st.binary(max_size=300),
    )
)
def test_fuzz_only_sdp_errors_and_answers_that_parse(text: str | bytes) -> None:
    try:
        offer = parse_sdp(text)
        got = negotiate(offer)
    except SdpError as exc:
        assert exc.status == (488 if isinstance(exc, SdpNotAcceptable) else 400)
        assert_loggable(exc.message, exc.code)
        return
    reply = parse_sdp(
        build_answer(offer, got, address="192.0.2.50", port=40000, session_id=1, session_version=1)
    )
    assert len(reply.media) == len(offer.media)
    assert reply.media[got.audio_index].port == 40000
    assert got.codec.name in ("PCMU", "PCMA")


def family_offer(c: tuple[str, str], rtcp: tuple[str, str] | None, session_level: bool) -> str:
    """An audio offer whose ``c=`` (session or media level) and ``a=rtcp`` address are
    ``(addrtype, address)`` pairs."""
    connection = f"c=IN {c[0]} {c[1]}"
    lines = ["a=rtpmap:0 PCMU/8000"]
    if rtcp is not None:
        lines.append(f"a=rtcp:4001 IN {rtcp[0]} {rtcp[1]}")
    if session_level:
        return audio_offer("0", *lines, c=connection)
    return audio_offer("0", connection, *lines, c="")


@FUZZ
@given(
    c=sdp_addresses(),
    rtcp=st.none() | sdp_addresses(),
    session_level=st.booleans(),
    damage=st.booleans(),
    data=st.data(),
)
def test_fuzz_connection_address_families(
    c: tuple[str, str],
    rtcp: tuple[str, str] | None,
    session_level: bool,
    damage: bool,
    data: st.DataObject,
) -> None:
    """Whatever family ``c=`` and ``a=rtcp`` name: an SdpError (400/488), or where to send
    RTP and RTCP as IP literals of the family written (never a host name, never a
    multicast group), so the gateway can tell at offer time whether its sockets reach it."""
    text = family_offer(c, rtcp, session_level)
    if damage:
        text = data.draw(line_damaged(text))
    try:
        got = negotiate(parse_sdp(text))
    except SdpError as exc:
        assert exc.status == (488 if isinstance(exc, SdpNotAcceptable) else 400)
        assert_loggable(exc.message, exc.code)
        return
    for destination in (got.remote_rtp, got.remote_rtcp):
        if destination is None:
            continue
        ip = ipaddress.ip_address(destination[0])  # a literal: raises on a name
        assert not ip.is_multicast and not ip.is_unspecified
        assert 0 < destination[1] < 65536
    if got.remote_rtp is not None and not damage:
        assert f"IP{ipaddress.ip_address(got.remote_rtp[0]).version}" == c[0]
    if got.remote_rtp is None:
        assert got.on_hold
