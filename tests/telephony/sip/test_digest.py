"""SIP digest authentication, server side: vectors, round trips, verdicts, parsing.

Vectors: RFC 2617 3.5 (MD5, qop=auth), RFC 7616 3.9.1 (SHA-256 and MD5, qop=auth) and,
for the RFC 2069 form without qop, the two ``DigestAuth.BasicVerification*`` cases of
SIPp's ``src/auth.cpp`` unit tests (each checked here against hashlib by hand as well).
Client headers are written as SIPp (``createAuthHeaderDigest``: no spaces, ``qop`` after
``cnonce``) and baresip's libre (``sip_auth_encode``: ``", "`` separators, ``algorithm``
last) write them.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telephony.sip import SipError, SipProtocolError
from telephony.sip import digest as digest_module
from telephony.sip.digest import (
    MAX_AUTHORIZATION_CHARS,
    MAX_PARAM_CHARS,
    DigestAlgorithm,
    DigestAuthenticator,
    DigestCredentials,
    DigestError,
    DigestErrorCode,
    DigestResult,
    DigestVerdict,
    digest_response,
    parse_authorization,
)

MD5 = DigestAlgorithm.MD5
SHA256 = DigestAlgorithm.SHA256

REALM = "gw.example.net"
SECRET = b"0123456789abcdef0123456789abcdef"
USER = "trunk-a"
PASSWORD = "s3cret pass"
HOST = "203.0.113.7"
URI = "sip:+15551234567@198.51.100.2:5060"
METHOD = "INVITE"
T0 = 1_700_000_000.25  # the challenge's time


def authenticator(**kwargs: object) -> DigestAuthenticator:
    options: dict[str, object] = {
        "realm": REALM,
        "secret": SECRET,
        "passwords": {USER: PASSWORD, "other": "other pass"},
    }
    options.update(kwargs)
    return DigestAuthenticator(**options)  # type: ignore[arg-type]


def challenge_params(challenge: str) -> dict[str, str]:
    """A test UAC's reading of a WWW-Authenticate value (ours is simple: no escapes)."""
    assert challenge.startswith("Digest ")
    return {
        name: quoted if quoted else bare
        for name, quoted, bare in re.findall(r'(\w+)=(?:"([^"]*)"|([^,\s]+))', challenge)
    }


def nonce_of(auth: DigestAuthenticator, *, now: float = T0, host: str = HOST) -> str:
    return challenge_params(auth.challenges(now, host)[0])["nonce"]


def sipp_header(
    *,
    username: str,
    realm: str,
    uri: str,
    nonce: str,
    response: str,
    algorithm: str,
    cnonce: str | None = None,
    nc: str | None = None,
) -> str:
    """As SIPp writes it: no spaces; cnonce, nc and qop (unquoted) before uri."""
    header = f'Digest username="{username}",realm="{realm}"'
    if cnonce is not None:
        header += f',cnonce="{cnonce}",nc={nc},qop=auth'
    return header + f',uri="{uri}",nonce="{nonce}",response="{response}",algorithm={algorithm}'


def baresip_header(
    *,
    username: str,
    realm: str,
    uri: str,
    nonce: str,
    response: str,
    algorithm: str,
    cnonce: str | None = None,
    nc: str | None = None,
) -> str:
    """As baresip's libre writes it, then roughed up: lowercase scheme, extra spaces."""
    header = (
        f'digest   username="{username}" ,  realm="{realm}",nonce="{nonce}", '
        f'uri="{uri}",\tresponse="{response}"'
    )
    if cnonce is not None:
        header += f', cnonce="{cnonce}", qop=auth , nc={nc}'
    return header + f",  algorithm={algorithm}  "


HeaderWriter = Callable[..., str]


