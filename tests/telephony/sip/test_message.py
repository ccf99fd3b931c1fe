"""SIP message parsing, building and serializing, byte for byte.

Fixtures are RFC 4475 ("SIP Torture Test Messages") section 3 messages, written out with
their layout (CRLF line ends added; the RFC's "<allOneLine>" and "<hex>" markers expanded
as it says), and RFC 3261 section 24 style dialogs. Each test names the RFC 4475 test
(``wsinv``, ``intmeth``...) it reproduces.
"""

from __future__ import annotations

import pytest

from telephony.sip import (
    MAX_HEADERS,
    MAX_LINE_BYTES,
    Headers,
    NameAddr,
    ParseErrorCode,
    SipParseError,
    SipRequest,
    SipResponse,
    SipUri,
    SipUsageError,
    Via,
    build_response,
    parse_message,
    parse_name_addr,
    parse_uri,
    parse_via,
    serialize,
    split_list,
)
from telephony.sip.message import canonical_name, format_hostport, ip_literal


def crlf(text: str) -> bytes:
    """The text with every LF made CRLF, as UTF-8 (fixtures are written with LF)."""
    return text.replace("\n", "\r\n").encode()


def request(data: bytes) -> SipRequest:
    message = parse_message(data)
    assert isinstance(message, SipRequest)
    return message


def response(data: bytes) -> SipResponse:
    message = parse_message(data)
    assert isinstance(message, SipResponse)
    return message


def parse_error(data: bytes, **kwargs: int) -> SipParseError:
    with pytest.raises(SipParseError) as info:
        parse_message(data, **kwargs)
    return info.value


# RFC 4475 3.1.1.1 "A Short Tortuous INVITE" (wsinv): folding, LWS everywhere, compact
# names, odd case, escaped quotes, three Vias over two headers, an empty header.
WSINV = crlf(
    """INVITE sip:vivekg@chair-dnrc.example.com;unknownparam SIP/2.0
TO :
 sip:vivekg@chair-dnrc.example.com ;   tag    = 1918181833n
from   : "J Rosenberg \\\\\\""       <sip:jdrosen@example.com>
  ;
  tag = 98asjd8
MaX-fOrWaRdS: 0068
Call-ID: wsinv.ndaksdj@192.0.2.1
Content-Length   : 150
cseq: 0009
  INVITE
Via  : SIP  /   2.0
 /UDP
    192.0.2.2;branch=390skdjuw
s :
NewFangledHeader:   newfangled value
 continued newfangled value
UnknownHeaderWithUnusualValue: ;;,,;;,;
Content-Type: application/sdp
Route:
 <sip:services.example.com;lr;unknownwith=value;unknown-no-value>
v:  SIP  / 2.0  / TCP     spindle.example.com   ;
  branch  =   z9hG4bK9ikj8  ,
 SIP  /    2.0   / UDP  192.168.255.111   ; branch=
 z9hG4bK30239
m:"Quoted string \\"\\"" <sip:jdrosen@example.com> ; newparam =
      newvalue ;
  secondparam ; q = 0.33

v=0
o=mhandley 29739 7272939 IN IP4 192.0.2.3
s=-
c=IN IP4 192.0.2.4
t=0 0
m=audio 49217 RTP/AVP 0 12
m=video 3227 RTP/AVP 31
a=rtpmap:31 LPC
"""
)


def test_wsinv_short_tortuous_invite() -> None:
    msg = request(WSINV)
    assert (msg.method, msg.uri) == ("INVITE", "sip:vivekg@chair-dnrc.example.com;unknownparam")
    assert msg.request_uri.has_param("unknownparam")
    assert msg.to == NameAddr(
        None,
        SipUri("sip", "vivekg", "chair-dnrc.example.com"),
        (("tag", "1918181833n"),),
    )
    assert msg.from_.display == 'J Rosenberg \\"'
    assert msg.from_.tag == "98asjd8"
    assert msg.max_forwards == 68
    assert msg.call_id == "wsinv.ndaksdj@192.0.2.1"
    assert msg.cseq == (9, "INVITE")
    assert [(v.transport, v.host, v.branch) for v in msg.vias] == [
        ("UDP", "192.0.2.2", "390skdjuw"),
        ("TCP", "spindle.example.com", "z9hG4bK9ikj8"),
        ("UDP", "192.168.255.111", "z9hG4bK30239"),
    ]
    assert msg.headers.get("Subject") == ""  # "s :" has an empty value
    assert msg.headers.get("newfangledheader") == "newfangled value continued newfangled value"
    assert msg.headers.get("UnknownHeaderWithUnusualValue") == ";;,,;;,;"
    contact = parse_name_addr(msg.headers.get_all("m")[0])
    assert contact.display == 'Quoted string ""'
    assert contact.params == (("newparam", "newvalue"), ("secondparam", None), ("q", "0.33"))
    route = parse_name_addr(msg.headers.get_all("Route")[0])
    assert route.uri.has_param("lr") and route.uri.param("unknownwith") == "value"
    assert len(msg.body) == 150 and msg.body.startswith(b"v=0\r\n")
    assert msg.content_type == "application/sdp"
    # names are canonical after parsing: compact forms expanded, case fixed
    assert [name for name, _ in msg.headers][:4] == ["To", "From", "Max-Forwards", "Call-ID"]
    assert "Contact" in [name for name, _ in msg.headers]


