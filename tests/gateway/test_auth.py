"""Tests for gateway.auth: JWT verification (RFC 7519, RFC 8725), extraction, redaction."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from multidict import CIMultiDict

import gateway.auth as gateway_auth
from gateway.auth import (
    AuthConfigError,
    AuthError,
    AuthSettings,
    Principal,
    TokenVerifier,
    mint_token,
    redact_query,
    token_from_request,
)

SECRET = "unit-test-secret-0123456789-abcdefghijklmnop"
SCOPE = "tts:stream"


# -- helpers -------------------------------------------------------------------------


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_json(obj: dict[str, Any]) -> str:
    return b64url(json.dumps(obj, separators=(",", ":")).encode())


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {"sub": "alice", "exp": now + 600, "iat": now, "scope": SCOPE}
    for key, value in overrides.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base


def hs256(payload: dict[str, Any], secret: str = SECRET) -> str:
    return jwt.encode(payload, secret, algorithm="HS256")


def settings(**kw: Any) -> AuthSettings:
    base: dict[str, Any] = {
        "secret": None,
        "public_key_path": None,
        "audience": None,
        "issuer": None,
    }
    base.update(kw)
    return AuthSettings(**base)


def hs_verifier(**kw: Any) -> TokenVerifier:
    return TokenVerifier.from_settings(settings(secret=SECRET, **kw))


def pem_private(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def pem_public(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def expect_error(verifier: TokenVerifier, token: str, code: str, scope: str = SCOPE) -> AuthError:
    with pytest.raises(AuthError) as info:
        verifier.verify(token, scope)
    assert info.value.code == code, info.value.message
    return info.value


# -- key fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def rsa_key_2() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[[str, bytes], str]:
    def _write(name: str, data: bytes) -> str:
        path = tmp_path / name
        path.write_bytes(data)
        return str(path)

    return _write


@pytest.fixture
def rsa_verifier(
    rsa_key: rsa.RSAPrivateKey, write_file: Callable[[str, bytes], str]
) -> TokenVerifier:
    path = write_file("rsa.pub.pem", pem_public(rsa_key))
    return TokenVerifier.from_settings(settings(public_key_path=path))


def jwks_doc(
    rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> dict[str, list[dict[str, Any]]]:
    rsa_jwk = RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True)
    ec_jwk = ec_jwk_dict(ec_key)
    rsa_jwk["kid"] = "rsa-1"
    rsa_jwk["use"] = "sig"
    ec_jwk["kid"] = "ec-1"  # no "alg": derived from kty/crv
    return {"keys": [rsa_jwk, ec_jwk]}


def ec_jwk_dict(key: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
    return ECAlgorithm.to_jwk(key.public_key(), as_dict=True)


@pytest.fixture
def jwks_verifier(
    rsa_key: rsa.RSAPrivateKey,
    ec_key: ec.EllipticCurvePrivateKey,
    write_file: Callable[[str, bytes], str],
) -> TokenVerifier:
    path = write_file("jwks.json", json.dumps(jwks_doc(rsa_key, ec_key)).encode())
    return TokenVerifier.from_settings(settings(public_key_path=path))


# -- happy paths ---------------------------------------------------------------------


def test_valid_hs256() -> None:
    verifier = hs_verifier()
    assert verifier.algorithms == ("HS256",)
    token = mint_token(secret=SECRET, subject="alice", tenant="acme", max_streams=4, ttl_s=600)
    principal = verifier.verify(token, SCOPE)
    assert isinstance(principal, Principal)
    assert principal.subject == "alice"
    assert principal.tenant == "acme"
    assert principal.scopes == frozenset({SCOPE})
    assert principal.max_streams == 4
    assert principal.expires_at == pytest.approx(time.time() + 600, abs=5)
    assert principal.has_scope(SCOPE)


def test_rs256_from_pem_file(rsa_key: rsa.RSAPrivateKey, rsa_verifier: TokenVerifier) -> None:
    assert rsa_verifier.algorithms == ("RS256",)
    token = mint_token(private_key_pem=pem_private(rsa_key), algorithm="RS256", subject="bob")
    assert rsa_verifier.verify(token, SCOPE).subject == "bob"


def test_rs256_rejects_other_rsa_key(
    rsa_key_2: rsa.RSAPrivateKey, rsa_verifier: TokenVerifier
) -> None:
    token = mint_token(private_key_pem=pem_private(rsa_key_2), algorithm="RS256", subject="bob")
    expect_error(rsa_verifier, token, "token_invalid")


def test_es256_from_pem_file(
    ec_key: ec.EllipticCurvePrivateKey, write_file: Callable[[str, bytes], str]
) -> None:
    path = write_file("ec.pub.pem", pem_public(ec_key))
    verifier = TokenVerifier.from_settings(settings(public_key_path=path))
    assert verifier.algorithms == ("ES256",)
    token = mint_token(private_key_pem=pem_private(ec_key), algorithm="ES256", subject="carol")
    assert verifier.verify(token, SCOPE).subject == "carol"
    # An RS256 token is refused outright: the algorithm comes from the key.
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rs = mint_token(private_key_pem=pem_private(other), algorithm="RS256", subject="carol")
    expect_error(verifier, rs, "token_invalid")


def test_es384_from_p384_pem(write_file: Callable[[str, bytes], str]) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    verifier = TokenVerifier.from_settings(
        settings(public_key_path=write_file("p384.pem", pem_public(key)))
    )
    assert verifier.algorithms == ("ES384",)
    token = mint_token(private_key_pem=pem_private(key), algorithm="ES384", subject="dave")
    assert verifier.verify(token, SCOPE).subject == "dave"
    # A P-256 ES256 token is not accepted by a P-384 (ES384) configuration.
    p256 = ec.generate_private_key(ec.SECP256R1())
    expect_error(
        verifier,
        mint_token(private_key_pem=pem_private(p256), algorithm="ES256", subject="dave"),
        "token_invalid",
    )


def test_jwks_two_keys_chosen_by_kid(
    rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey, jwks_verifier: TokenVerifier
) -> None:
    assert set(jwks_verifier.algorithms) == {"RS256", "ES256"}
    rs = mint_token(
        private_key_pem=pem_private(rsa_key), algorithm="RS256", subject="r", kid="rsa-1"
    )
    es = mint_token(private_key_pem=pem_private(ec_key), algorithm="ES256", subject="e", kid="ec-1")
    assert jwks_verifier.verify(rs, SCOPE).subject == "r"
    assert jwks_verifier.verify(es, SCOPE).subject == "e"

    # Right key, wrong kid label: the kid's key is bound to another algorithm.
    mislabelled = mint_token(
        private_key_pem=pem_private(ec_key), algorithm="ES256", subject="e", kid="rsa-1"
    )
    expect_error(jwks_verifier, mislabelled, "token_invalid")
    unknown = mint_token(
        private_key_pem=pem_private(ec_key), algorithm="ES256", subject="e", kid="nope"
    )
    expect_error(jwks_verifier, unknown, "token_invalid")
    no_kid = mint_token(private_key_pem=pem_private(ec_key), algorithm="ES256", subject="e")
    expect_error(jwks_verifier, no_kid, "token_invalid")


def test_jwks_single_key_without_kid_in_token(
    ec_key: ec.EllipticCurvePrivateKey, write_file: Callable[[str, bytes], str]
) -> None:
    jwk = ec_jwk_dict(ec_key)
    jwk.update(kid="only", alg="ES256")
    path = write_file("one.json", json.dumps({"keys": [jwk]}).encode())
    verifier = TokenVerifier.from_settings(settings(public_key_path=path))
    token = mint_token(private_key_pem=pem_private(ec_key), algorithm="ES256", subject="e")
    assert verifier.verify(token, SCOPE).subject == "e"


def test_jwks_skips_encryption_keys(
    rsa_key: rsa.RSAPrivateKey,
    ec_key: ec.EllipticCurvePrivateKey,
    write_file: Callable[[str, bytes], str],
) -> None:
    enc = RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True)
    enc.update(kid="enc", use="enc")
    sig = ec_jwk_dict(ec_key)
    sig["kid"] = "sig"
    path = write_file("mixed.json", json.dumps({"keys": [enc, sig]}).encode())
    verifier = TokenVerifier.from_settings(settings(public_key_path=path))
    assert verifier.algorithms == ("ES256",)


# -- time-based claims ---------------------------------------------------------------


def test_expired() -> None:
    verifier = hs_verifier()
    token = mint_token(secret=SECRET, subject="alice", ttl_s=-120)
    err = expect_error(verifier, token, "token_expired")
    assert err.http_status == 401


def test_expiry_leeway() -> None:
    now = time.time()
    token = hs256(claims(exp=int(now) - 10))
    assert hs_verifier().verify(token, SCOPE, now=now).subject == "alice"  # 30 s default
    strict = hs_verifier(leeway_s=0.0)
    with pytest.raises(AuthError) as info:
        strict.verify(token, SCOPE, now=now)
    assert info.value.code == "token_expired"


def test_not_yet_valid_nbf() -> None:
    now = time.time()
    verifier = hs_verifier()
    future = hs256(claims(nbf=int(now) + 300))
    with pytest.raises(AuthError) as info:
        verifier.verify(future, SCOPE, now=now)
    assert info.value.code == "token_claims"
    assert "not yet valid" in info.value.message
    # Within the clock-skew leeway.
    skewed = hs256(claims(nbf=int(now) + 10))
    assert verifier.verify(skewed, SCOPE, now=now).subject == "alice"


@pytest.mark.parametrize("bad", ["soon", True, None])
def test_exp_must_be_numeric(bad: Any) -> None:
    payload = claims()
    payload["exp"] = bad
    expect_error(hs_verifier(), hs256(payload), "token_claims")


# -- algorithm attacks (RFC 8725 §2.1, §3.1) -----------------------------------------


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "nOnE"])
def test_alg_none_rejected(alg: str) -> None:
    token = f"{b64url_json({'alg': alg, 'typ': 'JWT'})}.{b64url_json(claims())}."
    expect_error(hs_verifier(), token, "token_invalid")


def test_alg_none_rejected_with_public_key(rsa_verifier: TokenVerifier) -> None:
    token = f"{b64url_json({'alg': 'none'})}.{b64url_json(claims())}."
    expect_error(rsa_verifier, token, "token_invalid")


def forge_hs256(payload: dict[str, Any], key: bytes, header: dict[str, Any] | None = None) -> str:
    """HS256 by hand: PyJWT itself refuses PEM material as an HMAC key."""
    signing_input = (
        f"{b64url_json(header or {'alg': 'HS256', 'typ': 'JWT'})}.{b64url_json(payload)}"
    )
    sig = hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(sig)}"


def test_key_confusion_hs256_with_rsa_public_key(
    rsa_key: rsa.RSAPrivateKey, rsa_verifier: TokenVerifier
) -> None:
    public_pem = pem_public(rsa_key)
    forged = forge_hs256(claims(), public_pem)
    # A verifier that took "alg" from the header would HMAC-check this with the PEM
    # text and accept it.  Ours refuses on the algorithm binding (RFC 8725 §2.1),
    # before any signature computation.
    err = expect_error(rsa_verifier, forged, "token_invalid")
    assert "algorithm" in err.message
    expect_error(rsa_verifier, forge_hs256(claims(), public_pem.strip()), "token_invalid")


def test_key_confusion_with_jwks(
    rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey, jwks_verifier: TokenVerifier
) -> None:
    forged = forge_hs256(
        claims(), pem_public(rsa_key), header={"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}
    )
    expect_error(jwks_verifier, forged, "token_invalid")


def test_rs256_header_refused_under_secret() -> None:
    token = forge_hs256(claims(), SECRET.encode(), header={"alg": "RS256"})
    expect_error(hs_verifier(), token, "token_invalid")


def test_wrong_secret() -> None:
    token = hs256(claims(), secret="another-secret-that-is-long-enough-0123456789")
    expect_error(hs_verifier(), token, "token_invalid")


def test_tampered_payload() -> None:
    token = hs256(claims())
    header, _, sig = token.split(".")
    forged = f"{header}.{b64url_json(claims(sub='mallory'))}.{sig}"
    expect_error(hs_verifier(), forged, "token_invalid")


@pytest.mark.parametrize(
    ("token", "code"),
    [
        ("", "token_missing"),
        ("abc", "token_malformed"),
        ("a.b.c", "token_malformed"),
        ("a.b.c.d", "token_malformed"),
        ("é.é.é", "token_malformed"),
        ("x" * 9000, "token_malformed"),
        ("a.b.", "token_malformed"),
    ],
)
def test_malformed(token: str, code: str) -> None:
    expect_error(hs_verifier(), token, code)


@pytest.mark.parametrize("payload", [b"not-json", b"[1, 2]", b'"alice"'])
def test_signed_but_undecodable_payload(payload: bytes) -> None:
    signing_input = f"{b64url_json({'alg': 'HS256'})}.{b64url(payload)}"
    sig = hmac.new(SECRET.encode(), signing_input.encode(), hashlib.sha256).digest()
    expect_error(hs_verifier(), f"{signing_input}.{b64url(sig)}", "token_malformed")


def test_unsigned_garbage_payload_is_a_signature_failure() -> None:
    # The signature is checked before the payload is parsed (RFC 7519 §7.2).
    token = f"{b64url_json({'alg': 'HS256'})}.bm90LWpzb24.c2ln"
    expect_error(hs_verifier(), token, "token_invalid")


# -- required / configured claims ----------------------------------------------------


def test_missing_sub() -> None:
    err = expect_error(hs_verifier(), hs256(claims(sub=None)), "token_claims")
    assert "sub" in err.message


def test_missing_exp() -> None:
    err = expect_error(hs_verifier(), hs256(claims(exp=None)), "token_claims")
    assert "exp" in err.message


@pytest.mark.parametrize("sub", ["", 42, ["alice"]])
def test_bad_sub(sub: Any) -> None:
    expect_error(hs_verifier(), hs256(claims(sub=sub)), "token_claims")


def test_audience_and_issuer_checked_when_configured() -> None:
    verifier = hs_verifier(audience="ivr-gateway", issuer="https://idp.example")
    good = hs256(claims(aud="ivr-gateway", iss="https://idp.example"))
    assert verifier.verify(good, SCOPE).subject == "alice"
    as_list = hs256(claims(aud=["other", "ivr-gateway"], iss="https://idp.example"))
    assert verifier.verify(as_list, SCOPE).subject == "alice"

    for bad in (
        claims(aud="other", iss="https://idp.example"),
        claims(aud=["other"], iss="https://idp.example"),
        claims(iss="https://idp.example"),  # aud missing
        claims(aud="ivr-gateway", iss="https://evil.example"),
        claims(aud="ivr-gateway"),  # iss missing
    ):
        expect_error(verifier, hs256(bad), "token_claims")


def test_audience_and_issuer_ignored_when_not_configured() -> None:
    token = hs256(claims(aud="someone-else", iss="https://anyone.example"))
    assert hs_verifier().verify(token, SCOPE).subject == "alice"


def test_mint_token_sets_aud_iss() -> None:
    verifier = hs_verifier(audience="gw", issuer="me")
    token = mint_token(secret=SECRET, subject="s", audience="gw", issuer="me")
    assert verifier.verify(token, SCOPE).subject == "s"


# -- scopes --------------------------------------------------------------------------


def test_wrong_scope() -> None:
    token = mint_token(secret=SECRET, subject="alice", scopes=("tts:admin",))
    err = expect_error(hs_verifier(), token, "insufficient_scope")
    assert err.http_status == 403


def test_scope_among_several() -> None:
    token = mint_token(secret=SECRET, subject="a", scopes=("metrics:read", "tts:stream", "x"))
    principal = hs_verifier().verify(token, "tts:stream")
    assert principal.scopes == frozenset({"metrics:read", "tts:stream", "x"})


def test_scope_is_exact_match() -> None:
    token = hs256(claims(scope="tts:streaming tts:stream:read"))
    expect_error(hs_verifier(), token, "insufficient_scope")


def test_missing_scope_claim() -> None:
    expect_error(hs_verifier(), hs256(claims(scope=None)), "insufficient_scope")


def test_non_string_scope_claim() -> None:
    expect_error(hs_verifier(), hs256(claims(scope=["tts:stream"])), "token_claims")


def test_required_scope_must_be_one_scope() -> None:
    token = mint_token(secret=SECRET, subject="a")
    with pytest.raises(ValueError):
        hs_verifier().verify(token, "")
    with pytest.raises(ValueError):
        hs_verifier().verify(token, "a b")


# -- optional claims -----------------------------------------------------------------


def test_tenant_defaults_to_subject() -> None:
    principal = hs_verifier().verify(mint_token(secret=SECRET, subject="alice"), SCOPE)
    assert principal.tenant == "alice"
    assert principal.max_streams is None


@pytest.mark.parametrize("tenant", ["", 7, ["acme"]])
def test_bad_tenant(tenant: Any) -> None:
    expect_error(hs_verifier(), hs256(claims(tenant=tenant)), "token_claims")


@pytest.mark.parametrize("max_streams", ["4", 2.5, 2.0, True, 0, -1, [1]])
def test_max_streams_must_be_positive_int(max_streams: Any) -> None:
    expect_error(hs_verifier(), hs256(claims(max_streams=max_streams)), "token_claims")


def test_max_streams_int_accepted() -> None:
    assert hs_verifier().verify(hs256(claims(max_streams=3)), SCOPE).max_streams == 3


def test_the_cache_claim_is_zero_retention() -> None:
    """``cache: false`` in a token: the speech cache keeps none of its sessions' speech."""
    assert hs_verifier().verify(hs256(claims(cache=False)), SCOPE).cache is False
    assert hs_verifier().verify(hs256(claims(cache=True)), SCOPE).cache is True
    assert hs_verifier().verify(hs256(claims()), SCOPE).cache is None
    minted = mint_token(secret=SECRET, subject="alice", cache=False)
    assert hs_verifier().verify(minted, SCOPE).cache is False


