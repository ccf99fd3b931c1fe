"""What one gateway worker shares between its connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace

from aiohttp import web

from engine.ipc.client import EngineClient, EngineUnavailable
from engine.ipc.schema import VoiceInfo
from gateway.admission_gate import AdmissionGate
from gateway.auth import AuthError, Principal, TokenVerifier, token_from_request
from gateway.calls import CallRegistry
from gateway.config import GatewaySettings
from gateway.engine_supervisor import EngineSupervisor
from gateway.errors import CloseCode, ErrorCode, SessionError
from gateway.leases import Lease, LeaseError, TenantLeases
from gateway.metrics import GatewayMetrics
from gateway.pacer import Pacer
from gateway.session import Session, SessionLimits, SessionState
from gateway.voices.registry import VOICE_ID_PREFIX, BackendInfo, VoiceError, VoiceRegistry

log = logging.getLogger(__name__)


def _shutting_down() -> SessionError:
    return SessionError(
        ErrorCode.SHUTTING_DOWN,
        "this gateway instance is shutting down; connect again",
        CloseCode.TRY_AGAIN_LATER,
        retry_after_ms=0,
    )


@dataclass
class GatewayState:
    settings: GatewaySettings
    verifier: TokenVerifier
    metrics: GatewayMetrics
    pacer: Pacer
    supervisor: EngineSupervisor
    gate: AdmissionGate
    registry: VoiceRegistry
    leases: TenantLeases
    voices: tuple[VoiceInfo, ...] = ()
    backend: BackendInfo | None = None
    engine_max_text_chars: int = 5000
    calls: CallRegistry = field(default_factory=CallRegistry)
    draining: bool = False  # shutting down: no new sessions, calls in progress finish
    live: set[Session] = field(default_factory=set)  # every connection's session
    _lease_of: dict[str, Lease] = field(default_factory=dict)
    _leased: dict[str, Session] = field(default_factory=dict)
    _drained: asyncio.Event = field(default_factory=asyncio.Event)
    _owned: set[asyncio.Future[None]] = field(default_factory=set)

    # --- per-tenant session limits (SessionLeases) ---------------------------------------

    async def acquire_lease(self, session: Session) -> None:
        if self.draining:
            self.metrics.rejections.labels(reason="shutting_down").inc()
            raise _shutting_down()
        limit = session.max_streams or self.settings.tenant_max_streams
        try:
            lease = await self.leases.acquire(session.tenant, limit, session.id)
        except LeaseError as exc:
            self.metrics.rejections.labels(reason=exc.code).inc()
            raise SessionError(
                ErrorCode(exc.code),
                f"tenant {session.tenant!r} is at its limit of {limit} sessions"
                if exc.code == ErrorCode.TENANT_LIMIT
                else "session limits cannot be checked now",
                CloseCode.TRY_AGAIN_LATER,
                retry_after_ms=self.settings.retry_after_ms,
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
        self.metrics.golden_errors.labels(type="lease_lost").inc()
        if session is not None:
            log.warning("session %s lost its tenant lease", session.id)
            session.fail(
                SessionError(
                    ErrorCode.LEASE_LOST,
                    "the session's slot in the tenant limit expired (a stall)",
                    CloseCode.TRY_AGAIN_LATER,
                )
            )

    def track(self, session: Session) -> None:
        """A connection's session exists (from the upgrade until its socket is done)."""
        self.live.add(session)

    def own(self, task: asyncio.Future[None]) -> None:
        """Keep ``task`` (a connection's teardown) until it finishes; :meth:`close`
        awaits what is left."""
        self._owned.add(task)
        task.add_done_callback(self._owned.discard)

    async def close(self) -> None:
        """Wait for the teardowns still running (at shutdown, after the drain)."""
        if self._owned:
            await asyncio.wait(list(self._owned), timeout=5.0)

    def untrack(self, session: Session) -> None:
        self.live.discard(session)
        if not self.live:
            self._drained.set()

    async def drain(self, timeout_s: float) -> int:
        """Graceful shutdown: refuse new sessions, let those in progress finish for up to
        ``timeout_s``, then end the rest with ``shutting_down`` (1013: a client connects
        again, to another instance). Connections that never started are told at once.
        Returns how many had to be ended at the timeout."""
        self.draining = True
        for session in list(self.live):
            if session.state is SessionState.AWAITING_START:
                session.fail(_shutting_down())
        log.info("draining: %d session(s) in progress, up to %.0f s", len(self.live), timeout_s)
        if self.live:
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._drained.wait()
        remaining = [s for s in self.live if s.state is not SessionState.CLOSED]
        for session in remaining:
            session.fail(_shutting_down())
        if self.live:
            if remaining:
                log.warning("draining: ended %d session(s) still open", len(remaining))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):  # their close frames go out
                    await self._drained.wait()
        return len(remaining)

    def on_lease_store_error(self, op: str) -> None:
        self.metrics.lease_store_errors.labels(op=op, policy=self.settings.lease_policy).inc()

    def engine_client(self) -> EngineClient:
        client = self.supervisor.client
        if client is None or client.lost:
            raise EngineUnavailable("the engine is not ready")
        return client

    def on_engine_ready(self, client: EngineClient) -> None:
        welcome = client.welcome
        if welcome is not None:
            self.voices = welcome.voices
            self.engine_max_text_chars = welcome.max_text_chars
            self.backend = BackendInfo(
                name=welcome.backend,
                version=welcome.backend_version,
                cloning=welcome.voice_cloning,
                voices={v.id: v.language for v in welcome.voices},
            )
        self.metrics.engine_ready.set(1)

    def on_engine_lost(self) -> None:
        self.metrics.engine_ready.set(0)
        self.metrics.engine_restarts.inc()
        self.metrics.golden_errors.labels(type="engine_unavailable").inc()

    def refresh_engine_gauges(self) -> None:
        """Engine memory from the last heartbeat (the supervisor pings every second)."""
        client = self.supervisor.client
        pong = client.last_pong if client is not None else None
        if pong is not None:
            self.metrics.gpu_memory_used.set(pong.gpu_used_bytes)
            self.metrics.engine_memory_used.set(pong.memory_used_bytes or pong.rss_bytes)
            self.metrics.engine_memory_budget.set(pong.memory_budget_bytes)

    def session_limits(self) -> SessionLimits:
        limits = self.settings.limits
        return replace(
            limits,
            max_text_chars=min(limits.max_text_chars, self.engine_max_text_chars),
            retry_after_ms=self.settings.retry_after_ms,
        )

    async def resolve_voice(self, tenant: str, voice: str) -> tuple[str, bytes | None]:
        """(engine voice id, voice profile) for ``voice``: a built-in voice, or one of
        the tenant's registered voices. Raises ``unknown_voice`` (1008)."""
        if voice.startswith(VOICE_ID_PREFIX):
            try:
                found = await self.registry.profile(tenant, voice)
            except VoiceError as exc:
                raise SessionError(exc.code, exc.message, CloseCode.TRY_AGAIN_LATER) from None
            if found is not None:
                return found
        elif not self.voices or voice in self.voice_ids():
            return voice, None
        raise SessionError(
            ErrorCode.UNKNOWN_VOICE, f"unknown voice {voice[:64]!r}", CloseCode.POLICY
        )

    def voice_ids(self) -> frozenset[str]:
        return frozenset(v.id for v in self.voices)

    def authenticate(self, request: web.Request, scope: str) -> Principal:
        """Verify the request's token; raises :class:`AuthError` (counted, logged)."""
        token = token_from_request(request.headers, request.query)
        try:
            if token is None:
                raise AuthError("token_missing", "no bearer token or access_token parameter")
            return self.verifier.verify(token, scope)
        except AuthError as exc:
            self.metrics.auth_failures.labels(code=exc.code).inc()
            log.info("auth failed on %s: %s", request.path, exc.code)
            raise


STATE_KEY = web.AppKey("gateway_state", GatewayState)