# RFC 4475 3.1.1.2 "Wide Range of Valid Characters" (intmeth); the RFC writes the NUL,
# BEL and DEL of the To display name as <hex>00</hex> etc.
INTMETH = crlf(
    """!interesting-Method0123456789_*+`.%indeed'~ sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*:&it+has=1,weird!*pas$wo~d_too.(doesn't-it)@example.com SIP/2.0
Via: SIP/2.0/TCP host1.example.com;branch=z9hG4bK-.!%66*_+`'~
To: "BEL:\\\x07 NUL:\\\x00 DEL:\\\x7f" <sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*@example.com>
From: token1~` token2'+_ token3*%!.- <sip:mundane@example.com>;fromParam''~+*_!.-%="\u0440\u0430\u0431\u043e\u0442\u0430\u044e\u0449\u0438\u0439";tag=_token~1'+`*%!-.
Call-ID: intmeth.word%ZK-!.*_+'@word`~)(><:\\/"][?}{
CSeq: 139122385 !interesting-Method0123456789_*+`.%indeed'~
Max-Forwards: 255
extensionHeader-!.%*+_`'~: \u5927\u505c\u96fb
Content-Length: 0

"""  # noqa: E501  (RFC fixtures keep their long lines)
)


def test_intmeth_wide_range_of_valid_characters() -> None:
    msg = request(INTMETH)
    assert msg.method == "!interesting-Method0123456789_*+`.%indeed'~"
    uri = msg.request_uri
    assert uri.user == "1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*"
    assert uri.password == "&it+has=1,weird!*pas$wo~d_too.(doesn't-it)"
    assert uri.host == "example.com"
    assert msg.to.display == "BEL:\x07 NUL:\x00 DEL:\x7f"
    assert msg.from_.display == "token1~` token2'+_ token3*%!.-"
    assert msg.from_.tag == "_token~1'+`*%!-."
    assert msg.from_.param("fromParam''~+*_!.-%") == '"работающий"'
    assert msg.call_id == "intmeth.word%ZK-!.*_+'@word`~)(><:\\/\"][?}{"
    assert msg.cseq == (139122385, msg.method)
    assert msg.headers.get("extensionHeader-!.%*+_`'~") == "大停電"
    assert msg.vias[0].branch == "z9hG4bK-.!%66*_+`'~"
    assert str(uri) == msg.uri  # escapes and odd characters survive


def test_esc01_escaped_characters_are_kept_as_written() -> None:
    # RFC 4475 3.1.1.3 (esc01), "Valid Use of the % Escaping Mechanism"
    msg = request(
        crlf(
            """INVITE sip:sips%3Auser%40example.com@example.net SIP/2.0
To: sip:%75se%72@example.com
From: <sip:I%20have%20spaces@example.net>;tag=938
Max-Forwards: 87
i: esc01.239409asdfakjkn23onasd0-3234
CSeq: 234234 INVITE
Via: SIP/2.0/UDP host5.example.net;branch=z9hG4bKkdjuw
C: application/sdp
Contact:
  <sip:cal%6Cer@host5.example.net;%6C%72;n%61me=v%61lue%25%34%31>
Content-Length: 150

v=0
o=mhandley 29739 7272939 IN IP4 192.0.2.1
s=-
c=IN IP4 192.0.2.1
t=0 0
m=audio 49217 RTP/AVP 0 12
m=video 3227 RTP/AVP 31
a=rtpmap:31 LPC
"""
        )
    )
    assert msg.request_uri.user == "sips%3Auser%40example.com"
    assert msg.to.uri.user == "%75se%72"
    assert msg.from_.uri.user == "I%20have%20spaces"
    assert msg.call_id == "esc01.239409asdfakjkn23onasd0-3234"
    contact = parse_name_addr(msg.headers.get_all("Contact")[0])
    assert contact.uri.params == (("%6C%72", None), ("n%61me", "v%61lue%25%34%31"))
    assert msg.content_type == "application/sdp"


def test_escnull_lwsdisp_semiuri() -> None:
    # RFC 4475 3.1.1.4 (escnull), 3.1.1.6 (lwsdisp), 3.1.1.9 (semiuri)
    assert parse_uri("sip:null-%00-null@example.com").user == "null-%00-null"
    lwsdisp = parse_name_addr("caller<sip:caller@example.com>;tag=323")
    assert (lwsdisp.display, lwsdisp.tag) == ("caller", "323")
    semi = parse_uri("sip:user;par=u%40example.net@example.com")
    assert (semi.user, semi.host, semi.params) == ("user;par=u%40example.net", "example.com", ())


