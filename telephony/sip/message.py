"""SIP messages (RFC 3261): parse, inspect, build and serialize, without I/O.

Contract:

* :func:`parse_message` turns one UDP datagram into a :class:`SipRequest` or
  :class:`SipResponse`, or raises :class:`SipParseError`. The error carries ``code`` (for
  machines), ``status`` and ``reason`` (the response a UAS sends when it can: 400, 505 for
  an unknown SIP-Version, 513 for a message over the size limit) and ``partial``: the
  message as far as it could be read (start line and headers), so that a UAS can still
  answer a request whose Via, From, To, Call-ID and CSeq it found.
* :func:`serialize` writes a message back: CRLF line ends, canonical header names, one
  header field per line as stored, and ``Content-Length`` always set from the body.
* :func:`build_response` builds a response to a request as section 8.2.6.2 says.

What parsing accepts (section 7 and the grammar of section 25; RFC 4475 is the test suite):

* Leading CRLFs before the start line (7.5); header line folding (7.3.1: a line that starts
  with SP or HT continues the previous one); LWS around ``:`` and inside values; header
  names in any case, compact forms (7.3.3 and the registered ones of later RFCs) expanded
  to the canonical name; several values of a list header in one field (7.3.1), split by
  :meth:`Headers.get_all` without splitting inside quoted strings or ``<...>``; LF-only line
  ends (tolerated, never sent).
* Content-Length (18.3, 20.14): on a datagram the body is what follows the blank line; a
  ``Content-Length`` larger than that is an error, a smaller one truncates the body (the
  extra bytes are discarded); a missing one means "the rest of the datagram".
* Requests need Via, From, To, Call-ID and CSeq (8.1.1); Max-Forwards is checked when
  present and tolerated when missing. From, To, Call-ID, CSeq, Max-Forwards and
  Content-Type may appear once (7.3.1: only list headers may repeat). The CSeq method must
  be the request's (8.1.1.5); CSeq numbers are below 2**31 (8.1.1.5), Max-Forwards 0..255.
* Header values are decoded as UTF-8 with ``surrogateescape``: a byte that is not UTF-8
  survives a parse/serialize round trip unchanged. Other control characters than a bare CR
  are accepted (RFC 4475 3.1.1.2 puts NUL, BEL and DEL in a quoted-pair); values this
  package is given to write (:meth:`Headers.add`) must not hold CR or LF.

Limits: :data:`MAX_MESSAGE_BYTES` (a datagram, default), :data:`MAX_HEADERS` header fields
and :data:`MAX_LINE_BYTES` per line (physical, and logical after unfolding).

URIs (19.1, 25.1): ``sip``/``sips`` are parsed into user, password, host (an IPv6 reference
keeps its brackets), port, parameters and headers; ``tel`` (RFC 3966) keeps the number in
``user`` and an empty ``host``; any other scheme (an absoluteURI) keeps its opaque part in
``host``, so that a UAS can answer 416 (8.2.2.1) instead of failing to parse. Escapes
(``%41``) are validated, never decoded, so values round-trip byte for byte.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Final, TypeAlias

__all__ = [
    "COMPACT_FORMS",
    "DEFAULT_PORT",
    "LIST_HEADERS",
    "MAGIC_COOKIE",
    "MAX_HEADERS",
    "MAX_LINE_BYTES",
    "MAX_MESSAGE_BYTES",
    "REASON_PHRASES",
    "SIP_VERSION",
    "Headers",
    "NameAddr",
    "Params",
    "ParseErrorCode",
    "SipError",
    "SipMessage",
    "SipParseError",
    "SipProtocolError",
    "SipRequest",
    "SipResponse",
    "SipUri",
    "SipUsageError",
    "UsageErrorCode",
    "Via",
    "build_response",
    "canonical_name",
    "format_hostport",
    "ip_literal",
    "parse_message",
    "parse_name_addr",
    "parse_uri",
    "parse_via",
    "serialize",
    "split_list",
]

MAX_MESSAGE_BYTES: Final = 65_535  # the largest UDP payload over IPv4 (18.1.1 on sizes)
MAX_HEADERS: Final = 100  # header fields per message (ours: RFC 3261 sets no limit)
MAX_LINE_BYTES: Final = 8_192  # start line or header field, before and after unfolding
SIP_VERSION: Final = "SIP/2.0"
MAGIC_COOKIE: Final = "z9hG4bK"  # 8.1.1.7: an RFC 3261 branch starts with it
DEFAULT_PORT: Final = 5060  # 19.1.2 / 18.2.2: sip over UDP
_MAX_CSEQ: Final = 2**31  # 8.1.1.5: "MUST be less than 2**31"
_MAX_CONTENT_LENGTH_DIGITS: Final = 10

Params: TypeAlias = tuple[tuple[str, str | None], ...]


# --------------------------------------------------------------------------- errors


class ParseErrorCode(enum.StrEnum):
    """Machine-readable codes of :class:`SipParseError` (remote misbehaviour)."""

    EMPTY = "empty"  # nothing but whitespace: a keepalive, never answered
    TOO_LARGE = "too_large"
    TOO_MANY_HEADERS = "too_many_headers"
    LINE_TOO_LONG = "line_too_long"
    MALFORMED_START_LINE = "malformed_start_line"
    UNSUPPORTED_VERSION = "unsupported_version"
    MALFORMED_HEADER = "malformed_header"
    MISSING_HEADER = "missing_header"
    DUPLICATE_HEADER = "duplicate_header"
    BAD_CONTENT_LENGTH = "bad_content_length"
    MALFORMED_URI = "malformed_uri"


class UsageErrorCode(enum.StrEnum):
    """Machine-readable codes of :class:`SipUsageError` (local misuse)."""

    BAD_STATUS = "bad_status"  # a status code out of range for the call made
    BAD_HEADER = "bad_header"  # a header name that is not a token, CR/LF in a value
    BAD_ARGUMENT = "bad_argument"
    DIALOG_GONE = "dialog_gone"  # an intent on a dialog that ended (or never existed)
    ILLEGAL_STATE = "illegal_state"  # an intent the dialog's or transaction's state forbids
    REFER_PENDING = "refer_pending"  # a second REFER before the first one's final response
    TOO_MANY_TRANSACTIONS = "too_many_transactions"


class SipError(Exception):
    """Base of this package's errors: ``code`` for machines, ``message`` for the log."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SipProtocolError(SipError):
    """The remote end sent something SIP does not allow (remote misbehaviour)."""