def answer(
    auth: DigestAuthenticator,
    *,
    algorithm: DigestAlgorithm = SHA256,
    qop: bool = True,
    username: str = USER,
    password: str = PASSWORD,
    realm: str = REALM,
    method: str = METHOD,
    uri: str = URI,
    now: float = T0,
    host: str = HOST,
    nonce: str | None = None,
    write: HeaderWriter = sipp_header,
) -> DigestCredentials:
    """A test UAC: answer ``auth``'s challenge (for ``algorithm``), parse what it sent."""
    challenges = auth.challenges(now, host) if nonce is None else []
    for challenge in challenges:
        params = challenge_params(challenge)
        if params["algorithm"] == algorithm:
            nonce = params["nonce"]
    assert nonce is not None
    cnonce, nc = ("0a4f113b6b8b4567", "00000001") if qop else (None, None)
    response = digest_response(
        algorithm=algorithm,
        username=username,
        realm=realm,
        password=password,
        method=method,
        uri=uri,
        nonce=nonce,
        qop="auth" if qop else None,
        cnonce=cnonce,
        nc=nc,
    )
    header = write(
        username=username,
        realm=realm,
        uri=uri,
        nonce=nonce,
        response=response,
        algorithm=str(algorithm),
        cnonce=cnonce,
        nc=nc,
    )
    return parse_authorization(header)


def check(
    auth: DigestAuthenticator,
    credentials: DigestCredentials,
    *,
    now: float = T0 + 2,
    host: str = HOST,
    uri: str = URI,
    method: str = METHOD,
) -> DigestResult:
    return auth.verify(credentials, method=method, request_uri=uri, source_host=host, now=now)


# --------------------------------------------------------------------------- vectors

RFC2617_HEADER = """Digest username="Mufasa",
                 realm="testrealm@host.com",
                 nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
                 uri="/dir/index.html",
                 qop=auth,
                 nc=00000001,
                 cnonce="0a4f113b",
                 response="6629fae49393a05397450978507c4ef1",
                 opaque="5ccc069c403ebaf9f0171e9517f40e41\""""

RFC7616_HEADER = """Digest username="Mufasa",
       realm="http-auth@example.org",
       uri="/dir/index.html",
       algorithm={algorithm},
       nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
       nc=00000001,
       cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
       qop=auth,
       response="{response}",
       opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS\""""


def test_rfc2617_example() -> None:
    # RFC 2617 3.5: the Authorization of the example, folded as printed (header name cut).
    credentials = parse_authorization(RFC2617_HEADER.replace("\n", "\r\n"))
    assert credentials == DigestCredentials(
        username="Mufasa",
        realm="testrealm@host.com",
        nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
        uri="/dir/index.html",
        response="6629fae49393a05397450978507c4ef1",
        algorithm=MD5,
        qop="auth",
        cnonce="0a4f113b",
        nc="00000001",
        opaque="5ccc069c403ebaf9f0171e9517f40e41",
    )
    response = digest_response(
        algorithm=MD5,
        username="Mufasa",
        realm="testrealm@host.com",
        password="Circle Of Life",
        method="GET",
        uri="/dir/index.html",
        nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
        qop="auth",
        cnonce="0a4f113b",
        nc="00000001",
    )
    assert response == "6629fae49393a05397450978507c4ef1"


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        # RFC 7616 3.9.1: the SHA-256 response, then the MD5 one of the same example
        (SHA256, "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
        (MD5, "8ca523f5e9506fed4657c9700eebdbec"),
    ],
)
def test_rfc7616_example(algorithm: DigestAlgorithm, expected: str) -> None:
    header = RFC7616_HEADER.format(algorithm=algorithm, response=expected)
    credentials = parse_authorization(header)
    assert credentials.algorithm is algorithm
    assert credentials.opaque == "FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"
    response = digest_response(
        algorithm=credentials.algorithm,
        username=credentials.username,
        realm=credentials.realm,
        password="Circle of Life",
        method="GET",
        uri=credentials.uri,
        nonce=credentials.nonce,
        qop=credentials.qop,
        cnonce=credentials.cnonce,
        nc=credentials.nc,
    )
    assert response == expected == credentials.response


