"""SIP digest authentication, server side (RFC 3261 22.4, RFC 2617, RFC 7616, RFC 8760).

A sans-I/O core for a UAS that challenges the INVITEs of SIP trunks: it writes
``WWW-Authenticate`` values, parses ``Authorization`` values and checks them. It never
touches a socket, a clock or global state: time comes in as ``now`` (seconds, one clock for
the challenge and the check; use wall-clock time when several processes share the secret
or when nonces must survive a restart), and the source host as a string.

Contract:

* :meth:`DigestAuthenticator.challenges` gives one ``WWW-Authenticate`` value per offered
  algorithm, in order of preference (a 401 carries them all, as RFC 8760 asks of a UAS),
  each with ``qop="auth"`` and, when asked, ``stale=true``.
* :func:`parse_authorization` turns an ``Authorization`` value into
  :class:`DigestCredentials`, or raises :class:`DigestError` (remote misbehaviour; a UAS
  answers 400). Scheme and parameter names are case-insensitive, parameters come in any
  order, every value may be a quoted-string (its quoted-pairs resolved) or a bare token,
  unknown parameters (``opaque`` is kept) are ignored, and ``cnonce``/``nc`` without
  ``qop`` are kept but play no part in the response (RFC 2617 3.2.2).
* :meth:`DigestAuthenticator.verify` checks credentials against a request and returns a
  :class:`DigestResult`; it never raises on what a peer sent. Its verdicts, by precedence:
  ``BAD_NONCE`` (not one of ours for this source host and realm, or an algorithm we do not
  offer), ``WRONG_REALM`` (one of our nonces, another realm), ``STALE`` (one of our nonces
  for this host, older than ``nonce_lifetime_s`` or from more than one second in the
  future: challenge again with ``stale=true``, RFC 2617 3.2.1; the response is not looked
  at, so a stale nonce tells nothing of the password), ``UNKNOWN_USER``, ``WRONG_URI``
  (the ``uri`` parameter is not the Request-URI, compared as exact strings, RFC 2617
  3.2.2.5), ``WRONG`` (the response), ``OK``. The expected response is computed for an
  unknown user too (with a dummy password), so that timing does not tell which users
  exist; a UAS that answers ``UNKNOWN_USER`` and ``WRONG`` alike keeps that secret.
* Failed guesses (:attr:`DigestVerdict.failed_guess`): only ``UNKNOWN_USER``,
  ``WRONG_URI`` and ``WRONG``, the verdicts of a response computed over a valid, unexpired
  nonce that this authenticator issued to the source host. A lockout counts these and
  nothing else: a wrong realm, a foreign, forged or old nonce and an ``Authorization``
  that does not parse are not guesses at the password, and anyone can send them in
  another host's name over UDP (the nonce only reaches the host it was issued to).
* :func:`digest_response` is the computation itself (RFC 2617 3.2.2.1, RFC 7616 3.4.1),
  also what a test UAC needs to answer a challenge.

Nonces are stateless: the issue time (milliseconds) and an HMAC-SHA256, keyed by the
secret, over that time, the source host and the realm, in url-safe base64 without
padding. :meth:`~DigestAuthenticator.verify` needs no table of issued nonces, so nothing
grows with traffic and nothing is lost on restart (given the same secret), but nothing is
remembered either: ``nc`` is not tracked, so an intercepted ``Authorization`` can be
replayed from the same source host (for the same method and Request-URI) until the nonce
is ``nonce_lifetime_s`` old. Binding the nonce to the source host (which UDP lets an
attacker forge) and keeping the lifetime short are the only defences here; a trunk that
needs more should be reached over TLS, or admitted by an allow-list of addresses too.

Algorithms: SHA-256 (RFC 7616, for SIP RFC 8760) is offered first, as RFC 8760 asks (the
most preferred challenge first, MD5 last). MD5 is still offered by default because most
trunks and PBXs speak only MD5. The ``-sess`` variants (MD5-sess, SHA-256-sess) and
``qop=auth-int`` are not supported: credentials using them are rejected by the parser
with a code that says so. ``userhash`` (RFC 7616 3.4.4) is not supported either; a hashed
username is just an unknown user.

Limits: an ``Authorization`` value of at most :data:`MAX_AUTHORIZATION_CHARS` characters,
each parameter value (unquoted) of at most :data:`MAX_PARAM_CHARS`.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from telephony.sip.message import SipProtocolError, _unquote, split_list

__all__ = [
    "MAX_AUTHORIZATION_CHARS",
    "MAX_PARAM_CHARS",
    "DigestAlgorithm",
    "DigestAuthenticator",
    "DigestCredentials",
    "DigestError",
    "DigestErrorCode",
    "DigestResult",
    "DigestVerdict",
    "digest_response",
    "parse_authorization",
]

#: The longest ``Authorization`` value :func:`parse_authorization` reads (characters).
MAX_AUTHORIZATION_CHARS: Final = 4096
#: The longest parameter value, once unquoted (characters).
MAX_PARAM_CHARS: Final = 1024


class DigestAlgorithm(enum.StrEnum):
    """The ``algorithm`` values supported (RFC 7616 3.3, RFC 8760 2.1)."""

    MD5 = "MD5"
    SHA256 = "SHA-256"


class DigestErrorCode(enum.StrEnum):
    """Machine-readable codes of :class:`DigestError`, one per family of fault."""

    HEADER_TOO_LONG = "header_too_long"
    VALUE_TOO_LONG = "value_too_long"
    MALFORMED = "malformed"  # not "scheme name=value, ..." (an unterminated quote...)
    BAD_SCHEME = "bad_scheme"  # a scheme other than Digest
    DUPLICATE_PARAM = "duplicate_param"
    MISSING_PARAM = "missing_param"  # username, realm, nonce, uri or response
    UNSUPPORTED_ALGORITHM = "unsupported_algorithm"  # incl. the -sess variants
    UNSUPPORTED_QOP = "unsupported_qop"  # anything but auth (auth-int included)
    INCOMPLETE_QOP = "incomplete_qop"  # qop without cnonce or nc
    BAD_NC = "bad_nc"  # not 8 hex digits
    BAD_RESPONSE = "bad_response"  # not hex of the algorithm's digest length


class DigestError(SipProtocolError):
    """An ``Authorization`` value that cannot be read (remote misbehaviour: answer 400)."""

    code: DigestErrorCode

    def __init__(self, code: DigestErrorCode, message: str) -> None:
        super().__init__(code, message)


@dataclass(frozen=True, slots=True)
class DigestCredentials:
    """A parsed ``Authorization`` value of scheme Digest (RFC 2617 3.2.2, RFC 3261 25.1).

    Values are as sent (unquoted): ``qop``, ``nc`` and ``response`` keep their case.
    """

    username: str
    realm: str
    nonce: str
    uri: str
    response: str
    algorithm: DigestAlgorithm = DigestAlgorithm.MD5
    qop: str | None = None
    cnonce: str | None = None
    nc: str | None = None
    opaque: str | None = None


class DigestVerdict(enum.StrEnum):
    """What :meth:`DigestAuthenticator.verify` concluded."""

    OK = "ok"
    STALE = "stale"
    WRONG = "wrong"
    UNKNOWN_USER = "unknown_user"
    BAD_NONCE = "bad_nonce"
    WRONG_REALM = "wrong_realm"
    WRONG_URI = "wrong_uri"

    @property
    def failed_guess(self) -> bool:
        """A response computed over a valid, unexpired nonce of ours for the source host
        that is not right: the only verdicts a lockout may count (module docstring)."""
        return self in _FAILED_GUESSES


_FAILED_GUESSES: Final = frozenset(
    {DigestVerdict.UNKNOWN_USER, DigestVerdict.WRONG_URI, DigestVerdict.WRONG}
)


@dataclass(frozen=True, slots=True)
class DigestResult:
    """A verdict; ``username`` is set when the password was right (``OK`` only)."""

    verdict: DigestVerdict
    username: str | None = None


# --------------------------------------------------------------------------- parsing

# RFC 3261 25.1: token (a subset of HTTP's tchar, RFC 7230 3.2.6)
_TOKEN: Final = r"[A-Za-z0-9\-.!%*_+`'~]+"
_LWS: Final = r"[ \t\r\n]*"
# One auth-param: name LWS "=" LWS (quoted-string / token). The quoted-string alternatives
# are disjoint single characters, so matching is linear.
_PARAM_RE: Final = re.compile(
    rf'({_TOKEN}){_LWS}={_LWS}("(?:[^"\\]|\\.)*"|{_TOKEN})',
    re.DOTALL,
)
_SCHEME_RE: Final = re.compile(rf"{_LWS}({_TOKEN})(?:[ \t\r\n]+(.*))?", re.DOTALL)
_NC_RE: Final = re.compile(r"[0-9A-Fa-f]{8}")
_HEX_RE: Final = re.compile(r"[0-9A-Fa-f]+")
_REQUIRED: Final = ("username", "realm", "nonce", "uri", "response")
# RFC 7616 3.3: the session variants (MD5-sess, SHA-256-sess...), refused by name.
_SESS_SUFFIX: Final = "-sess"

_HASH_NAMES: Final[Mapping[DigestAlgorithm, str]] = {
    DigestAlgorithm.MD5: "md5",
    DigestAlgorithm.SHA256: "sha256",
}
_HEX_LENGTHS: Final[Mapping[DigestAlgorithm, int]] = {
    DigestAlgorithm.MD5: 32,
    DigestAlgorithm.SHA256: 64,
}


def _shown(value: str) -> str:
    """A peer's value for an error message: repr'd and cut short."""
    return repr(value[:40] + ("..." if len(value) > 40 else ""))


def parse_authorization(value: str) -> DigestCredentials:
    """Parse an ``Authorization`` header value of scheme Digest.

    Raises :class:`DigestError` with one :class:`DigestErrorCode` per family of fault; see
    the module docstring for what is accepted.
    """
    if len(value) > MAX_AUTHORIZATION_CHARS:
        raise DigestError(
            DigestErrorCode.HEADER_TOO_LONG,
            f"Authorization of {len(value)} characters (at most {MAX_AUTHORIZATION_CHARS})",
        )
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise DigestError(DigestErrorCode.MALFORMED, "not text a message could hold") from None
    scheme_match = _SCHEME_RE.fullmatch(value)
    if scheme_match is None:
        raise DigestError(DigestErrorCode.MALFORMED, "no auth scheme")
    scheme, rest = scheme_match.group(1), scheme_match.group(2) or ""
    if scheme.lower() != "digest":
        raise DigestError(DigestErrorCode.BAD_SCHEME, f"scheme {_shown(scheme)}, not Digest")

    params: dict[str, str] = {}
    for element in split_list(rest):
        match = _PARAM_RE.fullmatch(element)
        if match is None:
            raise DigestError(DigestErrorCode.MALFORMED, f"not name=value: {_shown(element)}")
        name = match.group(1).lower()
        raw = match.group(2)
        param = _unquote(raw) if raw.startswith('"') else raw
        if len(param) > MAX_PARAM_CHARS:
            raise DigestError(
                DigestErrorCode.VALUE_TOO_LONG,
                f"{name} of {len(param)} characters (at most {MAX_PARAM_CHARS})",
            )
        if name in params:
            raise DigestError(DigestErrorCode.DUPLICATE_PARAM, f"{name} given twice")
        params[name] = param

    for name in _REQUIRED:
        if name not in params:
            raise DigestError(DigestErrorCode.MISSING_PARAM, f"no {name}")

    algorithm = _parse_algorithm(params.get("algorithm"))
    qop = params.get("qop")
    cnonce = params.get("cnonce")
    nc = params.get("nc")
    if qop is not None:
        if not (qop.isascii() and qop.lower() == "auth"):
            raise DigestError(
                DigestErrorCode.UNSUPPORTED_QOP,
                f"qop {_shown(qop)}: only auth is supported (not auth-int)",
            )
        if cnonce is None or nc is None:
            raise DigestError(
                DigestErrorCode.INCOMPLETE_QOP, "qop=auth needs cnonce and nc (RFC 2617 3.2.2)"
            )
    if nc is not None and _NC_RE.fullmatch(nc) is None:
        raise DigestError(DigestErrorCode.BAD_NC, f"nc {_shown(nc)} is not 8 hex digits")
    response = params["response"]
    length = _HEX_LENGTHS[algorithm]
    if len(response) != length or _HEX_RE.fullmatch(response) is None:
        raise DigestError(
            DigestErrorCode.BAD_RESPONSE,
            f"response is not {length} hex digits, as {algorithm} gives",
        )
    return DigestCredentials(
        username=params["username"],
        realm=params["realm"],
        nonce=params["nonce"],
        uri=params["uri"],
        response=response,
        algorithm=algorithm,
        qop=qop,
        cnonce=cnonce,
        nc=nc,
        opaque=params.get("opaque"),
    )


def _parse_algorithm(value: str | None) -> DigestAlgorithm:
    """RFC 2617 3.2.1: an absent algorithm is MD5; names compare case-insensitively."""
    if value is None:
        return DigestAlgorithm.MD5
    for algorithm in DigestAlgorithm:
        if value.isascii() and value.upper() == algorithm.value:
            return algorithm
    if value.lower().endswith(_SESS_SUFFIX):
        raise DigestError(
            DigestErrorCode.UNSUPPORTED_ALGORITHM,
            f"algorithm {_shown(value)}: the -sess variants are not supported",
        )
    raise DigestError(
        DigestErrorCode.UNSUPPORTED_ALGORITHM,
        f"algorithm {_shown(value)}: only MD5 and SHA-256 are supported",
    )


# --------------------------------------------------------------------------- computing


def _h(algorithm: DigestAlgorithm, text: str) -> str:
    """H(data) in lowercase hex; text as the bytes it was read from (surrogateescape)."""
    return hashlib.new(_HASH_NAMES[algorithm], text.encode("utf-8", "surrogateescape")).hexdigest()


def digest_response(
    *,
    algorithm: DigestAlgorithm,
    username: str,
    realm: str,
    password: str,
    method: str,
    uri: str,
    nonce: str,
    qop: str | None = None,
    cnonce: str | None = None,
    nc: str | None = None,
) -> str:
    """The ``response`` value, in lowercase hex (RFC 2617 3.2.2.1, RFC 7616 3.4.1).

    HA1 = H(username:realm:password), HA2 = H(method:uri); with ``qop`` (auth), response =
    H(HA1:nonce:nc:cnonce:qop:HA2), without it (RFC 2069 compatibility) H(HA1:nonce:HA2).
    ``qop``, ``nc`` and ``cnonce`` go into the hash as given. Raises ValueError for a qop
    other than auth, or a qop without cnonce and nc.
    """
    ha1 = _h(algorithm, f"{username}:{realm}:{password}")
    ha2 = _h(algorithm, f"{method}:{uri}")
    if qop is None:
        return _h(algorithm, f"{ha1}:{nonce}:{ha2}")
    if not (qop.isascii() and qop.lower() == "auth"):
        raise ValueError(f"qop {qop!r} is not supported (only auth)")
    if cnonce is None or nc is None:
        raise ValueError("qop=auth needs cnonce and nc")
    return _h(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")


# --------------------------------------------------------------------------- authenticator

_MIN_SECRET_BYTES: Final = 16
_FUTURE_TOLERANCE_S: Final = 1.0
_TIME: Final = struct.Struct("!q")  # issue time, milliseconds, signed 64 bits
_MAC_BYTES: Final = 32  # HMAC-SHA256, untruncated
_NONCE_BYTES: Final = _TIME.size + _MAC_BYTES
_NONCE_CHARS: Final = (_NONCE_BYTES * 4 + 2) // 3  # base64 without padding: 54
_NONCE_RE: Final = re.compile(rf"[A-Za-z0-9_\-]{{{_NONCE_CHARS}}}")
_NONCE_DOMAIN: Final = b"telephony.sip.digest nonce v1\x00"
_MAX_NOW: Final = 2.0**62 / 1000  # keeps the milliseconds inside the 64-bit field
# Password of the digest computed for an unknown user, so that its timing is a known one's.
_DUMMY_PASSWORD: Final = "\x00unknown-user\x00"


def _b64(raw: bytes) -> str:
    """url-safe base64 without padding (RFC 4648 5)."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _check_now(now: float) -> None:
    if not math.isfinite(now) or abs(now) >= _MAX_NOW:
        raise ValueError(f"now must be a finite time in seconds, not {now!r}")