@pytest.mark.parametrize("cache", ["false", 0, 1, [False], {"on": True}])
def test_the_cache_claim_must_be_a_boolean(cache: Any) -> None:
    expect_error(hs_verifier(), hs256(claims(cache=cache)), "token_claims")


# -- configuration -------------------------------------------------------------------


def test_settings_from_env() -> None:
    s = AuthSettings.from_env(
        {
            "GATEWAY_JWT_SECRET": SECRET,
            "GATEWAY_JWT_PUBLIC_KEY": "  ",
            "GATEWAY_JWT_AUDIENCE": "gw",
            "GATEWAY_JWT_ISSUER": "",
            "GATEWAY_JWT_LEEWAY_S": "5",
        }
    )
    assert s == AuthSettings(
        secret=SECRET, public_key_path=None, audience="gw", issuer=None, leeway_s=5.0
    )
    assert AuthSettings.from_env({}).leeway_s == 30.0
    with pytest.raises(AuthConfigError):
        AuthSettings.from_env({"GATEWAY_JWT_LEEWAY_S": "soon"})
    with pytest.raises(AuthConfigError):
        settings(leeway_s=-1.0)


def test_config_errors(
    rsa_key: rsa.RSAPrivateKey, write_file: Callable[[str, bytes], str], tmp_path: Path
) -> None:
    cases: list[AuthSettings] = [
        settings(),
        settings(secret="short"),
        settings(secret=SECRET, public_key_path=write_file("k.pem", pem_public(rsa_key))),
        settings(public_key_path=str(tmp_path / "missing.pem")),
        settings(public_key_path=write_file("junk.pem", b"not a key")),
        settings(public_key_path=write_file("priv.pem", pem_private(rsa_key))),
        settings(public_key_path=write_file("bad.json", b"{not json")),
        settings(public_key_path=write_file("empty.json", b'{"keys": []}')),
        settings(
            public_key_path=write_file(
                "oct.json", json.dumps({"keys": [{"kty": "oct", "k": b64url(b"k" * 32)}]}).encode()
            )
        ),
    ]
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    cases.append(settings(public_key_path=write_file("small.pem", pem_public(small))))
    for case in cases:
        with pytest.raises(AuthConfigError) as info:
            TokenVerifier.from_settings(case)
        if case.secret:
            assert case.secret not in str(info.value)