@pytest.mark.parametrize(
    ("algorithm", "nonce", "expected"),
    [
        # SIPp src/auth.cpp, DigestAuth.BasicVerification and BasicVerificationSHA256
        (MD5, "dcd98b7102dd2f0e8b11d0f600bfb0c093", "db94e01e92f2b09a52a234eeca8b90f7"),
        (
            SHA256,
            "ZaGxV2WhsCtREI2EsiD1LR0RYd",
            "91b58523b983191b52d14455a2599631990110c974ed2e4b4b49bc6053af04ce",
        ),
    ],
)
def test_without_qop(algorithm: DigestAlgorithm, nonce: str, expected: str) -> None:
    response = digest_response(
        algorithm=algorithm,
        username="testuser",
        realm="testrealm@host.com",
        password="secret",
        method="REGISTER",
        uri="sip:sip:example.com",
        nonce=nonce,
    )
    # RFC 2617 3.2.2.1, the RFC 2069 form: H(HA1:nonce:HA2)
    name = "md5" if algorithm is MD5 else "sha256"

    def h(text: str) -> str:
        return hashlib.new(name, text.encode()).hexdigest()

    ha1 = h("testuser:testrealm@host.com:secret")
    ha2 = h("REGISTER:sip:sip:example.com")
    assert response == h(f"{ha1}:{nonce}:{ha2}") == expected


def test_digest_response_rejects_what_it_cannot_compute() -> None:
    common = {
        "username": "u",
        "realm": "r",
        "password": "p",
        "method": "INVITE",
        "uri": "sip:x",
        "nonce": "n",
    }
    with pytest.raises(ValueError, match="auth-int"):
        digest_response(algorithm=MD5, qop="auth-int", cnonce="c", nc="00000001", **common)
    with pytest.raises(ValueError, match="cnonce"):
        digest_response(algorithm=MD5, qop="auth", nc="00000001", **common)
    with pytest.raises(ValueError, match="cnonce"):
        digest_response(algorithm=SHA256, qop="auth", cnonce="c", **common)


# --------------------------------------------------------------------------- challenges


def test_challenges_one_per_algorithm_sha256_first() -> None:
    auth = authenticator()
    first, second = auth.challenges(T0, HOST)
    nonce = challenge_params(first)["nonce"]
    assert first == f'Digest realm="{REALM}", nonce="{nonce}", algorithm=SHA-256, qop="auth"'
    assert second == f'Digest realm="{REALM}", nonce="{nonce}", algorithm=MD5, qop="auth"'
    # url-safe base64 of 8 bytes of time and 32 of HMAC, unpadded
    assert re.fullmatch(r"[A-Za-z0-9_-]{54}", nonce)
    stale = auth.challenges(T0, HOST, stale=True)
    assert stale == [value + ", stale=true" for value in (first, second)]


def test_challenges_follow_the_configured_algorithms() -> None:
    auth = authenticator(algorithms=[MD5])
    (only,) = auth.challenges(T0, HOST)
    assert challenge_params(only)["algorithm"] == "MD5"
    assert auth.algorithms == (MD5,)
    assert auth.realm == REALM


def test_nonce_is_stateless_and_bound() -> None:
    auth = authenticator()
    # Same time and host: the same nonce, from another instance with the same secret too.
    assert nonce_of(auth) == nonce_of(authenticator())
    assert nonce_of(auth) != nonce_of(auth, host="203.0.113.8")
    assert nonce_of(auth) != nonce_of(auth, now=T0 + 0.001)
    assert nonce_of(auth) != nonce_of(authenticator(secret=b"another secret, 16+ bytes"))
    assert nonce_of(auth) != nonce_of(authenticator(realm="other.example.net"))
    # Verified by an instance that never issued it.
    assert check(authenticator(), answer(auth)).verdict is DigestVerdict.OK


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("algorithm", [SHA256, MD5])
@pytest.mark.parametrize("qop", [True, False])
@pytest.mark.parametrize("write", [sipp_header, baresip_header])
def test_round_trip(algorithm: DigestAlgorithm, qop: bool, write: HeaderWriter) -> None:
    auth = authenticator()
    credentials = answer(auth, algorithm=algorithm, qop=qop, write=write)
    assert credentials.algorithm is algorithm
    assert credentials.qop == ("auth" if qop else None)
    assert check(auth, credentials) == DigestResult(DigestVerdict.OK, USER)