class DigestAuthenticator:
    """Challenges and checks digest credentials for one realm (see the module docstring).

    ``passwords`` (username to password) is read at each :meth:`verify`, not copied, so a
    caller may change the mapping it passed. Raises ValueError for a ``secret`` under 16
    bytes, an empty realm or one with a control character, ``"`` or ``\\``, a lifetime that
    is not positive, or an empty or repeating list of algorithms.
    """

    __slots__ = ("_algorithms", "_lifetime", "_passwords", "_realm", "_secret")

    def __init__(
        self,
        *,
        realm: str,
        secret: bytes,
        passwords: Mapping[str, str],
        nonce_lifetime_s: float = 300.0,
        algorithms: Sequence[DigestAlgorithm] = (DigestAlgorithm.SHA256, DigestAlgorithm.MD5),
    ) -> None:
        if len(secret) < _MIN_SECRET_BYTES:
            raise ValueError(f"secret must be at least {_MIN_SECRET_BYTES} bytes")
        if not realm or not realm.isprintable() or '"' in realm or "\\" in realm:
            raise ValueError(
                f"realm must be non-empty printable text without quote or backslash: {realm!r}"
            )
        if not (math.isfinite(nonce_lifetime_s) and nonce_lifetime_s > 0):
            raise ValueError(f"nonce_lifetime_s must be positive, not {nonce_lifetime_s!r}")
        offered = tuple(DigestAlgorithm(algorithm) for algorithm in algorithms)
        if not offered or len(set(offered)) != len(offered):
            raise ValueError(f"algorithms must be non-empty and distinct: {offered!r}")
        self._realm = realm
        self._secret = bytes(secret)
        self._passwords = passwords
        self._lifetime = float(nonce_lifetime_s)
        self._algorithms = offered

    @property
    def realm(self) -> str:
        return self._realm

    @property
    def algorithms(self) -> tuple[DigestAlgorithm, ...]:
        return self._algorithms

    def challenges(self, now: float, source_host: str, *, stale: bool = False) -> list[str]:
        """The ``WWW-Authenticate`` values of a 401, one per algorithm in order of
        preference, sharing a nonce bound to ``source_host`` and issued at ``now``."""
        _check_now(now)
        nonce = self._make_nonce(round(now * 1000), source_host)
        suffix = ", stale=true" if stale else ""
        return [
            f'Digest realm="{self._realm}", nonce="{nonce}", algorithm={algorithm}, '
            f'qop="auth"{suffix}'
            for algorithm in self._algorithms
        ]

    def verify(
        self,
        credentials: DigestCredentials,
        *,
        method: str,
        request_uri: str,
        source_host: str,
        now: float,
    ) -> DigestResult:
        """Check ``credentials`` sent with a ``method`` request to ``request_uri`` from
        ``source_host`` at ``now``; the verdicts are in the module docstring."""
        _check_now(now)
        # The nonce first: nothing else is looked at unless this host was sent it.
        issued_ms = self._check_nonce(credentials.nonce, source_host)
        if issued_ms is None or credentials.algorithm not in self._algorithms:
            return DigestResult(DigestVerdict.BAD_NONCE)
        if credentials.realm != self._realm:
            return DigestResult(DigestVerdict.WRONG_REALM)
        age = now - issued_ms / 1000
        if age < -_FUTURE_TOLERANCE_S or age > self._lifetime:
            # Not checked: whether stale=true follows must not tell a right password.
            return DigestResult(DigestVerdict.STALE)
        password = self._passwords.get(credentials.username)
        # Computed whether or not the user exists: the work, and so the time, is the same.
        expected = digest_response(
            algorithm=credentials.algorithm,
            username=credentials.username,
            realm=credentials.realm,
            password=_DUMMY_PASSWORD if password is None else password,
            method=method,
            uri=credentials.uri,
            nonce=credentials.nonce,
            qop=credentials.qop,
            cnonce=credentials.cnonce,
            nc=credentials.nc,
        )
        matches = hmac.compare_digest(
            expected.encode(), credentials.response.lower().encode("utf-8", "surrogateescape")
        )
        if password is None:
            return DigestResult(DigestVerdict.UNKNOWN_USER)
        if credentials.uri != request_uri:
            return DigestResult(DigestVerdict.WRONG_URI)
        if not matches:
            return DigestResult(DigestVerdict.WRONG)
        return DigestResult(DigestVerdict.OK, credentials.username)

    # ----------------------------------------------------------------------- nonces

    def _mac(self, issued: bytes, source_host: str) -> bytes:
        host = source_host.encode("utf-8", "surrogateescape")
        message = b"".join(
            (
                _NONCE_DOMAIN,
                issued,
                struct.pack("!I", len(host)),
                host,
                self._realm.encode("utf-8", "surrogateescape"),
            )
        )
        return hmac.digest(self._secret, message, "sha256")

    def _make_nonce(self, issued_ms: int, source_host: str) -> str:
        issued = _TIME.pack(issued_ms)
        return _b64(issued + self._mac(issued, source_host))

    def _check_nonce(self, nonce: str, source_host: str) -> int | None:
        """The issue time (ms) of one of our nonces for ``source_host``, else None."""
        if _NONCE_RE.fullmatch(nonce) is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(nonce + "=" * (-len(nonce) % 4))
        except (binascii.Error, ValueError):
            return None
        # One string per nonce: the last character's unused bits must be zero.
        if len(raw) != _NONCE_BYTES or _b64(raw) != nonce:
            return None
        issued, mac = raw[: _TIME.size], raw[_TIME.size :]
        if not hmac.compare_digest(mac, self._mac(issued, source_host)):
            return None
        issued_ms: int = _TIME.unpack(issued)[0]
        return issued_ms
