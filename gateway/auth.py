"""JWT bearer-token authentication for the gateway's HTTP and WebSocket endpoints.

Contract
--------
* Configuration comes from the environment (:meth:`AuthSettings.from_env`):

  ``GATEWAY_JWT_SECRET``
      HMAC secret; tokens must be ``HS256``.  RFC 7518 §3.2 requires an HMAC key at
      least as long as the hash output, so secrets shorter than 32 bytes are refused.
  ``GATEWAY_JWT_PUBLIC_KEY``
      Path of a PEM public key (or X.509 certificate), or of a JWKS JSON file
      (RFC 7517 §5).  RSA -> ``RS256`` (at least 2048 bits), EC P-256 -> ``ES256``,
      P-384 -> ``ES384``, P-521 -> ``ES512``, Ed25519 -> ``EdDSA``.  In a JWKS each
      key's algorithm comes from its ``alg`` member or is derived from ``kty``/``crv``,
      and the key is chosen by the token's ``kid``.
  ``GATEWAY_JWT_AUDIENCE`` / ``GATEWAY_JWT_ISSUER``
      When set, ``aud`` / ``iss`` are required and must match (RFC 7519 §4.1.1, §4.1.3).
      When unset they are not checked at all; production deployments should set both
      (RFC 8725 §3.8, §3.9).
  ``GATEWAY_JWT_LEEWAY_S``
      Optional clock-skew allowance for ``exp`` / ``nbf`` in seconds (default 30).

  Exactly one of the secret and the public key must be configured.

* The accepted algorithms are fixed by the configured key and **never** taken from
  the token header (RFC 8725 §2.1, §3.1): every key is bound to exactly one
  algorithm, so ``alg: none`` and the HS256-with-the-RSA-public-key confusion attack
  are rejected before any signature check.  Header parameters that point at keys
  (``jku``, ``jwk``, ``x5u``, ``x5c``) are ignored; keys only come from configuration
  (RFC 8725 §3.10).
* Required claims: ``sub`` (non-empty string) and ``exp`` (NumericDate), RFC 7519
  §4.1.2 and §4.1.4; ``nbf`` is honoured when present (§4.1.5).  Scopes are the
  space-separated ``scope`` claim (RFC 8693 §4.2).  Optional claims: ``tenant``
  (non-empty string, defaults to ``sub``), ``max_streams`` (positive integer) and
  ``cache`` (boolean: ``false`` is zero retention in the speech cache).
* Tokens arrive as ``Authorization: Bearer <jwt>`` (RFC 6750 §2.1) or, for browsers
  that cannot set headers on a WebSocket, as ``?access_token=<jwt>`` (RFC 6750 §2.3).
  A token is never written to a log, never put into an exception message, and
  query strings are passed through :func:`redact_query` before access logging.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import unquote_plus

import jwt
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from jwt.algorithms import get_default_algorithms
from jwt.types import Options

__all__ = [
    "AuthConfigError",
    "AuthError",
    "AuthErrorCode",
    "AuthSettings",
    "Principal",
    "TokenVerifier",
    "mint_token",
    "redact_query",
    "token_from_request",
    "verifier_from_env",
]

_log = logging.getLogger(__name__)

ENV_SECRET: Final = "GATEWAY_JWT_SECRET"
ENV_PUBLIC_KEY: Final = "GATEWAY_JWT_PUBLIC_KEY"
ENV_AUDIENCE: Final = "GATEWAY_JWT_AUDIENCE"
ENV_ISSUER: Final = "GATEWAY_JWT_ISSUER"
ENV_LEEWAY: Final = "GATEWAY_JWT_LEEWAY_S"

DEFAULT_LEEWAY_S: Final = 30.0
# RFC 7518 §3.2: an HMAC key MUST be at least as long as the hash output (SHA-256).
MIN_HMAC_SECRET_BYTES: Final = 32
# RFC 7518 §3.3: RSA keys of 2048 bits or larger MUST be used.
MIN_RSA_BITS: Final = 2048
# NumericDates beyond the year 9999 (in seconds) are refused: no token lives that long,
# and a huge integer (10**400) cannot even be turned into a float.
MAX_NUMERIC_DATE: Final = 253_402_300_799
# Tokens longer than this are refused before any parsing (cheap DoS guard).
MAX_TOKEN_CHARS: Final = 8192
#: Verified tokens remembered (their claims, a few hundred bytes each).
VERIFIED_CACHE_SIZE: Final = 4096

REDACTED: Final = "[redacted]"
_REDACTED_QUERY_KEYS: Final = frozenset({"access_token", "token"})

# Asymmetric signature algorithms a configured public key may be bound to.
_ASYMMETRIC_ALGORITHMS: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_EC_CURVE_ALGORITHMS: Final[Mapping[str, str]] = {
    "secp256r1": "ES256",
    "secp384r1": "ES384",
    "secp521r1": "ES512",
}

AuthErrorCode = Literal[
    "token_missing",
    "token_malformed",
    "token_expired",
    "token_invalid",
    "token_claims",
    "insufficient_scope",
]


class AuthConfigError(Exception):
    """The authentication configuration is unusable (no key, unreadable or weak key...).

    Raised at start-up, never per request.  Messages may name the environment
    variable or key file path but never contain a secret.
    """


class AuthError(Exception):
    """A request failed authentication or authorisation.

    ``code`` is machine-readable and stable (see :data:`AuthErrorCode`); ``message``
    is a short human-readable reason that is safe to log and to return to clients:
    it never contains the token or any part of it.  Instances are raised ``from
    None`` so that a logged traceback carries no library exception text either.
    """

    def __init__(self, code: AuthErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: AuthErrorCode = code
        self.message: str = message

    @property
    def http_status(self) -> int:
        """401 for an absent or invalid token, 403 for a valid one lacking scope (RFC 6750 §3.1)."""
        return 403 if self.code == "insufficient_scope" else 401

    def __repr__(self) -> str:
        return f"AuthError(code={self.code!r}, message={self.message!r})"


@dataclass(frozen=True)
class AuthSettings:
    """Verifier configuration.  Exactly one of ``secret`` and ``public_key_path`` is set.

    ``leeway_s`` is the clock-skew allowance applied to ``exp`` and ``nbf``
    (RFC 7519 §4.1.4: "some small leeway, usually no more than a few minutes").
    """

    secret: str | None
    public_key_path: str | None
    audience: str | None
    issuer: str | None
    leeway_s: float = DEFAULT_LEEWAY_S

    def __post_init__(self) -> None:
        if not math.isfinite(self.leeway_s) or self.leeway_s < 0:
            raise AuthConfigError(f"JWT leeway must be a finite number >= 0, got {self.leeway_s}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AuthSettings:
        """Read the ``GATEWAY_JWT_*`` variables; empty values count as unset.

        Does not load keys; :meth:`TokenVerifier.from_settings` does, and raises
        :class:`AuthConfigError` when nothing usable is configured.
        """

        def opt(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        raw_secret = env.get(ENV_SECRET, "")
        leeway_raw = opt(ENV_LEEWAY)
        leeway = DEFAULT_LEEWAY_S
        if leeway_raw is not None:
            try:
                leeway = float(leeway_raw)
            except ValueError:
                raise AuthConfigError(f"{ENV_LEEWAY} must be a number of seconds") from None
        return cls(
            secret=raw_secret if raw_secret.strip() else None,
            public_key_path=opt(ENV_PUBLIC_KEY),
            audience=opt(ENV_AUDIENCE),
            issuer=opt(ENV_ISSUER),
            leeway_s=leeway,
        )


@dataclass(frozen=True)
class Principal:
    """The authenticated caller.

    ``tenant`` is the ``tenant`` claim, or the subject when that claim is absent (a
    token without a tenant is its own single-subject tenant).  ``max_streams`` is the
    token's per-caller concurrent-stream cap, ``None`` when the claim is absent.
    ``cache`` is the ``cache`` claim: ``False`` means the speech cache keeps nothing of
    this token's sessions (zero retention; docs/speech-cache.md), ``None`` when absent.
    ``expires_at`` is the ``exp`` claim as a UNIX timestamp (seconds); long-lived
    sessions should end or re-authenticate once it passes.
    """

    subject: str
    tenant: str
    scopes: frozenset[str]
    max_streams: int | None
    expires_at: float
    cache: bool | None = None  # the ``cache`` claim: False keeps none of its speech

    def has_scope(self, scope: str) -> bool:
        """True when ``scope`` was granted."""
        return scope in self.scopes


@dataclass(frozen=True)
class _BoundKey:
    """A verification key and the single algorithm it may be used with (RFC 8725 §3.1)."""

    kid: str | None
    algorithm: str
    key: Any  # bytes (HMAC) or a cryptography public-key object


_OPTIONS: Final[Options] = {
    "verify_signature": True,
    # Claims are validated below, by this module, so that every failure maps to a
    # precise error code; PyJWT only checks the signature and the JOSE header.
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
    "require": [],
    "enforce_minimum_key_length": True,
}


class TokenVerifier:
    """Verifies gateway access tokens against the configured key(s).

    Build with :meth:`from_settings`.  Keys are loaded once; rotating a key file
    needs a new verifier (restart or reload).  :meth:`verify` is synchronous and
    cheap (one HMAC or one public-key signature check) and safe to call from the
    event loop and from several threads.
    """

    def __init__(self, settings: AuthSettings, keys: Sequence[_BoundKey]) -> None:
        """Internal: use :meth:`from_settings`."""
        if not keys:
            raise AuthConfigError("no JWT verification key configured")
        self._settings = settings
        self._keys: tuple[_BoundKey, ...] = tuple(keys)
        self._by_kid: dict[str, _BoundKey] = {k.kid: k for k in self._keys if k.kid is not None}
        self._algorithms: tuple[str, ...] = tuple(dict.fromkeys(k.algorithm for k in self._keys))
        self._verified: dict[str, dict[str, Any]] = {}  # token -> claims, signature checked

    @classmethod
    def from_settings(cls, settings: AuthSettings) -> TokenVerifier:
        """Load the key material named by ``settings``.

        Raises :class:`AuthConfigError` when neither or both of the secret and the
        public key are set, when the secret is shorter than 32 bytes, or when the key
        file is unreadable, not a public key / JWKS, or an unsupported key type.
        """
        if settings.secret is not None and settings.public_key_path is not None:
            raise AuthConfigError(f"set either {ENV_SECRET} or {ENV_PUBLIC_KEY}, not both")
        if settings.secret is not None:
            keys = [_bind_secret(settings.secret)]
        elif settings.public_key_path is not None:
            keys = _load_key_file(settings.public_key_path)
        else:
            raise AuthConfigError(
                f"JWT authentication needs {ENV_SECRET} or {ENV_PUBLIC_KEY} to be set"
            )
        verifier = cls(settings, keys)
        _log.info(
            "JWT verification configured: algorithms=%s keys=%d audience=%s issuer=%s",
            ",".join(verifier.algorithms),
            len(keys),
            "set" if settings.audience else "unchecked",
            "set" if settings.issuer else "unchecked",
        )
        return verifier

    @property
    def algorithms(self) -> tuple[str, ...]:
        """The accepted ``alg`` values, derived from the configured key(s) only."""
        return self._algorithms

    @property
    def settings(self) -> AuthSettings:
        """The settings this verifier was built from."""
        return self._settings

    def verify(self, token: str, required_scope: str, *, now: float | None = None) -> Principal:
        """Validate ``token`` and return its :class:`Principal`.

        Checks, in order: size and shape; the header ``alg`` against the algorithm
        bound to the selected key (RFC 8725 §3.1); the signature; then the claims
        (RFC 7519 §7.2, §4.1): ``exp``, ``nbf`` with ``leeway_s``, ``sub``,
        ``aud``/``iss`` when configured, ``tenant``/``max_streams`` types, and finally
        that ``required_scope`` is among the ``scope`` claim's space-separated values.

        ``now`` (UNIX seconds) overrides the clock, for tests.  Raises
        :class:`AuthError`; its message never contains the token.
        """
        if not required_scope or " " in required_scope:
            raise ValueError("required_scope must be a single non-empty scope")
        if not token:
            raise AuthError("token_missing", "no access token")
        if len(token) > MAX_TOKEN_CHARS or not token.isascii() or token.count(".") != 2:
            raise AuthError("token_malformed", "access token is not a compact JWS")

        claims = self._verified.get(token)
        if claims is None:
            claims = self._decode(token)
            self._remember(token, claims)
        return self._check_claims(claims, required_scope, time.time() if now is None else now)

    def _remember(self, token: str, claims: dict[str, Any]) -> None:
        """Keep a verified token's claims: a reconnect storm (every media server of a
        failed instance at once) mostly repeats a few tokens, and the signature check
        is most of what a new session costs before the engine. The claims are checked
        again (expiry, scope) at every use; only the signature is not."""
        verified = self._verified
        while len(verified) >= VERIFIED_CACHE_SIZE:
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del verified[next(iter(verified))]  # the oldest (insertion order)
        verified[token] = claims

    def _decode(self, token: str) -> dict[str, Any]:
        """The claims of ``token`` once its header and signature check out."""
        key = self._select_key(token)
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=[key.algorithm], options=_OPTIONS
            )
        except jwt.InvalidAlgorithmError:
            raise AuthError("token_invalid", "token algorithm not accepted") from None
        except jwt.InvalidSignatureError:
            raise AuthError("token_invalid", "token signature verification failed") from None
        except jwt.DecodeError:
            raise AuthError("token_malformed", "access token could not be decoded") from None
        except (jwt.PyJWTError, ValueError, TypeError):
            raise AuthError("token_invalid", "access token rejected") from None
        return claims

    # -- internals ---------------------------------------------------------------------

    def _select_key(self, token: str) -> _BoundKey:
        """Pick the configured key for ``token`` by ``kid`` (RFC 7515 §4.1.4).

        The header is read unverified only to choose a key; its ``alg`` is never
        trusted, it is compared against the chosen key's bound algorithm.
        """
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthError("token_malformed", "access token header could not be decoded") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            # Covers "none" (RFC 8725 §3.1) and HS256 under an RSA key (key confusion).
            raise AuthError("token_invalid", "token algorithm not accepted")
        kid = header.get("kid")
        if self._by_kid and kid is not None:
            key = self._by_kid.get(kid)
            if key is None:
                raise AuthError("token_invalid", "token key id is not known")
        elif len(self._keys) == 1:
            key = self._keys[0]
        else:
            raise AuthError("token_invalid", "token has no key id and several keys are configured")
        if key.algorithm != alg:
            raise AuthError("token_invalid", "token algorithm not accepted for this key")
        return key

    def _check_claims(self, claims: dict[str, Any], required_scope: str, now: float) -> Principal:
        leeway = self._settings.leeway_s

        exp = claims.get("exp")
        if exp is None:
            raise AuthError("token_claims", "token is missing the 'exp' claim")
        if not _is_numeric_date(exp):
            raise AuthError("token_claims", "token 'exp' claim is not a NumericDate")
        if not _in_range(exp):
            raise AuthError("token_invalid", "token 'exp' claim is out of range")
        if now >= float(exp) + leeway:
            raise AuthError("token_expired", "access token has expired")

        nbf = claims.get("nbf")
        if nbf is not None:
            if not _is_numeric_date(nbf):
                raise AuthError("token_claims", "token 'nbf' claim is not a NumericDate")
            if not _in_range(nbf):
                raise AuthError("token_invalid", "token 'nbf' claim is out of range")
            if now + leeway < float(nbf):
                raise AuthError("token_claims", "access token is not yet valid")
        iat = claims.get("iat")
        if iat is not None and not _is_numeric_date(iat):
            raise AuthError("token_claims", "token 'iat' claim is not a NumericDate")

        sub = claims.get("sub")
        if sub is None:
            raise AuthError("token_claims", "token is missing the 'sub' claim")
        if not isinstance(sub, str) or not sub:
            raise AuthError("token_claims", "token 'sub' claim must be a non-empty string")

        audience = self._settings.audience
        if audience is not None:
            aud = claims.get("aud")
            if isinstance(aud, str):
                aud_ok = aud == audience
            elif isinstance(aud, list):
                aud_ok = audience in aud and all(isinstance(a, str) for a in aud)
            else:
                aud_ok = False
            if not aud_ok:
                raise AuthError("token_claims", "token audience does not match")

        issuer = self._settings.issuer
        if issuer is not None and claims.get("iss") != issuer:
            raise AuthError("token_claims", "token issuer does not match")

        tenant = claims.get("tenant")
        if tenant is None:
            tenant = sub
        elif not isinstance(tenant, str) or not tenant:
            raise AuthError("token_claims", "token 'tenant' claim must be a non-empty string")

        max_streams = claims.get("max_streams")
        if max_streams is not None and (
            not isinstance(max_streams, int) or isinstance(max_streams, bool) or max_streams < 1
        ):
            raise AuthError("token_claims", "token 'max_streams' claim must be a positive integer")

        cache = claims.get("cache")
        if cache is not None and not isinstance(cache, bool):
            raise AuthError("token_claims", "token 'cache' claim must be true or false")

        scope = claims.get("scope")
        if scope is not None and not isinstance(scope, str):
            raise AuthError("token_claims", "token 'scope' claim must be a space-separated string")
        scopes = frozenset(scope.split()) if scope else frozenset()
        if required_scope not in scopes:
            raise AuthError(
                "insufficient_scope", f"token lacks the required scope {required_scope!r}"
            )

        return Principal(
            subject=sub,
            tenant=tenant,
            scopes=scopes,
            max_streams=max_streams,
            expires_at=float(exp),
            cache=cache,
        )


def _is_numeric_date(value: object) -> bool:
    """RFC 7519 §2 NumericDate: a finite JSON number (booleans are not numbers).

    Values beyond :data:`MAX_NUMERIC_DATE` are refused separately (``token_invalid``):
    an integer like ``10**400`` is a JSON number that no clock can compare against."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _in_range(value: float) -> bool:
    return -MAX_NUMERIC_DATE <= value <= MAX_NUMERIC_DATE