def test_jwks_with_several_keys_needs_kids(
    rsa_key: rsa.RSAPrivateKey,
    ec_key: ec.EllipticCurvePrivateKey,
    write_file: Callable[[str, bytes], str],
) -> None:
    doc = jwks_doc(rsa_key, ec_key)
    del doc["keys"][1]["kid"]
    path = write_file("nokid.json", json.dumps(doc).encode())
    with pytest.raises(AuthConfigError):
        TokenVerifier.from_settings(settings(public_key_path=path))
    doc = jwks_doc(rsa_key, ec_key)
    doc["keys"][1]["kid"] = "rsa-1"
    path = write_file("dupkid.json", json.dumps(doc).encode())
    with pytest.raises(AuthConfigError):
        TokenVerifier.from_settings(settings(public_key_path=path))


# -- request extraction and log redaction --------------------------------------------


def test_token_from_request_precedence() -> None:
    assert token_from_request({"Authorization": "Bearer hdr"}, {"access_token": "qry"}) == "hdr"
    assert token_from_request({"authorization": "bearer  hdr "}, {}) == "hdr"
    assert token_from_request(CIMultiDict({"AUTHORIZATION": "BEARER hdr"}), {}) == "hdr"
    assert token_from_request({}, {"access_token": "qry"}) == "qry"
    assert token_from_request({"Authorization": "Basic dXNlcjpwdw=="}, {"access_token": "q"}) == "q"
    assert token_from_request({"Authorization": "Bearer "}, {"access_token": "q"}) == "q"
    assert token_from_request({"Authorization": "Basic dXNlcjpwdw=="}, {}) is None
    assert token_from_request({}, {"token": "not-this-one"}) is None
    assert token_from_request({}, {"access_token": ""}) is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/v1/stream", "/v1/stream"),
        ("/v1/stream?voice=a", "/v1/stream?voice=a"),
        ("/v1/stream?access_token=abc.def.ghi", "/v1/stream?access_token=[redacted]"),
        (
            "/ws?voice=a&access_token=abc.def&rate=8000&token=xyz",
            "/ws?voice=a&access_token=[redacted]&rate=8000&token=[redacted]",
        ),
        ("/ws?access%5Ftoken=abc&Token=x", "/ws?access%5Ftoken=[redacted]&Token=[redacted]"),
        ("/ws?access_token=", "/ws?access_token=[redacted]"),
        ("/ws?my_token=keep&tokens=keep", "/ws?my_token=keep&tokens=keep"),
        ("/ws?access_token=a#frag", "/ws?access_token=[redacted]#frag"),
    ],
)
def test_redact_query(raw: str, expected: str) -> None:
    assert redact_query(raw) == expected


