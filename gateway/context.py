"""The narrow views of a gateway worker that connections and call legs receive.

:class:`gateway.state.GatewayState` holds every component of a worker; a wire protocol's
connection and a telephony leg see only the part they use, typed here as protocols that
the state satisfies. So a leg cannot reach the engine supervisor, the admission gate, the
tenant leases or the voice store, and a change to those cannot ripple into the legs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.auth import Principal
    from gateway.calls import CallRegistry
    from gateway.config import GatewaySettings
    from gateway.connections import Connections
    from gateway.metrics import GatewayMetrics
    from gateway.pacer import Pacer
    from gateway.session import Peer, Session
    from gateway.tenant_quota import TenantQuota


class ConnectionContext(Protocol):
    """What one connection's lifecycle uses (:mod:`gateway.protocols.base`)."""

    @property
    def settings(self) -> GatewaySettings: ...

    @property
    def metrics(self) -> GatewayMetrics: ...

    @property
    def connections(self) -> Connections: ...

    @property
    def token_leeway_s(self) -> float:
        """How long past its ``exp`` a token's session may run (``GATEWAY_JWT_LEEWAY_S``)."""
        ...

    def verify(self, token: str | None, scope: str) -> Principal: ...

    def new_session(
        self,
        peer: Peer,
        protocol: str,
        quota: TenantQuota,
        *,
        burst_lead_s: float | None = None,
    ) -> Session: ...


class LegContext(ConnectionContext, Protocol):
    """What a telephony leg uses besides its connection: the worker's calls, the pacer
    (to resume a paused call) and voice resolution (:mod:`gateway.legs`)."""

    @property
    def calls(self) -> CallRegistry: ...

    @property
    def pacer(self) -> Pacer: ...

    @property
    def default_voice(self) -> str:
        """The engine's default voice (a call that names none speaks with it)."""
        ...

    async def resolve_voice(self, tenant: str, voice: str) -> tuple[str, bytes | None, str]:
        """(engine voice, registered voice features or None, voice digest or "")."""
        ...


__all__ = ["ConnectionContext", "LegContext"]
