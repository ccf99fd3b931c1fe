"""Where a worker takes relayed attaches: its own listener beside the shared port.

The public port is shared by the host's workers (SO_REUSEPORT), so it cannot name one
worker. Each worker that may hold calls others look for also listens on an address of its
own, published with its calls in the call directory (:mod:`gateway.call_directory`):

- with ``GATEWAY_REDIS_URL`` (calls reachable across instances): TCP on
  ``GATEWAY_HOST``, port ``GATEWAY_RELAY_PORT`` + the worker's index (0, the default: a
  free port), advertised as ``GATEWAY_RELAY_HOST`` (default: ``GATEWAY_HOST``, or this
  host's address when that is a wildcard);
- several workers and no Redis: a Unix socket in the host supervisor's run directory;
- one worker and no Redis: none (every call is local).

The listener serves the relay route only (``/v1/stream``, the same tokens; every other
path is a 404: no metrics, no speech or voices API), as an application of its own
(:meth:`RelayEndpoint.app`) under the public port's guards: its connections count against
the same ``GATEWAY_MAX_CONNECTIONS``, and the handshake timeout and write-stall limit
apply alike (:class:`gateway.listener.ConnectionGuard`). Connections from another worker
carry :data:`gateway.protocols.relay.RELAY_HEADER`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from redis.asyncio import Redis

from gateway.call_directory import CallDirectory, HostCallDirectory, RedisCallDirectory
from gateway.config import GatewaySettings
from gateway.protocols import native
from gateway.protocols.relay import RELAY_PATH
from gateway.state import STATE_KEY, GatewayState
from gateway.workers import RUN_DIR_ENV, WORKER_INDEX_ENV

WILDCARDS = ("", "0.0.0.0", "::")


def advertised_host(settings: GatewaySettings) -> str:
    if settings.relay_host:
        return settings.relay_host
    if settings.host not in WILDCARDS:
        return settings.host
    return socket.gethostbyname(socket.gethostname())


@dataclass
class RelayEndpoint:
    address: str  # what other workers connect to: unix:PATH or http://HOST:PORT
    sock: socket.socket
    run_dir: str | None
    worker_index: int

    @classmethod
    def bind(cls, settings: GatewaySettings, env: Mapping[str, str]) -> RelayEndpoint | None:
        run_dir = env.get(RUN_DIR_ENV) or None
        index = int(env.get(WORKER_INDEX_ENV) or 0)
        if settings.redis_url:
            port = settings.relay_port + index if settings.relay_port else 0
            family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((settings.host, port))
            host = advertised_host(settings)
            if ":" in host:
                host = f"[{host}]"
            return cls(f"http://{host}:{sock.getsockname()[1]}", sock, run_dir, index)
        if run_dir is None:
            return None
        path = os.path.join(run_dir, f"worker-{index}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        return cls(f"unix:{path}", sock, run_dir, index)

    def directory(self, redis: Redis | None, settings: GatewaySettings) -> CallDirectory:
        if redis is not None:
            return RedisCallDirectory(
                redis,
                settings.redis_prefix,
                self.address,
                lease_s=settings.lease_s,
                renew_s=settings.lease_renew_s,
            )
        assert self.run_dir is not None
        return HostCallDirectory(self.run_dir, self.worker_index, self.address)

    @staticmethod
    def app(state: GatewayState) -> web.Application:
        """What the relay listener serves: the worker's state, one route."""
        app = web.Application()
        app[STATE_KEY] = state
        app.router.add_get(RELAY_PATH, native.handle_stream)
        return app