def test_round_trip_uppercase_response_and_live_passwords() -> None:
    passwords = {USER: PASSWORD}
    auth = authenticator(passwords=passwords)
    credentials = answer(auth)
    shouted = replace(credentials, response=credentials.response.upper())
    assert check(auth, shouted).verdict is DigestVerdict.OK
    # The mapping is read at each check: a user added later can authenticate.
    newcomer = answer(auth, username="late", password="pw")
    assert check(auth, newcomer).verdict is DigestVerdict.UNKNOWN_USER
    passwords["late"] = "pw"
    assert check(auth, newcomer) == DigestResult(DigestVerdict.OK, "late")


# --------------------------------------------------------------------------- verdicts


def test_stale_by_age() -> None:
    auth = authenticator(nonce_lifetime_s=300.0)
    credentials = answer(auth)
    assert check(auth, credentials, now=T0 + 300).verdict is DigestVerdict.OK
    assert check(auth, credentials, now=T0 + 300.01) == DigestResult(DigestVerdict.STALE)
    # An old nonce is STALE whatever the password (issue 29): the response is not looked
    # at, so stale=true tells nothing, and a guess on an old nonce counts as none.
    wrong = answer(auth, password="guess")
    assert check(auth, wrong, now=T0 + 3600) == DigestResult(DigestVerdict.STALE)
    assert not DigestVerdict.STALE.failed_guess


def test_stale_from_the_future() -> None:
    auth = authenticator()
    credentials = answer(auth)
    assert check(auth, credentials, now=T0 - 1.0).verdict is DigestVerdict.OK
    assert check(auth, credentials, now=T0 - 1.01).verdict is DigestVerdict.STALE


def test_nonce_from_another_source_host() -> None:
    auth = authenticator()
    credentials = answer(auth, host="192.0.2.99")
    assert check(auth, credentials, host="192.0.2.99").verdict is DigestVerdict.OK
    assert check(auth, credentials, host=HOST) == DigestResult(DigestVerdict.BAD_NONCE)


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _tampered_nonces(nonce: str) -> list[str]:
    raw = base64.urlsafe_b64decode(nonce + "==")
    later = (int.from_bytes(raw[:8], "big") + 60_000).to_bytes(8, "big")  # a minute younger

    def flip(index: int) -> str:
        char = "B" if nonce[index] == "A" else "A"
        return nonce[:index] + char + nonce[index + 1 :]

    return [
        flip(3),  # in the time
        flip(30),  # in the MAC
        base64.urlsafe_b64encode(later + raw[8:]).decode().rstrip("="),  # time, old MAC
        nonce[:-1] + _B64URL[_B64URL.index(nonce[-1]) | 1],  # an unused bit of the last char
        nonce + "A",
        nonce[:-1],
        nonce + "==",
        nonce.replace(nonce[5], "+", 1),
        "",
        "dcd98b7102dd2f0e8b11d0f600bfb0c093",
    ]


def test_tampered_nonce() -> None:
    auth = authenticator()
    nonce = nonce_of(auth)
    for tampered in _tampered_nonces(nonce):
        assert tampered != nonce
        # The response is right for the nonce sent: only the nonce is at fault.
        credentials = answer(auth, nonce=tampered)
        assert check(auth, credentials) == DigestResult(DigestVerdict.BAD_NONCE), tampered


def test_nonce_of_another_secret_or_realm() -> None:
    auth = authenticator()
    for issuer in (
        authenticator(secret=b"a different secret of 32 bytes!!"),
        authenticator(realm="other.example.net"),
    ):
        credentials = answer(auth, nonce=nonce_of(issuer))
        assert check(auth, credentials).verdict is DigestVerdict.BAD_NONCE


def test_wrong_password_and_wrong_method() -> None:
    auth = authenticator()
    assert check(auth, answer(auth, password="guess")) == DigestResult(DigestVerdict.WRONG)
    # The response covers the method (HA2 = H(method:uri)).
    assert check(auth, answer(auth), method="ACK").verdict is DigestVerdict.WRONG


