"""The worker's listening socket, guarded against clients that are slow, silent or many.

- **Handshake deadline.** A connection must deliver a complete request head within
  ``GATEWAY_HANDSHAKE_TIMEOUT_S`` of connecting (or of finishing its previous request,
  on a kept-alive connection); otherwise it is closed. aiohttp's keep-alive timer
  already runs from the moment a connection is made and closes it while it waits for a
  request head, so the deadline is that timer set to the handshake timeout. A
  connection whose request is being handled (a WebSocket session, an upload) is not
  affected; uploads have their own body deadline.
- **Connection cap.** At most ``GATEWAY_MAX_CONNECTIONS`` open connections per worker;
  beyond it a new connection is answered ``503`` with ``Retry-After`` and closed at once,
  before any parsing, and counted in ``gateway_connections_refused_total``.
  ``gateway_connections_open`` shows how many are open.
"""

from __future__ import annotations

import asyncio
import json
from typing import cast

from aiohttp import web

from gateway.errors import ErrorCode
from gateway.metrics import GatewayMetrics

_BODY = json.dumps(
    {"error": {"code": ErrorCode.TOO_MANY_CONNECTIONS, "message": "this worker is at its limit"}}
).encode()
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


class _Refuse(asyncio.Protocol):
    """Answers 503 and closes: what a connection over the cap gets."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = cast(asyncio.WriteTransport, transport)  # uvloop's are not subclasses
        writer.write(REFUSAL)
        writer.close()


class GuardedSite(web.TCPSite):
    """A :class:`aiohttp.web.TCPSite` that refuses connections beyond ``max_connections``."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        max_connections: int,
        metrics: GatewayMetrics,
    ) -> None:
        super().__init__(runner, host, port)
        self._max_connections = max_connections
        self._metrics = metrics

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        if len(server.connections) >= self._max_connections:
            self._metrics.connections_refused.labels(reason="limit").inc()
            return _Refuse()
        return server()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        self._metrics.connections_open.set_function(lambda: len(server.connections))
        self._server = await asyncio.get_running_loop().create_server(
            self._protocol, self._host, self._port, backlog=self._backlog
        )