def _bind_secret(secret: str) -> _BoundKey:
    key = secret.encode("utf-8")
    if len(key) < MIN_HMAC_SECRET_BYTES:
        raise AuthConfigError(
            f"{ENV_SECRET} is {len(key)} bytes; HS256 needs at least {MIN_HMAC_SECRET_BYTES} "
            "(RFC 7518 §3.2)"
        )
    return _BoundKey(kid=None, algorithm="HS256", key=key)


def _load_key_file(path: str) -> list[_BoundKey]:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise AuthConfigError(
            f"cannot read {ENV_PUBLIC_KEY} file {path!r}: {exc.strerror or exc}"
        ) from None
    if data.lstrip().startswith(b"{"):
        return _load_jwks(data, path)
    return [_load_pem(data, path)]


def _load_pem(data: bytes, path: str) -> _BoundKey:
    """A PEM ``PUBLIC KEY`` / ``RSA PUBLIC KEY`` or ``CERTIFICATE``; private keys are refused."""
    if b"PRIVATE KEY-----" in data:
        raise AuthConfigError(
            f"{ENV_PUBLIC_KEY} file {path!r} holds a private key; give the gateway the public key"
        )
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            public_key: Any = x509.load_pem_x509_certificate(data).public_key()
        else:
            public_key = load_pem_public_key(data)
    except ValueError:
        raise AuthConfigError(
            f"{ENV_PUBLIC_KEY} file {path!r} is not a PEM public key, certificate or JWKS"
        ) from None
    return _bind_public_key(public_key, None, None, path)