def test_unknown_user_still_computes_a_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = authenticator()
    credentials = answer(auth, username="mallory")
    calls: list[str] = []
    real = digest_module.digest_response

    def counting(**kwargs: object) -> str:
        calls.append(str(kwargs["username"]))
        return real(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(digest_module, "digest_response", counting)
    assert check(auth, credentials) == DigestResult(DigestVerdict.UNKNOWN_USER)
    assert check(auth, answer(auth, password="guess")).verdict is DigestVerdict.WRONG
    assert calls == ["mallory", USER]


def test_wrong_realm() -> None:
    auth = authenticator()
    credentials = answer(auth, realm="evil.example.net")
    assert check(auth, credentials) == DigestResult(DigestVerdict.WRONG_REALM)
    # Realms compare exactly.
    assert check(auth, answer(auth, realm=REALM.upper())).verdict is DigestVerdict.WRONG_REALM


def test_wrong_uri() -> None:
    auth = authenticator()
    credentials = answer(auth)
    for request_uri in ("sip:+15557654321@198.51.100.2:5060", URI + ";transport=udp"):
        assert check(auth, credentials, uri=request_uri) == DigestResult(DigestVerdict.WRONG_URI)


def test_algorithm_not_offered() -> None:
    sha_only = authenticator(algorithms=(SHA256,))
    nonce = nonce_of(sha_only)
    md5 = answer(sha_only, algorithm=MD5, nonce=nonce)
    assert check(sha_only, md5) == DigestResult(DigestVerdict.BAD_NONCE)
    # Either offered algorithm may answer either challenge: the nonce is the same.
    both = authenticator()
    assert check(both, answer(both, algorithm=MD5, nonce=nonce)).verdict is DigestVerdict.OK


def test_verdict_precedence() -> None:
    auth = authenticator()
    late = T0 + 3600
    # a bad nonce beats a wrong realm (issue 29: the nonce is checked first), an unknown
    # user and a wrong password
    bad_realm = answer(auth, realm="x", nonce="junk")
    assert check(auth, bad_realm).verdict is DigestVerdict.BAD_NONCE
    assert check(auth, answer(auth, username="x", nonce="junk")).verdict is DigestVerdict.BAD_NONCE
    # a wrong realm beats a stale nonce and everything after it
    stale_realm = answer(auth, realm="x", username="x", password="guess")
    assert check(auth, stale_realm, uri="sip:else", now=late).verdict is DigestVerdict.WRONG_REALM
    # a stale nonce beats an unknown user, a wrong uri and a wrong password
    unknown = answer(auth, username="x")
    assert check(auth, unknown, uri="sip:else", now=late).verdict is DigestVerdict.STALE
    wrong = answer(auth, password="guess")
    assert check(auth, wrong, uri="sip:else", now=late).verdict is DigestVerdict.STALE
    assert check(auth, answer(auth), uri="sip:else", now=late).verdict is DigestVerdict.STALE
    # an unknown user beats a wrong uri
    assert check(auth, unknown, uri="sip:else").verdict is DigestVerdict.UNKNOWN_USER
    # a wrong uri beats a wrong password
    assert check(auth, wrong, uri="sip:else").verdict is DigestVerdict.WRONG_URI


# --------------------------------------------------------------------------- failed guesses


def test_only_a_response_over_a_valid_nonce_is_a_failed_guess() -> None:
    """The found lockout (issue 29): what a forger can send in a trunk's name without
    seeing its challenges counts as no guess; the verdicts of a response computed over a
    valid, unexpired nonce issued to that host do."""
    assert {v for v in DigestVerdict if v.failed_guess} == {
        DigestVerdict.UNKNOWN_USER,
        DigestVerdict.WRONG_URI,
        DigestVerdict.WRONG,
    }
    auth = authenticator()
    ours = nonce_of(auth)
    # Byte for byte what a forger sends: no nonce of ours for this host can be in it.
    forged = [
        # the found case: a wrong realm (and a made-up nonce)
        f'Digest username="{USER}",realm="evil",nonce="x",uri="{URI}",'
        f'response="{"0" * 64}",algorithm=SHA-256',
        # the realm right, a nonce made up in our format
        f'Digest username="{USER}",realm="{REALM}",nonce="{"A" * 54}",uri="{URI}",'
        f'response="{"0" * 32}",algorithm=MD5',
        # a nonce of ours, issued to another host
        f'Digest username="{USER}",realm="{REALM}",nonce="{nonce_of(auth, host="192.0.2.66")}",'
        f'uri="{URI}",response="{"0" * 64}",algorithm=SHA-256',
        # a nonce of another gateway (another secret)
        f'Digest username="{USER}",realm="{REALM}",'
        f'nonce="{nonce_of(authenticator(secret=b"another gateway secret, 32 bytes"))}",'
        f'uri="{URI}",response="{"0" * 64}",algorithm=SHA-256',
        # our nonce for this host, another realm: not computed over our realm
        f'Digest username="{USER}",realm="evil",nonce="{ours}",uri="{URI}",'
        f'response="{"0" * 64}",algorithm=SHA-256',
    ]
    verdicts = [check(auth, parse_authorization(value)).verdict for value in forged]
    assert verdicts == [DigestVerdict.BAD_NONCE] * 4 + [DigestVerdict.WRONG_REALM]
    assert not any(verdict.failed_guess for verdict in verdicts)
    # our nonce, expired: the same answer for a wrong password and the right one
    old_wrong = f'Digest username="{USER}",realm="{REALM}",nonce="{ours}",uri="{URI}",' + (
        f'response="{"0" * 64}",algorithm=SHA-256'
    )
    late = T0 + 301
    assert check(auth, parse_authorization(old_wrong), now=late) == DigestResult(
        DigestVerdict.STALE
    )
    assert check(auth, answer(auth), now=late) == DigestResult(DigestVerdict.STALE)
    # a valid, unexpired nonce of ours for this host: wrong answers are guesses
    guesses = [
        check(auth, answer(auth, password="guess")),
        check(auth, answer(auth, username="mallory")),
        check(auth, answer(auth), uri="sip:other@198.51.100.2"),
        check(auth, parse_authorization(old_wrong)),
    ]
    assert [g.verdict for g in guesses] == [
        DigestVerdict.WRONG,
        DigestVerdict.UNKNOWN_USER,
        DigestVerdict.WRONG_URI,
        DigestVerdict.WRONG,
    ]
    assert all(g.verdict.failed_guess for g in guesses)
    assert not DigestVerdict.OK.failed_guess and not DigestVerdict.STALE.failed_guess


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "kwargs",
    [
        {"secret": b"15 bytes secret"},
        {"realm": ""},
        {"realm": 'say "hi"'},
        {"realm": "back\\slash"},
        {"realm": "line\nbreak"},
        {"nonce_lifetime_s": 0.0},
        {"nonce_lifetime_s": float("inf")},
        {"algorithms": ()},
        {"algorithms": (MD5, MD5)},
        {"algorithms": ("MD5-sess",)},
    ],
)
def test_constructor_rejects(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        authenticator(**kwargs)


def test_time_must_be_finite() -> None:
    auth = authenticator()
    credentials = answer(auth)
    with pytest.raises(ValueError):
        auth.challenges(float("nan"), HOST)
    with pytest.raises(ValueError):
        check(auth, credentials, now=float("inf"))


# --------------------------------------------------------------------------- parsing

RESPONSE_MD5 = "0123456789abcdef0123456789abcdef"
RESPONSE_SHA256 = RESPONSE_MD5 * 2


def header(*drop: str, **params: str) -> str:
    """A valid Authorization (MD5, qop=auth) with params replaced, added or dropped
    (values are written as given: quote them yourself)."""
    values = {
        "username": '"alice"',
        "realm": f'"{REALM}"',
        "nonce": '"abc"',
        "uri": f'"{URI}"',
        "response": f'"{RESPONSE_MD5}"',
        "algorithm": "MD5",
        "qop": "auth",
        "cnonce": '"c0ffee"',
        "nc": "00000001",
    }
    values.update(params)
    return "Digest " + ", ".join(f"{k}={v}" for k, v in values.items() if k not in drop)


def test_parse_sipp_style() -> None:
    value = (
        'Digest username="trunk-a",realm="gw.example.net",cnonce="6b8b4567327b23c6",'
        'nc=00000001,qop=auth,uri="sip:+15551234567@198.51.100.2:5060",'
        'nonce="bm9uY2U",response="6629fae49393a05397450978507c4ef1",algorithm=MD5'
    )
    assert parse_authorization(value) == DigestCredentials(
        username="trunk-a",
        realm="gw.example.net",
        nonce="bm9uY2U",
        uri="sip:+15551234567@198.51.100.2:5060",
        response="6629fae49393a05397450978507c4ef1",
        algorithm=MD5,
        qop="auth",
        cnonce="6b8b4567327b23c6",
        nc="00000001",
    )


def test_parse_baresip_style() -> None:
    value = (
        'digest  username="alice" ,  realm="gw.example.net", nonce="bm9uY2U", '
        'uri="sip:alice@gw.example.net",\tresponse="' + RESPONSE_SHA256 + '", '
        'cnonce="00a1b2c3d4e5f607", qop=auth, nc=0000000A,  algorithm=SHA-256 '
    )
    credentials = parse_authorization(value)
    assert credentials.username == "alice"
    assert credentials.uri == "sip:alice@gw.example.net"
    assert credentials.algorithm is SHA256
    assert (credentials.qop, credentials.cnonce, credentials.nc) == (
        "auth",
        "00a1b2c3d4e5f607",
        "0000000A",
    )


def test_parse_leniencies() -> None:
    # quoted tokens, names in any case, algorithm in any case, unknown params ignored
    value = header(algorithm='"md5"', qop='"auth"', Opaque='"o"', userhash="false")
    value = value.replace("username=", "UserName=")
    credentials = parse_authorization(value)
    assert (credentials.algorithm, credentials.qop, credentials.opaque) == (MD5, "auth", "o")
    assert parse_authorization(header(algorithm="sha-256", response=RESPONSE_SHA256)).algorithm is (
        SHA256
    )
    # no algorithm: MD5 (RFC 2617 3.2.1); no qop: neither cnonce nor nc needed
    plain = parse_authorization(header("algorithm", "qop", "cnonce", "nc"))
    assert (plain.algorithm, plain.qop, plain.cnonce, plain.nc) == (MD5, None, None, None)
    # quoted-pairs resolved; commas and "=" inside quotes are data; empty elements skipped
    odd = parse_authorization(header(username=r'"a\"l,i=c\\e"') + ", ,")
    assert odd.username == 'a"l,i=c\\e'
    # cnonce and nc without qop are kept (they play no part in the response)
    assert parse_authorization(header("qop")).cnonce == "c0ffee"


def test_parse_limits_inclusive() -> None:
    assert parse_authorization(header(username=f'"{"u" * MAX_PARAM_CHARS}"')).username == (
        "u" * MAX_PARAM_CHARS
    )
    base = header()
    padding = MAX_AUTHORIZATION_CHARS - len(base)
    pads: list[str] = []
    while padding > 0:
        # ', pN=""' is 7 characters around the value
        size = min(padding - 7, 1000)
        pads.append(f', p{len(pads)}="{"x" * size}"')
        padding -= 7 + size
    value = base + "".join(pads)
    assert len(value) == MAX_AUTHORIZATION_CHARS
    assert parse_authorization(value).username == "alice"


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (header() + ", pad=" + "1" * MAX_AUTHORIZATION_CHARS, DigestErrorCode.HEADER_TOO_LONG),
        (header(username=f'"{"u" * (MAX_PARAM_CHARS + 1)}"'), DigestErrorCode.VALUE_TOO_LONG),
        (header(opaque="o" * (MAX_PARAM_CHARS + 1)), DigestErrorCode.VALUE_TOO_LONG),
        ("Basic dXNlcjpwYXNzd29yZA==", DigestErrorCode.BAD_SCHEME),
        ("Digestive " + header()[7:], DigestErrorCode.BAD_SCHEME),
        ("", DigestErrorCode.MALFORMED),
        ("   ", DigestErrorCode.MALFORMED),
        ('"Digest" username="a"', DigestErrorCode.MALFORMED),
        ('Digest username="alice', DigestErrorCode.MALFORMED),
        (header(username='"alice" realm="x"'), DigestErrorCode.MALFORMED),
        (header(uri="sip:alice@example.net"), DigestErrorCode.MALFORMED),
        (header() + ", flag", DigestErrorCode.MALFORMED),
        (header(username='"a"b'), DigestErrorCode.MALFORMED),
        (header(username='"\ud800"'), DigestErrorCode.MALFORMED),
        (header() + ', username="bob"', DigestErrorCode.DUPLICATE_PARAM),
        (header() + ', REALM="x"', DigestErrorCode.DUPLICATE_PARAM),
        (header() + ", opaque=a, opaque=a", DigestErrorCode.DUPLICATE_PARAM),
        ("Digest", DigestErrorCode.MISSING_PARAM),
        (header("username"), DigestErrorCode.MISSING_PARAM),
        (header("realm"), DigestErrorCode.MISSING_PARAM),
        (header("nonce"), DigestErrorCode.MISSING_PARAM),
        (header("uri"), DigestErrorCode.MISSING_PARAM),
        (header("response"), DigestErrorCode.MISSING_PARAM),
        (header(algorithm="MD5-sess"), DigestErrorCode.UNSUPPORTED_ALGORITHM),
        (header(algorithm="SHA-256-sess"), DigestErrorCode.UNSUPPORTED_ALGORITHM),
        (header(algorithm="SHA-512-256"), DigestErrorCode.UNSUPPORTED_ALGORITHM),
        (header(algorithm="AKAv1-MD5"), DigestErrorCode.UNSUPPORTED_ALGORITHM),
        (header(algorithm='""'), DigestErrorCode.UNSUPPORTED_ALGORITHM),
        (header(qop="auth-int"), DigestErrorCode.UNSUPPORTED_QOP),
        (header(qop='"auth,auth-int"'), DigestErrorCode.UNSUPPORTED_QOP),
        (header(qop='""'), DigestErrorCode.UNSUPPORTED_QOP),
        (header("cnonce"), DigestErrorCode.INCOMPLETE_QOP),
        (header("nc"), DigestErrorCode.INCOMPLETE_QOP),
        (header("cnonce", "nc"), DigestErrorCode.INCOMPLETE_QOP),
        (header(nc="1"), DigestErrorCode.BAD_NC),
        (header(nc="000000001"), DigestErrorCode.BAD_NC),
        (header(nc="0000000g"), DigestErrorCode.BAD_NC),
        (header("qop", "cnonce", nc="x"), DigestErrorCode.BAD_NC),
        (header(response=f'"{RESPONSE_MD5[:-1]}"'), DigestErrorCode.BAD_RESPONSE),
        (header(response=f'"{RESPONSE_MD5}0"'), DigestErrorCode.BAD_RESPONSE),
        (header(response='"' + "z" * 32 + '"'), DigestErrorCode.BAD_RESPONSE),
        (header(response='""'), DigestErrorCode.BAD_RESPONSE),
        (header(algorithm="SHA-256"), DigestErrorCode.BAD_RESPONSE),  # an MD5-long response
        (header(response=f'"{RESPONSE_SHA256}"'), DigestErrorCode.BAD_RESPONSE),
    ],
)
def test_parse_rejects(value: str, code: DigestErrorCode) -> None:
    with pytest.raises(DigestError) as info:
        parse_authorization(value)
    assert info.value.code is code
    assert isinstance(info.value, SipProtocolError)
    assert isinstance(info.value, SipError)
    assert str(info.value).startswith(f"{code}: ")


def test_parse_says_sess_is_unsupported() -> None:
    with pytest.raises(DigestError, match="-sess variants are not supported"):
        parse_authorization(header(algorithm="MD5-sess"))


def test_parse_error_messages_stay_short() -> None:
    with pytest.raises(DigestError) as info:
        parse_authorization(header(algorithm='"' + "A" * 1000 + '"'))
    assert len(info.value.message) < 200


_CHARS = st.sampled_from([*'Digest usernamrlocqp="\\,= \t\r\n05aAfF-', "\ud800", "é"])


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(_CHARS, max_size=60).map("".join), st.sampled_from([SHA256, MD5]))
def test_parse_and_verify_never_raise_anything_else(noise: str, algorithm: DigestAlgorithm) -> None:
    auth = authenticator()
    good = answer(auth, algorithm=algorithm, write=baresip_header)
    for value in (noise, "Digest " + noise, header() + noise, header(username=noise)):
        try:
            credentials = parse_authorization(value)
        except DigestError:
            continue
        assert check(auth, credentials).verdict is not DigestVerdict.OK
    assert check(auth, good).verdict is DigestVerdict.OK
