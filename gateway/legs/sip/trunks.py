"""Who may call from outside the trusted networks: SIP trunks that answer a digest
challenge (``[trunks.<name>]`` in the routes file, RFC 3261 22.4 with RFC 8760's
algorithms; the checks themselves are :mod:`telephony.sip.digest`).

:class:`TrunkGate` decides, for a datagram from a source outside ``GATEWAY_SIP_ALLOW``,
before the SIP core sees it:

- a new INVITE (no To tag) or an OPTIONS: its ``Authorization`` is checked, every time
  (a retransmission carries it again). None, a nonce that is not ours (another worker,
  a restart) or an old one: **challenge** (401 with ``WWW-Authenticate``, stateless: the
  nonce carries its own proof). Right credentials: **accept**, billed to the trunk's
  tenant; an INVITE's Call-ID is then remembered for that source host (an OPTIONS is
  answered and forgotten). Wrong password, unknown user, a digest for another URI:
  **forbid** (403); a malformed ``Authorization``: **bad request** (400);
- anything else (ACK, CANCEL, BYE, a re-INVITE, responses) gets in only when its Call-ID
  is remembered for its source host; an ACK that is not (the ACK of our 401) is
  **dropped**; the rest is forbidden.

Limits: a source host with :data:`MAX_FAILURES` failed digests in
:data:`FAILURE_WINDOW_S` is refused without checking for as long (no online password
guessing at line rate); each host may have ``max_calls_per_host`` remembered Call-IDs and
all hosts ``max_calls`` (beyond: **busy**, 503). A Call-ID is kept while a call with it
lives and :data:`LINGER_S` after (its last transactions), or :data:`LINGER_S` when no call
came of it (a 404, a 488, a lost ACK).
"""

from __future__ import annotations

import enum
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.legs.sip.routes import Trunk
from gateway.peer_log import PeerLog
from telephony.sip import SipError, SipParseError, SipRequest, parse_message, parse_uri
from telephony.sip.digest import (
    DigestAlgorithm,
    DigestAuthenticator,
    DigestError,
    DigestVerdict,
    parse_authorization,
)

__all__ = ["LINGER_S", "MAX_FAILURES", "Admission", "TrunkGate", "Verdict"]

log = logging.getLogger(__name__)
_digest_log = PeerLog(log, "sip digest")  # anyone can fail a digest: rate-limited

#: 64*T1: how long a Call-ID stays known once its calls are over (or never began).
LINGER_S = 32.0
MAX_FAILURES = 5
FAILURE_WINDOW_S = 60.0
MAX_FAILURE_HOSTS = 4096
CHALLENGED_METHODS = frozenset({"INVITE", "OPTIONS"})
_DEFAULT_PORTS = {"sip": 5060, "sips": 5061}


class Verdict(enum.Enum):
    ACCEPT = "accept"
    CHALLENGE = "challenge"
    FORBID = "forbid"
    BAD_REQUEST = "bad_request"
    BUSY = "busy"
    DROP = "drop"


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    tenant: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # WWW-Authenticate for a challenge
    reason: str = ""  # for the refused metric and the log


@dataclass
class _Known:
    tenant: str
    expires: float  # monotonic; inf while a call with this Call-ID lives
    calls: int = 0  # legs with this Call-ID from this host


@dataclass
class _Failures:
    count: int
    since: float


def _same_target(digest_uri: str, request_uri: str) -> bool:
    """The digest's ``uri`` names what the request is for: the Request-URI itself, or the
    URI of the same host and port without a user (sipp and some PBXs hash that).
    Anything else is checked as a wrong URI."""
    if digest_uri == request_uri:
        return True
    try:
        digest, request = parse_uri(digest_uri), parse_uri(request_uri)
    except SipError:
        return False
    default = _DEFAULT_PORTS.get(request.scheme)
    return (
        default is not None
        and digest.scheme == request.scheme
        and not digest.user
        and digest.host.lower() == request.host.lower()
        and (digest.port or default) == (request.port or default)
    )


