"""Whom a session counts against, and how many sessions that tenant may hold at once.

Every entry point gives its session a tenant and a limit through :func:`quota_for`, and
through nothing else (a session has no other way to be given them):

- the native WebSocket, the WebSocket legs (Twilio, Asterisk chan_websocket, jambonz,
  FreeSWITCH) and ``POST /v1/audio/speech``: the verified token: its tenant, under its
  ``max_streams`` claim (``GATEWAY_TENANT_MAX_STREAMS`` when it has none);
- AudioSocket and the SIP bridge, which carry no token: the tenant of the trusted network
  (``GATEWAY_AUDIOSOCKET_ALLOW``, ``GATEWAY_SIP_ALLOW``) or of the digest trunk the call
  came from, under ``GATEWAY_TENANT_MAX_STREAMS``.

:class:`gateway.tenant_limits.TenantLimits` leases one of the tenant's slots when the
session starts, and refuses it (``tenant_limit``) when the tenant holds them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth import Principal


@dataclass(frozen=True)
class TenantQuota:
    tenant: str
    max_streams: int | None = None  # the token's claim; None: GATEWAY_TENANT_MAX_STREAMS
    cache: bool | None = None  # the token's ``cache`` claim; None: the tenant's setting

    def limit(self, default: int) -> int:
        """The tenant's concurrent sessions at most (``default``: the setting)."""
        return self.max_streams or default

    def retains(self, no_retention: frozenset[str], requested: bool | None = None) -> bool:
        """Whether the speech cache may keep this session's (or utterance's) speech:
        never when the token says ``cache: false`` or the tenant is in ``no_retention``
        (``GATEWAY_SPEECH_CACHE_NO_RETENTION``; ``*`` is every tenant); else what the
        request says (``cache`` on ``start``, ``speak``, the speech endpoint), by
        default yes. The tenant's setting is a ceiling: a request cannot turn it on."""
        if self.cache is False or "*" in no_retention or self.tenant in no_retention:
            return False
        return requested is not False


#: A session not yet authenticated (it cannot start before it gets a quota).
UNASSIGNED = TenantQuota("")


def quota_for(who: Principal | str) -> TenantQuota:
    """The quota of a session: ``who`` is the verified token, or, for an entry point
    without one, the tenant its trusted network or trunk names."""
    if isinstance(who, str):
        return TenantQuota(who)
    return TenantQuota(who.tenant, who.max_streams, who.cache)
