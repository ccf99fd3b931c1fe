"""What one gateway worker shares between its connections: its settings and the
components every connection uses, each with one job (:mod:`gateway.connections`,
:mod:`gateway.tenant_limits`, :mod:`gateway.engine_link`, the pacer, the admission gate,
the voice registry, the call registry)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from aiohttp import web
from redis.asyncio import Redis

from engine.speech_cache.key import registered_voice_digest
from gateway.admission_gate import AdmissionGate
from gateway.auth import AuthError, Principal, TokenVerifier
from gateway.calls import CallRegistry
from gateway.config import GatewaySettings
from gateway.connections import Connections
from gateway.engine_link import EngineLink
from gateway.engine_supervisor import EngineSupervisor
from gateway.errors import CloseCode, ErrorCode, SessionError
from gateway.metrics import GatewayMetrics
from gateway.pacer import Pacer
from gateway.session import Peer, Session, SessionLimits
from gateway.tenant_limits import TenantLimits
from gateway.tenant_quota import TenantQuota
from gateway.voices.registry import VOICE_ID_PREFIX, VoiceError, VoiceRegistry
from gateway.voices.store import VoiceStore

log = logging.getLogger(__name__)


@dataclass
class GatewayState:
    settings: GatewaySettings
    verifier: TokenVerifier
    metrics: GatewayMetrics
    pacer: Pacer
    gate: AdmissionGate
    engine: EngineLink
    registry: VoiceRegistry
    limits: TenantLimits
    connections: Connections
    calls: CallRegistry = field(default_factory=CallRegistry)

    @classmethod
    def create(
        cls,
        settings: GatewaySettings,
        *,
        supervisor: EngineSupervisor,
        store: VoiceStore,
        redis: Redis | None = None,
        verifier: TokenVerifier | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> GatewayState:
        """The worker's components, wired together (tests pass fakes for the engine
        supervisor and the store)."""
        metrics = metrics or GatewayMetrics()
        engine = EngineLink(supervisor, metrics)
        connections = Connections()
        return cls(
            settings=settings,
            verifier=verifier or TokenVerifier.from_settings(settings.auth),
            metrics=metrics,
            pacer=Pacer(metrics, tick_s=settings.tick_s),
            gate=AdmissionGate(settings.admission, metrics),
            engine=engine,
            registry=VoiceRegistry(
                store,
                engine=lambda: engine.client(),
                backend=lambda: engine.backend,
                metrics=metrics,
                l1_size=settings.voice_cache_size,
            ),
            limits=TenantLimits(
                settings,
                metrics,
                redis,
                instance_id=uuid.uuid4().hex,
                draining=lambda: connections.draining,
            ),
            connections=connections,
        )

    @property
    def token_leeway_s(self) -> float:
        return self.verifier.settings.leeway_s

    @property
    def default_voice(self) -> str:
        return self.engine.default_voice

    def verify(self, token: str | None, scope: str) -> Principal:
        """Verify a bearer token for ``scope``; raises :class:`AuthError`, counted in
        ``gateway_auth_failures_total`` (the token itself is never logged)."""
        try:
            if not token:
                raise AuthError("token_missing", "no bearer token or access_token parameter")
            return self.verifier.verify(token, scope)
        except AuthError as exc:
            self.metrics.auth_failures.labels(code=exc.code).inc()
            raise

    def new_session(
        self,
        peer: Peer,
        protocol: str,
        quota: TenantQuota,
        *,
        burst_lead_s: float | None = None,
    ) -> Session:
        """A session of this worker for ``peer`` (every protocol's connection or leg),
        counted against ``quota`` (:func:`gateway.tenant_quota.quota_for`; ``UNASSIGNED``
        for a connection that authenticates later); ``burst_lead_s`` overrides how far
        ahead of real time burst pacing may run (an HTTP response, whose backpressure is
        the peer's, has no need to hold back)."""
        limits = self.session_limits()
        if burst_lead_s is not None:
            limits = replace(limits, burst_lead_s=burst_lead_s)
        return Session(
            peer=peer,
            engine=self.engine.client,
            pacer=self.pacer,
            metrics=self.metrics,
            limits=limits,
            protocol=protocol,
            quota=quota,
            gate=self.gate,
            leases=self.limits,
        )

    def session_limits(self) -> SessionLimits:
        limits = self.settings.limits
        return replace(
            limits,
            max_text_chars=min(limits.max_text_chars, self.engine.max_text_chars),
            retry_after_ms=self.settings.retry_after_ms,
            no_retention=self.settings.speech_cache_no_retention,
        )

    async def resolve_voice(self, tenant: str, voice: str) -> ResolvedVoice:
        """(engine voice id, voice profile, voice digest) for ``voice``: a built-in
        voice, or one of the tenant's registered voices. Raises ``unknown_voice``
        (1008)."""
        if voice.startswith(VOICE_ID_PREFIX):
            try:
                found = await self.registry.profile(tenant, voice)
            except VoiceError as exc:
                raise SessionError(exc.code, exc.message, CloseCode.TRY_AGAIN_LATER) from None
            if found is not None:
                base, features = found
                digest = registered_voice_digest(tenant, voice, features)
                return ResolvedVoice(base, features, digest)
        elif not self.engine.voices or voice in self.engine.voice_ids():
            return ResolvedVoice(voice, None, "")
        raise SessionError(
            ErrorCode.UNKNOWN_VOICE, f"unknown voice {voice[:64]!r}", CloseCode.POLICY
        )


class ResolvedVoice(NamedTuple):
    """A voice as the engine is asked for it: its engine voice id, a registered voice's
    features (None: built in) and its digest in the speech cache ("" built in)."""

    voice: str
    profile: bytes | None
    digest: str


STATE_KEY = web.AppKey("gateway_state", GatewayState)