# -- secrecy of tokens in errors and logs --------------------------------------------


def _failing_tokens(rsa_key: rsa.RSAPrivateKey) -> Iterator[str]:
    yield mint_token(secret=SECRET, subject="alice", ttl_s=-120)
    yield mint_token(secret=SECRET, subject="alice", scopes=("other",))
    yield hs256(claims(sub=None))
    yield hs256(claims(max_streams="lots"))
    yield hs256(claims(), secret="wrong-secret-wrong-secret-wrong-secret!!")
    yield forge_hs256(claims(), pem_public(rsa_key))
    yield f"{b64url_json({'alg': 'none'})}.{b64url_json(claims())}."
    yield "garbage.token.value"
    yield "garbage-token-value"


def test_auth_errors_never_contain_the_token(
    rsa_key: rsa.RSAPrivateKey, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    verifier = hs_verifier()
    for token in _failing_tokens(rsa_key):
        with pytest.raises(AuthError) as info:
            verifier.verify(token, SCOPE)
        err = info.value
        segments = [s for s in token.split(".") if len(s) > 8]
        for text in (str(err), err.message, repr(err), str(err.args)):
            assert token not in text
            for segment in segments:
                assert segment not in text
        # No library exception (whose text might quote the token) rides along.
        assert err.__cause__ is None
        assert err.__context__ is None or err.__suppress_context__
        assert token not in caplog.text


# -- verified tokens are remembered (a reconnect storm repeats a few tokens) -----------


def test_a_remembered_token_skips_the_signature_but_not_the_claims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    verifier = hs_verifier()
    now = time.time()
    token = hs256(claims(exp=int(now) + 60, scope="tts:stream"))
    decodes = 0
    real_decode = jwt.decode

    def counting_decode(*args: Any, **kwargs: Any) -> Any:
        nonlocal decodes
        decodes += 1
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting_decode)
    assert verifier.verify(token, SCOPE, now=now).subject == "alice"
    assert verifier.verify(token, SCOPE, now=now).subject == "alice"
    assert decodes == 1  # the second time from memory
    # Expiry and scope are checked at every use, remembered or not.
    with pytest.raises(AuthError) as expired:
        verifier.verify(token, SCOPE, now=now + 3600)
    assert expired.value.code == "token_expired"
    with pytest.raises(AuthError) as scope:
        verifier.verify(token, "voices:write", now=now)
    assert scope.value.code == "insufficient_scope"
    assert decodes == 1


def test_only_verified_tokens_are_remembered() -> None:
    verifier = hs_verifier()
    good = hs256(claims())
    forged = good.rsplit(".", 1)[0] + "." + b64url(b"\0" * 32)
    verifier.verify(good, SCOPE)
    expect_error(verifier, forged, "token_invalid")
    expect_error(verifier, forged, "token_invalid")  # still checked: never remembered
    other_key = hs256(claims(), secret="another-secret-of-at-least-32-bytes!!")
    expect_error(verifier, other_key, "token_invalid")


def test_remembered_tokens_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway_auth, "VERIFIED_CACHE_SIZE", 8)
    verifier = hs_verifier()
    tokens = [hs256(claims(sub=f"user-{i}")) for i in range(20)]
    for token in tokens:
        verifier.verify(token, SCOPE)
    assert len(verifier._verified) == 8
    assert verifier.verify(tokens[0], SCOPE).subject == "user-0"  # verified again