class TrunkGate:
    def __init__(
        self,
        trunks: Mapping[str, Trunk],
        *,
        realm: str,
        max_calls: int,
        max_calls_per_host: int | None = None,
        algorithms: Sequence[str] = ("MD5",),
        secret: bytes | None = None,
    ) -> None:
        self._trunks = dict(trunks)
        self._max = max_calls
        self._max_per_host = max_calls_per_host or max_calls
        self._known: dict[tuple[str, str], _Known] = {}  # (host, Call-ID)
        self._per_host: dict[str, int] = {}
        self._failures: dict[str, _Failures] = {}
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
        ``now`` is monotonic (the Call-ID table, failures), ``wall`` Unix time (nonces)."""
        auth = self._auth
        if auth is None:
            return Admission(Verdict.FORBID, reason="untrusted")
        try:
            message = parse_message(data)
            call_id = message.call_id
            new_request = isinstance(message, SipRequest) and (
                message.method == "OPTIONS"
                or (message.method == "INVITE" and message.to.tag is None)
            )
        except SipParseError:
            return Admission(Verdict.FORBID, reason="untrusted")
        if not new_request:
            known = self._known.get((host, call_id))
            if known is not None and known.expires > now:
                return Admission(Verdict.ACCEPT, tenant=known.tenant)
            if isinstance(message, SipRequest) and message.method == "ACK":
                return Admission(Verdict.DROP)  # the ACK of our 401 (or of nothing)
            return Admission(Verdict.FORBID, reason="untrusted")
        assert isinstance(message, SipRequest)
        header = message.headers.get("Authorization")
        if header is None:
            return self._challenge(auth, wall, host)
        if self._blocked(host, now):
            return Admission(Verdict.FORBID, reason="bad_credentials")
        try:
            credentials = parse_authorization(header)
        except DigestError as exc:
            self._failed(host, now)
            _digest_log.info("from %s: malformed Authorization: %s", host, exc.code)
            return Admission(Verdict.BAD_REQUEST, reason="bad_credentials")
        uri = credentials.uri if _same_target(credentials.uri, message.uri) else message.uri
        result = auth.verify(
            credentials, method=message.method, request_uri=uri, source_host=host, now=wall
        )
        if result.verdict is DigestVerdict.STALE or result.verdict is DigestVerdict.BAD_NONCE:
            # an old nonce, or one this worker did not issue (a restart): ask again
            return self._challenge(auth, wall, host, stale=result.verdict is DigestVerdict.STALE)
        if result.verdict is not DigestVerdict.OK or result.username is None:
            self._failed(host, now)
            _digest_log.info(
                "from %s for user %r refused: %s (uri %r, Request-URI %r)",
                host,
                credentials.username[:64],
                result.verdict.value,
                credentials.uri[:128],
                message.uri[:128],
            )
            return Admission(Verdict.FORBID, reason="bad_credentials")
        tenant = self._trunks[result.username].tenant
        if message.method == "INVITE" and not self._remember(host, call_id, tenant, now):
            return Admission(Verdict.BUSY, reason="trunk_calls")
        return Admission(Verdict.ACCEPT, tenant=tenant)

    def tenant(self, call_id: str, host: str) -> str | None:
        """The tenant of an authenticated call from ``host``; None when it is not one."""
        known = self._known.get((host, call_id))
        return known.tenant if known is not None else None

    def call_started(self, call_id: str, host: str) -> None:
        """A call with this Call-ID from ``host`` has a leg: keep the Call-ID while it lives."""
        known = self._known.get((host, call_id))
        if known is not None:
            known.calls += 1
            known.expires = math.inf

    def call_ended(self, call_id: str, host: str, now: float) -> None:
        """That call is over: once no call with the Call-ID lives, keep it a little longer
        for the last transactions."""
        known = self._known.get((host, call_id))
        if known is not None:
            known.calls = max(0, known.calls - 1)
            if known.calls == 0:
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

    def _remember(self, host: str, call_id: str, tenant: str, now: float) -> bool:
        key = (host, call_id)
        known = self._known.get(key)
        if known is not None:
            if known.tenant != tenant:
                return False  # another trunk's credentials for a Call-ID in use
            if known.calls == 0:
                known.expires = now + LINGER_S
            return True
        if len(self._known) >= self._max or self._per_host.get(host, 0) >= self._max_per_host:
            self._prune(now)
            if len(self._known) >= self._max or self._per_host.get(host, 0) >= self._max_per_host:
                return False
        self._known[key] = _Known(tenant, now + LINGER_S)
        self._per_host[host] = self._per_host.get(host, 0) + 1
        return True

    def _prune(self, now: float) -> None:
        for key in [k for k, v in self._known.items() if v.expires <= now]:
            del self._known[key]
            left = self._per_host[key[0]] - 1
            if left:
                self._per_host[key[0]] = left
            else:
                del self._per_host[key[0]]

    def _blocked(self, host: str, now: float) -> bool:
        failures = self._failures.get(host)
        if failures is None or now - failures.since > FAILURE_WINDOW_S:
            return False
        return failures.count >= MAX_FAILURES

    def _failed(self, host: str, now: float) -> None:
        failures = self._failures.get(host)
        if failures is None or now - failures.since > FAILURE_WINDOW_S:
            if len(self._failures) >= MAX_FAILURE_HOSTS:
                stale = [h for h, f in self._failures.items() if now - f.since > FAILURE_WINDOW_S]
                for old in stale or [next(iter(self._failures))]:
                    del self._failures[old]
            self._failures[host] = _Failures(1, now)
        else:
            failures.count += 1
