"""What one gateway worker shares between its connections."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from aiohttp import web

from engine.client import EngineClient, EngineUnavailable
from engine.schema import VoiceInfo
from engine.supervisor import EngineSupervisor
from gateway.auth import AuthError, Principal, TokenVerifier, token_from_request
from gateway.calls import CallRegistry
from gateway.config import GatewaySettings
from gateway.metrics import GatewayMetrics
from gateway.pacer import Pacer
from gateway.session import SessionLimits

log = logging.getLogger(__name__)


@dataclass
class GatewayState:
    settings: GatewaySettings
    verifier: TokenVerifier
    metrics: GatewayMetrics
    pacer: Pacer
    supervisor: EngineSupervisor
    voices: tuple[VoiceInfo, ...] = ()
    engine_max_text_chars: int = 5000
    calls: CallRegistry = field(default_factory=CallRegistry)

    def engine_client(self) -> EngineClient:
        client = self.supervisor.client
        if client is None or client.lost:
            raise EngineUnavailable("the engine is not ready")
        return client

    def on_engine_ready(self, client: EngineClient) -> None:
        if client.welcome is not None:
            self.voices = client.welcome.voices
            self.engine_max_text_chars = client.welcome.max_text_chars
        self.metrics.engine_ready.set(1)

    def on_engine_lost(self) -> None:
        self.metrics.engine_ready.set(0)
        self.metrics.engine_restarts.inc()

    def session_limits(self) -> SessionLimits:
        limits = self.settings.limits
        if limits.max_text_chars > self.engine_max_text_chars:
            from dataclasses import replace

            limits = replace(limits, max_text_chars=self.engine_max_text_chars)
        return limits

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
