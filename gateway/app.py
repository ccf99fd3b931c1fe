"""The aiohttp application of one gateway worker."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.supervisor import EngineSupervisor, SupervisorSettings
from gateway.admission_gate import AdmissionGate
from gateway.auth import AuthError, TokenVerifier, redact_query
from gateway.config import GatewaySettings
from gateway.metrics import GatewayMetrics
from gateway.pacer import Pacer
from gateway.protocols import PROTOCOLS
from gateway.protocols.native import SCOPE
from gateway.state import STATE_KEY, GatewayState

log = logging.getLogger(__name__)


class RedactingAccessLogger(AbstractAccessLogger):
    """Access log lines with ``access_token`` values replaced: tokens never reach logs."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            '%s "%s %s" %s %.1fms',
            request.remote,
            request.method,
            redact_query(request.path_qs),
            response.status,
            time * 1000,
        )


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


async def voices(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        state.authenticate(request, SCOPE)
    except AuthError as exc:
        return _error(exc.http_status, exc.code, exc.message)
    if not state.voices:
        return _error(503, "engine_unavailable", "the TTS engine is not ready")
    return web.json_response(
        {
            "voices": [
                {
                    "id": v.id,
                    "language": v.language,
                    "name": v.name,
                    "gender": v.gender,
                    "backend": v.backend,
                    "kind": "builtin",
                }
                for v in state.voices
            ]
        }
    )


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    supervisor = state.supervisor
    ready = supervisor.ready
    client = supervisor.client
    body = {
        "ready": ready,
        "engine": supervisor.state.value,
        "engine_pid": client.welcome.engine_pid if ready and client and client.welcome else None,
        "engine_restarts": supervisor.restarts,
    }
    return web.json_response(body, status=200 if ready else 503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.metrics.engine_ready.set(1 if state.supervisor.ready else 0)
    state.refresh_engine_gauges()
    body = generate_latest(state.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def index(request: web.Request) -> web.StreamResponse:
    page = request.app[STATE_KEY].settings.web_demo_dir / "index.html"
    if not page.is_file():
        return _error(404, "not_found", "the demo page is not installed")
    return web.FileResponse(page, headers={"Cache-Control": "no-cache"})


def create_app(settings: GatewaySettings, verifier: TokenVerifier | None = None) -> web.Application:
    metrics = GatewayMetrics()
    supervisor = EngineSupervisor(
        SupervisorSettings(
            socket_path=settings.engine_socket,
            backend=settings.engine_backend,
            extra_args=list(settings.engine_extra_args),
            ready_timeout=settings.engine_ready_timeout_s,
            heartbeat_interval=settings.engine_heartbeat_s,
            heartbeat_timeout=settings.engine_heartbeat_timeout_s,
        )
    )
    state = GatewayState(
        settings=settings,
        verifier=verifier or TokenVerifier.from_settings(settings.auth),
        metrics=metrics,
        pacer=Pacer(metrics, tick_s=settings.tick_s),
        supervisor=supervisor,
        gate=AdmissionGate(settings.admission, metrics),
    )
    supervisor.on_ready = state.on_engine_ready
    supervisor.on_lost = state.on_engine_lost

    app = web.Application(client_max_size=1024**2)
    app[STATE_KEY] = state

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        state.pacer.start()
        state.gate.start()
        await supervisor.start()
        yield
        await supervisor.stop()
        await state.gate.stop()
        await state.pacer.stop()

    app.cleanup_ctx.append(lifecycle)
    for path, handler in PROTOCOLS.items():
        app.router.add_get(path, handler)
    app.router.add_get("/v1/voices", voices)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/", index)
    if settings.web_demo_dir.is_dir():
        app.router.add_static("/static/", settings.web_demo_dir, show_index=False)
    return app
