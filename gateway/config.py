"""Gateway settings from the environment.

Fixed names (design brief): ``GATEWAY_HOST``, ``GATEWAY_PORT``, ``GATEWAY_JWT_*``,
``GATEWAY_REDIS_URL``, ``ENGINE_BACKEND``. The rest are the gateway's own and are listed
in README.md's configuration table.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from engine.ipc.env import ConfigError, env_int
from gateway.admission import AdmissionSettings
from gateway.auth import AuthSettings
from gateway.session import SessionLimits

MAX_WORKERS = 256
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK_NETWORKS: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)
MIN_METRICS_TOKEN_CHARS = 16
WEB_DEMO_DIR = Path(__file__).resolve().parent.parent / "web-demo"

__all__ = ["WEB_DEMO_DIR", "ConfigError", "GatewaySettings"]


def _policy(value: str) -> str:
    if value not in ("fail-open", "fail-closed"):
        raise ConfigError(f"GATEWAY_LEASE_POLICY must be fail-open or fail-closed, not {value!r}")
    return value


def _networks(env: Mapping[str, str], name: str) -> tuple[IPNetwork, ...]:
    """``CIDR,...`` (unset: loopback only; empty: no network)."""
    value = env.get(name)
    if value is None:
        return LOOPBACK_NETWORKS
    networks: list[IPNetwork] = []
    for item in (i.strip() for i in value.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(f"{name}: {item!r} is not a network") from None
    return tuple(networks)


def _metrics_token(value: str) -> str:
    if value and len(value) < MIN_METRICS_TOKEN_CHARS:
        raise ConfigError(
            f"GATEWAY_METRICS_TOKEN must be at least {MIN_METRICS_TOKEN_CHARS} characters"
        )
    return value


def _prompts_path(value: str | None) -> Path | None:
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise ConfigError(f"GATEWAY_SPEECH_CACHE_PROMPTS: {value!r} is not a file")
    return path


@dataclass(frozen=True)
class GatewaySettings:
    auth: AuthSettings
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1  # GATEWAY_WORKERS: worker processes on the port, under a supervisor
    redis_url: str | None = None
    relay_host: str = ""  # GATEWAY_RELAY_HOST: how other instances reach this one
    relay_port: int = 0  # GATEWAY_RELAY_PORT: worker i's relay port is this + i (0: any)
    redis_prefix: str = "ivr"  # key prefix: several deployments (or tests) share a Redis
    engine_backend: str = ""  # ENGINE_BACKEND; "": the engine's default (piper,espeak or espeak)
    engine_socket: str | None = None  # attach to this engine instead of starting one
    engine_ready_timeout_s: float = 30.0
    engine_heartbeat_s: float = 1.0
    engine_heartbeat_timeout_s: float = 3.0
    engine_extra_args: tuple[str, ...] = ()
    limits: SessionLimits = field(default_factory=SessionLimits)
    max_message_bytes: int = 64 * 1024
    start_timeout_s: float = 10.0
    #: No message from the client this long, and nothing playing: the session ends
    #: (``idle_timeout``). 0: never. ``keepalive`` (or any message) resets it.
    idle_timeout_s: float = 300.0
    tick_s: float = 0.005
    ws_heartbeat_s: float = 20.0
    web_demo_dir: Path = WEB_DEMO_DIR
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    voice_dir: Path = field(
        default_factory=lambda: Path.home() / ".local" / "share" / "ivr-gateway" / "voices"
    )
    voice_cache_size: int = 100
    tenant_max_streams: int = 100  # when the token has no max_streams claim
    lease_s: float = 10.0
    lease_renew_s: float = 3.0
    lease_policy: str = "fail-open"  # or "fail-closed", when Redis is unreachable
    retry_after_ms: int = 2000
    drain_timeout_s: float = 30.0  # on SIGTERM: how long calls in progress may go on
    # Limits that hold for the slow, the silent and the malformed (docs/operations.md).
    max_connections: int = 4096  # open TCP connections per worker; beyond: 503 and close
    handshake_timeout_s: float = 10.0  # a request head must arrive within this (and idle)
    max_protocol_errors: int = 10  # malformed messages a connection may send before 1008
    send_stall_s: float = 10.0  # unsent output not shrinking this long: the connection goes
    max_uploads: int = 2  # voice uploads in flight per worker; beyond: 429 retry_after_ms
    upload_workers: int = 1  # processes that decode and normalize uploads
    upload_timeout_s: float = 60.0  # to receive a whole upload body
    #: The environment the legs read their own settings from (``GATEWAY_SIP_*``,
    #: ``GATEWAY_AUDIOSOCKET_*``: :mod:`gateway.legs.kinds`); this module names no leg.
    leg_env: Mapping[str, str] = field(default_factory=dict)
    # The speech cache's warm prompts (docs/speech-cache.md): a prompts file warmed at
    # start-up, and the limits of every warm prompt (the file's and the API's).
    speech_cache_prompts: Path | None = None  # GATEWAY_SPEECH_CACHE_PROMPTS
    speech_cache_max_text_chars: int = 2000
    speech_cache_max_prompts: int = 1000  # per tenant (and lines of the prompts file)
    speech_cache_warm_concurrency: int = 2  # prompts with the engine at a time
    # Tenants whose calls' speech the cache never keeps ("*": every tenant): zero
    # retention, a ceiling no request lifts (GATEWAY_SPEECH_CACHE_NO_RETENTION).
    speech_cache_no_retention: frozenset[str] = frozenset()
    # Who may read /metrics: peers in these networks (GATEWAY_METRICS_ALLOW), or anyone
    # with the bearer token GATEWAY_METRICS_TOKEN when it is set.
    metrics_allow: tuple[IPNetwork, ...] = LOOPBACK_NETWORKS
    metrics_token: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GatewaySettings:
        limits = SessionLimits(
            max_text_chars=env_int(env, "GATEWAY_MAX_TEXT_CHARS", 2000, minimum=1),
            max_queued_items=env_int(env, "GATEWAY_MAX_QUEUED", 64, minimum=1),
            realtime_lead_s=env_int(env, "GATEWAY_REALTIME_LEAD_MS", 60, minimum=0) / 1000,
            burst_lead_s=env_int(env, "GATEWAY_BURST_LEAD_MS", 2000, minimum=0) / 1000,
        )
        port = env_int(env, "GATEWAY_PORT", 8080, minimum=0)
        if port > 65535:
            raise ConfigError(f"GATEWAY_PORT must be at most 65535, got {port}")
        return cls(
            auth=AuthSettings.from_env(env),
            host=env.get("GATEWAY_HOST") or "127.0.0.1",
            port=port,
            workers=env_int(env, "GATEWAY_WORKERS", 1, minimum=1, maximum=MAX_WORKERS),
            redis_url=env.get("GATEWAY_REDIS_URL") or None,
            relay_host=env.get("GATEWAY_RELAY_HOST") or "",
            relay_port=env_int(env, "GATEWAY_RELAY_PORT", 0, minimum=0, maximum=65535),
            redis_prefix=env.get("GATEWAY_REDIS_PREFIX") or "ivr",
            engine_backend=env.get("ENGINE_BACKEND") or "",
            engine_socket=env.get("ENGINE_SOCKET") or None,
            engine_ready_timeout_s=float(env_int(env, "ENGINE_READY_TIMEOUT_S", 30, minimum=1)),
            limits=limits,
            max_message_bytes=env_int(env, "GATEWAY_MAX_MESSAGE_BYTES", 64 * 1024, minimum=1024),
            start_timeout_s=float(env_int(env, "GATEWAY_START_TIMEOUT_S", 10, minimum=1)),
            idle_timeout_s=float(env_int(env, "GATEWAY_IDLE_TIMEOUT_S", 300, minimum=0)),
            tick_s=env_int(env, "GATEWAY_TICK_MS", 5, minimum=1) / 1000,
            admission=AdmissionSettings(
                soft_latency_s=env_int(env, "GATEWAY_SOFT_LATENCY_MS", 1500, minimum=1) / 1000,
                window_s=float(env_int(env, "GATEWAY_LATENCY_WINDOW_S", 30, minimum=1)),
                max_queue=env_int(env, "GATEWAY_ADMISSION_QUEUE", 256, minimum=0),
                max_wait_s=env_int(env, "GATEWAY_QUEUE_TIMEOUT_MS", 5000, minimum=1) / 1000,
            ),
            retry_after_ms=env_int(env, "GATEWAY_RETRY_AFTER_MS", 2000, minimum=0),
            drain_timeout_s=float(env_int(env, "GATEWAY_DRAIN_TIMEOUT_S", 30, minimum=0)),
            max_connections=env_int(env, "GATEWAY_MAX_CONNECTIONS", 4096, minimum=1),
            handshake_timeout_s=float(env_int(env, "GATEWAY_HANDSHAKE_TIMEOUT_S", 10, minimum=1)),
            max_protocol_errors=env_int(env, "GATEWAY_MAX_PROTOCOL_ERRORS", 10, minimum=1),
            send_stall_s=float(env_int(env, "GATEWAY_SEND_STALL_S", 10, minimum=1)),
            max_uploads=env_int(env, "GATEWAY_MAX_UPLOADS", 2, minimum=1),
            upload_workers=env_int(env, "GATEWAY_UPLOAD_WORKERS", 1, minimum=1),
            upload_timeout_s=float(env_int(env, "GATEWAY_UPLOAD_TIMEOUT_S", 60, minimum=1)),
            voice_dir=Path(env["GATEWAY_VOICE_DIR"])
            if env.get("GATEWAY_VOICE_DIR")
            else Path.home() / ".local" / "share" / "ivr-gateway" / "voices",
            voice_cache_size=env_int(env, "GATEWAY_VOICE_CACHE_SIZE", 100, minimum=1),
            tenant_max_streams=env_int(env, "GATEWAY_TENANT_MAX_STREAMS", 100, minimum=1),
            lease_s=env_int(env, "GATEWAY_LEASE_MS", 10000, minimum=100) / 1000,
            lease_renew_s=env_int(env, "GATEWAY_LEASE_RENEW_MS", 3000, minimum=50) / 1000,
            lease_policy=_policy(env.get("GATEWAY_LEASE_POLICY") or "fail-open"),
            leg_env=MappingProxyType(dict(env)),
            speech_cache_prompts=_prompts_path(env.get("GATEWAY_SPEECH_CACHE_PROMPTS")),
            speech_cache_max_text_chars=env_int(
                env, "GATEWAY_SPEECH_CACHE_MAX_TEXT_CHARS", 2000, minimum=1, maximum=100_000
            ),
            speech_cache_max_prompts=env_int(
                env, "GATEWAY_SPEECH_CACHE_MAX_PROMPTS", 1000, minimum=1, maximum=100_000
            ),
            speech_cache_warm_concurrency=env_int(
                env, "GATEWAY_SPEECH_CACHE_WARM_CONCURRENCY", 2, minimum=1, maximum=64
            ),
            speech_cache_no_retention=frozenset(
                t.strip()
                for t in (env.get("GATEWAY_SPEECH_CACHE_NO_RETENTION") or "").split(",")
                if t.strip()
            ),
            metrics_allow=_networks(env, "GATEWAY_METRICS_ALLOW"),
            metrics_token=_metrics_token(env.get("GATEWAY_METRICS_TOKEN") or ""),
        )
