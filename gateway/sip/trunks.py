"""Who may call from outside the trusted networks: SIP trunks that answer a digest
challenge (``[trunks.<name>]`` in the routes file, RFC 3261 22.4 with RFC 8760's
algorithms; the checks themselves are :mod:`telephony.sip.digest`).

:class:`TrunkGate` decides, for a datagram from a source outside ``GATEWAY_SIP_ALLOW``,
before the SIP core sees it:

- an INVITE or OPTIONS without credentials: **challenge** (401 with ``WWW-Authenticate``,
  stateless: the nonce carries its own proof, nothing is kept);
- an INVITE whose ``Authorization`` checks out: **accept**, billed to the trunk's tenant;
  its Call-ID is remembered for that source host, so that the ACK, CANCEL, BYE, re-INVITE
  and the responses of that call get in too (they carry no credentials);
- right password, old nonce: challenge again with ``stale=true``;
- wrong credentials, an unknown user, a nonce of another host: **forbid** (403); a
  malformed ``Authorization``: **bad request** (400);
- anything else: forbid, as without trunks.

Limits: at most ``max_calls`` remembered Call-IDs (beyond: **busy**, 503); a Call-ID is
kept while its call lives and :data:`LINGER_S` after (the last transactions of a call
that ended), or :data:`LINGER_S` when no call came of it (a 404, a 488, a lost ACK).
"""

from __future__ import annotations

import enum
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.sip.routes import Trunk
from telephony.sip import SipError, SipParseError, SipRequest, parse_message, parse_uri
from telephony.sip.digest import (
    DigestAlgorithm,
    DigestAuthenticator,
    DigestError,
    DigestVerdict,
    parse_authorization,
)

__all__ = ["LINGER_S", "Admission", "TrunkGate", "Verdict"]

log = logging.getLogger(__name__)
#: 64*T1: how long a Call-ID stays known once its call is over (or never began).
LINGER_S = 32.0
CHALLENGED_METHODS = frozenset({"INVITE", "OPTIONS"})


class Verdict(enum.Enum):
    ACCEPT = "accept"
    CHALLENGE = "challenge"
    FORBID = "forbid"
    BAD_REQUEST = "bad_request"
    BUSY = "busy"


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    tenant: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # WWW-Authenticate for a challenge
    reason: str = ""  # for the refused metric and the log


@dataclass
class _Known:
    host: str
    tenant: str
    expires: float  # monotonic; inf while the call lives


def _same_target(digest_uri: str, request_uri: str) -> bool:
    """The digest's ``uri`` names what the request is for: the Request-URI itself, or the
    same host and port with the same user or none (sipp and some PBXs hash the domain's
    URI, ``sip:host:port``). Anything else is checked as a wrong URI."""
    if digest_uri == request_uri:
        return True
    try:
        digest, request = parse_uri(digest_uri), parse_uri(request_uri)
    except SipError:
        return False
    return (
        digest.scheme == request.scheme
        and digest.host.lower() == request.host.lower()
        and (digest.port or 5060) == (request.port or 5060)
        and digest.user in (None, "", request.user)
    )


class TrunkGate:
    def __init__(
        self,
        trunks: Mapping[str, Trunk],
        *,
        realm: str,
        max_calls: int,
        algorithms: Sequence[str] = ("MD5",),
        secret: bytes | None = None,
    ) -> None:
        self._trunks = dict(trunks)
        self._max = max_calls
        self._known: dict[str, _Known] = {}
        self._auth = (
            DigestAuthenticator(
                realm=realm,
                secret=secret or os.urandom(32),
                passwords={u: t.password for u, t in trunks.items()},
                algorithms=[DigestAlgorithm(a) for a in algorithms],
            )
            if trunks
            else None
        )

    @property
    def enabled(self) -> bool:
        return self._auth is not None

    def admit(self, data: bytes, host: str, *, now: float, wall: float) -> Admission:
        """What to do with ``data`` from ``host`` (outside the trusted networks).
        ``now`` is monotonic (the Call-ID table), ``wall`` the Unix time (nonces)."""
        auth = self._auth
        if auth is None:
            return Admission(Verdict.FORBID, reason="untrusted")
        try:
            message = parse_message(data)
            call_id = message.call_id
        except SipParseError:
            return Admission(Verdict.FORBID, reason="untrusted")
        known = self._known.get(call_id)
        if known is not None and known.host == host and known.expires > now:
            return Admission(Verdict.ACCEPT, tenant=known.tenant)
        if not isinstance(message, SipRequest) or message.method not in CHALLENGED_METHODS:
            return Admission(Verdict.FORBID, reason="untrusted")
        header = message.headers.get("Authorization")
        if header is None or message.method != "INVITE":
            return self._challenge(auth, wall, host)
        try:
            credentials = parse_authorization(header)
        except DigestError:
            return Admission(Verdict.BAD_REQUEST, reason="bad_credentials")
        uri = credentials.uri if _same_target(credentials.uri, message.uri) else message.uri
        result = auth.verify(
            credentials, method="INVITE", request_uri=uri, source_host=host, now=wall
        )
        if result.verdict is DigestVerdict.STALE:
            return self._challenge(auth, wall, host, stale=True)
        if result.verdict is not DigestVerdict.OK or result.username is None:
            log.info(
                "sip: digest from %s for user %r refused: %s (uri %r, Request-URI %r)",
                host,
                credentials.username[:64],
                result.verdict.value,
                credentials.uri[:128],
                message.uri[:128],
            )
            return Admission(Verdict.FORBID, reason="bad_credentials")
        tenant = self._trunks[result.username].tenant
        if not self._remember(call_id, host, tenant, now):
            return Admission(Verdict.BUSY, reason="trunk_calls")
        return Admission(Verdict.ACCEPT, tenant=tenant)

    def tenant(self, call_id: str, host: str) -> str | None:
        """The tenant of an authenticated call from ``host``; None when it is not one."""
        known = self._known.get(call_id)
        return known.tenant if known is not None and known.host == host else None

    def call_started(self, call_id: str) -> None:
        """The call has a leg: keep its Call-ID while it lives."""
        known = self._known.get(call_id)
        if known is not None:
            known.expires = math.inf

    def call_ended(self, call_id: str, now: float) -> None:
        """The call is over: keep its Call-ID a little longer for its last transactions."""
        known = self._known.get(call_id)
        if known is not None:
            known.expires = now + LINGER_S

    @property
    def known_calls(self) -> int:
        return len(self._known)

    def _challenge(
        self, auth: DigestAuthenticator, wall: float, host: str, *, stale: bool = False
    ) -> Admission:
        values = auth.challenges(wall, host, stale=stale)
        return Admission(
            Verdict.CHALLENGE,
            headers=tuple(("WWW-Authenticate", value) for value in values),
            reason="challenged",
        )

    def _remember(self, call_id: str, host: str, tenant: str, now: float) -> bool:
        if call_id not in self._known and len(self._known) >= self._max:
            for key in [k for k, v in self._known.items() if v.expires <= now]:
                del self._known[key]
            if len(self._known) >= self._max:
                return False
        self._known[call_id] = _Known(host, tenant, now + LINGER_S)
        return True