def test_dblreq_bytes_after_content_length_are_discarded() -> None:
    # RFC 4475 3.1.1.8 (dblreq): a REGISTER with Content-Length 0 followed by an INVITE
    msg = request(
        crlf(
            """REGISTER sip:example.com SIP/2.0
To: sip:j.user@example.com
From: sip:j.user@example.com;tag=43251j3j324
Max-Forwards: 8
I: dblreq.0ha0isndaksdj99sdfafnl3lk233412
Contact: sip:j.user@host.example.com
CSeq: 8 REGISTER
Via: SIP/2.0/UDP 192.0.2.125;branch=z9hG4bKkdjuw23492
Content-Length: 0


INVITE sip:joe@example.com SIP/2.0
t: sip:joe@example.com
From: sip:caller@example.net;tag=141334
Max-Forwards: 8
Call-ID: dblreq.0ha0isnda977644900765@192.0.2.15
CSeq: 8 INVITE
Via: SIP/2.0/UDP 192.0.2.15;branch=z9hG4bKkdjuw380234
Content-Type: application/sdp
Content-Length: 150

v=0
"""
        )
    )
    assert msg.method == "REGISTER" and msg.body == b""


def test_transports_unknown_transport_tokens() -> None:
    # RFC 4475 3.1.1.10 (transports)
    msg = request(
        crlf(
            """OPTIONS sip:user@example.com SIP/2.0
To: sip:user@example.com
From: <sip:caller@example.com>;tag=323
Max-Forwards: 70
Call-ID:  transports.kijh4akdnaqjkwendsasfdj
Accept: application/sdp
CSeq: 60 OPTIONS
Via: SIP/2.0/UDP t1.example.com;branch=z9hG4bKkdjuw
Via: SIP/2.0/SCTP t2.example.com;branch=z9hG4bKklasjdhf
Via: SIP/2.0/TLS t3.example.com;branch=z9hG4bK2980unddj
Via: SIP/2.0/UNKNOWN t4.example.com;branch=z9hG4bKasd0f3en
Via: SIP/2.0/TCP t5.example.com;branch=z9hG4bK0a9idfnee
l: 0

"""
        )
    )
    assert [v.transport for v in msg.vias] == ["UDP", "SCTP", "TLS", "UNKNOWN", "TCP"]
    assert msg.call_id == "transports.kijh4akdnaqjkwendsasfdj"


def test_unreason_and_noreason_responses() -> None:
    # RFC 4475 3.1.1.12 (unreason) and 3.1.1.13 (noreason)
    headers = """Via: SIP/2.0/UDP 192.0.2.198;branch=z9hG4bK1324923
Call-ID: unreason.1234ksdfak3j2erwedfsASdf
CSeq: 35 INVITE
From: sip:user@example.com;tag=11141343
To: sip:user@example.edu;tag=2229
Content-Length: 0

"""
    unreason = response(
        crlf("SIP/2.0 200 = 2**3 * 5**2 но сто девяносто девять - простое\n" + headers)
    )
    assert unreason.status == 200
    assert unreason.reason == "= 2**3 * 5**2 но сто девяносто девять - простое"
    noreason = response(crlf("SIP/2.0 100 \n" + headers))
    assert (noreason.status, noreason.reason) == (100, "")
    assert serialize(noreason).startswith(b"SIP/2.0 100 \r\n")


def test_compact_forms_case_and_lf_only_line_ends() -> None:
    msg = request(
        b"\r\n\r\nBYE sip:bob@192.0.2.4 SIP/2.0\n"
        b"v: SIP/2.0/UDP pc33.atlanta.example.com;branch=z9hG4bKnashds10\n"
        b"MAX-FORWARDS: 70\n"
        b"f: Alice <sip:alice@atlanta.example.com>;tag=1928301774\n"
        b"t: Bob <sip:bob@biloxi.example.com>;tag=a6c85cf\n"
        b"i: a84b4c76e66710\n"
        b"cseq: 231 BYE\n"
        b"l: 0\n\n"
    )
    assert msg.method == "BYE" and msg.max_forwards == 70
    assert msg.to.tag == "a6c85cf" and msg.call_id == "a84b4c76e66710"
    assert msg.headers.get("Call-ID") == msg.headers.get("i") == msg.headers.get("CALL-id")
    assert canonical_name("l") == "Content-Length" and canonical_name("x-custom") == "x-custom"


