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
  answered and forgotten). Wrong password, unknown user, a digest for another URI, a
  realm not ours: **forbid** (403); a malformed ``Authorization``: **bad request** (400);
- anything else (ACK, CANCEL, BYE, a re-INVITE, responses) gets in only when its Call-ID
  is remembered for its source host; an ACK that is not (the ACK of our 401) is
  **dropped**; the rest is forbidden.

Lockout (no online password guessing at line rate, and no locking a trunk out by
forgery): a failed guess is only a response computed over a valid, unexpired nonce that
this gateway issued to the source host (``DigestVerdict.failed_guess``: a wrong password,
an unknown user, a digest for another URI). A malformed ``Authorization``, a realm not
ours, and a nonce that is foreign, forged, issued to another host or expired count
nothing: anyone can send those in a trunk's name over UDP, while a nonce only reaches the
host it was issued to (the 401 goes to the packet's source and nowhere else). Failures
are counted per credential and source, the pair (source host, username):
:data:`MAX_FAILURES` in :data:`FAILURE_WINDOW_S` lock that pair out until the window
ends (**forbid**, reason ``bad_credentials``, whatever the password), and only that
pair: the same username from another host, and other usernames from that host, are
checked as before. A right password clears its pair's count. The table holds at most
:data:`MAX_FAILURE_ENTRIES` pairs; when it is full, expired entries go first, then the
oldest one not locked out, then the oldest. So only a party that receives the trunk's
own challenges (the trunk, or someone on its path) can lock the trunk's username out at
the trunk's address.

Other limits: each host may have ``max_calls_per_host`` remembered Call-IDs and all
hosts ``max_calls`` (beyond: **busy**, 503). A Call-ID is kept while a call with it
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

__all__ = [
    "FAILURE_WINDOW_S",
    "LINGER_S",
    "MAX_FAILURES",
    "MAX_FAILURE_ENTRIES",
    "Admission",
    "TrunkGate",
    "Verdict",
]

log = logging.getLogger(__name__)
_digest_log = PeerLog(log, "sip digest")  # anyone can fail a digest: rate-limited

#: 64*T1: how long a Call-ID stays known once its calls are over (or never began).
LINGER_S = 32.0
MAX_FAILURES = 5
FAILURE_WINDOW_S = 60.0
MAX_FAILURE_ENTRIES = 4096  # (source host, username) pairs with failures
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
        self._failures: dict[tuple[str, str], _Failures] = {}  # (host, username)
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
        try:
            credentials = parse_authorization(header)
        except DigestError as exc:  # no guess at a password: counts nothing
            _digest_log.info("from %s: malformed Authorization: %s", host, exc.code)
            return Admission(Verdict.BAD_REQUEST, reason="bad_credentials")
        uri = credentials.uri if _same_target(credentials.uri, message.uri) else message.uri
        result = auth.verify(
            credentials, method=message.method, request_uri=uri, source_host=host, now=wall
        )
        if result.verdict is DigestVerdict.STALE or result.verdict is DigestVerdict.BAD_NONCE:
            # an old nonce, or one this worker did not issue to this host (a restart, a
            # forgery): ask again; counts nothing
            return self._challenge(auth, wall, host, stale=result.verdict is DigestVerdict.STALE)
        key = (host, credentials.username)
        if self._locked_out(key, now):  # whatever the password: no guessing on
            _digest_log.info("from %s for user %r: locked out", host, credentials.username[:64])
            return Admission(Verdict.FORBID, reason="bad_credentials")
        if result.verdict is not DigestVerdict.OK or result.username is None:
            if result.verdict.failed_guess:  # not a realm not ours
                self._failed(key, now)
            _digest_log.info(
                "from %s for user %r refused: %s (uri %r, Request-URI %r)",
                host,
                credentials.username[:64],
                result.verdict.value,
                credentials.uri[:128],
                message.uri[:128],
            )
            return Admission(Verdict.FORBID, reason="bad_credentials")
        self._failures.pop(key, None)
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

    @property
    def failure_entries(self) -> int:
        """(source host, username) pairs with failed guesses held (at most
        :data:`MAX_FAILURE_ENTRIES`)."""
        return len(self._failures)

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

    def _locked_out(self, key: tuple[str, str], now: float) -> bool:
        failures = self._failures.get(key)
        if failures is None or now - failures.since > FAILURE_WINDOW_S:
            return False
        return failures.count >= MAX_FAILURES

    def _failed(self, key: tuple[str, str], now: float) -> None:
        failures = self._failures.get(key)
        if failures is not None and now - failures.since <= FAILURE_WINDOW_S:
            failures.count += 1
            return
        self._failures.pop(key, None)
        if len(self._failures) >= MAX_FAILURE_ENTRIES:
            self._evict(now)
        self._failures[key] = _Failures(1, now)

    def _evict(self, now: float) -> None:
        """Room for one entry: every expired one goes; else the oldest that is not locked
        out (so flooding the table does not free a locked-out pair); else the oldest."""
        expired = [k for k, f in self._failures.items() if now - f.since > FAILURE_WINDOW_S]
        for key in expired:
            del self._failures[key]
        if expired:
            return
        oldest = next(iter(self._failures))
        unlocked = (k for k, f in self._failures.items() if f.count < MAX_FAILURES)
        del self._failures[next(unlocked, oldest)]