def _algorithm_for_public_key(public_key: Any, path: str) -> str:
    if isinstance(public_key, rsa.RSAPublicKey):
        return "RS256"
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        alg = _EC_CURVE_ALGORITHMS.get(public_key.curve.name)
        if alg is None:
            raise AuthConfigError(f"unsupported EC curve {public_key.curve.name} in {path!r}")
        return alg
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return "EdDSA"
    raise AuthConfigError(f"unsupported public key type {type(public_key).__name__} in {path!r}")


def _bind_public_key(public_key: Any, alg: str | None, kid: str | None, path: str) -> _BoundKey:
    """Bind ``public_key`` to one algorithm, checking type, curve and size agree."""
    algorithm = alg or _algorithm_for_public_key(public_key, path)
    if algorithm not in _ASYMMETRIC_ALGORITHMS:
        raise AuthConfigError(
            f"algorithm {algorithm!r} is not accepted for a public key ({path!r})"
        )
    if isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size < MIN_RSA_BITS:
        raise AuthConfigError(
            f"RSA key in {path!r} is {public_key.key_size} bits; at least {MIN_RSA_BITS} needed"
        )
    alg_obj = get_default_algorithms()[algorithm]
    try:
        prepared = alg_obj.prepare_key(public_key)
    except (jwt.PyJWTError, TypeError, ValueError) as exc:
        raise AuthConfigError(f"key in {path!r} does not suit {algorithm}: {exc}") from None
    weak = alg_obj.check_key_length(prepared)
    if weak:
        raise AuthConfigError(f"key in {path!r} is too weak: {weak}")
    return _BoundKey(kid=kid, algorithm=algorithm, key=prepared)