class SipUsageError(SipError):
    """This process called the core in a way its contract forbids (local misuse)."""

    code: UsageErrorCode

    def __init__(self, code: UsageErrorCode, message: str) -> None:
        super().__init__(code, message)


class SipParseError(SipProtocolError):
    """A datagram that is not a valid SIP message.

    ``status``/``reason``: the response a UAS sends when it can answer (it needs the
    ``partial`` request's Via, From, To, Call-ID and CSeq); ``partial``: the message as far
    as it was read (None when not even the start line was).
    """

    code: ParseErrorCode

    def __init__(
        self,
        code: ParseErrorCode,
        message: str,
        *,
        status: int = 400,
        reason: str = "Bad Request",
        partial: SipMessage | None = None,
    ) -> None:
        super().__init__(code, message)
        self.status = status
        self.reason = reason
        self.partial = partial


# --------------------------------------------------------------------------- lexical helpers

# 25.1: token = 1*(alphanum / "-" / "." / "!" / "%" / "*" / "_" / "+" / "`" / "'" / "~")
_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9\-.!%*_+`'~]+")
_SCHEME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9+\-.]*")
# 25.1 user = 1*( unreserved / escaped / user-unreserved ); password likewise. "%" is
# allowed here and checked as an escape separately.
_USER_RE: Final = re.compile(r"[A-Za-z0-9\-_.!~*'()&=+$,;?/%]+")
_PASSWORD_RE: Final = re.compile(r"[A-Za-z0-9\-_.!~*'()&=+$,%]*")
_BAD_ESCAPE_RE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")
# hostname (25.1), leniently: labels of alphanumerics, "-" and "_" (seen in the wild).
_HOSTNAME_RE: Final = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_\-.]*[A-Za-z0-9_.])?")
_PORT_RE: Final = re.compile(r"[0-9]{1,5}")
# Characters never legal unescaped in a URI's params/headers: whitespace, quotes, <>.
_URI_FORBIDDEN_RE: Final = re.compile(r"[\s\"<>\\]")
_QUOTE_ESCAPE_RE: Final = re.compile(r'[\\"\x00-\x09\x0b\x0c\x0e-\x1f\x7f]')
_VIA_CTL_RE: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # no quoted-pairs in a Via
_INJECTION_RE: Final = re.compile(r"[\r\n]")  # what a value we write must not hold
_CSEQ_RE: Final = re.compile(r"([0-9]{1,10})\s+(" + _TOKEN_RE.pattern + r")")
_VERSION_RE: Final = re.compile(r"SIP/[0-9]+\.[0-9]+", re.IGNORECASE)
_HEAD_END_RE: Final = re.compile(rb"\r?\n\r?\n")
_VIA_PROTOCOL_RE: Final = re.compile(
    r"\s*("
    + _TOKEN_RE.pattern
    + r")\s*/\s*("
    + _TOKEN_RE.pattern
    + r")\s*/\s*("
    + _TOKEN_RE.pattern
    + r")\s+(.*)",
    re.DOTALL,
)


def _is_token(text: str) -> bool:
    return _TOKEN_RE.fullmatch(text) is not None


def split_list(value: str, separator: str = ",") -> list[str]:
    """Split a header value at top-level ``separator`` characters (7.3.1): never inside a
    quoted string (with its backslash escapes) or ``<...>``. Elements are stripped and
    empty ones dropped. Never raises: an unterminated quoted string runs to the end (and
    the element then fails to parse where it is used)."""
    if '"' not in value and "<" not in value:
        return [part.strip() for part in value.split(separator) if part.strip()]
    return [part.strip() for part in _split_raw(value, separator) if part.strip()]


def _split_raw(value: str, separator: str) -> list[str]:
    parts: list[str] = []
    start = 0
    quoted = escaped = False
    depth = 0
    for index, char in enumerate(value):
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == "<":
            depth += 1
        elif char == ">" and depth:
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(value[start:index])
            start = index + 1
    parts.append(value[start:])
    return parts


def _parse_params(text: str) -> Params:
    """``;name[=value]`` parameters (25.1 generic-param), LWS tolerated around ``;`` and ``=``
    (RFC 4475 3.1.1.1). Values keep their quotes when quoted. Raises ValueError."""
    params: list[tuple[str, str | None]] = []
    for part in _split_raw(text, ";") if '"' in text else text.split(";"):
        part = part.strip()
        if not part:
            continue
        name, equals, value = part.partition("=")
        name = name.strip()
        if not _is_token(name):
            raise ValueError(f"bad parameter name {name[:32]!r}")
        if not equals:
            params.append((name, None))
            continue
        value = value.strip()
        if not value:
            raise ValueError(f"parameter {name[:32]!r} has an empty value")
        if value.startswith('"'):
            if len(value) < 2 or not value.endswith('"') or value.endswith('\\"'):
                raise ValueError(f"parameter {name[:32]!r} has a bad quoted value")
        elif any(c.isspace() for c in value):
            raise ValueError(f"parameter {name[:32]!r} has whitespace in its value")
        params.append((name, value))
    return tuple(params)


def _format_params(params: Params) -> str:
    return "".join(f";{name}" if value is None else f";{name}={value}" for name, value in params)


def _find_param(params: Params, name: str) -> tuple[bool, str | None]:
    lowered = name.lower()
    for key, value in params:
        if key.lower() == lowered:
            return True, value
    return False, None


def _set_param(params: Params, name: str, value: str | None) -> Params:
    lowered = name.lower()
    out = list(params)
    for index, (key, _) in enumerate(out):
        if key.lower() == lowered:
            out[index] = (key, value)
            return tuple(out)
    out.append((name, value))
    return tuple(out)


def ip_literal(host: str) -> str | None:
    """The address ``host`` names when it is an IP literal (an IPv6 reference loses its
    brackets), else None: a domain name, which this package never resolves."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return None


def format_hostport(host: str, port: int | None) -> str:
    """``host[:port]``, an IPv6 address put in brackets (25.1 IPv6reference)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return host if port is None else f"{host}:{port}"


def _parse_hostport(text: str) -> tuple[str, int | None]:
    """25.1 hostport; raises ValueError."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("unterminated IPv6 reference")
        host, rest = text[: end + 1], text[end + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"bad IPv6 reference {host[:64]!r}") from None
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
        if not _HOSTNAME_RE.fullmatch(host):
            raise ValueError(f"bad host {host[:64]!r}")
    if not rest:
        return host, None
    if not rest.startswith(":"):
        raise ValueError(f"junk after host {rest[:32]!r}")
    port_text = rest[1:].strip()
    if not _PORT_RE.fullmatch(port_text) or int(port_text) > 65_535:
        raise ValueError(f"bad port {port_text[:16]!r}")
    return host, int(port_text)


def _unquote(text: str) -> str:
    """The content of a quoted-string (25.1), quoted-pairs resolved."""
    out: list[str] = []
    escaped = False
    for char in text[1:-1]:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            out.append(char)
    return "".join(out)


def _quote(text: str) -> str:
    """A quoted-string (25.1): backslash, quote and control characters as quoted-pairs
    (CR and LF cannot be escaped; a parsed value never holds them)."""
    return '"' + _QUOTE_ESCAPE_RE.sub(lambda m: "\\" + m.group(0), text) + '"'


# --------------------------------------------------------------------------- URIs


@dataclass(frozen=True, slots=True)
class SipUri:
    """A SIP, SIPS or tel URI (19.1, RFC 3966), or another scheme's absoluteURI.

    ``host`` keeps an IPv6 reference's brackets; a tel URI has its number in ``user`` and
    an empty ``host``; another scheme's opaque part is in ``host``. ``params`` are the
    ``;`` uri-parameters in order (a valueless one has value None), ``headers`` the ``?``
    part. Escapes are kept as written.
    """

    scheme: str
    user: str | None
    host: str
    port: int | None = None
    params: Params = ()
    headers: tuple[tuple[str, str], ...] = ()
    password: str | None = None

    def param(self, name: str) -> str | None:
        """A parameter's value (case-insensitive name); "" for a valueless one, None when
        absent (use :meth:`has_param` for flags such as ``lr``)."""
        found, value = _find_param(self.params, name)
        return (value if value is not None else "") if found else None

    def has_param(self, name: str) -> bool:
        return _find_param(self.params, name)[0]

    @property
    def is_sip(self) -> bool:
        return self.scheme in ("sip", "sips")

    def __str__(self) -> str:
        if self.scheme == "tel":
            return f"tel:{self.user or ''}{_format_params(self.params)}"
        if not self.is_sip:
            return f"{self.scheme}:{self.host}"
        userinfo = ""
        if self.user is not None:
            userinfo = self.user if self.password is None else f"{self.user}:{self.password}"
            userinfo += "@"
        text = f"{self.scheme}:{userinfo}{format_hostport(self.host, self.port)}"
        text += _format_params(self.params)
        if self.headers:
            text += "?" + "&".join(f"{name}={value}" for name, value in self.headers)
        return text


def _uri_error(text: str, why: str) -> SipParseError:
    return SipParseError(
        ParseErrorCode.MALFORMED_URI, f"URI {text[:64]!r}: {why}", reason="Bad URI"
    )


def parse_uri(text: str) -> SipUri:
    """Parse a URI (19.1.1, 25.1 SIP-URI/SIPS-URI; RFC 3966 tel; else absoluteURI).

    Raises :class:`SipParseError` (``malformed_uri``): whitespace, quotes or ``<>`` anywhere,
    a bad escape, host or port.
    """
    if not text or _URI_FORBIDDEN_RE.search(text):
        raise _uri_error(text, "empty, or whitespace, quote or <> in it")
    scheme, colon, rest = text.partition(":")
    if not colon or not _SCHEME_RE.fullmatch(scheme) or not rest:
        raise _uri_error(text, "no scheme")
    scheme = scheme.lower()
    if _BAD_ESCAPE_RE.search(rest):
        raise _uri_error(text, "bad % escape")
    if scheme == "tel":
        number, _, param_text = rest.partition(";")
        try:
            params = _parse_params(param_text)
        except ValueError as exc:
            raise _uri_error(text, str(exc)) from None
        return SipUri("tel", number, "", None, params)
    if scheme not in ("sip", "sips"):
        return SipUri(scheme, None, rest)
    user: str | None = None
    password: str | None = None
    at = rest.find("@")  # 25.1: "@" is never unescaped in userinfo, params or headers
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1 :]
        user_text, has_password, password_text = userinfo.partition(":")
        if not _USER_RE.fullmatch(user_text):
            raise _uri_error(text, "bad user part")
        if has_password:
            if not _PASSWORD_RE.fullmatch(password_text):
                raise _uri_error(text, "bad password")
            password = password_text
        user = user_text
    rest, question, header_text = rest.partition("?")
    hostport, _, param_text = rest.partition(";")
    try:
        host, port = _parse_hostport(hostport)
        params = _parse_params(param_text)
    except ValueError as exc:
        raise _uri_error(text, str(exc)) from None
    headers: list[tuple[str, str]] = []
    if question:
        for item in header_text.split("&"):
            name, equals, value = item.partition("=")
            if not name or not equals:
                raise _uri_error(text, "bad header part")
            headers.append((name, value))
    return SipUri(scheme, user, host, port, params, tuple(headers), password)


# --------------------------------------------------------------------------- name-addr


@dataclass(frozen=True, slots=True)
class NameAddr:
    """A From/To/Contact/Route value (20.10, 25.1 name-addr / addr-spec).

    ``display`` is the display name with quoting removed (None when absent); ``params``
    the header parameters after the URI (``tag``, ``expires``, ``q``...). Serializes with
    the URI in angle brackets, which is always legal.
    """

    display: str | None
    uri: SipUri
    params: Params = ()

    @property
    def tag(self) -> str | None:
        """The ``tag`` parameter (8.1.1.3, 19.3)."""
        return self.param("tag")

    def param(self, name: str) -> str | None:
        found, value = _find_param(self.params, name)
        return (value if value is not None else "") if found else None

    def with_tag(self, tag: str) -> NameAddr:
        return replace(self, params=_set_param(self.params, "tag", tag))

    def __str__(self) -> str:
        display = f"{_quote(self.display)} " if self.display else ""
        return f"{display}<{self.uri}>{_format_params(self.params)}"


def _name_addr_error(text: str, why: str) -> SipParseError:
    return SipParseError(
        ParseErrorCode.MALFORMED_HEADER, f"name-addr {text[:64]!r}: {why}", reason="Bad Address"
    )


def parse_name_addr(text: str) -> NameAddr:
    """Parse a name-addr (``"Bob" <sip:bob@host>;tag=1``, ``Bob<sip:...>``, ``<sip:...>``) or
    an addr-spec (``sip:bob@host;tag=1``: 20.10, its ``;`` parameters are the header's,
    not the URI's). Raises :class:`SipParseError`."""
    rest = text.strip()
    display: str | None = None
    if rest.startswith('"'):
        index, escaped = 1, False
        while index < len(rest):
            char = rest[index]
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                break
            index += 1
        else:
            raise _name_addr_error(text, "unterminated quoted display name")
        display = _unquote(rest[: index + 1])
        rest = rest[index + 1 :].lstrip()
        if not rest.startswith("<"):
            raise _name_addr_error(text, "no <URI> after the display name")
    if rest.startswith("<") or "<" in rest:
        open_at = rest.find("<")
        if display is None and open_at > 0:
            token_display = " ".join(rest[:open_at].split())
            if '"' in token_display or any(c in token_display for c in "<>,;"):
                raise _name_addr_error(text, "bad display name")
            display = token_display or None
        close_at = rest.find(">", open_at)
        if close_at < 0:
            raise _name_addr_error(text, "unterminated <URI>")
        uri_text = rest[open_at + 1 : close_at].strip()
        param_text = rest[close_at + 1 :]
        if param_text.strip() and not param_text.lstrip().startswith(";"):
            raise _name_addr_error(text, "junk after <URI>")
    else:
        uri_text, _, param_text = rest.partition(";")
        uri_text = uri_text.strip()
        if "," in uri_text or "?" in uri_text:
            raise _name_addr_error(text, "an addr-spec with , or ? needs <>")
    try:
        params = _parse_params(param_text)
    except ValueError as exc:
        raise _name_addr_error(text, str(exc)) from None
    try:
        uri = parse_uri(uri_text)
    except SipParseError as exc:
        raise _name_addr_error(text, exc.message) from None
    return NameAddr(display, uri, params)


# --------------------------------------------------------------------------- Via


@dataclass(frozen=True, slots=True)
class Via:
    """One Via value (20.42, 25.1 via-parm): ``SIP/2.0/UDP host:port;branch=...``."""

    transport: str
    host: str
    port: int | None = None
    params: Params = ()
    protocol: str = SIP_VERSION

    @property
    def branch(self) -> str | None:
        return _find_param(self.params, "branch")[1]

    @property
    def received(self) -> str | None:
        return _find_param(self.params, "received")[1]

    @property
    def rport(self) -> int | None:
        """The value of ``rport`` (RFC 3581) when it has one."""
        value = _find_param(self.params, "rport")[1]
        if value is None or not (value.isascii() and value.isdigit()) or len(value) > 5:
            return None
        port = int(value)
        return port if 0 < port <= 65_535 else None

    @property
    def rport_requested(self) -> bool:
        """``rport`` present without a value: the client asks for symmetric responses."""
        found, value = _find_param(self.params, "rport")
        return found and value is None

    @property
    def maddr(self) -> str | None:
        return _find_param(self.params, "maddr")[1]

    @property
    def sent_by(self) -> str:
        """``host[:port]`` as sent (17.2.3 matches transactions on it)."""
        return format_hostport(self.host, self.port)

    def has_param(self, name: str) -> bool:
        return _find_param(self.params, name)[0]

    def param(self, name: str) -> str | None:
        found, value = _find_param(self.params, name)
        return (value if value is not None else "") if found else None

    def with_param(self, name: str, value: str | None) -> Via:
        """This Via with ``name`` set (replaced in place, or appended)."""
        return replace(self, params=_set_param(self.params, name, value))

    def __str__(self) -> str:
        return (
            f"{self.protocol}/{self.transport} {format_hostport(self.host, self.port)}"
            f"{_format_params(self.params)}"
        )


def parse_via(text: str) -> Via:
    """Parse one via-parm; LWS is allowed around ``/`` (RFC 4475 3.1.1.1), control
    characters are not. Raises :class:`SipParseError` (``malformed_header``)."""
    match = _VIA_PROTOCOL_RE.fullmatch(text)
    if match is None or _VIA_CTL_RE.search(text):
        raise SipParseError(
            ParseErrorCode.MALFORMED_HEADER,
            f"Via {text[:64]!r}: no sent-protocol",
            reason="Bad Via",
        )
    name, version, transport, rest = match.groups()
    if name.upper() != "SIP" or version != "2.0":
        raise SipParseError(
            ParseErrorCode.MALFORMED_HEADER,
            f"Via {text[:64]!r}: protocol {name[:16]}/{version[:16]}",
            reason="Bad Via",
        )
    sent_by, _, param_text = rest.partition(";")
    try:
        host, port = _parse_hostport(sent_by)
        params = _parse_params(param_text)
    except ValueError as exc:
        raise SipParseError(
            ParseErrorCode.MALFORMED_HEADER, f"Via {text[:64]!r}: {exc}", reason="Bad Via"
        ) from None
    return Via(transport.upper(), host, port, params)


# --------------------------------------------------------------------------- headers

#: 7.3.3 and registered compact forms (RFC 3515 r, RFC 3892 b, RFC 6665 o/u, RFC 4028 x,
#: RFC 3841 a/j/d, RFC 4474 y/n).
COMPACT_FORMS: Final = {
    "i": "Call-ID",
    "m": "Contact",
    "e": "Content-Encoding",
    "l": "Content-Length",
    "c": "Content-Type",
    "f": "From",
    "s": "Subject",
    "k": "Supported",
    "t": "To",
    "v": "Via",
    "r": "Refer-To",
    "b": "Referred-By",
    "o": "Event",
    "u": "Allow-Events",
    "x": "Session-Expires",
    "a": "Accept-Contact",
    "j": "Reject-Contact",
    "d": "Request-Disposition",
    "y": "Identity",
    "n": "Identity-Info",
}

_CANONICAL: Final = {
    name.lower(): name
    for name in (
        "Accept",
        "Accept-Contact",
        "Accept-Encoding",
        "Accept-Language",
        "Alert-Info",
        "Allow",
        "Allow-Events",
        "Authentication-Info",
        "Authorization",
        "Call-ID",
        "Call-Info",
        "Contact",
        "Content-Disposition",
        "Content-Encoding",
        "Content-Language",
        "Content-Length",
        "Content-Type",
        "CSeq",
        "Date",
        "Diversion",
        "Error-Info",
        "Event",
        "Expires",
        "From",
        "Identity",
        "Identity-Info",
        "In-Reply-To",
        "Info-Package",
        "Max-Forwards",
        "MIME-Version",
        "Min-Expires",
        "Min-SE",
        "Organization",
        "P-Asserted-Identity",
        "P-Preferred-Identity",
        "Path",
        "Priority",
        "Privacy",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Require",
        "RAck",
        "Reason",
        "Record-Route",
        "Recv-Info",
        "Refer-To",
        "Referred-By",
        "Reject-Contact",
        "Replaces",
        "Reply-To",
        "Request-Disposition",
        "Require",
        "Retry-After",
        "Route",
        "RSeq",
        "Server",
        "Session-Expires",
        "Subject",
        "Subscription-State",
        "Supported",
        "Timestamp",
        "To",
        "Unsupported",
        "User-Agent",
        "Via",
        "Warning",
        "WWW-Authenticate",
    )
}

#: Headers whose values are comma-separated lists (7.3.1; the ``#`` rules of 25.1), split
#: by :meth:`Headers.get_all`.
LIST_HEADERS: Final = frozenset(
    {
        "Accept",
        "Accept-Encoding",
        "Accept-Language",
        "Alert-Info",
        "Allow",
        "Allow-Events",
        "Call-Info",
        "Contact",
        "Content-Encoding",
        "Content-Language",
        "Error-Info",
        "In-Reply-To",
        "P-Asserted-Identity",
        "Path",
        "Proxy-Require",
        "Record-Route",
        "Require",
        "Route",
        "Supported",
        "Unsupported",
        "Via",
        "Warning",
    }
)

#: 7.3.1: only list headers may repeat; these must not.
_SINGLE_HEADERS: Final = ("From", "To", "Call-ID", "CSeq", "Max-Forwards", "Content-Type")


def canonical_name(name: str) -> str:
    """The canonical spelling of a header name: compact forms expanded (7.3.3), known names
    in their RFC case, unknown names as given."""
    lowered = name.lower()
    if lowered in COMPACT_FORMS:
        return COMPACT_FORMS[lowered]
    return _CANONICAL.get(lowered, name)


def _check_header(name: str, value: str) -> None:
    if not _is_token(name):
        raise SipUsageError(UsageErrorCode.BAD_HEADER, f"header name {name[:64]!r} is not a token")
    if _INJECTION_RE.search(value):
        raise SipUsageError(UsageErrorCode.BAD_HEADER, f"header {name[:64]!r} has CR or LF")


class Headers:
    """An ordered, case-insensitive multi-map of header fields.

    Names are stored canonical (:func:`canonical_name`); lookups accept any case and compact
    forms. Each entry is one header field as it appeared (a list header may hold several
    comma-separated values: :meth:`get_all` splits them, :meth:`raw` does not). Iteration
    yields ``(name, value)`` in order. :meth:`add` and :meth:`set` refuse names that are not
    tokens and values with CR or LF (no header injection).
    """

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: list[tuple[str, str]] = []
        for name, value in items:
            self.add(name, value)

    @classmethod
    def _trusted(cls, items: list[tuple[str, str]]) -> Headers:
        headers = cls()
        headers._items = items
        return headers

    def get(self, name: str) -> str | None:
        """The first field's value, or None."""
        key = canonical_name(name).lower()
        for item_name, value in self._items:
            if item_name.lower() == key:
                return value
        return None

    def raw(self, name: str) -> list[str]:
        """Every field's value, unsplit, in order."""
        key = canonical_name(name).lower()
        return [value for item_name, value in self._items if item_name.lower() == key]

    def get_all(self, name: str) -> list[str]:
        """Every value in order; list headers (:data:`LIST_HEADERS`) split at top-level
        commas (7.3.1), never inside quotes or ``<...>`` (:func:`split_list`)."""
        canonical = canonical_name(name)
        values = self.raw(canonical)
        if canonical not in LIST_HEADERS:
            return values
        out: list[str] = []
        for value in values:
            out.extend(split_list(value))
        return out

    def add(self, name: str, value: str) -> None:
        _check_header(name, value)
        self._items.append((canonical_name(name), value))

    def set(self, name: str, value: str) -> None:
        """Replace every field called ``name`` with one, where the first one was (or last)."""
        _check_header(name, value)
        canonical = canonical_name(name)
        key = canonical.lower()
        out: list[tuple[str, str]] = []
        placed = False
        for item in self._items:
            if item[0].lower() == key:
                if not placed:
                    out.append((canonical, value))
                    placed = True
                continue
            out.append(item)
        if not placed:
            out.append((canonical, value))
        self._items = out

    def replace_first(self, name: str, value: str) -> None:
        """Replace the value of the first field called ``name`` (which must exist)."""
        _check_header(name, value)
        key = canonical_name(name).lower()
        for index, (item_name, _) in enumerate(self._items):
            if item_name.lower() == key:
                self._items[index] = (item_name, value)
                return
        raise KeyError(name)

    def remove(self, name: str) -> int:
        """Remove every field called ``name``; return how many there were."""
        key = canonical_name(name).lower()
        before = len(self._items)
        self._items = [item for item in self._items if item[0].lower() != key]
        return before - len(self._items)

    def copy(self) -> Headers:
        return Headers._trusted(list(self._items))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headers) and self._items == other._items

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


# --------------------------------------------------------------------------- messages


def _missing(name: str) -> SipParseError:
    return SipParseError(
        ParseErrorCode.MISSING_HEADER, f"no {name} header", reason=f"Missing {name} Header"
    )


def _bad(name: str, value: str, why: str = "") -> SipParseError:
    detail = f" ({why})" if why else ""
    return SipParseError(
        ParseErrorCode.MALFORMED_HEADER,
        f"{name} {value[:64]!r} is malformed{detail}",
        reason=f"Bad {name} Header",
    )


class _MessageBase:
    """The convenience properties requests and responses share (parsed on each access;
    :func:`parse_message` has validated them, so they raise only on hand-built messages)."""

    headers: Headers

    def _required(self, name: str) -> str:
        value = self.headers.get(name)
        if value is None:
            raise _missing(name)
        return value

    @property
    def call_id(self) -> str:
        return self._required("Call-ID")

    @property
    def cseq(self) -> tuple[int, str]:
        """(sequence number, method) (20.16, 8.1.1.5)."""
        value = self._required("CSeq")
        match = _CSEQ_RE.fullmatch(value.strip())
        if match is None or int(match.group(1)) >= _MAX_CSEQ:
            raise _bad("CSeq", value)
        return int(match.group(1)), match.group(2)

    @property
    def from_(self) -> NameAddr:
        return parse_name_addr(self._required("From"))

    @property
    def to(self) -> NameAddr:
        return parse_name_addr(self._required("To"))

    @property
    def vias(self) -> list[Via]:
        values = self.headers.get_all("Via")
        if not values:
            raise _missing("Via")
        return [parse_via(value) for value in values]

    @property
    def top_via(self) -> Via:
        return self.vias[0]

    @property
    def content_type(self) -> str | None:
        value = self.headers.get("Content-Type")
        return value.strip() if value is not None else None


@dataclass(eq=True)
class SipRequest(_MessageBase):
    """A request (7.1): ``method``, ``uri`` (the Request-URI as text), headers, body."""

    method: str
    uri: str
    headers: Headers
    body: bytes = b""

    @property
    def request_uri(self) -> SipUri:
        return parse_uri(self.uri)

    @property
    def max_forwards(self) -> int | None:
        """Max-Forwards (8.1.1.6), None when absent."""
        value = self.headers.get("Max-Forwards")
        if value is None:
            return None
        text = value.strip()
        if not text.isascii() or not text.isdigit() or len(text) > 5 or int(text) > 255:
            raise _bad("Max-Forwards", value)
        return int(text)


@dataclass(eq=True)
class SipResponse(_MessageBase):
    """A response (7.2): ``status``, ``reason`` (may be empty), headers, body."""

    status: int
    reason: str
    headers: Headers
    body: bytes = b""


SipMessage: TypeAlias = SipRequest | SipResponse


# --------------------------------------------------------------------------- parsing


def _start_line_error(line: str, partial: SipMessage | None = None) -> SipParseError:
    return SipParseError(
        ParseErrorCode.MALFORMED_START_LINE,
        f"start line {line[:64]!r}",
        reason="Malformed Start Line",
        partial=partial,
    )


def _split_head(head: bytes) -> tuple[str, list[tuple[str, str]], SipParseError | None]:
    """Start line, header fields (unfolded, names canonical) and the first header problem:
    fields that cannot be read are skipped so the rest can still answer the request."""
    text = head.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if len(line) > MAX_LINE_BYTES + 1:
            raise SipParseError(
                ParseErrorCode.LINE_TOO_LONG,
                f"line {index + 1} is {len(line)} characters, limit {MAX_LINE_BYTES}",
                reason="Header Line Too Long",
            )
        if line.endswith("\r"):
            lines[index] = line[:-1]
    start = lines[0].strip(" \t")  # RFC 4475 3.1.2.10 (trws): trailing SP tolerated
    logical: list[str] = []
    problem: SipParseError | None = None
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):  # 7.3.1 folding
            if not logical:
                problem = problem or SipParseError(
                    ParseErrorCode.MALFORMED_HEADER,
                    "continuation line before the first header",
                    reason="Malformed Header",
                )
                continue
            logical[-1] = logical[-1].rstrip(" \t") + " " + line.strip(" \t")
        else:
            logical.append(line)
    if len(logical) > MAX_HEADERS:
        problem = SipParseError(
            ParseErrorCode.TOO_MANY_HEADERS,
            f"{len(logical)} header fields, limit {MAX_HEADERS}",
            reason="Too Many Headers",
        )
        logical = logical[:MAX_HEADERS]
    fields: list[tuple[str, str]] = []
    for line in logical:
        if not line:  # a head with no blank line after it ends with one empty line
            continue
        name, colon, value = line.partition(":")
        name = name.strip(" \t")
        value = value.strip(" \t")
        if len(line) > MAX_LINE_BYTES:
            problem = problem or SipParseError(
                ParseErrorCode.LINE_TOO_LONG,
                f"header {name[:64]!r} is {len(line)} characters, limit {MAX_LINE_BYTES}",
                reason="Header Line Too Long",
            )
            continue
        if not colon or not _is_token(name) or "\r" in value:
            problem = problem or SipParseError(
                ParseErrorCode.MALFORMED_HEADER,
                f"header line {line[:64]!r}",
                reason="Malformed Header",
            )
            continue
        fields.append((canonical_name(name), value))
    return start, fields, problem


def _parse_start(start: str, headers: Headers, body: bytes) -> SipMessage:
    """The start line (7.1 Request-Line, 7.2 Status-Line) as a message with ``headers``."""
    if start[:4].upper() == "SIP/":  # 7.2 Status-Line = SIP-Version SP Status-Code SP Reason
        version, _, rest = start.partition(" ")
        status_text, _, reason = rest.partition(" ")
        if (
            version.upper() != SIP_VERSION
            or len(status_text) != 3
            or not status_text.isdigit()
            or not 100 <= int(status_text) <= 699
        ):
            raise _start_line_error(start)
        return SipResponse(int(status_text), reason, headers, body)
    parts = start.split()  # RFC 4475 3.1.2.9 (lwsstart): runs of SP tolerated
    if len(parts) < 3 or not _is_token(parts[0]):
        raise _start_line_error(start)
    method, version = parts[0], parts[-1]
    request = SipRequest(method, " ".join(parts[1:-1]), headers, body)
    if len(parts) > 3:  # RFC 4475 3.1.2.8 (lwsruri): whitespace inside the Request-URI
        raise SipParseError(
            ParseErrorCode.MALFORMED_START_LINE,
            f"whitespace in the Request-URI {request.uri[:64]!r}",
            reason="Bad Request-URI",
            partial=request,
        )
    if version.upper() != SIP_VERSION:
        if _VERSION_RE.fullmatch(version):  # 8.2.6 / 21.5.20: 505 Version Not Supported
            raise SipParseError(
                ParseErrorCode.UNSUPPORTED_VERSION,
                f"version {version[:16]!r}",
                status=505,
                reason="Version Not Supported",
                partial=request,
            )
        raise _start_line_error(start, request)
    return request


def _validate(message: SipMessage) -> None:
    """Mandatory headers (8.1.1), single-valued headers, and the values this package
    relies on. Raises :class:`SipParseError` without ``partial`` (the caller adds it)."""
    headers = message.headers
    if isinstance(message, SipRequest):
        try:
            parse_uri(message.uri)
        except SipParseError:
            raise SipParseError(
                ParseErrorCode.MALFORMED_START_LINE,
                f"Request-URI {message.uri[:64]!r}",
                reason="Bad Request-URI",
            ) from None
    for name in ("Via", "From", "To", "Call-ID", "CSeq"):
        if name not in headers:
            raise _missing(name)
    for name in _SINGLE_HEADERS:
        if len(headers.raw(name)) > 1:
            raise SipParseError(
                ParseErrorCode.DUPLICATE_HEADER,
                f"{len(headers.raw(name))} {name} headers",
                reason=f"Multiple {name} Headers",
            )
    call_id = message.call_id
    if not call_id or any(c.isspace() for c in call_id):
        raise _bad("Call-ID", call_id)
    _, method = message.cseq
    if isinstance(message, SipRequest):
        if method != message.method:  # 8.1.1.5; RFC 4475 3.1.2.? (mismatch01)
            raise SipParseError(
                ParseErrorCode.MALFORMED_HEADER,
                f"CSeq method {method[:32]!r} is not the request's {message.method[:32]!r}",
                reason="CSeq Method Mismatch",
            )
        _ = message.max_forwards
    for name in ("From", "To"):
        value = headers.get(name) or ""
        try:
            parse_name_addr(value)
        except SipParseError as exc:
            raise _bad(name, value, exc.message) from None
    _ = message.vias


def _content_length(headers: Headers) -> int | None:
    values = {value.strip() for value in headers.raw("Content-Length")}
    if not values:
        return None
    if len(values) > 1:
        raise SipParseError(
            ParseErrorCode.BAD_CONTENT_LENGTH,
            "Content-Length headers disagree",
            reason="Bad Content-Length",
        )
    (text,) = values
    if not text.isascii() or not text.isdigit() or len(text) > _MAX_CONTENT_LENGTH_DIGITS:
        raise SipParseError(
            ParseErrorCode.BAD_CONTENT_LENGTH,
            f"Content-Length {text[:32]!r}",
            reason="Bad Content-Length",
        )
    return int(text)


def parse_message(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> SipMessage:
    """Parse one datagram (7, 18.3, 25). Raises :class:`SipParseError`; see the module
    docstring for what is accepted."""
    stripped = data.lstrip(b"\r\n")  # 7.5: CRLFs before the start line are ignored
    if not stripped.strip(b" \t\r\n\x00"):
        raise SipParseError(ParseErrorCode.EMPTY, "no message (a keepalive?)")
    end = _HEAD_END_RE.search(stripped)
    head, body = (
        (stripped, b"") if end is None else (stripped[: end.start()], stripped[end.end() :])
    )
    if len(data) > max_bytes:
        partial: SipMessage | None = None
        if end is not None and len(data) - len(stripped) + end.end() <= max_bytes:
            try:
                start, fields, _ = _split_head(head)
                partial = _parse_start(start, Headers._trusted(fields), b"")
            except SipParseError as exc:
                partial = exc.partial
        raise SipParseError(
            ParseErrorCode.TOO_LARGE,
            f"{len(data)} bytes, limit {max_bytes}",
            status=513,
            reason="Message Too Large",
            partial=partial,
        )
    start, fields, problem = _split_head(head)
    message = _parse_start(start, Headers._trusted(fields), body)
    try:
        if problem is not None:
            raise problem
        _validate(message)
        length = _content_length(message.headers)
        if length is not None:
            if length > len(body):  # 18.3: on UDP a short body is an error
                raise SipParseError(
                    ParseErrorCode.BAD_CONTENT_LENGTH,
                    f"Content-Length {length} but {len(body)} body bytes",
                    reason="Bad Content-Length",
                )
            message.body = body[:length]  # 18.3: extra bytes are discarded
    except SipParseError as exc:
        exc.partial = message
        raise
    return message


# --------------------------------------------------------------------------- serializing


def serialize(message: SipMessage) -> bytes:
    """The message as a datagram: CRLF line ends, headers in order, ``Content-Length``
    (the first one's position, else last) set from the body (20.14)."""
    if isinstance(message, SipRequest):
        lines = [f"{message.method} {message.uri} {SIP_VERSION}"]
    else:
        lines = [f"{SIP_VERSION} {message.status} {message.reason}"]
    length_written = False
    for name, value in message.headers:
        if name == "Content-Length":
            if length_written:
                continue
            value = str(len(message.body))
            length_written = True
        lines.append(f"{name}: {value}" if value else f"{name}:")
    if not length_written:
        lines.append(f"Content-Length: {len(message.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + message.body


#: 21: the reason phrases this package writes when none is given.
REASON_PHRASES: Final = {
    100: "Trying",
    180: "Ringing",
    181: "Call Is Being Forwarded",
    182: "Queued",
    183: "Session Progress",
    200: "OK",
    202: "Accepted",
    300: "Multiple Choices",
    301: "Moved Permanently",
    302: "Moved Temporarily",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    408: "Request Timeout",
    410: "Gone",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    416: "Unsupported URI Scheme",
    420: "Bad Extension",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    483: "Too Many Hops",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    491: "Request Pending",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Server Time-out",
    505: "Version Not Supported",
    513: "Message Too Large",
    600: "Busy Everywhere",
    603: "Decline",
}

_TAG_RE: Final = re.compile(r";\s*tag\s*=", re.IGNORECASE)


def _has_tag(to_value: str) -> bool:
    try:
        return parse_name_addr(to_value).tag is not None
    except SipParseError:
        return _TAG_RE.search(to_value) is not None


def build_response(
    request: SipRequest,
    status: int,
    reason: str | None = None,
    *,
    to_tag: str | None = None,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
    content_type: str | None = None,
    record_route: bool = False,
) -> SipResponse:
    """A response to ``request`` (8.2.6.2): every Via field in order, From, Call-ID and CSeq
    copied as received, To copied with ``;tag=to_tag`` appended when it has no tag yet.

    ``record_route``: copy Record-Route too (12.1.1: a UAS answering a dialog-creating
    request copies it into its 2xx and 18x); honoured only for 101..299. Then ``headers``,
    then ``Content-Type`` when given. Headers missing from a partially parsed request are
    skipped. Raises :class:`SipUsageError` for a status outside 100..699 or a bad header.
    """
    if not 100 <= status <= 699:
        raise SipUsageError(UsageErrorCode.BAD_STATUS, f"status {status} is not 100..699")
    if reason is None:
        reason = REASON_PHRASES.get(status, "Unknown")
    if "\r" in reason or "\n" in reason:
        raise SipUsageError(UsageErrorCode.BAD_ARGUMENT, "CR or LF in the reason phrase")
    out: list[tuple[str, str]] = [("Via", value) for value in request.headers.raw("Via")]
    for name in ("From", "To", "Call-ID", "CSeq"):
        value = request.headers.get(name)
        if value is None:
            continue
        if name == "To" and to_tag is not None and not _has_tag(value):
            value = f"{value};tag={to_tag}"
        out.append((name, value))
    if record_route and 101 <= status <= 299:
        out.extend(("Record-Route", value) for value in request.headers.raw("Record-Route"))
    response = SipResponse(status, reason, Headers._trusted(out), body)
    for name, value in headers:
        response.headers.add(name, value)
    if content_type is not None:
        response.headers.add("Content-Type", content_type)
    return response