def test_missing_content_length_takes_the_rest_of_the_datagram() -> None:
    msg = request(
        crlf(
            """INFO sip:bob@192.0.2.4 SIP/2.0
Via: SIP/2.0/UDP 192.0.2.101:5060;branch=z9hG4bKinfo1
From: <sip:alice@atlanta.example.com>;tag=1
To: <sip:bob@biloxi.example.com>;tag=2
Call-ID: nolength@192.0.2.101
CSeq: 3 INFO
Content-Type: application/dtmf-relay

Signal=5
Duration=160
"""
        )
    )
    assert msg.body == b"Signal=5\r\nDuration=160\r\n"
    assert msg.max_forwards is None  # tolerated when missing


def test_multiple_vias_in_one_header_and_list_splitting() -> None:
    headers = Headers(
        [
            ("Via", 'SIP/2.0/UDP a.example.com;branch=z9hG4bK1;x="q,uo;te", SIP/2.0/UDP b'),
            ("Contact", '"Doe, John" <sip:j@a.example.com;p=1,2>;q=0.5, <sip:k@b>'),
            ("Allow", "INVITE,ACK ,, BYE"),
            ("Date", "Sat, 13 Nov 2010 23:29:00 GMT"),
        ]
    )
    vias = headers.get_all("v")
    assert vias == ['SIP/2.0/UDP a.example.com;branch=z9hG4bK1;x="q,uo;te"', "SIP/2.0/UDP b"]
    assert parse_via(vias[0]).param("x") == '"q,uo;te"'
    contacts = headers.get_all("m")
    assert contacts == ['"Doe, John" <sip:j@a.example.com;p=1,2>;q=0.5', "<sip:k@b>"]
    assert headers.get_all("Allow") == ["INVITE", "ACK", "BYE"]
    assert headers.get_all("Date") == ["Sat, 13 Nov 2010 23:29:00 GMT"]  # not a list header
    assert headers.raw("Via") == [headers.get("Via")]
    assert split_list('a, "unterminated, quote') == ["a", '"unterminated, quote']


def test_headers_api() -> None:
    headers = Headers([("to", "<sip:a@b>"), ("X-One", "1"), ("Route", "<sip:p1;lr>")])
    headers.add("route", "<sip:p2;lr>")
    assert list(headers) == [
        ("To", "<sip:a@b>"),
        ("X-One", "1"),
        ("Route", "<sip:p1;lr>"),
        ("Route", "<sip:p2;lr>"),
    ]
    assert len(headers) == 4 and "t" in headers and "From" not in headers
    headers.set("ROUTE", "<sip:p3;lr>")
    assert headers.get_all("Route") == ["<sip:p3;lr>"]
    assert [name for name, _ in headers] == ["To", "X-One", "Route"]
    headers.set("Subject", "appended")
    assert list(headers)[-1] == ("Subject", "appended")
    assert headers.remove("x-one") == 1 and headers.remove("x-one") == 0
    copy = headers.copy()
    copy.add("X-Two", "2")
    assert copy != headers and headers.get("X-Two") is None
    for name, value in (("Bad Name", "v"), ("X", "a\r\nInjected: 1"), ("X", "bare\rcr")):
        with pytest.raises(SipUsageError):
            headers.add(name, value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sip:alice@atlanta.example.com", SipUri("sip", "alice", "atlanta.example.com")),
        ("SIP:ALICE@AtLanTa.CoM;Transport=udp", SipUri("sip", "ALICE", "AtLanTa.CoM", None,
                                                       (("Transport", "udp"),))),
        ("sips:alice:secret@[2001:db8::1]:5061;maddr=239.255.255.1;ttl=15",
         SipUri("sips", "alice", "[2001:db8::1]", 5061,
                (("maddr", "239.255.255.1"), ("ttl", "15")), password="secret")),
        ("sip:192.0.2.4:5060;lr", SipUri("sip", None, "192.0.2.4", 5060, (("lr", None),))),
        ("sip:biloxi.com;transport=tcp;method=REGISTER?to=sip:bob%40biloxi.com&x=1",
         SipUri("sip", None, "biloxi.com", None, (("transport", "tcp"), ("method", "REGISTER")),
                (("to", "sip:bob%40biloxi.com"), ("x", "1")))),
        ("tel:+1-201-555-0123;phone-context=example.com",
         SipUri("tel", "+1-201-555-0123", "", None, (("phone-context", "example.com"),))),
        ("nobodyKnowsThisScheme:totally-opaque-content",
         SipUri("nobodyknowsthisscheme", None, "totally-opaque-content")),
    ],
)  # fmt: skip
def test_parse_uri(text: str, expected: SipUri) -> None:
    uri = parse_uri(text)
    assert uri == expected
    round_trip = parse_uri(str(uri))
    assert round_trip == uri


