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
- **Write stall.** A connection whose unsent output has not shrunk for
  ``GATEWAY_SEND_STALL_S`` (the peer reads nothing: not our audio, not a pong, not an
  HTTP response, not even the close frame) is aborted, so that it cannot hold its
  session, its engine slot or a place under the cap; counted in
  ``gateway_connections_aborted_total{reason="write_stall"}``. A closing transport waits
  for its buffer to drain, so without this a peer that never reads would keep a closed
  connection open for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
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


STALL_CHECK_S = 1.0


class StallWatch:
    """Aborts transports whose write buffer has been non-empty and not shrinking for
    ``stall_s`` (checked every :data:`STALL_CHECK_S`)."""

    def __init__(
        self,
        transports: Callable[[], list[asyncio.BaseTransport]],
        stall_s: float,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transports = transports
        self._stall_s = stall_s
        self._metrics = metrics
        self._clock = clock
        # transport -> (buffered bytes at the last check, since when it has not shrunk)
        self._watched: dict[asyncio.BaseTransport, tuple[int, float]] = {}

    def check(self) -> int:
        """One pass; returns how many transports were aborted."""
        now = self._clock()
        watched: dict[asyncio.BaseTransport, tuple[int, float]] = {}
        aborted = 0
        transports = self._transports()
        # Also the open-connection gauge's value where a scrape-time function does not
        # count (several workers' metrics in files, gateway/metrics.py).
        self._metrics.connections_open.set(len(transports))
        for transport in transports:
            writer = cast(asyncio.WriteTransport, transport)
            size = writer.get_write_buffer_size()
            if size == 0:
                continue
            previous = self._watched.get(transport)
            since = now if previous is None or size < previous[0] else previous[1]
            if now - since >= self._stall_s:
                writer.abort()
                aborted += 1
                self._metrics.connections_aborted.labels(reason="write_stall").inc()
                continue
            watched[transport] = (size, since)
        self._watched = watched
        return aborted

    async def run(self) -> None:
        while True:
            await asyncio.sleep(STALL_CHECK_S)
            self.check()


#: The kernel's queue of connections not yet accepted (capped by net.core.somaxconn).
#: A reconnect storm (every media server of a failed instance at once) arrives faster
#: than one event loop accepts: beyond the queue, a connection's SYN is dropped and
#: retried 1 s, then 3 s later; in the queue it waits only its turn.
LISTEN_BACKLOG = 4096


class GuardedSite(web.TCPSite):
    """A :class:`aiohttp.web.TCPSite` that refuses connections beyond ``max_connections``."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        max_connections: int,
        send_stall_s: float,
        metrics: GatewayMetrics,
        reuse_port: bool = False,
    ) -> None:
        super().__init__(runner, host, port, reuse_port=reuse_port, backlog=LISTEN_BACKLOG)
        self._max_connections = max_connections
        self._metrics = metrics
        self._stall = StallWatch(self._open_transports, send_stall_s, metrics)
        self._stall_task: asyncio.Task[None] | None = None

    def _open_transports(self) -> list[asyncio.BaseTransport]:
        """Every open connection's transport, closing ones included. aiohttp's handler
        forgets its transport when it closes it (``handler.transport`` is None) while the
        transport itself waits for its buffer to drain; the server's own table keeps it
        until the connection is lost, which is exactly what must be watched.
        (tests/gateway/test_listener.py checks that the table is there.)"""
        server = self._runner.server
        if server is None:
            return []
        return list(server._connections.values())

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
        # Read at scrape time; when the host's workers share their metrics (values in
        # files, gateway/metrics.py) a function does not count there, so each pass of
        # the stall watch (every second) also sets the value.
        self._metrics.connections_open.set_function(lambda: len(server.connections))
        self._server = await asyncio.get_running_loop().create_server(
            self._protocol,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_port=self._reuse_port,  # GATEWAY_WORKERS: the host's workers share the port
        )
        self._stall_task = asyncio.create_task(self._stall.run(), name="write-stall-watch")

    async def stop(self) -> None:
        if self._stall_task is not None:
            self._stall_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stall_task
            self._stall_task = None
        await super().stop()
