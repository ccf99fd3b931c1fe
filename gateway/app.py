"""The aiohttp application of one gateway worker."""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import AsyncIterator, Sequence

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import speech_api
from gateway.auth import TokenVerifier, redact_query
from gateway.config import GatewaySettings
from gateway.engine_supervisor import EngineSupervisor, SupervisorSettings
from gateway.errors import ErrorCode
from gateway.http_errors import json_error
from gateway.legs.kinds import LEG_KINDS, LegKind, LegService, declared_prompts, leg_routes
from gateway.likely_hits import likely_hit_key
from gateway.metrics import exposition_registry
from gateway.protocols import PROTOCOLS
from gateway.relay_endpoint import RelayEndpoint
from gateway.speech_cache import api as speech_cache_api
from gateway.speech_cache.prompts import PromptLimits
from gateway.speech_cache.service import SpeechCacheService, SpeechCacheSettings
from gateway.state import STATE_KEY, GatewayState
from gateway.voices import api as voices_api
from gateway.voices.deletions import DeletionChannel
from gateway.voices.reference_audio import MAX_UPLOAD_BYTES
from gateway.voices.store import FileVoiceStore, RedisVoiceStore, VoiceStore
from gateway.voices.upload_worker import UploadWorkers

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


WORKER_HEADER = "X-Gateway-Worker"
LEG_SERVICES_KEY = web.AppKey("leg_services", list[LegService])  # legs with own listeners
WEBSOCKET_ROUTES = {**PROTOCOLS, **leg_routes()}
"""Every WebSocket path the gateway serves: the native protocol's and each leg's."""


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    supervisor = state.engine.supervisor
    draining = state.connections.draining
    ready = supervisor.ready and not draining
    client = supervisor.client
    # Probes are unauthenticated: they say whether to send traffic here, nothing internal
    # (process ids, restart counts and the rest are in /metrics and the log).
    body = {
        "ready": ready,
        "draining": draining,
        "vad_ready": bool(
            supervisor.ready
            and client
            and client.last_pong is not None
            and client.last_pong.vad_ready
        ),
    }
    return web.json_response(body, status=200 if ready else 503)


def may_scrape(settings: GatewaySettings, request: web.Request) -> bool:
    """Whether ``request`` may read /metrics: its peer (the socket's, never a header) is
    in ``GATEWAY_METRICS_ALLOW`` (loopback by default), or it bears
    ``GATEWAY_METRICS_TOKEN``. The counters tell how callers are served: an operator's."""
    token = settings.metrics_token
    if token:
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return True
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in settings.metrics_allow)


async def metrics_endpoint(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    if not may_scrape(state.settings, request):
        return json_error(403, ErrorCode.FORBIDDEN, "metrics are not served to this client")
    state.engine.refresh_gauges()
    metrics = state.metrics
    body = generate_latest(
        exposition_registry(metrics.registry, (metrics.engine_speech_cache_collector,))
    )
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def index(request: web.Request) -> web.StreamResponse:
    page = request.app[STATE_KEY].settings.web_demo_dir / "index.html"
    if not page.is_file():
        return json_error(404, ErrorCode.NOT_FOUND, "the demo page is not installed")
    return web.FileResponse(page, headers={"Cache-Control": "no-cache"})


def create_app(
    settings: GatewaySettings,
    verifier: TokenVerifier | None = None,
    *,
    relay: RelayEndpoint | None = None,
    legs: Sequence[LegKind] = LEG_KINDS,
) -> web.Application:
    """The worker's application; ``relay`` (its own listener for relayed attaches, see
    :mod:`gateway.relay_endpoint`) makes its calls reachable from other workers."""
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
    redis_client = (
        aioredis.from_url(settings.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        if settings.redis_url
        else None
    )
    store: VoiceStore = (
        RedisVoiceStore(redis_client, prefix=settings.redis_prefix)
        if redis_client
        else FileVoiceStore(settings.voice_dir)
    )
    state = GatewayState.create(
        settings, supervisor=supervisor, store=store, redis=redis_client, verifier=verifier
    )
    if relay is not None:
        state.calls.directory = relay.directory(redis_client, settings)
    call_directory = state.calls.directory
    registry = state.registry
    if redis_client is not None:
        registry.deletions = DeletionChannel(
            redis_client,
            settings.redis_prefix,
            on_deleted=registry.forget,
            on_resync=registry.expire_records,
        )

    app = web.Application(client_max_size=MAX_UPLOAD_BYTES + 256 * 1024)
    if relay is not None and relay.run_dir is not None:
        # Which of the host's workers answered (GATEWAY_WORKERS): for the operator
        # reading a trace, and for tests that need two workers.
        worker = str(relay.worker_index)

        async def name_worker(_request: web.Request, response: web.StreamResponse) -> None:
            response.headers[WORKER_HEADER] = worker

        app.on_response_prepare.append(name_worker)
    app[STATE_KEY] = state
    services = [
        service
        for kind in legs
        if kind.service is not None
        and (service := kind.service(state, settings.leg_env)) is not None
    ]
    app[LEG_SERVICES_KEY] = services
    speech_cache = SpeechCacheService(
        SpeechCacheSettings(
            prompts_path=settings.speech_cache_prompts,
            limits=PromptLimits(
                max_text_chars=settings.speech_cache_max_text_chars,
                max_prompts=settings.speech_cache_max_prompts,
            ),
            warm_concurrency=settings.speech_cache_warm_concurrency,
        ),
        link=state.engine,
        resolve_voice=state.resolve_voice,
        metrics=state.metrics,
        declared=declared_prompts(settings.leg_env, legs),
        # The host's workers share one engine: the first warms the start-up prompts.
        warm_at_start=relay is None or relay.worker_index == 0,
        # A warmed prompt is a likely hit: its callers need not queue behind synthesis.
        on_warm=lambda tenant, spec: state.gate.likely_hits.remember(
            likely_hit_key(tenant, spec.voice, spec.speed, spec.instruct, spec.text)
        ),
    )
    registry.deletion_listeners.append(
        lambda deletion: speech_cache.forget_voice(
            deletion.voice_id, deletion.features_digest, deletion.tenant
        )
    )
    upload_workers = UploadWorkers(settings.upload_workers)  # processes start at 1st upload
    app[voices_api.UPLOAD_WORKERS_KEY] = upload_workers

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        state.pacer.start()
        state.gate.start()
        await state.limits.start()
        await supervisor.start()
        await call_directory.start()
        if registry.deletions is not None:
            registry.deletions.start()
        for service in services:
            await service.start()
        await speech_cache.start()  # in the background: nothing waits for the warm-up
        yield
        await speech_cache.stop()
        for service in reversed(services):
            await service.stop()
        await state.connections.close()
        await call_directory.stop()
        await state.limits.stop()
        await supervisor.stop()
        await state.gate.stop()
        await state.pacer.stop()
        await upload_workers.close()
        if registry.deletions is not None:
            await registry.deletions.stop()
        if redis_client is not None:
            await redis_client.aclose()

    app.cleanup_ctx.append(lifecycle)
    for path, handler in {**PROTOCOLS, **leg_routes(legs)}.items():
        app.router.add_get(path, handler)
    voices_api.add_routes(app, state)
    speech_api.add_routes(app)
    speech_cache_api.add_routes(app, speech_cache)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/", index)
    if settings.web_demo_dir.is_dir():
        app.router.add_static("/static/", settings.web_demo_dir, show_index=False)
    return app