def test_uri_params_and_ip_literals() -> None:
    uri = parse_uri("sip:p1.example.com;lr;transport=udp")
    assert uri.param("lr") == "" and uri.has_param("LR") and uri.param("TRANSPORT") == "udp"
    assert uri.param("maddr") is None and not uri.has_param("maddr")
    assert ip_literal("[2001:DB8::1]") == "2001:db8::1" and ip_literal("192.0.2.1") == "192.0.2.1"
    assert ip_literal("example.com") is None
    assert format_hostport("2001:db8::1", 5060) == "[2001:db8::1]:5060"
    assert format_hostport("192.0.2.1", None) == "192.0.2.1"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sip:",
        "no-scheme",
        "sip:user@example.com; lr",  # RFC 4475 3.1.2.8 (lwsruri)
        "<sip:user@example.com>",  # 3.1.2.7 (ltgtruri)
        "sip:user@example.com:65536",
        "sip:user@example.com:12x",
        "sip:alice@[2001:db8::1",
        "sip:alice@[not:an:address]",
        "sip:alice%zz@host",
        "sip:alice@host;=value",
        "sip:al ice@host",
        "sip:alice@-",
    ],
)
def test_parse_uri_rejects(text: str) -> None:
    with pytest.raises(SipParseError) as info:
        parse_uri(text)
    assert info.value.code is ParseErrorCode.MALFORMED_URI


def test_name_addr_forms() -> None:
    quoted = parse_name_addr('"Bob \\"the\\" Builder" <sips:bob@biloxi.example.com> ;tag=a48s')
    assert quoted.display == 'Bob "the" Builder' and quoted.tag == "a48s"
    assert str(quoted) == '"Bob \\"the\\" Builder" <sips:bob@biloxi.example.com>;tag=a48s'
    token = parse_name_addr("Anonymous <sip:c8oqz84zk7z@privacy.org>;tag=hyh8")
    assert token.display == "Anonymous"
    bare = parse_name_addr("<sip:alice@atlanta.example.com>")
    assert bare.display is None and bare.tag is None
    assert str(bare.with_tag("x1")) == "<sip:alice@atlanta.example.com>;tag=x1"
    assert bare.with_tag("x1").with_tag("x2").tag == "x2"
    # 20.10: an addr-spec's ;parameters are the header's, not the URI's
    spec = parse_name_addr("sip:bob@biloxi.example.com;user=phone;tag=7")
    assert spec.uri.params == () and spec.params == (("user", "phone"), ("tag", "7"))
    ipv6 = parse_name_addr("<sip:[2001:db8::10]:5070>")
    assert (ipv6.uri.host, ipv6.uri.port) == ("[2001:db8::10]", 5070)


@pytest.mark.parametrize(
    "text",
    [
        '"Mr. J. User <sip:j.user@example.com>',  # RFC 4475 3.1.2.6 (quotbal)
        "<sip:j.user@example.com",
        "Bob sip:bob@example.com",
        "<sip:bob@example.com> junk",
        "sip:bob@example.com?subject=x",
        "<sip:bob@example.com>;=1",
    ],
)
def test_name_addr_rejects(text: str) -> None:
    with pytest.raises(SipParseError):
        parse_name_addr(text)


def test_via_parse_and_rewrite() -> None:
    via = parse_via("SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bK776asdhds;rport")
    assert (via.transport, via.host, via.port, via.sent_by) == (
        "UDP",
        "10.0.0.7",
        5062,
        "10.0.0.7:5062",
    )
    assert via.rport_requested and via.rport is None and via.received is None
    filled = via.with_param("received", "203.0.113.9").with_param("rport", "40000")
    assert str(filled) == (
        "SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bK776asdhds;rport=40000;received=203.0.113.9"
    )
    assert not filled.rport_requested and filled.rport == 40000
    assert filled.received == "203.0.113.9"
    ipv6 = parse_via("SIP/2.0/udp [2001:db8::9]:5060;branch=z9hG4bKv6;maddr=239.1.1.1")
    assert (ipv6.transport, ipv6.host, ipv6.maddr) == ("UDP", "[2001:db8::9]", "239.1.1.1")
    assert parse_via(str(ipv6)) == ipv6
    for bad in (
        "SIP/2.0/UDP",
        "HTTP/1.1/TCP host",
        "SIP/3.0/UDP host",
        "SIP/2.0/UDP host:99999",
        "SIP/2.0/UDP host;branch=a\x07b",
    ):
        with pytest.raises(SipParseError):
            parse_via(bad)


# --------------------------------------------------------------------------- invalid messages

VALID_HEADERS = """Via: SIP/2.0/UDP 192.0.2.15;branch=z9hG4bKkdjuw
To: <sip:user@example.com>
From: <sip:caller@example.net>;tag=134161461246
Max-Forwards: 7
Call-ID: invalid.test@192.0.2.15
CSeq: 1 OPTIONS
"""


def options(*, start: str = "OPTIONS sip:user@example.com SIP/2.0", extra: str = "") -> bytes:
    return crlf(f"{start}\n{VALID_HEADERS}{extra}\n")


