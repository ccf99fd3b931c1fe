"""Per-tenant session limits for sessions (:class:`gateway.session.SessionLeases`): a
session takes a lease of its tenant's slots at ``start`` (:mod:`gateway.leases`, in Redis
across instances) and gives it back when it ends; a lease lost in a stall ends it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from redis.asyncio import Redis

from gateway.config import GatewaySettings
from gateway.connections import shutting_down
from gateway.errors import CloseCode, ErrorCode, SessionError
from gateway.leases import Lease, LeaseError, LeaseSettings, TenantLeases
from gateway.metrics import GatewayMetrics
from gateway.session import Session

log = logging.getLogger(__name__)


class TenantLimits:
    def __init__(
        self,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        redis: Redis | None,
        *,
        instance_id: str,
        draining: Callable[[], bool],
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._draining = draining
        self.leases = TenantLeases(
            redis,
            LeaseSettings(
                lease_s=settings.lease_s,
                renew_every_s=settings.lease_renew_s,
                policy="fail-closed" if settings.lease_policy == "fail-closed" else "fail-open",
                key_prefix=settings.redis_prefix,
            ),
            instance_id=instance_id,
            on_store_error=self.on_store_error,
            on_lost=self.on_lease_lost,
        )
        self._lease_of: dict[str, Lease] = {}
        self._leased: dict[str, Session] = {}

    async def start(self) -> None:
        await self.leases.start()  # renews the leases held, every GATEWAY_LEASE_RENEW_MS

    async def stop(self) -> None:
        await self.leases.stop()

    @property
    def held(self) -> int:
        """Sessions holding a lease now."""
        return len(self._lease_of)

    async def acquire_lease(self, session: Session) -> None:
        """Raises ``shutting_down``, ``tenant_limit`` or ``limits_unavailable`` (1013)."""
        if self._draining():
            self._metrics.rejections.labels(reason="shutting_down").inc()
            raise shutting_down()
        limit = session.quota.limit(self._settings.tenant_max_streams)
        try:
            lease = await self.leases.acquire(session.tenant, limit, session.id)
        except LeaseError as exc:
            self._metrics.rejections.labels(reason=exc.code).inc()
            raise SessionError(
                ErrorCode(exc.code),
                f"tenant {session.tenant!r} is at its limit of {limit} sessions"
                if exc.code == ErrorCode.TENANT_LIMIT
                else "session limits cannot be checked now",
                CloseCode.TRY_AGAIN_LATER,
                retry_after_ms=self._settings.retry_after_ms,
            ) from None
        self._lease_of[session.id] = lease
        self._leased[session.id] = session

    async def release_lease(self, session: Session) -> None:
        self._leased.pop(session.id, None)
        lease = self._lease_of.pop(session.id, None)
        if lease is not None:
            await self.leases.release(lease)

    def on_lease_lost(self, lease: Lease) -> None:
        session = self._leased.get(lease.session_id)
        self._metrics.golden_errors.labels(type="lease_lost").inc()
        if session is not None:
            log.warning("session %s lost its tenant lease", session.id)
            session.fail(
                SessionError(
                    ErrorCode.LEASE_LOST,
                    "the session's slot in the tenant limit expired (a stall)",
                    CloseCode.TRY_AGAIN_LATER,
                )
            )

    def on_store_error(self, op: str) -> None:
        self._metrics.lease_store_errors.labels(op=op, policy=self._settings.lease_policy).inc()