def _load_jwks(data: bytes, path: str) -> list[_BoundKey]:
    """A JWK Set (RFC 7517 §5) or a single JWK.

    Keys marked for encryption (``use`` other than ``sig``, or ``key_ops`` without
    ``verify``) are skipped.  Symmetric (``oct``) keys are refused: shared secrets
    belong in ``GATEWAY_JWT_SECRET``.  ``kid`` values must be unique.
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise AuthConfigError(f"{ENV_PUBLIC_KEY} file {path!r} is not valid JSON") from None
    if isinstance(doc, dict) and "keys" in doc:
        entries = doc["keys"]
    elif isinstance(doc, dict) and "kty" in doc:
        entries = [doc]
    else:
        raise AuthConfigError(f"{path!r} is neither a JWK Set nor a JWK")
    if not isinstance(entries, list):
        raise AuthConfigError(f"'keys' in {path!r} must be a list")

    keys: list[_BoundKey] = []
    seen_kids: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise AuthConfigError(f"JWKS entry {i} in {path!r} is not an object")
        use = entry.get("use")
        ops = entry.get("key_ops")
        if (use is not None and use != "sig") or (isinstance(ops, list) and "verify" not in ops):
            continue
        if entry.get("kty") == "oct":
            raise AuthConfigError(
                f"JWKS entry {i} in {path!r} is a symmetric key; use {ENV_SECRET} instead"
            )
        kid = entry.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise AuthConfigError(f"JWKS entry {i} in {path!r} has a non-string kid")
        if kid is not None:
            if kid in seen_kids:
                raise AuthConfigError(f"duplicate kid {kid!r} in {path!r}")
            seen_kids.add(kid)
        alg = entry.get("alg")
        if alg is not None and alg not in _ASYMMETRIC_ALGORITHMS:
            raise AuthConfigError(f"JWKS entry {i} in {path!r} has unsupported alg {alg!r}")
        try:
            jwk = jwt.PyJWK(entry)
        except jwt.PyJWTError as exc:
            raise AuthConfigError(f"JWKS entry {i} in {path!r} is unusable: {exc}") from None
        public_key = jwk.key
        if hasattr(public_key, "public_key") and not isinstance(
            public_key, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey, ed25519.Ed25519PublicKey)
        ):
            public_key = public_key.public_key()  # a private JWK: keep only the public half
        keys.append(_bind_public_key(public_key, jwk.algorithm_name, kid, path))
    if not keys:
        raise AuthConfigError(f"{path!r} holds no signature-verification key")
    if len(keys) > 1 and len(seen_kids) < len(keys):
        raise AuthConfigError(f"every key in {path!r} needs a kid when it holds several keys")
    return keys


def token_from_request(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """Extract the bearer token, or ``None`` when there is none.

    ``Authorization: Bearer <token>`` wins (scheme case-insensitive, RFC 6750 §2.1,
    RFC 7235 §2.1); otherwise the ``access_token`` query parameter (RFC 6750 §2.3).
    ``headers`` may be case-insensitive (aiohttp's ``CIMultiDictProxy``) or a plain
    mapping, whose keys are then matched case-insensitively.
    """
    value = headers.get("Authorization")
    if value is None:
        for name, header_value in headers.items():
            if name.lower() == "authorization":
                value = header_value
                break
    if value is not None:
        scheme, _, credentials = value.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() == "bearer" and credentials:
            return credentials
    token = query.get("access_token", "").strip()
    return token or None


def redact_query(path_qs: str) -> str:
    """Return ``path_qs`` with ``access_token`` and ``token`` query values replaced.

    Each such parameter becomes ``name=[redacted]``; other parameters, their order
    and the path are kept byte for byte.  Names are compared after percent-decoding
    and case-insensitively, so ``Access%5FToken=...`` is redacted too.
    """
    path, sep, rest = path_qs.partition("?")
    if not sep:
        return path_qs
    query, hash_sep, fragment = rest.partition("#")
    parts = []
    for part in query.split("&"):
        name, eq, _ = part.partition("=")
        if eq and unquote_plus(name).lower() in _REDACTED_QUERY_KEYS:
            parts.append(f"{name}={REDACTED}")
        else:
            parts.append(part)
    return f"{path}?{'&'.join(parts)}{hash_sep}{fragment}"


def mint_token(
    *,
    secret: str | None = None,
    private_key_pem: bytes | None = None,
    algorithm: str = "HS256",
    subject: str,
    tenant: str | None = None,
    ttl_s: int = 3600,
    scopes: Sequence[str] = ("tts:stream",),
    audience: str | None = None,
    issuer: str | None = None,
    max_streams: int | None = None,
    kid: str | None = None,
    cache: bool | None = None,
) -> str:
    """Issue a token the gateway accepts (development, tests and the demo page).

    HS* algorithms sign with ``secret`` (at least 32 bytes, RFC 7518 §3.2); the others
    with the unencrypted PEM ``private_key_pem``.  Claims: ``sub``, ``iat``, ``exp =
    iat + ttl_s`` (a negative ``ttl_s`` mints an already-expired token, for tests), a
    random ``jti``, ``scope`` (space-joined ``scopes``) and, when given, ``tenant``,
    ``aud``, ``iss``, ``max_streams`` and ``cache``; ``kid`` goes into the header.  Raises
    ``ValueError`` on inconsistent arguments.
    """
    if algorithm == "none" or algorithm not in get_default_algorithms():
        raise ValueError(f"unsupported signing algorithm {algorithm!r}")
    if not subject:
        raise ValueError("subject must be non-empty")
    if any(not s or any(c.isspace() for c in s) for s in scopes):
        raise ValueError("scopes must be non-empty and contain no whitespace")
    if max_streams is not None and (isinstance(max_streams, bool) or max_streams < 1):
        raise ValueError("max_streams must be a positive integer")

    signing_key: Any
    if algorithm.startswith("HS"):
        if secret is None or private_key_pem is not None:
            raise ValueError(f"{algorithm} needs secret= (and no private_key_pem=)")
        signing_key = secret.encode("utf-8")
        if len(signing_key) < MIN_HMAC_SECRET_BYTES:
            raise ValueError(f"HMAC secret must be at least {MIN_HMAC_SECRET_BYTES} bytes")
    else:
        if private_key_pem is None or secret is not None:
            raise ValueError(f"{algorithm} needs private_key_pem= (and no secret=)")
        signing_key = load_pem_private_key(private_key_pem, password=None)

    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": subject,
        "iat": now,
        "exp": now + ttl_s,
        "jti": uuid.uuid4().hex,
        "scope": " ".join(scopes),
    }
    if tenant is not None:
        claims["tenant"] = tenant
    if audience is not None:
        claims["aud"] = audience
    if issuer is not None:
        claims["iss"] = issuer
    if max_streams is not None:
        claims["max_streams"] = max_streams
    if cache is not None:
        claims["cache"] = cache
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(claims, signing_key, algorithm=algorithm, headers=headers)


def verifier_from_env(env: Mapping[str, str] | None = None) -> TokenVerifier:
    """``TokenVerifier.from_settings(AuthSettings.from_env(env or os.environ))``."""
    return TokenVerifier.from_settings(AuthSettings.from_env(os.environ if env is None else env))