def test_clerr_content_length_larger_than_the_body() -> None:
    # RFC 4475 3.1.2.2 (clerr) in its UDP reading (18.3): a short body is an error
    error = parse_error(options(extra="Content-Length: 9999\n") + b"v=0\r\n")
    assert (error.code, error.status, error.reason) == (
        ParseErrorCode.BAD_CONTENT_LENGTH,
        400,
        "Bad Content-Length",
    )
    assert isinstance(error.partial, SipRequest) and error.partial.call_id


@pytest.mark.parametrize(
    "value", ["-999", "12a", "99999999999", "1 1"]
)  # 3.1.2.3 (ncl) and friends
def test_bad_content_length(value: str) -> None:
    error = parse_error(options(extra=f"Content-Length: {value}\n"))
    assert error.code is ParseErrorCode.BAD_CONTENT_LENGTH


def test_content_length_headers_that_disagree() -> None:
    error = parse_error(options(extra="Content-Length: 0\nl: 3\n") + b"abc")
    assert error.code is ParseErrorCode.BAD_CONTENT_LENGTH


@pytest.mark.parametrize(
    ("replace", "by", "reason"),
    [
        # RFC 4475 3.1.2.4 (scalar02): scalar fields with overlarge values
        ("CSeq: 1 OPTIONS", "CSeq: 36893488147419103232 OPTIONS", "Bad CSeq Header"),
        ("CSeq: 1 OPTIONS", "CSeq: 2147483648 OPTIONS", "Bad CSeq Header"),
        ("Max-Forwards: 7", "Max-Forwards: 300", "Bad Max-Forwards Header"),
        ("CSeq: 1 OPTIONS", "CSeq: x OPTIONS", "Bad CSeq Header"),
        # 3.1.2.? (mismatch01): CSeq method differs from the request's
        ("CSeq: 1 OPTIONS", "CSeq: 1 INVITE", "CSeq Method Mismatch"),
        # 3.1.2.6 (quotbal)
        ("To: <sip:user@example.com>", 'To: "Mr. J. User <sip:user@example.com>', "Bad To Header"),
        ("Call-ID: invalid.test@192.0.2.15", "Call-ID: two words", "Bad Call-ID Header"),
        ("Via: SIP/2.0/UDP 192.0.2.15;branch=z9hG4bKkdjuw", "Via: SIP/2.0 192.0.2.15", "Bad Via"),
    ],
)
def test_malformed_headers_name_the_problem(replace: str, by: str, reason: str) -> None:
    data = crlf(f"OPTIONS sip:user@example.com SIP/2.0\n{VALID_HEADERS}\n".replace(replace, by))
    error = parse_error(data)
    assert error.code is ParseErrorCode.MALFORMED_HEADER
    assert (error.status, error.reason) == (400, reason)
    assert isinstance(error.partial, SipRequest) and error.partial.headers.get("CSeq")


@pytest.mark.parametrize("missing", ["Via", "To", "From", "Call-ID", "CSeq"])
def test_missing_mandatory_header(missing: str) -> None:
    # RFC 4475 3.1.2.15 (insuf) removes several; one at a time here
    lines = [line for line in VALID_HEADERS.splitlines() if not line.startswith(missing + ":")]
    error = parse_error(crlf("OPTIONS sip:user@example.com SIP/2.0\n" + "\n".join(lines) + "\n\n"))
    assert (error.code, error.reason) == (
        ParseErrorCode.MISSING_HEADER,
        f"Missing {missing} Header",
    )


def test_multi01_single_valued_headers_repeated() -> None:
    # RFC 4475 3.1.2.16 (multi01): multiple values in single-value fields
    error = parse_error(options(extra="To: <sip:other@example.com>\n"))
    assert (error.code, error.reason) == (ParseErrorCode.DUPLICATE_HEADER, "Multiple To Headers")


@pytest.mark.parametrize(
    ("start", "code", "status"),
    [
        ("OPTIONS sip:user@example.com SIP/7.0", ParseErrorCode.UNSUPPORTED_VERSION, 505),
        ("INVITE <sip:user@example.com> SIP/2.0", ParseErrorCode.MALFORMED_START_LINE, 400),
        ("INVITE sip:user@example.com; lr SIP/2.0", ParseErrorCode.MALFORMED_START_LINE, 400),
        ("OPTIONS sip:user@example.com HTTP/1.1", ParseErrorCode.MALFORMED_START_LINE, 400),
    ],
)
def test_bad_request_lines_keep_a_partial_request(
    start: str, code: ParseErrorCode, status: int
) -> None:
    # RFC 4475 3.1.2.17 (badvers), 3.1.2.7 (ltgtruri), 3.1.2.8 (lwsruri)
    error = parse_error(options(start=start))
    assert (error.code, error.status) == (code, status)
    assert isinstance(error.partial, SipRequest) and error.partial.headers.get("Via")


def test_lwsstart_and_trws_are_tolerated() -> None:
    # RFC 4475 3.1.2.9 (lwsstart: runs of SP) and 3.1.2.10 (trws: trailing SP)
    msg = request(options(start="OPTIONS   sip:user@example.com     SIP/2.0   "))
    assert (msg.method, msg.uri) == ("OPTIONS", "sip:user@example.com")


def test_unparseable_start_lines_have_no_partial() -> None:
    for start in ("garbage", "SIP/2.0 4294967301 better not break the receiver", "\x01 x y"):
        error = parse_error(options(start=start))
        assert error.code is ParseErrorCode.MALFORMED_START_LINE and error.partial is None


def test_empty_datagrams_are_keepalives() -> None:
    for data in (b"\r\n\r\n", b"\r\n", b"   ", b"\x00\x00\x00\x00"):
        assert parse_error(data).code is ParseErrorCode.EMPTY


def test_limits() -> None:
    head = options(extra="X-Pad: " + "a" * 200 + "\n")
    too_large = parse_error(head + b"x" * 100, max_bytes=len(head) + 10)
    assert (too_large.code, too_large.status) == (ParseErrorCode.TOO_LARGE, 513)
    assert isinstance(too_large.partial, SipRequest)  # the head fits: still answerable
    no_head = parse_error(head, max_bytes=len(head) - 10)
    assert no_head.code is ParseErrorCode.TOO_LARGE and no_head.partial is None
    many = "".join(f"X-H{i}: {i}\n" for i in range(MAX_HEADERS))
    too_many = parse_error(options(extra=many))
    assert too_many.code is ParseErrorCode.TOO_MANY_HEADERS and too_many.partial is not None
    long_line = parse_error(options(extra="X-Long: " + "a" * MAX_LINE_BYTES + "\n"))
    assert long_line.code is ParseErrorCode.LINE_TOO_LONG
    folded = "X-Folded: a\n" + " b\n" * (MAX_LINE_BYTES // 2)
    assert parse_error(options(extra=folded)).code is ParseErrorCode.LINE_TOO_LONG


def test_malformed_header_lines_are_skipped_for_the_partial() -> None:
    error = parse_error(options(extra="this line has no colon\n"))
    assert error.code is ParseErrorCode.MALFORMED_HEADER
    assert isinstance(error.partial, SipRequest) and error.partial.call_id
    bare_cr = parse_error(options(extra="X-Cr: a\rb\n"))
    assert bare_cr.code is ParseErrorCode.MALFORMED_HEADER
    fold_first = parse_error(
        crlf("OPTIONS sip:user@example.com SIP/2.0\n folded\n" + VALID_HEADERS)
    )
    assert fold_first.code is ParseErrorCode.MALFORMED_HEADER


# --------------------------------------------------------------------------- serializing

# RFC 3261 24.2 F1, as this package writes it: canonical, so it round-trips exactly.
F1 = crlf(
    """INVITE sip:bob@biloxi.example.com SIP/2.0
Via: SIP/2.0/TCP client.atlanta.example.com:5060;branch=z9hG4bK74bf9
Max-Forwards: 70
From: Alice <sip:alice@atlanta.example.com>;tag=9fxced76sl
To: Bob <sip:bob@biloxi.example.com>
Call-ID: 3848276298220188511@atlanta.example.com
CSeq: 1 INVITE
Contact: <sip:alice@client.atlanta.example.com;transport=tcp>
Content-Type: application/sdp
Content-Length: 151

v=0
o=alice 2890844526 2890844526 IN IP4 client.atlanta.example.com
s=-
c=IN IP4 192.0.2.101
t=0 0
m=audio 49172 RTP/AVP 0
a=rtpmap:0 PCMU/8000
"""
)


def test_serialize_is_exact_for_canonical_messages() -> None:
    assert len(request(F1).body) == 151
    assert serialize(parse_message(F1)) == F1


@pytest.mark.parametrize("data", [WSINV, INTMETH, F1, options(), options(extra="l: 0\n")])
def test_serialize_parse_round_trip(data: bytes) -> None:
    first = parse_message(data)
    written = serialize(first)
    second = parse_message(written)
    assert serialize(second) == written  # a fixed point after one pass
    assert second.body == first.body
    strip = [(n, v) for n, v in first.headers if n != "Content-Length"]
    assert [(n, v) for n, v in second.headers if n != "Content-Length"] == strip
    assert second.headers.get("Content-Length") == str(len(first.body))


def test_serialize_sets_content_length_from_the_body() -> None:
    msg = SipRequest("MESSAGE", "sip:a@b", Headers([("l", "99"), ("Content-Length", "1")]), b"hi")
    assert serialize(msg) == b"MESSAGE sip:a@b SIP/2.0\r\nContent-Length: 2\r\n\r\nhi"
    empty = SipResponse(200, "OK", Headers([("Supported", "")]))
    assert serialize(empty) == b"SIP/2.0 200 OK\r\nSupported:\r\nContent-Length: 0\r\n\r\n"
    raw = SipResponse(200, "OK", Headers([("X-Bytes", "caf\udce9")]))  # surrogateescape
    assert b"X-Bytes: caf\xe9\r\n" in serialize(raw)


# --------------------------------------------------------------------------- build_response

# RFC 3261 24.2 F3-style: a request that came through two proxies.
PROXIED = crlf(
    """INVITE sip:bob@192.0.2.4 SIP/2.0
Via: SIP/2.0/UDP server10.biloxi.example.com;branch=z9hG4bK4b43c2ff8.1;received=192.0.2.3, SIP/2.0/UDP bigbox3.site3.atlanta.example.com;branch=z9hG4bK77ef4c2312983.1;received=192.0.2.2
Via: SIP/2.0/UDP pc33.atlanta.example.com;branch=z9hG4bKnashds8;received=192.0.2.1
Max-Forwards: 68
To: Bob <sip:bob@biloxi.example.com>
From: Alice <sip:alice@atlanta.example.com>;tag=1928301774
Call-ID: a84b4c76e66710
CSeq: 314159 INVITE
Record-Route: <sip:server10.biloxi.example.com;lr>, <sip:bigbox3.site3.atlanta.example.com;lr>
Contact: <sip:alice@pc33.atlanta.example.com>
Content-Length: 0

"""  # noqa: E501  (RFC fixtures keep their long lines)
)


def test_build_response_copies_what_8_2_6_2_says() -> None:
    ringing = build_response(request(PROXIED), 180, to_tag="a6c85cf", record_route=True)
    assert serialize(ringing) == crlf(
        """SIP/2.0 180 Ringing
Via: SIP/2.0/UDP server10.biloxi.example.com;branch=z9hG4bK4b43c2ff8.1;received=192.0.2.3, SIP/2.0/UDP bigbox3.site3.atlanta.example.com;branch=z9hG4bK77ef4c2312983.1;received=192.0.2.2
Via: SIP/2.0/UDP pc33.atlanta.example.com;branch=z9hG4bKnashds8;received=192.0.2.1
From: Alice <sip:alice@atlanta.example.com>;tag=1928301774
To: Bob <sip:bob@biloxi.example.com>;tag=a6c85cf
Call-ID: a84b4c76e66710
CSeq: 314159 INVITE
Record-Route: <sip:server10.biloxi.example.com;lr>, <sip:bigbox3.site3.atlanta.example.com;lr>
Content-Length: 0

"""  # noqa: E501  (RFC fixtures keep their long lines)
    )


def test_build_response_options() -> None:
    req = request(PROXIED)
    plain = build_response(req, 486, "Busy Here", to_tag="x", record_route=True)
    assert "Record-Route" not in plain.headers  # only 101..299
    assert plain.headers.get("To") == "Bob <sip:bob@biloxi.example.com>;tag=x"
    trying = build_response(req, 100)
    assert trying.reason == "Trying" and trying.headers.get("To") == req.headers.get("To")
    answered = build_response(
        req,
        200,
        to_tag="y",
        headers=[("Contact", "<sip:gw@192.0.2.4>")],
        body=b"v=0\r\n",
        content_type="application/sdp",
    )
    assert answered.reason == "OK" and "Record-Route" not in answered.headers
    assert list(answered.headers)[-2:] == [
        ("Contact", "<sip:gw@192.0.2.4>"),
        ("Content-Type", "application/sdp"),
    ]
    assert serialize(answered).endswith(b"Content-Length: 5\r\n\r\nv=0\r\n")
    # a To that already has a tag keeps it
    in_dialog = request(
        crlf(
            """BYE sip:alice@pc33.atlanta.example.com SIP/2.0
Via: SIP/2.0/UDP 192.0.2.4;branch=z9hG4bKnashds10
Max-Forwards: 70
From: Bob <sip:bob@biloxi.example.com>;tag=a6c85cf
To: Alice <sip:alice@atlanta.example.com>;tag=1928301774
Call-ID: a84b4c76e66710
CSeq: 231 BYE
Content-Length: 0

"""
        )
    )
    ok = build_response(in_dialog, 200, to_tag="other")
    assert ok.headers.get("To") == "Alice <sip:alice@atlanta.example.com>;tag=1928301774"
    assert build_response(in_dialog, 299).reason == "Unknown"
    for status in (99, 700):
        with pytest.raises(SipUsageError):
            build_response(in_dialog, status)
    with pytest.raises(SipUsageError):
        build_response(in_dialog, 400, "Bad\r\nX: injected")


def test_via_dataclass_defaults() -> None:
    assert str(Via("UDP", "192.0.2.1", 5060, (("branch", "z9hG4bKx"),))) == (
        "SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKx"
    )


@pytest.mark.parametrize("value", ["99999", "0", "\u00b2", "123456", "-1"])
def test_an_impossible_rport_is_no_port(value: str) -> None:
    via = parse_via(f"SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKx;rport={value}")
    assert via.rport is None
